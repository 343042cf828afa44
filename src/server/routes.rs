//! The HTTP endpoints: the two completion endpoints (a prompt checked against the context, queued for the worker,
//! answered whole or as server-sent events), models, health and metrics; and the layers every request passes:
//! the API key, the body limit, the request counter and the log line.

use super::api::{self, Endpoint, Input, Reply};
use super::error::{ApiError, ErrorNote};
use super::worker::{Event, Finish, Job};
use super::{decode::StopRules, AppState};
use crate::tokenizer::Tokenizer;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::sse::{self, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio::time::timeout_at;

type Shared = Arc<AppState>;

/// Every route and layer over `state`.
pub fn router(state: Shared) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .method_not_allowed_fallback(wrong_method)
        .fallback(no_route)
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .layer(DefaultBodyLimit::max(state.opts.max_body))
        .with_state(state)
}

/// Marks a response whose request is logged by its handler (with its token counts), not by [`observe`].
#[derive(Clone, Copy, Debug)]
struct LoggedByHandler;

/// The label of a path in the request counter (a fixed set, so that odd paths cannot grow the metrics).
fn endpoint_label(path: &str) -> &'static str {
    match path {
        "/v1/chat/completions" => "/v1/chat/completions",
        "/v1/completions" => "/v1/completions",
        "/v1/models" => "/v1/models",
        "/health" => "/health",
        "/metrics" => "/metrics",
        p if p.starts_with("/v1/models/") => "/v1/models/{id}",
        _ => "other",
    }
}

/// Count every request and log a line for those their handler does not log.
async fn observe(State(s): State<Shared>, req: Request, next: Next) -> Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let t0 = Instant::now();
    let response = next.run(req).await;
    let status = response.status().as_u16();
    s.metrics.count_request(endpoint_label(&path), status);
    if response.extensions().get::<LoggedByHandler>().is_none() {
        let note = response.extensions().get::<ErrorNote>().map(|n| format!(": {}", n.0));
        log::info!(
            "{method} {path} {status} {:.1} ms{}",
            t0.elapsed().as_secs_f64() * 1e3,
            note.unwrap_or_default()
        );
    }
    response
}

/// With `--api-key`, every request but `/health` needs `Authorization: Bearer KEY`.
async fn authorize(State(s): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(key) = &s.opts.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if req.uri().path() != "/health" && !given.is_some_and(|g| same_secret(g.as_bytes(), key.as_bytes())) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// Equality whose time does not depend on where two keys of equal length differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::no_route(method.as_str(), uri.path())
}

async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        ..ApiError::no_route(method.as_str(), uri.path())
    }
}

async fn health() -> Response {
    api::json_response(StatusCode::OK, &json!({"status": "ok"}))
}

fn model_object(s: &AppState) -> serde_json::Value {
    json!({"id": s.opts.model_id, "object": "model", "created": s.created, "owned_by": "shaderlm"})
}

async fn models(State(s): State<Shared>) -> Response {
    api::json_response(StatusCode::OK, &json!({"object": "list", "data": [model_object(&s)]}))
}

async fn model(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    if id != s.opts.model_id {
        return ApiError::unknown_model(&id, &s.opts.model_id).into_response();
    }
    api::json_response(StatusCode::OK, &model_object(&s))
}

async fn metrics(State(s): State<Shared>) -> Response {
    let waiting = s.jobs.max_capacity() - s.jobs.capacity();
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    ([(header::CONTENT_TYPE, content_type)], s.metrics.render(waiting)).into_response()
}

async fn chat(State(s): State<Shared>, body: Result<Bytes, BytesRejection>) -> Response {
    complete(s, Endpoint::Chat, body).await
}

async fn completions(State(s): State<Shared>, body: Result<Bytes, BytesRejection>) -> Response {
    complete(s, Endpoint::Completion, body).await
}

/// The prompt's tokens, checked against the vocabulary.
fn tokenize(tok: &Tokenizer, input: Input, vocab: usize) -> Result<Vec<u32>, ApiError> {
    let (param, ids) = match input {
        Input::Messages(m) => (
            "messages",
            tok.encode_chat(&m, true)
                .map_err(|e| ApiError::invalid("messages", format!("messages: {e}")))?,
        ),
        Input::Text(t) => (
            "prompt",
            tok.encode(&t, true)
                .map_err(|e| ApiError::invalid("prompt", format!("prompt: {e}")))?,
        ),
        Input::Ids(ids) => ("prompt", ids),
    };
    if ids.is_empty() {
        return Err(ApiError::invalid(param, format!("{param}: the prompt is empty")));
    }
    if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid(
            param,
            format!("{param}: token id {bad} is outside the vocabulary of {vocab}"),
        ));
    }
    Ok(ids)
}

/// Read and check a request, and queue it: the request and the receiver of its events.
async fn submit(
    s: &AppState,
    endpoint: Endpoint,
    body: Result<Bytes, BytesRejection>,
) -> Result<(api::Request, mpsc::UnboundedReceiver<Event>), ApiError> {
    let bytes = body.map_err(|r| ApiError::body(r.status(), s.opts.max_body, &r.body_text()))?;
    let req = api::parse(endpoint, &bytes)?;
    if req.model != s.opts.model_id {
        return Err(ApiError::unknown_model(&req.model, &s.opts.model_id));
    }
    let (tok, input, vocab) = (s.tok.clone(), req.input.clone(), s.vocab);
    let prompt = tokio::task::spawn_blocking(move || tokenize(&tok, input, vocab))
        .await
        .map_err(|e| ApiError::internal(format!("tokenizing the prompt failed: {e}")))??;
    let ctx = s.ctx;
    let param = if endpoint == Endpoint::Chat {
        "messages"
    } else {
        "prompt"
    };
    if prompt.len() >= ctx {
        return Err(ApiError::context_length(
            param,
            format!(
                "the prompt has {} tokens, but the context holds {ctx} (the server's --ctx) and needs room for at \
                 least one generated token",
                prompt.len()
            ),
        ));
    }
    let room = ctx - prompt.len();
    let max_tokens = match req.max_tokens {
        None => room,
        Some(n) if n <= room => n,
        Some(n) => {
            let param = req.max_tokens_param;
            return Err(ApiError::context_length(
                param,
                format!(
                    "the prompt ({} tokens) and {param} ({n}) are over the context of {ctx} tokens; ask for at most \
                     {room}",
                    prompt.len()
                ),
            ));
        }
    };
    let (events, receiver) = mpsc::unbounded_channel();
    let job = Job {
        prompt,
        sampling: req.sampling.clone(),
        rules: StopRules {
            max_tokens,
            strings: req.stop.clone(),
            at_eos: !req.ignore_eos,
        },
        events,
        received: Instant::now(),
    };
    match s.jobs.try_send(job) {
        Ok(()) => Ok((req, receiver)),
        Err(TrySendError::Full(_)) => Err(ApiError::busy(s.opts.queue)),
        Err(TrySendError::Closed(_)) => Err(ApiError::internal("the GPU worker has stopped")),
    }
}

async fn complete(s: Shared, endpoint: Endpoint, body: Result<Bytes, BytesRejection>) -> Response {
    // The timeout counts from the request's arrival: tokenizing and waiting for a session are part of it.
    let (started, deadline) = (Instant::now(), tokio::time::Instant::now() + s.opts.timeout);
    let (req, receiver) = match submit(&s, endpoint, body).await {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let log = RequestLog {
        endpoint,
        stream: req.stream,
        started,
        done: false,
    };
    let reply = Reply::new(endpoint, &s.opts.model_id);
    let mut response = if req.stream {
        let stream = Streaming {
            receiver,
            reply,
            deadline,
            timeout_secs: s.opts.timeout.as_secs(),
            include_usage: req.include_usage,
            log,
            phase: Phase::Start,
        };
        Sse::new(futures_util::stream::unfold(stream, Streaming::next))
            .keep_alive(sse::KeepAlive::default())
            .into_response()
    } else {
        whole(receiver, reply, deadline, s.opts.timeout.as_secs(), log).await
    };
    response.extensions_mut().insert(LoggedByHandler);
    response
}

/// Collect a completion and answer it in one object.
async fn whole(
    mut receiver: mpsc::UnboundedReceiver<Event>,
    reply: Reply,
    deadline: tokio::time::Instant,
    timeout_secs: u64,
    mut log: RequestLog,
) -> Response {
    let mut text = String::new();
    let outcome = timeout_at(deadline, async {
        while let Some(event) = receiver.recv().await {
            match event {
                Event::Text(t) => text.push_str(&t),
                Event::Done(f) => return Ok(f),
                Event::Failed(e) => return Err(e),
            }
        }
        Err(ApiError::internal("the GPU worker stopped"))
    })
    .await
    .unwrap_or_else(|_| Err(ApiError::timeout(timeout_secs)));
    match outcome {
        Ok(finish) => {
            log.done(&finish);
            api::json_response(StatusCode::OK, &reply.completion(&text, &finish))
        }
        Err(e) => {
            log.failed(&e);
            e.into_response()
        }
    }
}

/// Where a stream is.
enum Phase {
    /// The chat stream opens with the assistant's role.
    Start,
    /// Text chunks until the worker says the end.
    Body,
    /// The usage chunk (`include_usage`).
    Usage(Finish),
    /// `data: [DONE]`.
    Done,
    End,
}

/// A completion as server-sent events in OpenAI's chunk format; dropping it (the client left) drops the
/// receiver, which tells the worker to free the session.
struct Streaming {
    receiver: mpsc::UnboundedReceiver<Event>,
    reply: Reply,
    deadline: tokio::time::Instant,
    timeout_secs: u64,
    include_usage: bool,
    log: RequestLog,
    phase: Phase,
}

fn data(value: &serde_json::Value) -> Result<sse::Event, Infallible> {
    Ok(sse::Event::default().data(value.to_string()))
}

impl Streaming {
    async fn next(mut self) -> Option<(Result<sse::Event, Infallible>, Streaming)> {
        let event = match std::mem::replace(&mut self.phase, Phase::End) {
            Phase::Start if self.reply.endpoint == Endpoint::Chat => {
                self.phase = Phase::Body;
                data(&self.reply.chunk(true, Some(""), None))
            }
            Phase::Start | Phase::Body => self.body().await,
            Phase::Usage(finish) => {
                self.phase = Phase::Done;
                data(&self.reply.usage_chunk(&finish))
            }
            Phase::Done => Ok(sse::Event::default().data("[DONE]")),
            Phase::End => return None,
        };
        Some((event, self))
    }

    /// The next chunk from the worker: text, the finish reason, or an error (which ends the stream).
    async fn body(&mut self) -> Result<sse::Event, Infallible> {
        let received = timeout_at(self.deadline, self.receiver.recv()).await;
        let error = match received {
            Ok(Some(Event::Text(t))) => {
                self.phase = Phase::Body;
                return data(&self.reply.chunk(false, Some(&t), None));
            }
            Ok(Some(Event::Done(finish))) => {
                self.log.done(&finish);
                let chunk = match self.reply.endpoint {
                    Endpoint::Chat => self.reply.chunk(false, None, Some(finish.reason)),
                    Endpoint::Completion => self.reply.chunk(false, Some(""), Some(finish.reason)),
                };
                self.phase = if self.include_usage {
                    Phase::Usage(finish)
                } else {
                    Phase::Done
                };
                return data(&chunk);
            }
            Ok(Some(Event::Failed(e))) => e,
            Ok(None) => ApiError::internal("the GPU worker stopped"),
            Err(_) => ApiError::timeout(self.timeout_secs),
        };
        self.log.failed(&error);
        data(&error.to_json())
    }
}

/// The log line of one generation request, written when it ends, or when it is dropped unfinished (the client
/// disconnected).
struct RequestLog {
    endpoint: Endpoint,
    stream: bool,
    started: Instant,
    done: bool,
}

impl RequestLog {
    fn head(&self) -> String {
        let mode = if self.stream { " (stream)" } else { "" };
        format!("POST {}{mode}", self.endpoint.path())
    }

    fn done(&mut self, f: &Finish) {
        self.done = true;
        let rate = |n: usize, d: std::time::Duration| n as f64 / d.as_secs_f64().max(1e-9);
        let prefilled = f.prompt_tokens - f.cached_tokens;
        log::info!(
            "{} 200 {:.2} s: prompt {} tokens ({} cached, {prefilled} prefilled at {:.1} tok/s after {:.2} s queued), \
             {} generated at {:.1} tok/s, finish {}",
            self.head(),
            self.started.elapsed().as_secs_f64(),
            f.prompt_tokens,
            f.cached_tokens,
            rate(prefilled, f.prefill),
            f.queued.as_secs_f64(),
            f.completion_tokens,
            rate(f.completion_tokens, f.decode),
            f.reason.as_str(),
        );
    }

    fn failed(&mut self, e: &ApiError) {
        self.done = true;
        log::warn!(
            "{} {} {:.2} s: {}",
            self.head(),
            e.status.as_u16(),
            self.started.elapsed().as_secs_f64(),
            e.message
        );
    }
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        if !self.done {
            log::info!(
                "{} cancelled after {:.2} s: the client disconnected",
                self.head(),
                self.started.elapsed().as_secs_f64()
            );
        }
    }
}
