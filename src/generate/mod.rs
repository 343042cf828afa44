//! Generation: prefill in chunks, decode one token per submission, sampling, stop rules, streaming, timings.
//! The decode plan is built once and reused; the per-token loop allocates nothing on the host.

pub mod stats;

use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::model::{KvCache, Llama, Step, StepInputs, StepOutputs};
use crate::sampling::Sampler;
use crate::tokenizer::{StreamDecoder, Tokenizer};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What the last fed token produced (the outputs the generator was asked for).
pub use crate::model::StepResult;

/// The step plans of one session, built on first use: decode (dense, and sparse past the model's `dense_len`) and
/// prefill by (tokens, sparse).
#[derive(Default)]
struct Plans {
    decode: [Option<Step>; 2],
    prefill: HashMap<(usize, bool), Step>,
}

impl Plans {
    /// The plan of a step of `n` tokens with dense or sparse attention.
    fn get(
        &mut self,
        gpu: &Gpu,
        model: &Llama,
        cache: &KvCache,
        outputs: StepOutputs,
        n: usize,
        sparse: bool,
    ) -> Result<&mut Step> {
        if n == 1 {
            let slot = &mut self.decode[usize::from(sparse)];
            if slot.is_none() {
                *slot = Some(model.step_with(gpu, cache, 1, outputs, sparse)?);
            }
            return Ok(slot.as_mut().expect("just built"));
        }
        if !self.prefill.contains_key(&(n, sparse)) {
            if self.prefill.len() >= 8 {
                self.prefill.clear();
            }
            let step = model.step_with(gpu, cache, n, outputs, sparse)?;
            self.prefill.insert((n, sparse), step);
        }
        Ok(self.prefill.get_mut(&(n, sparse)).expect("just inserted"))
    }
}

/// A model plus its KV-cache state: which tokens the cache holds.
pub struct Generator<'a> {
    gpu: &'a Gpu,
    model: &'a Llama,
    cache: KvCache,
    outputs: StepOutputs,
    plans: Plans,
    /// Tokens whose K/V are in the cache, in order.
    pub tokens: Vec<u32>,
    /// Tokens per prefill step.
    pub chunk: usize,
    pub result: StepResult,
    /// BlockFFN sparsity counts, when the outputs include the router weights.
    pub moe_stats: Option<stats::MoeStats>,
}

impl<'a> Generator<'a> {
    /// A session with its own KV cache of `max_ctx` positions.
    pub fn new(gpu: &'a Gpu, model: &'a Llama, max_ctx: usize, outputs: StepOutputs) -> Result<Generator<'a>> {
        Ok(Generator {
            gpu,
            model,
            cache: model.new_cache(gpu, max_ctx)?,
            outputs,
            plans: Plans::default(),
            tokens: Vec::new(),
            chunk: 128,
            result: StepResult::default(),
            moe_stats: match (&model.cfg.moe, outputs.router) {
                (Some(m), true) => Some(stats::MoeStats::new(model.cfg.n_layers, m.experts)),
                _ => None,
            },
        })
    }

    pub fn max_ctx(&self) -> usize {
        self.cache.max_ctx
    }

    /// Forget the cache from position `n` on (keep a shared prefix of a conversation).
    pub fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
    }

    /// Build the plans now so that the first token pays no pipeline compile.
    pub fn warm_up(&mut self) -> Result<()> {
        self.plan(1, self.tokens.len())?;
        Ok(())
    }

    /// Whether a step reaching KV length `kv_len` attends sparsely.
    fn sparse_at(&self, kv_len: usize) -> bool {
        self.cache.sparse_at(&self.model.cfg, kv_len)
    }

    /// The plan of a step of `n` tokens after `pos` cached ones, dense or sparse as the KV length it reaches asks.
    fn plan(&mut self, n: usize, pos: usize) -> Result<&mut Step> {
        let sparse = self.sparse_at(pos + n);
        self.plans
            .get(self.gpu, self.model, &self.cache, self.outputs, n, sparse)
    }

    /// Run the model over `ids` (appended after the cached tokens); `self.result` then holds the last token's outputs.
    pub fn feed(&mut self, ids: &[u32]) -> Result<()> {
        if ids.is_empty() {
            return Err(Error::Invalid("nothing to feed: the prompt is empty".into()));
        }
        let vocab = self.model.cfg.vocab as u32;
        if let Some(bad) = ids.iter().find(|&&t| t >= vocab) {
            return Err(Error::Invalid(format!(
                "token id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        if self.tokens.len() + ids.len() > self.cache.max_ctx {
            return Err(Error::Invalid(format!(
                "{} tokens do not fit the context of {} (already {} in the cache); use a larger --ctx or a shorter prompt",
                ids.len(),
                self.cache.max_ctx,
                self.tokens.len()
            )));
        }
        let gpu = self.gpu;
        for chunk in ids.chunks(self.chunk.max(1)) {
            let pos = self.tokens.len();
            let inputs = StepInputs { tokens: chunk, pos };
            let sparse = self.sparse_at(pos + chunk.len());
            let step = self
                .plans
                .get(gpu, self.model, &self.cache, self.outputs, chunk.len(), sparse)?;
            step.run(gpu, inputs, &mut self.result)?;
            self.tokens.extend_from_slice(chunk);
            if let Some(st) = &mut self.moe_stats {
                for (layer, r) in self.result.router.iter().enumerate() {
                    st.add(layer, r);
                }
            }
        }
        Ok(())
    }
}

/// Options of one generation.
#[derive(Clone, Debug)]
pub struct GenOptions {
    pub max_tokens: usize,
    pub stop_strings: Vec<String>,
    /// Stop at EOS / end-of-turn tokens.
    pub stop_at_eos: bool,
}

/// What one generation produced, with timings.
#[derive(Clone, Debug, Default)]
pub struct GenOutput {
    pub prompt_ids: Vec<u32>,
    pub generated: Vec<u32>,
    pub text: String,
    /// Top-k of the logits that chose each generated token (when the generator reads them).
    pub topk: Vec<(Vec<u32>, Vec<f32>)>,
    pub prefill_time: Duration,
    pub decode_time: Duration,
    pub stopped_by: String,
}

impl GenOutput {
    pub fn prefill_tok_s(&self) -> f64 {
        self.prompt_ids.len() as f64 / self.prefill_time.as_secs_f64().max(1e-9)
    }
    pub fn decode_tok_s(&self) -> f64 {
        self.generated.len().saturating_sub(1) as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

/// Prefill `prompt` (after whatever the cache holds) and generate; `on_text` gets each complete piece of text and
/// may return false to stop (Ctrl-C).
pub fn generate(
    gen: &mut Generator<'_>,
    tok: &Tokenizer,
    sampler: &mut Sampler,
    prompt: &[u32],
    opts: &GenOptions,
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<GenOutput> {
    let mut out = GenOutput {
        prompt_ids: prompt.to_vec(),
        ..Default::default()
    };
    let t0 = Instant::now();
    gen.feed(prompt)?;
    out.prefill_time = t0.elapsed();
    let t1 = Instant::now();
    let mut stream = StreamDecoder::new();
    let mut history: Vec<u32> = gen.tokens.clone();
    out.stopped_by = "max tokens".into();
    for i in 0..opts.max_tokens {
        if !gen.result.topk_ids.is_empty() {
            out.topk
                .push((gen.result.topk_ids.clone(), gen.result.topk_logits.clone()));
        }
        let next = match gen.result.argmax {
            Some(a) if !sampler.params.needs_logits() => a,
            _ if gen.result.logits.is_empty() => {
                return Err(Error::Invalid(
                    "sampling needs logits but the step does not read them".into(),
                ))
            }
            _ => sampler.sample(&mut gen.result.logits, &history),
        };
        out.generated.push(next);
        history.push(next);
        if opts.stop_at_eos && tok.is_stop(next) {
            out.stopped_by = "end of turn".into();
            break;
        }
        if let Some(piece) = stream.step(tok, next)? {
            out.text.push_str(&piece);
            if let Some(s) = opts.stop_strings.iter().find(|s| out.text.contains(s.as_str())) {
                let cut = out.text.find(s.as_str()).unwrap_or(out.text.len());
                out.text.truncate(cut);
                out.stopped_by = format!("stop string {s:?}");
                break;
            }
            if !on_text(&piece) {
                out.stopped_by = "interrupted".into();
                break;
            }
        }
        if i + 1 == opts.max_tokens {
            break;
        }
        if gen.tokens.len() >= gen.max_ctx() {
            out.stopped_by = "context full".into();
            break;
        }
        gen.feed(&[next])?;
    }
    if out.stopped_by == "max tokens" || out.stopped_by == "context full" {
        let rest = stream.flush(tok)?;
        on_text(&rest);
        out.text.push_str(&rest);
    }
    out.decode_time = t1.elapsed();
    Ok(out)
}

impl Generator<'_> {
    /// Profile one decode step at the current position (per node: dispatches, traffic, GPU time).
    pub fn profile_decode(&mut self) -> Result<Vec<crate::graph::NodeProfile>> {
        let pos = self.tokens.len();
        let gpu = self.gpu;
        let inputs = StepInputs { tokens: &[0], pos };
        self.plan(1, pos)?.profile(gpu, inputs)
    }

    /// Feed `ids` as one step checked node by node against the ops' CPU references (see
    /// [`crate::graph::Plan::check`]); the cache then holds them as after [`Generator::feed`].
    pub fn check_step(
        &mut self,
        ids: &[u32],
        opts: &crate::graph::CheckOptions,
    ) -> Result<Vec<crate::graph::NodeCheck>> {
        let pos = self.tokens.len();
        if ids.is_empty() || pos + ids.len() > self.cache.max_ctx {
            return Err(Error::Invalid(format!(
                "a checked step of {} tokens after {pos} does not fit the context of {}",
                ids.len(),
                self.cache.max_ctx
            )));
        }
        let gpu = self.gpu;
        let verdicts = self
            .plan(ids.len(), pos)?
            .check(gpu, StepInputs { tokens: ids, pos }, opts)?;
        self.tokens.extend_from_slice(ids);
        Ok(verdicts)
    }

    /// Dispatches of one decode step.
    pub fn decode_dispatches(&mut self) -> Result<usize> {
        Ok(self.plan(1, self.tokens.len())?.dispatch_count())
    }
}
