//! Errors as the OpenAI API returns them: an HTTP status and `{"error": {"message", "type", "param", "code"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// A request that failed, with what the client is told.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault (`messages[0].content`), when there is one.
    pub param: Option<String>,
    /// A machine-readable reason (`model_not_found`, `context_length_exceeded`, ...).
    pub code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// 400: a field is missing, of the wrong type or out of range.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.into()),
            ..ApiError::new(StatusCode::BAD_REQUEST, message)
        }
    }

    /// 400: the body is not a JSON document of the expected shape.
    pub fn bad_json(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// 400: the prompt, or the prompt plus the tokens asked for, does not fit the context.
    pub fn context_length(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::invalid(param, message)
        }
    }

    /// 401: the API key is missing or wrong.
    pub fn unauthorized() -> ApiError {
        ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(
                StatusCode::UNAUTHORIZED,
                "missing or incorrect API key: send the header `Authorization: Bearer KEY` with the server's --api-key",
            )
        }
    }

    /// 404: a model id this server does not serve.
    pub fn unknown_model(asked: &str, served: &str) -> ApiError {
        ApiError {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                format!("the model `{asked}` does not exist: this server serves `{served}` (see GET /v1/models)"),
            )
        }
    }

    /// 404: no such endpoint.
    pub fn no_route(method: &str, path: &str) -> ApiError {
        ApiError {
            code: Some("unknown_url"),
            ..ApiError::new(StatusCode::NOT_FOUND, format!("unknown endpoint: {method} {path}"))
        }
    }

    /// The request body could not be read: 413 when it is over the limit, else the status axum chose.
    pub fn body(status: StatusCode, limit: usize, detail: &str) -> ApiError {
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            return ApiError::new(
                status,
                format!("the request body is over the server's limit of {limit} bytes (--max-body)"),
            );
        }
        ApiError::new(status, format!("could not read the request body: {detail}"))
    }

    /// 503: every session is busy and the queue is full.
    pub fn busy(queue: usize) -> ApiError {
        ApiError {
            code: Some("server_busy"),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the server is busy: every session is generating and {queue} requests are already waiting; retry later"),
            )
        }
    }

    /// 504: the request ran past the server's per-request timeout.
    pub fn timeout(secs: u64) -> ApiError {
        ApiError {
            code: Some("timeout"),
            ..ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                format!("the request ran past the server's timeout of {secs} s (--timeout)"),
            )
        }
    }

    /// 500: the engine failed (a device error); the message says where.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// The OpenAI `type` of this error.
    fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        }
    }

    /// The error body.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

/// The message of a failed request, kept on the response for the request log line.
#[derive(Clone, Debug)]
pub struct ErrorNote(pub String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = super::api::json_response(self.status, &self.to_json());
        response.extensions_mut().insert(ErrorNote(self.message));
        response
    }
}
