//! `shaderlm serve`: an OpenAI-compatible HTTP server (axum on tokio) in front of one GPU worker thread that owns
//! the model and its sessions. The async side parses and checks requests, tokenizes prompts and queues jobs; the
//! worker generates and sends text back through channels.

pub mod api;
pub mod decode;
pub mod error;
pub mod metrics;
mod routes;
pub mod worker;

use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::model::load::LoadedModel;
use crate::tokenizer::Tokenizer;
use metrics::Metrics;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// How the server listens and what it allows.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    pub host: String,
    /// 0 picks a free port.
    pub port: u16,
    /// When set, every request but `/health` needs `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// The model's id in requests and `/v1/models`.
    pub model_id: String,
    /// Most requests generating at once (one session and KV cache each).
    pub parallel: usize,
    /// Most requests waiting for a session; past that a request gets 503.
    pub queue: usize,
    /// Largest request body in bytes (413 past it).
    pub max_body: usize,
    /// Longest time one request may take, waiting included.
    pub timeout: Duration,
    /// Prompt tokens per prefill step.
    pub chunk: usize,
    /// Prompt-lookup drafts per step (speculative decoding, output unchanged); 0 decodes one token per step.
    pub lookup: usize,
}

/// The longest `--timeout`: a week.
const MAX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// What every handler shares.
pub struct AppState {
    pub opts: ServerOptions,
    jobs: mpsc::Sender<worker::Job>,
    tok: Arc<Tokenizer>,
    /// KV-cache positions of a session, and the model's vocabulary size.
    ctx: usize,
    vocab: usize,
    metrics: Arc<Metrics>,
    /// When the model was loaded (Unix seconds), for `/v1/models`.
    created: u64,
}

impl ServerOptions {
    /// Refuse options that cannot work (zero sessions, an empty key, limits past their bounds).
    pub fn check(&self) -> Result<()> {
        let positive = [
            ("--parallel", self.parallel),
            ("--queue", self.queue),
            ("--max-body", self.max_body),
            ("--chunk", self.chunk),
        ];
        if let Some((flag, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(Error::Invalid(format!("{flag} must be at least 1")));
        }
        // Bounds that keep the channel and deadline arithmetic finite.
        let bounded = [("--parallel", self.parallel, 1 << 10), ("--queue", self.queue, 1 << 20)];
        if let Some((flag, v, max)) = bounded.iter().find(|(_, v, max)| v > max) {
            return Err(Error::Invalid(format!("{flag} {v} is over the limit of {max}")));
        }
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT {
            return Err(Error::Invalid(format!(
                "--timeout must be from 1 to {} seconds",
                MAX_TIMEOUT.as_secs()
            )));
        }
        if self.lookup > crate::generate::spec::MAX_DRAFT {
            return Err(Error::Invalid(format!(
                "--spec-lookup {} is over the limit of {}",
                self.lookup,
                crate::generate::spec::MAX_DRAFT
            )));
        }
        if self.model_id.is_empty() {
            return Err(Error::Invalid("--model-id must not be empty".into()));
        }
        if self.api_key.as_deref() == Some("") {
            return Err(Error::Invalid("--api-key must not be empty".into()));
        }
        Ok(())
    }
}

/// Serve `loaded` on `gpu` until Ctrl-C. `on_listen` gets the bound address once requests are accepted.
pub fn run(gpu: Gpu, loaded: LoadedModel, opts: ServerOptions, on_listen: impl FnOnce(SocketAddr)) -> Result<()> {
    opts.check()?;
    let LoadedModel {
        model, tokenizer, ctx, ..
    } = loaded;
    let tok = Arc::new(tokenizer);
    let metrics = Arc::new(Metrics::new(opts.parallel));
    let vocab = model.cfg.vocab;
    let worker_opts = worker::WorkerOptions {
        parallel: opts.parallel,
        queue: opts.queue,
        ctx,
        chunk: opts.chunk,
        lookup: opts.lookup,
    };
    let jobs = worker::spawn(gpu, model, tok.clone(), worker_opts, metrics.clone())?;
    let io = |what: &str, e: std::io::Error| Error::Invalid(format!("{what}: {e}"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| io("starting the async runtime", e))?;
    let state = Arc::new(AppState {
        opts,
        jobs,
        tok,
        ctx,
        vocab,
        metrics,
        created: api::unix_now(),
    });
    runtime.block_on(async move {
        let (host, port) = (state.opts.host.as_str(), state.opts.port);
        let listener = tokio::net::TcpListener::bind((host, port))
            .await
            .map_err(|e| io(&format!("listening on {host} port {port} (--host, --port)"), e))?;
        let bound = listener.local_addr().map_err(|e| io("the bound address", e))?;
        if !bound.ip().is_loopback() && state.opts.api_key.is_none() {
            log::warn!("listening on {bound}, beyond loopback, without --api-key: anyone who reaches it can use it");
        }
        on_listen(bound);
        let app = routes::router(state);
        tokio::select! {
            served = axum::serve(listener, app) => served.map_err(|e| io("serving", e)),
            _ = tokio::signal::ctrl_c() => Ok(()),
        }
    })
}
