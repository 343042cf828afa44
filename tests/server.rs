//! `shaderlm serve` end to end: the binary on an ephemeral loopback port with a tiny chat model, driven over HTTP.
//! Greedy answers equal `shaderlm generate` on the same messages (whole, streamed, with stop strings, and after a
//! cached prefix); bad requests get OpenAI error bodies with the right status and bad flags a clear error; the API
//! key is enforced; a client that disconnects mid-stream, or a request past the timeout, frees its session; 32
//! concurrent streams on 4 sessions each get their text alone.

mod common;

use common::tiny::{write_gguf, write_gguf_chat, Tiny};
use serde_json::{json, Value};
use shaderlm::loader::gguf::{GgufFile, Value as GgufValue};
use shaderlm::loader::gguf_write::GgufWriter;
use shaderlm::quant::GgmlType;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A tiny chat model: the byte vocabulary and ChatML template of the CLI tests' model, with an LM head of its
/// own (a tied head makes a random tiny model repeat its last token, too weak a test of equal texts) and a
/// trained context of 16384 positions (a long generation outlives a disconnect or a timeout; the server's
/// sessions hold `--ctx`, 4096 by default), as `MODEL_ID` in `dir`.
fn tiny_chat_model(dir: &Path) -> PathBuf {
    let chat = dir.join("chat.gguf");
    let vocab = write_gguf_chat(&chat, SEED, GgmlType::F32).vocab;
    let untied = dir.join("untied.gguf");
    write_gguf(
        &untied,
        &Tiny {
            vocab,
            tied: false,
            ..Tiny::llama()
        },
        SEED,
        GgmlType::F32,
    );
    let (chat, untied) = (GgufFile::open(&chat).unwrap(), GgufFile::open(&untied).unwrap());
    let mut w = GgufWriter::new();
    for (key, value) in chat.metadata_entries() {
        let value = match key {
            "llama.context_length" => GgufValue::U32(16384),
            _ => value.clone(),
        };
        w.add_metadata(key, value).unwrap();
    }
    for t in untied.tensors() {
        let bytes = untied.tensor_data(t).unwrap().to_vec();
        w.add_tensor_bytes(t.name.clone(), &t.shape(), t.ggml_type, bytes)
            .unwrap();
    }
    let path = dir.join(format!("{MODEL_ID}.gguf"));
    w.write(&path).unwrap();
    path
}

/// Its weights' seed: one whose greedy answer to "hello world" runs 16 tokens, some of them whole ASCII.
const SEED: u64 = 6;
const MODEL_ID: &str = "tiny-chat";

/// A running `shaderlm serve`, killed when dropped; its stderr (the request log) is collected.
struct Server {
    child: Child,
    base: String,
    log: Arc<Mutex<Vec<String>>>,
    agent: ureq::Agent,
}

impl Server {
    fn start(model: &Path, flags: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_shaderlm"))
            .args(["serve", "-m", model.to_str().unwrap(), "--port", "0"])
            .args(flags)
            .env_remove("SHADERLM_MODEL")
            .env_remove("SHADERLM_API_KEY")
            .env("RUST_LOG", "warn,shaderlm=info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run shaderlm serve");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let lines = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or_default().to_string());
                }
                lines.lock().unwrap().push(line);
            }
        });
        let addr = rx.recv_timeout(Duration::from_secs(120)).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!(
                "shaderlm serve did not start (the tests need an adapter; lavapipe counts):\n{}",
                log.lock().unwrap().join("\n")
            )
        });
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .build();
        Server {
            child,
            base: format!("http://{addr}"),
            log,
            agent: config.into(),
        }
    }

    fn post_raw(&self, path: &str, body: &str, key: Option<&str>) -> (u16, String) {
        let mut req = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("Content-Type", "application/json");
        if let Some(k) = key {
            req = req.header("Authorization", format!("Bearer {k}"));
        }
        let mut resp = req.send(body).expect("POST");
        let status = resp.status().as_u16();
        (status, resp.body_mut().read_to_string().expect("body"))
    }

    /// POST a JSON body; the status and the JSON answer.
    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_key(path, body, None)
    }

    fn post_key(&self, path: &str, body: &Value, key: Option<&str>) -> (u16, Value) {
        let (status, text) = self.post_raw(path, &body.to_string(), key);
        let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text}"));
        (status, value)
    }

    fn get(&self, path: &str, key: Option<&str>) -> (u16, String) {
        let mut req = self.agent.get(format!("{}{path}", self.base));
        if let Some(k) = key {
            req = req.header("Authorization", format!("Bearer {k}"));
        }
        let mut resp = req.call().expect("GET");
        let status = resp.status().as_u16();
        (status, resp.body_mut().read_to_string().expect("body"))
    }

    /// Open a stream: the reader of its `data:` payloads, once the response head has arrived.
    fn open_stream(&self, path: &str, body: &Value, key: Option<&str>) -> SseReader {
        let mut req = self.agent.post(format!("{}{path}", self.base));
        if let Some(k) = key {
            req = req.header("Authorization", format!("Bearer {k}"));
        }
        let resp = req.send(body.to_string()).expect("POST stream");
        assert_eq!(resp.status().as_u16(), 200, "stream {body}");
        let reader: Box<dyn Read + Send> = Box::new(resp.into_body().into_reader());
        SseReader(BufReader::new(reader))
    }

    /// A metric's value in `/metrics` (the first sample whose line starts with `name`).
    fn metric(&self, key: Option<&str>, name: &str) -> f64 {
        let (status, text) = self.get("/metrics", key);
        assert_eq!(status, 200, "{text}");
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
    }

    fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// The server's log once it holds `needle` (its lines arrive through a reader thread, and a request's last
    /// line may come after the metrics that count it), or as it is after `timeout`.
    fn log_with(&self, needle: &str, timeout: Duration) -> String {
        let t0 = Instant::now();
        loop {
            let log = self.log_text();
            if log.contains(needle) || t0.elapsed() > timeout {
                return log;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `data:` payloads of a server-sent event stream.
struct SseReader(BufReader<Box<dyn Read + Send>>);

impl SseReader {
    /// The next payload, `None` at the end of the stream.
    fn next_data(&mut self) -> Option<String> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.0.read_line(&mut line).expect("read stream") == 0 {
                return None;
            }
            if let Some(data) = line.trim_end().strip_prefix("data: ") {
                return Some(data.to_string());
            }
        }
    }

    /// Every chunk up to `[DONE]` (which must come).
    fn chunks(mut self) -> Vec<Value> {
        let mut out = Vec::new();
        loop {
            let data = self.next_data().expect("the stream ended without data: [DONE]");
            if data == "[DONE]" {
                assert_eq!(self.next_data(), None, "data after [DONE]");
                return out;
            }
            out.push(serde_json::from_str(&data).unwrap_or_else(|e| panic!("chunk not JSON ({e}): {data}")));
        }
    }
}

/// The text of streamed chunks (chat deltas or completion texts), their one finish reason and the usage chunk.
fn streamed(chunks: &[Value]) -> (String, String, Option<Value>) {
    let mut text = String::new();
    let mut finish = Vec::new();
    let mut usage = None;
    for c in chunks {
        let choices = c["choices"].as_array().unwrap();
        if choices.is_empty() {
            usage = Some(c["usage"].clone());
            continue;
        }
        let choice = &choices[0];
        let piece = choice["delta"]["content"].as_str().or(choice["text"].as_str());
        text.push_str(piece.unwrap_or(""));
        if let Some(r) = choice["finish_reason"].as_str() {
            finish.push(r.to_string());
        }
    }
    assert_eq!(finish.len(), 1, "one chunk carries the finish reason: {chunks:?}");
    (text, finish.remove(0), usage)
}

/// What `shaderlm generate ... --json --temp 0` produced.
struct Greedy {
    prompt: Vec<u32>,
    generated: Vec<u32>,
    text: String,
    /// The OpenAI finish reason of its "stopped by".
    finish: &'static str,
}

fn cli_greedy(model: &Path, args: &[&str]) -> Greedy {
    let out = common::cli::run_within(
        &[
            &["generate", "-m", model.to_str().unwrap(), "--temp", "0", "--json"],
            args,
        ]
        .concat(),
        model.parent().unwrap(),
        120,
    )
    .expect("shaderlm generate ran past 120 s");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids = |k: &str| serde_json::from_value::<Vec<u32>>(v[k].clone()).unwrap();
    let finish = match stderr.split("stopped by ").nth(1) {
        Some(r) if r.starts_with("max tokens") => "length",
        Some(r) if r.starts_with("end of turn") => "stop",
        _ => panic!("unexpected end of generate: {stderr}"),
    };
    Greedy {
        prompt: ids("prompt_ids"),
        generated: ids("generated_ids"),
        text: v["text"].as_str().unwrap().to_string(),
        finish,
    }
}

fn chat_body(messages: Value, max_tokens: usize) -> Value {
    json!({"model": MODEL_ID, "messages": messages, "max_tokens": max_tokens, "temperature": 0})
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

fn assert_error(status: u16, body: &Value, want_status: u16, param: Option<&str>, what: &str) {
    assert_eq!(status, want_status, "{what}: {body}");
    let e = &body["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: {body}");
    assert!(e["type"].is_string() && e.get("code").is_some(), "{what}: {body}");
    if let Some(p) = param {
        assert_eq!(e["param"], p, "{what}: {body}");
    }
}

#[test]
fn greedy_answers_equal_generate_whole_streamed_and_cut_at_stop_strings() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_chat_model(dir.path());
    let server = Server::start(&model, &[]);

    // Chat: the same ids and text as `generate --chat`.
    let want = cli_greedy(&model, &["--chat", "--prompt", "hello world", "-n", "16"]);
    let (prompt, generated, text) = (&want.prompt, &want.generated, want.text.as_str());
    assert!(
        text.chars().count() >= 4,
        "the tiny model says too little for this prompt: {text:?}"
    );
    let (status, v) = server.post("/v1/chat/completions", &chat_body(user("hello world"), 16));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], MODEL_ID);
    let choice = &v["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], text);
    assert_eq!(choice["finish_reason"], want.finish);
    assert_eq!(v["usage"]["prompt_tokens"], prompt.len());
    assert_eq!(v["usage"]["completion_tokens"], generated.len());
    assert_eq!(v["usage"]["total_tokens"], prompt.len() + generated.len());

    // Streamed: a role chunk, the same text in pieces, one finish reason, the usage, [DONE].
    let mut body = chat_body(user("hello world"), 16);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let chunks = server.open_stream("/v1/chat/completions", &body, None).chunks();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk" && c["id"] == chunks[0]["id"]));
    let (streamed_text, finish, usage) = streamed(&chunks);
    assert_eq!(streamed_text, text);
    assert_eq!(finish, want.finish);
    let usage = usage.expect("include_usage: a usage chunk");
    assert_eq!(usage["prompt_tokens"], prompt.len());
    assert_eq!(usage["completion_tokens"], generated.len());

    // A stop string from the middle of the answer cuts it there, whole and streamed alike.
    let stop: String = text.chars().skip(2).take(2).collect();
    let cut = &text[..text.find(&stop).unwrap()];
    let mut body = chat_body(user("hello world"), 16);
    body["stop"] = json!([stop, "never appears"]);
    let (_, v) = server.post("/v1/chat/completions", &body);
    assert_eq!(v["choices"][0]["message"]["content"], cut, "stop {stop:?}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    body["stream"] = json!(true);
    let (streamed_text, finish, _) = streamed(&server.open_stream("/v1/chat/completions", &body, None).chunks());
    assert_eq!((streamed_text.as_str(), finish.as_str()), (cut, "stop"));

    // Text completions: a plain prompt as `generate --prompt`, and the same prompt as token ids.
    let want = cli_greedy(&model, &["--prompt", "hello world", "-n", "12", "--ignore-eos"]);
    let (prompt, generated, text) = (&want.prompt, &want.generated, want.text.as_str());
    let body =
        json!({"model": MODEL_ID, "prompt": "hello world", "max_tokens": 12, "temperature": 0, "ignore_eos": true});
    let (status, v) = server.post("/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], text);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], generated.len());
    let mut by_ids = body.clone();
    by_ids["prompt"] = json!(prompt);
    by_ids["stream"] = json!(true);
    let (streamed_text, finish, _) = streamed(&server.open_stream("/v1/completions", &by_ids, None).chunks());
    assert_eq!((streamed_text.as_str(), finish.as_str()), (text, "length"));

    // Sampling with a seed repeats itself.
    let body = json!({"model": MODEL_ID, "messages": user("hi"), "max_tokens": 12, "temperature": 1.0,
                      "top_k": 0, "top_p": 1.0, "min_p": 0, "seed": 42, "frequency_penalty": 0.5});
    let (_, a) = server.post("/v1/chat/completions", &body);
    let (_, b) = server.post("/v1/chat/completions", &body);
    assert_eq!(
        a["choices"][0]["message"], b["choices"][0]["message"],
        "same seed, different text"
    );

    // One log line per generation, with its tokens and speeds.
    let log = server.log_with("POST /v1/chat/completions (stream) 200", Duration::from_secs(30));
    assert!(
        log.contains("POST /v1/chat/completions (stream) 200") && log.contains("generated at"),
        "{log}"
    );
}

#[test]
fn bad_requests_get_openai_errors_and_do_not_disturb_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_chat_model(dir.path());
    let server = Server::start(&model, &["--ctx", "64", "--max-body", "16384"]);
    let chat = "/v1/chat/completions";
    let ok = chat_body(user("hello world"), 4);

    let (status, text) = server.post_raw(chat, "{\"model\": ", None);
    assert_error(
        status,
        &serde_json::from_str(&text).unwrap(),
        400,
        None,
        "truncated JSON",
    );
    let (status, text) = server.post_raw(chat, "[1, 2]", None);
    assert_error(
        status,
        &serde_json::from_str(&text).unwrap(),
        400,
        None,
        "not an object",
    );
    let with = |field: &str, value: Value| {
        let mut b = ok.clone();
        b[field] = value;
        server.post(chat, &b)
    };
    let (s, v) = with("temperature", json!("warm"));
    assert_error(s, &v, 400, Some("temperature"), "a string temperature");
    let (s, v) = with("messages", json!([{"role": "user", "content": 7}]));
    assert_error(s, &v, 400, Some("messages[0].content"), "a number as content");
    let (s, v) = with("top_p", json!(1.5));
    assert_error(s, &v, 400, Some("top_p"), "top_p past 1");
    let (s, v) = with("max_tokens", json!(0));
    assert_error(s, &v, 400, Some("max_tokens"), "max_tokens 0");
    let (s, v) = with("n", json!(3));
    assert_error(s, &v, 400, Some("n"), "n = 3");
    let (s, v) = with("model", json!("gpt-4o"));
    assert_error(s, &v, 404, Some("model"), "an unknown model");
    assert_eq!(v["error"]["code"], "model_not_found");
    let (s, v) = server.post(chat, &json!({"model": MODEL_ID}));
    assert_error(s, &v, 400, Some("messages"), "no messages");

    // Over the body limit: 413.
    let (s, v) = with("messages", user(&"x".repeat(40_000)));
    assert_error(s, &v, 413, None, "a 40 kB body over --max-body 16384");

    // Past the context of 64: the prompt alone, then the prompt with max_tokens.
    let (s, v) = with("messages", user(&"the quick brown fox ".repeat(5)));
    assert_error(s, &v, 400, Some("messages"), "a prompt past the context");
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    let (s, v) = with("max_tokens", json!(60));
    assert_error(s, &v, 400, Some("max_tokens"), "max_tokens past the context");
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    let (s, v) = server.post("/v1/completions", &json!({"model": MODEL_ID, "prompt": [5, 100000]}));
    assert_error(s, &v, 400, Some("prompt"), "a token id outside the vocabulary");

    // Unknown endpoints and methods.
    let (s, text) = server.get("/v1/embeddings", None);
    assert_error(
        s,
        &serde_json::from_str(&text).unwrap(),
        404,
        None,
        "an unknown endpoint",
    );
    let (s, text) = server.get(chat, None);
    assert_error(
        s,
        &serde_json::from_str(&text).unwrap(),
        405,
        None,
        "GET on a POST endpoint",
    );

    // The server still answers, and counted all of it.
    let (status, v) = server.post(chat, &ok);
    assert_eq!(status, 200, "{v}");
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() >= 1);
    let (status, text) = server.get("/health", None);
    assert_eq!((status, text.as_str()), (200, "{\"status\":\"ok\"}"));
    let (_, text) = server.get("/v1/models", None);
    let models: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(models["data"][0]["id"], MODEL_ID);
    let count = |status: &str| {
        server.metric(
            None,
            &format!("shaderlm_requests_total{{endpoint=\"{chat}\",status=\"{status}\"}}"),
        )
    };
    assert_eq!(
        (count("400"), count("404"), count("405"), count("413"), count("200")),
        (10.0, 1.0, 1.0, 1.0, 1.0)
    );
    let log = server.log_with("over the server's limit", Duration::from_secs(30));
    assert!(log.contains("413") && log.contains("over the server's limit"), "{log}");
}

#[test]
fn sessions_reuse_prefixes_queue_and_free_on_disconnect_behind_an_api_key() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_chat_model(dir.path());
    let key = Some("sk-local-test");
    let server = Server::start(
        &model,
        &["--parallel", "1", "--queue", "1", "--api-key", "sk-local-test"],
    );
    let chat = "/v1/chat/completions";

    // The key: /health is open, everything else needs it.
    assert_eq!(server.get("/health", None).0, 200);
    for wrong in [None, Some("sk-wrong"), Some("sk-local-test2")] {
        let (s, v) = server.post_key(chat, &chat_body(user("hi"), 2), wrong);
        assert_error(s, &v, 401, None, &format!("key {wrong:?}"));
        assert_eq!(v["error"]["code"], "invalid_api_key");
        assert_eq!(server.get("/v1/models", wrong).0, 401);
    }
    assert_eq!(server.get("/v1/models", key).0, 200);

    // A second turn reuses the first turn's cache (its prompt and the answer's tokens but the last) and answers
    // like a fresh `generate` over the whole conversation.
    let turn1 = cli_greedy(&model, &["--chat", "--prompt", "hello world", "-n", "8"]);
    let (prompt1, generated1, text1) = (&turn1.prompt, &turn1.generated, turn1.text.as_str());
    let (status, v) = server.post_key(chat, &chat_body(user("hello world"), 8), key);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], text1);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let conversation = json!([
        {"role": "user", "content": "hello world"},
        {"role": "assistant", "content": text1},
        {"role": "user", "content": "and then?"},
    ]);
    let file = dir.path().join("conversation.json");
    std::fs::write(&file, conversation.to_string()).unwrap();
    let turn2 = cli_greedy(&model, &["--messages", file.to_str().unwrap(), "-n", "8"]);
    let (prompt2, text2) = (&turn2.prompt, turn2.text.as_str());
    let held = [&prompt1[..], &generated1[..generated1.len() - 1]].concat();
    let shared = held.iter().zip(prompt2).take_while(|(a, b)| a == b).count();
    assert!(
        shared > prompt1.len() / 2,
        "the turns share little: {held:?} / {prompt2:?}"
    );
    let (_, v) = server.post_key(chat, &chat_body(conversation, 8), key);
    assert_eq!(v["choices"][0]["message"]["content"], text2);
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"],
        shared.min(prompt2.len() - 1)
    );
    assert_eq!(v["usage"]["prompt_tokens"], prompt2.len());

    // One session, a queue of one: a long stream holds the session, a second waits, a third is refused.
    let long = json!({"model": MODEL_ID, "messages": user("tell me everything"), "max_tokens": 3000,
                      "temperature": 0, "ignore_eos": true, "stream": true});
    let mut first = server.open_stream(chat, &long, key);
    let role = first.next_data().unwrap();
    assert!(role.contains("\"role\":\"assistant\""), "{role}");
    let piece = first.next_data().unwrap();
    assert!(
        piece.contains("\"content\""),
        "the long stream has started generating: {piece}"
    );
    let mut short = chat_body(user("hi"), 3);
    short["stream"] = json!(true);
    let waiting = server.open_stream(chat, &short, key);
    let (s, v) = server.post_key(chat, &chat_body(user("hi"), 3), key);
    assert_error(
        s,
        &v,
        503,
        None,
        "a third request with the session busy and the queue full",
    );
    assert_eq!(v["error"]["code"], "server_busy");

    // The long stream's client leaves: its session goes to the waiting request, long before 3000 tokens.
    drop(first);
    let (_, finish, _) = streamed(&waiting.chunks());
    assert!(finish == "stop" || finish == "length");
    let t0 = Instant::now();
    while server.metric(key, "shaderlm_sessions_active") != 0.0 && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(server.metric(key, "shaderlm_requests_cancelled_total"), 1.0);
    assert_eq!(server.metric(key, "shaderlm_sessions_active"), 0.0);
    assert_eq!(server.metric(key, "shaderlm_sessions"), 1.0);
    let generated = server.metric(key, "shaderlm_completion_tokens_total");
    assert!(
        generated < 1000.0,
        "the disconnected stream kept generating: {generated} tokens"
    );
    let log = server.log_with("the client disconnected", Duration::from_secs(30));
    assert!(log.contains("the client disconnected"), "{log}");
}

#[test]
fn a_request_past_the_timeout_gets_504_and_frees_its_session() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_chat_model(dir.path());
    let server = Server::start(&model, &["--timeout", "1", "--parallel", "1", "--ctx", "16384"]);
    let chat = "/v1/chat/completions";
    // 16000 tokens take well over a second on any device (one submission and read-back per token).
    let mut long = json!({"model": MODEL_ID, "messages": user("go on"), "max_tokens": 16000, "temperature": 0,
                          "ignore_eos": true});
    let (s, v) = server.post(chat, &long);
    assert_error(s, &v, 504, None, "a whole completion past --timeout 1");
    assert_eq!(v["error"]["code"], "timeout");

    // Streamed: text, then an error event instead of a finish reason, and no [DONE].
    long["stream"] = json!(true);
    let mut stream = server.open_stream(chat, &long, None);
    let mut payloads = Vec::new();
    while let Some(data) = stream.next_data() {
        payloads.push(data);
    }
    let last: Value = serde_json::from_str(payloads.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "timeout", "{last}");
    assert!(payloads.len() > 2 && !payloads.contains(&"[DONE]".to_string()));

    // Both sessions' jobs were dropped: the one session serves the next request.
    let (status, v) = server.post(chat, &chat_body(user("hi"), 4));
    assert_eq!(status, 200, "{v}");
    assert_eq!(server.metric(None, "shaderlm_requests_cancelled_total"), 2.0);
    assert_eq!(server.metric(None, "shaderlm_sessions"), 1.0);
}

#[test]
fn bad_flags_are_refused_before_the_model_loads() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 6] = [
        (&["--parallel", "0"], "--parallel must be at least 1"),
        (&["--queue", "99999999999"], "--queue 99999999999 is over the limit"),
        (&["--timeout", "0"], "--timeout must be from 1"),
        (&["--timeout", "18446744073709551615"], "--timeout must be from 1"),
        (&["--api-key="], "--api-key must not be empty"),
        (&["--max-body", "0"], "--max-body must be at least 1"),
    ];
    for (flags, message) in cases {
        let args = [&["serve", "-m", "missing.gguf"], flags].concat();
        let out = common::cli::run_within(&args, dir.path(), 60).expect("serve with a bad flag hung");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(message), "{flags:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("missing.gguf"),
            "{flags:?}: {err}"
        );
    }
}

/// Bounded load: 32 concurrent streams on 4 sessions; each gets the text it got alone (its tokens decoded as rows
/// of batched steps), none is lost, and no more than 4 sessions are ever allocated. Prints requests/s and aggregate tokens/s against one session at a time.
#[test]
fn thirty_two_concurrent_streams_on_four_sessions_each_get_their_text_alone() {
    const N: usize = 32;
    const TOKENS: usize = 12;
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_chat_model(dir.path());
    let server = Arc::new(Server::start(&model, &["--parallel", "4"]));
    let body = |i: usize| {
        json!({"model": MODEL_ID, "messages": user(&format!("request {i}: hello")), "max_tokens": TOKENS,
               "temperature": 0, "ignore_eos": true, "stream": true})
    };
    let t0 = Instant::now();
    let alone: Vec<String> = (0..N)
        .map(|i| streamed(&server.open_stream("/v1/chat/completions", &body(i), None).chunks()).0)
        .collect();
    let sequential = t0.elapsed();
    let t1 = Instant::now();
    let threads: Vec<_> = (0..N)
        .map(|i| {
            let (server, body) = (server.clone(), body(i));
            std::thread::spawn(move || {
                let chunks = server.open_stream("/v1/chat/completions", &body, None).chunks();
                streamed(&chunks).0
            })
        })
        .collect();
    let together: Vec<String> = threads
        .into_iter()
        .map(|t| t.join().expect("a client thread"))
        .collect();
    let concurrent = t1.elapsed();
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a, b, "request {i}: concurrent text differs from its text alone");
    }
    assert!(alone.iter().all(|t| !t.is_empty()));
    let count = server.metric(
        None,
        "shaderlm_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"}",
    );
    assert_eq!(count, 2.0 * N as f64);
    assert_eq!(server.metric(None, "shaderlm_sessions"), 4.0);
    assert_eq!(server.metric(None, "shaderlm_queue_depth"), 0.0);
    assert_eq!(
        server.metric(None, "shaderlm_completion_tokens_total"),
        (2 * N * TOKENS) as f64
    );
    // The concurrent streams decoded as rows of batched steps (the texts above equal the ones alone).
    let steps = server.metric(None, "shaderlm_batch_steps_total");
    let rows = server.metric(None, "shaderlm_batched_tokens_total");
    let tokens = (N * TOKENS) as f64;
    assert!(
        rows >= 0.5 * tokens && rows >= 3.0 * steps,
        "{steps} batched steps of {rows} tokens, for {tokens} tokens decoded concurrently"
    );
    println!("batched: {steps} steps, {:.2} tokens per step", rows / steps);
    println!(
        "{N} requests of {TOKENS} tokens: one at a time {:.2} s ({:.1} req/s, {:.1} tok/s); 32 at once on 4 sessions \
         {:.2} s ({:.1} req/s, {:.1} tok/s)",
        sequential.as_secs_f64(),
        N as f64 / sequential.as_secs_f64(),
        tokens / sequential.as_secs_f64(),
        concurrent.as_secs_f64(),
        N as f64 / concurrent.as_secs_f64(),
        tokens / concurrent.as_secs_f64()
    );
}

/// `--spec-lookup 3`: decode steps verify prompt-lookup drafts, and the answers are still `generate`'s, whole and
/// streamed, greedy (SmolLM2 asked to repeat a text, so drafts are accepted) and seeded.
#[test]
fn prompt_lookup_speculation_keeps_the_answers() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        model.exists(),
        "this test needs the default model: run `bash models/fetch.sh`"
    );
    let server = Server::start(&model, &["--spec-lookup", "3", "--ctx", "512"]);
    let prompt =
        "Repeat exactly: the quick brown fox jumps over the lazy dog, the quick brown fox jumps over the lazy dog.";
    let want = cli_greedy(&model, &["--chat", "--prompt", prompt, "-n", "40", "--ctx", "512"]);
    let model_id = "SmolLM2-135M-Instruct.Q4_1";
    let body = json!({"model": model_id, "messages": user(prompt), "max_tokens": 40, "temperature": 0});
    let (status, v) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], want.text.as_str());
    assert_eq!(v["usage"]["completion_tokens"], want.generated.len());
    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let (text, finish, _) = streamed(&server.open_stream("/v1/chat/completions", &streaming, None).chunks());
    assert_eq!((text.as_str(), finish.as_str()), (want.text.as_str(), want.finish));
    let (drafted, accepted) = (
        server.metric(None, "shaderlm_spec_drafted_total"),
        server.metric(None, "shaderlm_spec_accepted_total"),
    );
    assert!(
        accepted > 0.0 && accepted <= drafted,
        "drafted {drafted}, accepted {accepted}"
    );
    // Seeded sampling: the same seed gives the same answer with or without speculation.
    let plain = Server::start(&model, &["--ctx", "512"]);
    let mut seeded = body.clone();
    seeded["temperature"] = json!(0.8);
    seeded["seed"] = json!(5);
    let (a, b) = (
        server.post("/v1/chat/completions", &seeded).1,
        plain.post("/v1/chat/completions", &seeded).1,
    );
    assert_eq!(
        a["choices"][0]["message"]["content"],
        b["choices"][0]["message"]["content"]
    );
}
