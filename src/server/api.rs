//! The OpenAI wire format: the bodies of `/v1/chat/completions` and `/v1/completions` parsed and checked into a
//! [`Request`] (a wrong field is a 400 naming it), and the response objects and stream chunks built from what the
//! worker produced.

use super::decode::FinishReason;
use super::error::ApiError;
use super::worker::Finish;
use crate::sampling::SamplingParams;
use crate::tokenizer::chat::Message;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};

/// Which endpoint a request came through: it decides how the prompt is built and the shape of the response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completion => "/v1/completions",
        }
    }
}

/// The prompt as the client gave it.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// Chat messages, for the model's chat template.
    Messages(Vec<Message>),
    /// A plain prompt, tokenized as `generate --prompt` does (BOS where the model asks for it).
    Text(String),
    Ids(Vec<u32>),
}

/// A checked generation request.
#[derive(Clone, Debug)]
pub struct Request {
    pub endpoint: Endpoint,
    pub model: String,
    pub input: Input,
    /// `max_completion_tokens` or `max_tokens`; `None`: up to the end of the context.
    pub max_tokens: Option<usize>,
    /// Which of the two the client sent (for error messages).
    pub max_tokens_param: &'static str,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage.
    pub include_usage: bool,
    /// Keep going past end-of-turn tokens (an extension, as in llama.cpp's server).
    pub ignore_eos: bool,
}

/// Most stop strings per request, and bytes per stop string.
const MAX_STOPS: usize = 16;
const MAX_STOP_BYTES: usize = 1024;

/// The fields of both endpoints; which are required or allowed is checked per endpoint.
#[derive(Deserialize)]
struct Body {
    model: Option<String>,
    messages: Option<Vec<ChatMessage>>,
    prompt: Option<Prompt>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    seed: Option<i64>,
    stop: Option<Stop>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    n: Option<u64>,
    logprobs: Option<Value>,
    tools: Option<Vec<Value>>,
    response_format: Option<ResponseFormat>,
    echo: Option<bool>,
    suffix: Option<String>,
    best_of: Option<u64>,
    ignore_eos: Option<bool>,
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    content: Option<Content>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
struct ResponseFormat {
    #[serde(rename = "type")]
    kind: String,
}

/// What a field that takes one of several shapes expects, for the error message.
fn expected_shape(path: &str) -> Option<&'static str> {
    let last = path.rsplit('.').next().unwrap_or(path);
    Some(match last {
        "stop" => "a string or a list of strings",
        "prompt" => "a string, a list of one string, a list of token ids or a list of one list of token ids",
        _ if last.starts_with("content") => "a string or a list of {\"type\": \"text\", \"text\": ...} parts",
        _ => return None,
    })
}

/// Parse the body of a request to `endpoint`.
pub fn parse(endpoint: Endpoint, bytes: &[u8]) -> Result<Request, ApiError> {
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::bad_json("the request body must be a JSON object"));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let body: Body = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if !inner.is_data() {
            ApiError::bad_json(format!("the request body is not valid JSON: {inner}"))
        } else if let Some(shape) = expected_shape(&path) {
            ApiError::invalid(path.clone(), format!("{path}: expected {shape}"))
        } else {
            ApiError::invalid(path.clone(), format!("{path}: {inner}"))
        }
    })?;
    de.end()
        .map_err(|e| ApiError::bad_json(format!("the request body is not valid JSON: {e}")))?;
    body.check(endpoint)
}

/// `value` within `range`, else a 400 naming `param`.
fn in_range(param: &str, value: Option<f32>, lo: f32, hi: f32) -> Result<Option<f32>, ApiError> {
    match value {
        Some(v) if !(v.is_finite() && (lo..=hi).contains(&v)) => Err(ApiError::invalid(
            param,
            format!("{param} must be between {lo} and {hi}, not {v}"),
        )),
        _ => Ok(value),
    }
}

/// Refuse a field that asks for something this server does not do.
fn unsupported(param: &str, asked: bool, why: &str) -> Result<(), ApiError> {
    if asked {
        return Err(ApiError::invalid(param, format!("{param}: {why}")));
    }
    Ok(())
}

/// A seed for requests without one: the clock, and a counter so that two requests in one tick differ.
fn fresh_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos
        ^ COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

impl Body {
    fn check(self, endpoint: Endpoint) -> Result<Request, ApiError> {
        let model = self
            .model
            .ok_or_else(|| ApiError::invalid("model", "model is required (see GET /v1/models)"))?;
        let misplaced = |field: &str, home: Endpoint| {
            let message = format!(
                "{field} is not a field of {} (it belongs to {})",
                endpoint.path(),
                home.path()
            );
            Err(ApiError::invalid(field, message))
        };
        let input = match (endpoint, self.messages, self.prompt) {
            (Endpoint::Chat, Some(messages), None) => Input::Messages(check_messages(messages)?),
            (Endpoint::Completion, None, Some(prompt)) => check_prompt(prompt)?,
            (Endpoint::Chat, _, Some(_)) => return misplaced("prompt", Endpoint::Completion),
            (Endpoint::Completion, Some(_), _) => return misplaced("messages", Endpoint::Chat),
            (Endpoint::Chat, None, None) => return Err(ApiError::invalid("messages", "messages is required")),
            (Endpoint::Completion, None, None) => return Err(ApiError::invalid("prompt", "prompt is required")),
        };
        let (param, max_tokens) = match (self.max_completion_tokens, self.max_tokens) {
            (Some(n), _) => ("max_completion_tokens", Some(n)),
            (None, n) => ("max_tokens", n),
        };
        if max_tokens == Some(0) {
            return Err(ApiError::invalid(param, format!("{param} must be at least 1")));
        }
        unsupported("n", self.n.is_some_and(|n| n != 1), "only n = 1 is supported")?;
        let logprobs = self
            .logprobs
            .as_ref()
            .is_some_and(|v| !(v.is_null() || v == &json!(false)));
        unsupported("logprobs", logprobs, "log probabilities are not supported")?;
        unsupported(
            "tools",
            self.tools.is_some_and(|t| !t.is_empty()),
            "tool calls are not supported",
        )?;
        let format = self.response_format.is_some_and(|f| f.kind != "text");
        unsupported("response_format", format, "only the \"text\" format is supported")?;
        unsupported("echo", self.echo == Some(true), "echoing the prompt is not supported")?;
        unsupported("suffix", self.suffix.is_some(), "insertion (suffix) is not supported")?;
        unsupported(
            "best_of",
            self.best_of.is_some_and(|n| n != 1),
            "only best_of = 1 is supported",
        )?;
        let defaults = SamplingParams::default();
        let sampling = SamplingParams {
            temperature: in_range("temperature", self.temperature, 0.0, 2.0)?.unwrap_or(defaults.temperature),
            top_p: in_range("top_p", self.top_p, 0.0, 1.0)?.unwrap_or(defaults.top_p),
            min_p: in_range("min_p", self.min_p, 0.0, 1.0)?.unwrap_or(defaults.min_p),
            top_k: self.top_k.map_or(defaults.top_k, |k| k.max(0) as usize),
            presence_penalty: in_range("presence_penalty", self.presence_penalty, -2.0, 2.0)?.unwrap_or(0.0),
            frequency_penalty: in_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)?.unwrap_or(0.0),
            repetition_penalty: 1.0,
            // OpenAI's penalties count every token generated so far.
            penalty_last_n: usize::MAX,
            seed: self.seed.map_or_else(fresh_seed, |s| s as u64),
        };
        let stop = match self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(list)) => list,
        };
        if stop.len() > MAX_STOPS {
            return Err(ApiError::invalid(
                "stop",
                format!("stop: at most {MAX_STOPS} stop strings"),
            ));
        }
        if let Some(bad) = stop.iter().find(|s| s.is_empty() || s.len() > MAX_STOP_BYTES) {
            return Err(ApiError::invalid(
                "stop",
                format!(
                    "stop: each stop string must have 1 to {MAX_STOP_BYTES} bytes, not {}",
                    bad.len()
                ),
            ));
        }
        Ok(Request {
            endpoint,
            model,
            input,
            max_tokens: max_tokens.map(|n| n.min(usize::MAX as u64) as usize),
            max_tokens_param: param,
            sampling,
            stop,
            stream: self.stream.unwrap_or(false),
            include_usage: self.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
            ignore_eos: self.ignore_eos.unwrap_or(false),
        })
    }
}

/// Chat messages with their content as one string; `developer` is OpenAI's newer name for `system`.
fn check_messages(messages: Vec<ChatMessage>) -> Result<Vec<Message>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.into_iter().enumerate() {
        let role = match m.role.as_str() {
            "developer" => "system",
            r @ ("system" | "user" | "assistant" | "tool") => r,
            other => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].role"),
                    format!("messages[{i}].role: unknown role {other:?} (system, developer, user, assistant or tool)"),
                ))
            }
        };
        let content = match m.content {
            None => String::new(),
            Some(Content::Text(t)) => t,
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for (j, p) in parts.into_iter().enumerate() {
                    match (p.kind.as_str(), p.text) {
                        ("text", Some(t)) => text.push_str(&t),
                        (kind, _) => {
                            return Err(ApiError::invalid(
                                format!("messages[{i}].content[{j}]"),
                                format!("messages[{i}].content[{j}]: only text parts with a \"text\" field are supported, not {kind:?}"),
                            ))
                        }
                    }
                }
                text
            }
        };
        out.push(Message::new(role, &content));
    }
    Ok(out)
}

/// One prompt: a batch of several is refused (n prompts would need n sessions for one request).
fn check_prompt(prompt: Prompt) -> Result<Input, ApiError> {
    let one = |n: usize| -> Result<(), ApiError> {
        if n != 1 {
            return Err(ApiError::invalid(
                "prompt",
                format!("prompt: exactly one prompt per request is supported, not {n}"),
            ));
        }
        Ok(())
    };
    Ok(match prompt {
        Prompt::Text(t) => Input::Text(t),
        Prompt::Texts(mut list) => {
            one(list.len())?;
            Input::Text(list.remove(0))
        }
        Prompt::Ids(ids) => Input::Ids(ids),
        Prompt::IdLists(mut lists) => {
            one(lists.len())?;
            Input::Ids(lists.remove(0))
        }
    })
}

/// A JSON response.
pub fn json_response(status: StatusCode, value: &Value) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], value.to_string()).into_response()
}

/// The identity of one response: its id, creation time and model, repeated in each stream chunk.
pub struct Reply {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Reply {
    pub fn new(endpoint: Endpoint, model: &str) -> Reply {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completion => "cmpl",
        };
        let created = unix_now();
        Reply {
            endpoint,
            id: format!("{prefix}-{created:x}{:06x}", NEXT.fetch_add(1, Ordering::Relaxed)),
            created,
            model: model.into(),
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }

    fn wrap(&self, chunk: bool, choices: Value, usage: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": Value::Null,
            "choices": choices,
            "usage": usage,
        })
    }

    /// The whole (non-streamed) completion.
    pub fn completion(&self, text: &str, finish: &Finish) -> Value {
        let reason = finish.reason.as_str();
        let choice = match self.endpoint {
            Endpoint::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": Value::Null,
                "finish_reason": reason,
            }),
            Endpoint::Completion => json!({
                "index": 0, "text": text, "logprobs": Value::Null, "finish_reason": reason,
            }),
        };
        self.wrap(false, json!([choice]), usage(finish))
    }

    /// A stream chunk: the assistant's role (chat, first chunk), a piece of text, or the finish reason.
    pub fn chunk(&self, role: bool, text: Option<&str>, finish: Option<FinishReason>) -> Value {
        let reason = finish.map(FinishReason::as_str);
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let mut delta = serde_json::Map::new();
                if role {
                    delta.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = text {
                    delta.insert("content".into(), json!(t));
                }
                json!({"index": 0, "delta": delta, "logprobs": Value::Null, "finish_reason": reason})
            }
            Endpoint::Completion => json!({
                "index": 0, "text": text.unwrap_or(""), "logprobs": Value::Null, "finish_reason": reason,
            }),
        };
        self.wrap(true, json!([choice]), Value::Null)
    }

    /// The last chunk of a stream with `include_usage`: no choices, the usage.
    pub fn usage_chunk(&self, finish: &Finish) -> Value {
        self.wrap(true, json!([]), usage(finish))
    }
}

fn usage(f: &Finish) -> Value {
    json!({
        "prompt_tokens": f.prompt_tokens,
        "completion_tokens": f.completion_tokens,
        "total_tokens": f.prompt_tokens + f.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": f.cached_tokens},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_chat(body: &str) -> Result<Request, ApiError> {
        parse(Endpoint::Chat, body.as_bytes())
    }

    #[test]
    fn a_full_chat_request_is_read_with_every_field() {
        let r = parse_chat(
            r#"{"model": "m", "messages": [{"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
                {"role": "user", "content": "hi"}], "max_completion_tokens": 7, "temperature": 0, "top_p": 0.5,
                "top_k": -1, "min_p": 0.1, "seed": -3, "stop": "END", "presence_penalty": 0.5,
                "frequency_penalty": -0.5, "stream": true, "stream_options": {"include_usage": true}, "n": 1,
                "logprobs": false, "user": "ignored"}"#,
        )
        .unwrap();
        let messages = vec![Message::new("system", "be brief"), Message::new("user", "hi")];
        assert_eq!(r.input, Input::Messages(messages));
        assert_eq!(r.max_tokens, Some(7));
        assert_eq!(r.sampling.temperature, 0.0);
        assert_eq!((r.sampling.top_p, r.sampling.top_k, r.sampling.min_p), (0.5, 0, 0.1));
        assert_eq!(r.sampling.seed, (-3i64) as u64);
        assert_eq!((r.sampling.presence_penalty, r.sampling.frequency_penalty), (0.5, -0.5));
        assert_eq!(r.stop, vec!["END".to_string()]);
        assert!(r.stream && r.include_usage && !r.ignore_eos);
    }

    #[test]
    fn wrong_fields_are_400s_that_name_the_field() {
        let cases = [
            (
                r#"{"model": "m", "messages": [{"role": "user", "content": 5}]}"#,
                "messages[0].content",
            ),
            (r#"{"model": "m", "messages": [], "temperature": "hot"}"#, "temperature"),
            (
                r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 3}"#,
                "temperature",
            ),
            (
                r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}"#,
                "max_tokens",
            ),
            (
                r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}"#,
                "max_tokens",
            ),
            (
                r#"{"model": "m", "messages": [{"role": "wizard", "content": "x"}]}"#,
                "messages[0].role",
            ),
            (
                r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": [1]}"#,
                "stop",
            ),
            (
                r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2}"#,
                "n",
            ),
            (r#"{"model": "m", "messages": []}"#, "messages"),
            (r#"{"messages": [{"role": "user", "content": "x"}]}"#, "model"),
            (r#"{"model": "m", "prompt": "x"}"#, "prompt"),
        ];
        for (body, param) in cases {
            let e = parse_chat(body).expect_err(body);
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
            assert!(e.message.contains(param), "{body}: {}", e.message);
        }
    }

    #[test]
    fn bodies_that_are_not_json_objects_are_400s() {
        for body in ["{", "[1, 2]", "", "{\"model\": \"m\"} trailing", "\"text\""] {
            let e = parse_chat(body).expect_err(body);
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(e.to_json()["error"]["type"], "invalid_request_error");
        }
    }

    #[test]
    fn completion_prompts_take_every_openai_shape() {
        let input = |p: &str| {
            parse(
                Endpoint::Completion,
                format!(r#"{{"model": "m", "prompt": {p}}}"#).as_bytes(),
            )
        };
        assert_eq!(input("\"a\"").unwrap().input, Input::Text("a".into()));
        assert_eq!(input("[\"a\"]").unwrap().input, Input::Text("a".into()));
        assert_eq!(input("[1, 2]").unwrap().input, Input::Ids(vec![1, 2]));
        assert_eq!(input("[[1, 2]]").unwrap().input, Input::Ids(vec![1, 2]));
        assert_eq!(input("[\"a\", \"b\"]").unwrap_err().param.as_deref(), Some("prompt"));
        assert_eq!(input("{}").unwrap_err().param.as_deref(), Some("prompt"));
    }
}
