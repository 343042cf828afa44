//! The server's counters and gauges (requests, tokens, sessions, queue depth, throughput), shared by the HTTP side
//! and the GPU worker, and their OpenMetrics text for `GET /metrics` (Prometheus scrapes it).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// The labels of a finished HTTP request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub endpoint: String,
    pub status: u16,
}

type FloatCounter = Counter<f64, AtomicU64>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// Every metric, cheap to update from any thread.
pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    /// Requests whose client went away before the end (their session was freed).
    pub cancelled: Counter,
    /// Prompt tokens of the jobs started, and how many of them a session already held (prefix reuse).
    pub prompt_tokens: Counter,
    pub cached_tokens: Counter,
    /// Prompt tokens run through the model, and the worker's time doing so.
    pub prefill_tokens: Counter,
    pub prefill_seconds: FloatCounter,
    /// Tokens generated, and the worker's time in decode steps.
    pub completion_tokens: Counter,
    pub decode_seconds: FloatCounter,
    /// Prompt-lookup drafts verified, and accepted (speculative decoding).
    pub drafted: Counter,
    pub accepted: Counter,
    /// Batched decode steps (several sessions' tokens as rows of one step), and the tokens they decoded.
    pub batch_steps: Counter,
    pub batched_tokens: Counter,
    pub queue_depth: Gauge,
    pub sessions_active: Gauge,
    /// Sessions (KV caches) allocated so far, at most `sessions_max`.
    pub sessions: Gauge,
    pub sessions_max: Gauge,
    prefill_rate: FloatGauge,
    decode_rate: FloatGauge,
}

impl Metrics {
    pub fn new(parallel: usize) -> Metrics {
        let mut registry = Registry::with_prefix("shaderlm");
        let m = Metrics {
            requests: Family::default(),
            cancelled: Counter::default(),
            prompt_tokens: Counter::default(),
            cached_tokens: Counter::default(),
            prefill_tokens: Counter::default(),
            prefill_seconds: FloatCounter::default(),
            completion_tokens: Counter::default(),
            decode_seconds: FloatCounter::default(),
            drafted: Counter::default(),
            accepted: Counter::default(),
            batch_steps: Counter::default(),
            batched_tokens: Counter::default(),
            queue_depth: Gauge::default(),
            sessions_active: Gauge::default(),
            sessions: Gauge::default(),
            sessions_max: Gauge::default(),
            prefill_rate: FloatGauge::default(),
            decode_rate: FloatGauge::default(),
            registry: Registry::default(),
        };
        m.sessions_max.set(parallel as i64);
        let r = &mut registry;
        r.register("requests", "HTTP requests by endpoint and status", m.requests.clone());
        r.register(
            "requests_cancelled",
            "Requests whose client disconnected before the end",
            m.cancelled.clone(),
        );
        r.register(
            "prompt_tokens",
            "Prompt tokens of the requests started",
            m.prompt_tokens.clone(),
        );
        r.register(
            "prompt_tokens_cached",
            "Prompt tokens a session already held (prefix reuse)",
            m.cached_tokens.clone(),
        );
        r.register(
            "prefill_tokens",
            "Prompt tokens run through the model",
            m.prefill_tokens.clone(),
        );
        r.register(
            "prefill_seconds",
            "Worker time in prefill steps",
            m.prefill_seconds.clone(),
        );
        r.register("completion_tokens", "Tokens generated", m.completion_tokens.clone());
        r.register(
            "decode_seconds",
            "Worker time in decode steps",
            m.decode_seconds.clone(),
        );
        r.register("spec_drafted", "Prompt-lookup drafts verified", m.drafted.clone());
        r.register("spec_accepted", "Prompt-lookup drafts accepted", m.accepted.clone());
        r.register(
            "batch_steps",
            "Decode steps that ran several sessions' tokens together",
            m.batch_steps.clone(),
        );
        r.register(
            "batched_tokens",
            "Tokens decoded in batched steps",
            m.batched_tokens.clone(),
        );
        r.register("queue_depth", "Requests waiting for a session", m.queue_depth.clone());
        r.register("sessions_active", "Sessions generating now", m.sessions_active.clone());
        r.register("sessions", "Sessions (KV caches) allocated", m.sessions.clone());
        r.register(
            "sessions_max",
            "Most sessions at once (--parallel)",
            m.sessions_max.clone(),
        );
        r.register(
            "prefill_tokens_per_second",
            "Prompt tokens per second of worker prefill time, all sessions together",
            m.prefill_rate.clone(),
        );
        r.register(
            "decode_tokens_per_second",
            "Generated tokens per second of worker decode time, all sessions together",
            m.decode_rate.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Count a finished HTTP request.
    pub fn count_request(&self, endpoint: &str, status: u16) {
        let labels = RequestLabels {
            endpoint: endpoint.into(),
            status,
        };
        self.requests.get_or_create(&labels).inc();
    }

    /// The OpenMetrics text, with the queue depth given and the rates computed now.
    pub fn render(&self, queue_depth: usize) -> String {
        self.queue_depth.set(queue_depth as i64);
        let rate = |tokens: &Counter, secs: &FloatCounter| tokens.get() as f64 / secs.get().max(1e-9);
        self.prefill_rate.set(rate(&self.prefill_tokens, &self.prefill_seconds));
        self.decode_rate
            .set(rate(&self.completion_tokens, &self.decode_seconds));
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}
