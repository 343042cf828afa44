//! The GPU worker: one thread owns the device, the model and up to `parallel` sessions (each a `Generator` with its
//! own KV cache over the shared weights). It takes jobs from a bounded queue, gives each the idle session whose
//! cached tokens share the longest prefix with its prompt (only the rest is prefilled), and advances the active
//! sessions in turn, one prefill chunk or one decoded token each, so that several streams progress together.
//! A job whose receiver is gone (the client disconnected) is dropped before its session's next step.
//!
//! The sessions that decode a token in the same turn run as rows of one batched step when the model allows it
//! ([`Llama::can_batch`]): the weights are read once for all of them, and each row equals that session's own
//! one-token step bit for bit, so a request gets the same text batched or alone. With `lookup` > 0 a session's
//! decode step is a speculative verification of prompt-lookup drafts when there are any (lossless: the text is the
//! same), run on its own, so one turn may produce several tokens.

use super::decode::{Decoding, FinishReason, Next, StopRules};
use super::error::ApiError;
use super::metrics::Metrics;
use crate::error::{Error, Result};
use crate::generate::batch::Batch;
use crate::generate::draft::{Drafter, Lookup};
use crate::generate::{Generator, StepResult};
use crate::gpu::Gpu;
use crate::model::llama::MAX_BATCH;
use crate::model::{Llama, StepOutputs};
use crate::sampling::SamplingParams;
use crate::tokenizer::Tokenizer;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// One request for the worker.
pub struct Job {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    pub rules: StopRules,
    /// Where the text and the end go; dropped by the HTTP side when the client leaves.
    pub events: mpsc::UnboundedSender<Event>,
    pub received: Instant,
}

/// What the worker tells the HTTP side about a job.
#[derive(Debug)]
pub enum Event {
    /// Text to append to the completion.
    Text(String),
    Done(Finish),
    Failed(ApiError),
}

/// How a job ended, with its counts and timings.
#[derive(Clone, Debug)]
pub struct Finish {
    pub reason: FinishReason,
    pub prompt_tokens: usize,
    /// Prompt tokens the session already held (prefix reuse); the rest were prefilled.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// Waiting for a session; from the session to the last prompt token's step; from there to the end.
    pub queued: Duration,
    pub prefill: Duration,
    pub decode: Duration,
}

/// Settings of the worker.
#[derive(Clone, Copy, Debug)]
pub struct WorkerOptions {
    /// Most sessions at once.
    pub parallel: usize,
    /// Jobs that may wait for a session beyond those.
    pub queue: usize,
    /// KV-cache positions of each session.
    pub ctx: usize,
    /// Prompt tokens per prefill step.
    pub chunk: usize,
    /// Prompt-lookup drafts per step; 0: one token per step.
    pub lookup: usize,
}

/// Start the worker thread on `gpu` and `model`; returns the queue's sending end once the first session is
/// allocated and its decode plan built (so the first request pays no pipeline compile).
pub fn spawn(
    gpu: Gpu,
    model: Llama,
    tok: Arc<Tokenizer>,
    opts: WorkerOptions,
    metrics: Arc<Metrics>,
) -> Result<mpsc::Sender<Job>> {
    let (jobs_tx, jobs_rx) = mpsc::channel(opts.queue.max(1));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("shaderlm-gpu".into())
        .spawn(move || {
            let mut scheduler = Scheduler {
                gpu: &gpu,
                model: &model,
                tok: &tok,
                opts,
                slots: Vec::new(),
                batch: model.can_batch(&gpu).then(|| Batch::new(SESSION_OUTPUTS)),
                jobs: jobs_rx,
                metrics: &metrics,
                clock: 0,
            };
            let first = scheduler.new_session().and_then(|mut s| {
                s.gen.warm_up()?;
                Ok(s)
            });
            match first {
                Ok(s) => {
                    scheduler.slots.push(s);
                    metrics.sessions.set(1);
                    let _ = ready_tx.send(Ok(()));
                    scheduler.run();
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        })
        .map_err(|e| Error::Invalid(format!("could not start the GPU worker thread: {e}")))?;
    ready_rx
        .recv()
        .map_err(|_| Error::Invalid("the GPU worker stopped while starting".into()))??;
    Ok(jobs_tx)
}

/// A session and what it is doing.
struct Slot<'a> {
    gen: Generator<'a>,
    active: Option<Active>,
    /// When it last started or finished a job (for least-recently-used reuse).
    last_used: u64,
}

/// A job on a session.
struct Active {
    job: Job,
    /// Prompt tokens in the cache: the reused prefix, then each prefilled chunk.
    fed: usize,
    cached: usize,
    decoding: Decoding,
    /// A chosen token the model has not run on yet.
    pending: Option<u32>,
    started: Instant,
    prefilled: Option<Instant>,
}

struct Scheduler<'a> {
    gpu: &'a Gpu,
    model: &'a Llama,
    tok: &'a Tokenizer,
    opts: WorkerOptions,
    slots: Vec<Slot<'a>>,
    /// Batched decode steps over the sessions, when the model can batch on this adapter.
    batch: Option<Batch>,
    jobs: mpsc::Receiver<Job>,
    metrics: &'a Metrics,
    clock: u64,
}

/// Length of the common prefix of two token lists.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl<'a> Scheduler<'a> {
    /// Serve until the queue is closed and every job is done.
    fn run(&mut self) {
        let mut batched = Vec::new();
        while self.admit() {
            batched.clear();
            for i in 0..self.slots.len() {
                self.advance(i, &mut batched);
            }
            for rows in batched.chunks(MAX_BATCH) {
                match rows {
                    // One session alone takes its own decode step (the same bits).
                    [i] => self.decode_alone(*i, Vec::new()),
                    _ => self.decode_batch(rows),
                }
            }
            self.metrics.sessions_active.set(self.active() as i64);
        }
    }

    fn active(&self) -> usize {
        self.slots.iter().filter(|s| s.active.is_some()).count()
    }

    /// Start queued jobs while a session is free; waits for one when nothing is active. False when the queue is
    /// closed and nothing is active.
    fn admit(&mut self) -> bool {
        loop {
            let active = self.active();
            if active == self.opts.parallel {
                return true;
            }
            let job = if active == 0 {
                match self.jobs.blocking_recv() {
                    Some(job) => job,
                    None => return false,
                }
            } else {
                match self.jobs.try_recv() {
                    Ok(job) => job,
                    Err(_) => return true,
                }
            };
            self.start(job);
            self.metrics.sessions_active.set(self.active() as i64);
        }
    }

    fn new_session(&self) -> Result<Slot<'a>> {
        let mut gen = Generator::new(self.gpu, self.model, self.opts.ctx, SESSION_OUTPUTS)?;
        gen.chunk = self.opts.chunk;
        Ok(Slot {
            gen,
            active: None,
            last_used: 0,
        })
    }

    /// The session for `prompt` and how many of its tokens that session holds: the idle one with the longest
    /// common prefix (an empty one, else the least recently used, among equals), or a new one while there are
    /// fewer than `parallel` and no idle session shares anything or is empty.
    fn pick(&mut self, prompt: &[u32]) -> Result<(usize, usize)> {
        let best = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.active.is_none())
            .map(|(i, s)| {
                (
                    common_prefix(&s.gen.tokens, prompt).min(prompt.len().saturating_sub(1)),
                    i,
                )
            })
            .max_by_key(|&(shared, i)| {
                let s = &self.slots[i];
                (shared, s.gen.tokens.is_empty(), std::cmp::Reverse(s.last_used))
            });
        let reuse = |shared: usize, i: usize| {
            shared > 0 || self.slots.len() >= self.opts.parallel || self.slots[i].gen.tokens.is_empty()
        };
        match best {
            Some((shared, i)) if reuse(shared, i) => Ok((i, shared)),
            _ => {
                let slot = self.new_session()?;
                self.slots.push(slot);
                self.metrics.sessions.set(self.slots.len() as i64);
                Ok((self.slots.len() - 1, 0))
            }
        }
    }

    fn start(&mut self, job: Job) {
        if job.events.is_closed() {
            self.metrics.cancelled.inc();
            return;
        }
        let (i, shared) = match self.pick(&job.prompt) {
            Ok(x) => x,
            Err(e) => {
                let _ = job.events.send(Event::Failed(ApiError::internal(format!(
                    "could not allocate a session: {e}"
                ))));
                return;
            }
        };
        self.clock += 1;
        self.metrics.prompt_tokens.inc_by(job.prompt.len() as u64);
        self.metrics.cached_tokens.inc_by(shared as u64);
        let slot = &mut self.slots[i];
        slot.last_used = self.clock;
        slot.gen.truncate(shared);
        slot.active = Some(Active {
            decoding: Decoding::new(job.sampling.clone(), job.rules.clone()),
            pending: None,
            job,
            fed: shared,
            cached: shared,
            started: Instant::now(),
            prefilled: None,
        });
    }

    /// One unit of work for session `i`: a prefill chunk or a decoded token. A session whose next step is one
    /// token without drafts is pushed to `batched` instead when the model batches, for [`Scheduler::decode_batch`].
    fn advance(&mut self, i: usize, batched: &mut Vec<usize>) {
        let slot = &mut self.slots[i];
        let Some(active) = &mut slot.active else {
            return;
        };
        if active.job.events.is_closed() {
            slot.active = None;
            self.metrics.cancelled.inc();
            return;
        }
        let t0 = Instant::now();
        let outcome = if active.fed < active.job.prompt.len() {
            prefill(&mut slot.gen, active).map(|n| {
                self.metrics.prefill_tokens.inc_by(n as u64);
                self.metrics.prefill_seconds.inc_by(t0.elapsed().as_secs_f64());
                None
            })
        } else {
            match drafts(&slot.gen, active, self.opts.lookup) {
                Ok(d) if d.is_empty() && active.pending.is_some() && self.batch.is_some() => {
                    batched.push(i);
                    return;
                }
                Ok(d) => return self.decode_alone(i, d),
                Err(e) => Err(e),
            }
        };
        self.end_turn(i, outcome);
    }

    /// Decode session `i`'s pending token in its own step, verifying `drafts` after it when there are any (or,
    /// right after the prefill, take its outputs).
    fn decode_alone(&mut self, i: usize, drafts: Vec<u32>) {
        let t0 = Instant::now();
        let slot = &mut self.slots[i];
        let Some(active) = &mut slot.active else {
            return;
        };
        let before = active.decoding.generated.len();
        let outcome = decode(&mut slot.gen, active, self.tok, drafts, self.metrics).inspect(|_| {
            let n = active.decoding.generated.len() - before;
            self.metrics.completion_tokens.inc_by(n as u64);
            self.metrics.decode_seconds.inc_by(t0.elapsed().as_secs_f64());
        });
        self.end_turn(i, outcome);
    }

    /// Decode the pending token of each session of `rows` (at most `MAX_BATCH`) in one batched step, then let
    /// each take its row.
    fn decode_batch(&mut self, rows: &[usize]) {
        let t0 = Instant::now();
        let mut ids = Vec::with_capacity(rows.len());
        let mut gens = Vec::with_capacity(rows.len());
        // `rows` ascend (pushed in slot order), so `gens` and `ids` follow them.
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if let (true, Some(a)) = (rows.contains(&i), &mut slot.active) {
                ids.push(a.pending.take().expect("batched sessions have a pending token"));
                gens.push(&mut slot.gen);
            }
        }
        let Some(mut batch) = self.batch.take() else {
            return;
        };
        let ran = batch.feed(rows, &mut gens, &ids);
        self.metrics.decode_seconds.inc_by(t0.elapsed().as_secs_f64());
        if ran.is_ok() {
            self.metrics.batch_steps.inc();
            self.metrics.batched_tokens.inc_by(rows.len() as u64);
        }
        for (r, &i) in rows.iter().enumerate() {
            let slot = &mut self.slots[i];
            let Some(active) = &mut slot.active else {
                continue;
            };
            let outcome = match &ran {
                Ok(()) => take_rows(&mut slot.gen, active, &mut batch.result, r, &[], self.tok, self.metrics),
                Err(e) => Err(Error::Invalid(format!("batched step: {e}"))),
            };
            if outcome.is_ok() {
                self.metrics.completion_tokens.inc();
            }
            self.end_turn(i, outcome);
        }
        self.batch = Some(batch);
    }

    /// After session `i`'s turn: tell its client how the job ended, if it did, and free the session.
    fn end_turn(&mut self, i: usize, outcome: Result<Option<Finish>>) {
        let slot = &mut self.slots[i];
        let Some(active) = &mut slot.active else {
            return;
        };
        let event = match outcome {
            Ok(None) => return,
            Ok(Some(finish)) => Event::Done(finish),
            Err(e) => {
                // The cache may hold half a step: forget it.
                slot.gen.truncate(0);
                Event::Failed(ApiError::internal(format!("generation failed: {e}")))
            }
        };
        let _ = active.job.events.send(event);
        slot.active = None;
        self.clock += 1;
        slot.last_used = self.clock;
    }
}

/// Run the next chunk of the prompt; returns how many tokens it held.
fn prefill(gen: &mut Generator<'_>, a: &mut Active) -> Result<usize> {
    let end = (a.fed + gen.chunk.max(1)).min(a.job.prompt.len());
    gen.feed(&a.job.prompt[a.fed..end])?;
    let n = end - a.fed;
    a.fed = end;
    if a.fed == a.job.prompt.len() {
        a.prefilled = Some(Instant::now());
    }
    Ok(n)
}

/// What every session reads back: the logits (sampling) and the argmax (greedy) of each row.
const SESSION_OUTPUTS: StepOutputs = StepOutputs {
    logits: true,
    argmax: true,
    topk: 0,
    lse: false,
    router: false,
    hidden: false,
    aux_hidden: false,
};

/// Up to `lookup` prompt-lookup drafts to verify after the pending token (none without one).
fn drafts(gen: &Generator<'_>, a: &Active, lookup: usize) -> Result<Vec<u32>> {
    let mut drafts = Vec::new();
    if let Some(t) = a.pending {
        let room = gen.max_ctx() - gen.tokens.len();
        let left = a.decoding.tokens_left();
        let k = lookup.min(room.saturating_sub(1)).min(left.saturating_sub(1));
        if k > 0 {
            let mut history = gen.tokens.clone();
            history.push(t);
            Lookup::default().propose(&history, k, &mut drafts)?;
        }
    }
    Ok(drafts)
}

/// Run the model on the pending token (with its `drafts` after it, as one verification step) or, right after the
/// prefill, use its outputs; then [`take_rows`].
fn decode(
    gen: &mut Generator<'_>,
    a: &mut Active,
    tok: &Tokenizer,
    drafts: Vec<u32>,
    metrics: &Metrics,
) -> Result<Option<Finish>> {
    if let Some(t) = a.pending.take() {
        if drafts.is_empty() {
            gen.feed(&[t])?;
        } else {
            let mut ids = vec![t];
            ids.extend_from_slice(&drafts);
            gen.verify(&ids)?;
            metrics.drafted.inc_by(drafts.len() as u64);
        }
    }
    let mut result = std::mem::take(&mut gen.result);
    let outcome = take_rows(gen, a, &mut result, 0, &drafts, tok, metrics);
    gen.result = result;
    outcome
}

/// Choose tokens from `result`'s rows `first ..` (the session's step: the pending token's row, then one per
/// draft), sending their text, while they equal the `drafts`; the first other choice becomes the pending token and
/// the cache forgets the rejected drafts. Returns how the job ended, if it did.
fn take_rows(
    gen: &mut Generator<'_>,
    a: &mut Active,
    result: &mut StepResult,
    first: usize,
    drafts: &[u32],
    tok: &Tokenizer,
    metrics: &Metrics,
) -> Result<Option<Finish>> {
    // Tokens in the cache before the pending token.
    let base = gen.tokens.len() - drafts.len();
    for row in 0..=drafts.len() {
        let room = base + row < gen.max_ctx();
        let (text, next) = a.decoding.step(result, first + row, tok, room)?;
        if !text.is_empty() {
            let _ = a.job.events.send(Event::Text(text));
        }
        match next {
            Next::Feed(t) if drafts.get(row) == Some(&t) => {
                metrics.accepted.inc();
            }
            Next::Feed(t) => {
                gen.truncate(base + row);
                a.pending = Some(t);
                return Ok(None);
            }
            Next::Finish(reason) => {
                gen.truncate(base + row);
                let prefilled = a.prefilled.unwrap_or(a.started);
                return Ok(Some(Finish {
                    reason,
                    prompt_tokens: a.job.prompt.len(),
                    cached_tokens: a.cached,
                    completion_tokens: a.decoding.generated.len(),
                    queued: a.started - a.job.received,
                    prefill: prefilled - a.started,
                    decode: prefilled.elapsed(),
                }));
            }
        }
    }
    unreachable!("the last row has no draft to equal")
}
