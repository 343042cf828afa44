//! Generation: prefill in chunks, decode one token per submission, sampling, stop rules, streaming, timings.
//! The decode plan is built once and reused; the per-token loop allocates nothing on the host.

pub mod batch;
pub mod draft;
pub mod draft_len;
pub mod eagle;
mod emit;
pub mod spec;
pub mod stats;
pub mod tree;

use emit::Emitter;

use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::model::llama::MAX_CHAIN;
use crate::model::{KvCache, Llama, Step, StepInputs, StepOutputs};
use crate::sampling::Sampler;
use crate::tokenizer::Tokenizer;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What the last fed token produced (the outputs the generator was asked for).
pub use crate::model::StepResult;

/// The step plans of one session, built on first use: decode (dense, and sparse past the model's `dense_len`),
/// prefill by (tokens, sparse), and verification (outputs for every token) by (tokens, sparse).
#[derive(Default)]
struct Plans {
    decode: [Option<Step>; 2],
    prefill: HashMap<(usize, bool), Step>,
    verify: HashMap<(usize, bool), Step>,
    /// Chained greedy draft steps by (tokens of the first link, links).
    chain: HashMap<(usize, usize), Step>,
    /// Draft-tree steps by (nodes, whether they accept greedily on the device, sparse attention), and the plan that
    /// moves an accepted path's K/V into place.
    tree: HashMap<(usize, bool, bool), Step>,
    mover: Option<crate::model::tree_step::KvMover>,
    /// InfLLM-v2 compressed-key updates over an accepted path, by its length (`Llama::key_compressor`).
    compress: HashMap<usize, Option<crate::graph::Plan>>,
    /// Draft trees grown on the device by (catch-up tokens, (depth, top-k, size)) (`Llama::tree_draft`).
    tree_draft: HashMap<(usize, (usize, usize, usize)), crate::model::tree_draft::TreeDraft>,
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

    /// The plan of a verification step of `n` tokens.
    fn verify(
        &mut self,
        gpu: &Gpu,
        model: &Llama,
        cache: &KvCache,
        outputs: StepOutputs,
        n: usize,
        sparse: bool,
    ) -> Result<&mut Step> {
        Ok(match self.verify.entry((n, sparse)) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(model.verify_step(gpu, cache, n, outputs, sparse)?),
        })
    }

    /// The plan of a tree step over `n` nodes, accepting greedily on the device or not, attending sparsely or not
    /// (`Llama::tree_step`).
    fn tree_step(
        &mut self,
        (gpu, model, cache): (&Gpu, &Llama, &KvCache),
        outputs: StepOutputs,
        (n, accept, sparse): (usize, bool, bool),
    ) -> Result<&mut Step> {
        Ok(match self.tree.entry((n, accept, sparse)) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(model.tree_step(gpu, cache, n, outputs, accept, sparse)?),
        })
    }

    /// The plan growing a draft tree of (depth, top-k, size) after `m` tokens (`Llama::tree_draft`).
    fn tree_draft(
        &mut self,
        gpu: &Gpu,
        model: &Llama,
        cache: &KvCache,
        (m, shape): (usize, (usize, usize, usize)),
    ) -> Result<&mut crate::model::tree_draft::TreeDraft> {
        Ok(match self.tree_draft.entry((m, shape)) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(model.tree_draft(gpu, cache, m, shape)?),
        })
    }

    /// The plan of a chain of `k` greedy steps whose first link runs `m` tokens.
    fn chain(&mut self, gpu: &Gpu, model: &Llama, cache: &KvCache, m: usize, k: usize) -> Result<&mut Step> {
        Ok(match self.chain.entry((m, k)) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(model.chain_step(gpu, cache, m, k)?),
        })
    }
}

/// A model plus its KV-cache state: which tokens the cache holds.
pub struct Generator<'a> {
    gpu: &'a Gpu,
    model: &'a Llama,
    cache: KvCache,
    /// What each step reads back.
    pub outputs: StepOutputs,
    plans: Plans,
    /// Tokens whose K/V are in the cache, in order.
    pub tokens: Vec<u32>,
    /// Tokens per prefill step.
    pub chunk: usize,
    pub result: StepResult,
    /// What the last draft tree grown on the device read back ([`Generator::feed_tree_draft`]).
    pub tree_result: crate::model::tree_draft::TreeDraftResult,
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
            tree_result: Default::default(),
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

    /// How a draft tree's step after `base` cached tokens, its nodes at most `depth` deep, attends where it equals
    /// plain decoding along every path: densely (Some(false)) where plain decoding at the deepest position would,
    /// sparsely (Some(true)) where it would at the root's position already and at most one InfLLM-v2 window of each
    /// kind (C1, C2) completes within the positions of the tree's nodes past the root, `base + 1 ..= base + depth`
    /// (the tree step updates the compressed keys for its root and gives each row its own copy of the next window of
    /// each kind); None where neither holds.
    pub(super) fn tree_attends(&self, base: usize, depth: usize) -> Option<bool> {
        if !self.sparse_at(base + depth + 1) {
            return Some(false);
        }
        let sparse = self.model.cfg.sparse.as_ref()?;
        let (fine, coarse) = sparse.windows();
        let one_window = [fine, coarse]
            .iter()
            .all(|w| w.count(base + depth + 1) <= w.count(base + 1) + 1);
        (self.sparse_at(base + 1) && one_window).then_some(true)
    }

    /// The deepest draft tree, at most `depth` deep, whose step after `base` cached tokens attends as plain
    /// decoding would ([`Generator::tree_attends`]); None where not even one level does.
    pub(super) fn tree_depth(&self, base: usize, depth: usize) -> Option<usize> {
        (1..=depth).rev().find(|&d| self.tree_attends(base, d).is_some())
    }

    /// The plan of a step of `n` tokens after `pos` cached ones, dense or sparse as the KV length it reaches asks.
    fn plan(&mut self, n: usize, pos: usize) -> Result<&mut Step> {
        let sparse = self.sparse_at(pos + n);
        self.plans
            .get(self.gpu, self.model, &self.cache, self.outputs, n, sparse)
    }

    /// An error unless every id of `ids` is in the vocabulary.
    fn check_vocab(&self, ids: &[u32]) -> Result<()> {
        let vocab = self.model.cfg.vocab as u32;
        match ids.iter().find(|&&t| t >= vocab) {
            Some(bad) => Err(Error::Invalid(format!(
                "token id {bad} is outside the vocabulary of {vocab}"
            ))),
            None => Ok(()),
        }
    }

    /// An error unless `ids` are non-empty, in the vocabulary and fit the context after the cached tokens.
    pub(super) fn check_fits(&self, ids: &[u32]) -> Result<()> {
        if ids.is_empty() {
            return Err(Error::Invalid("nothing to feed: the prompt is empty".into()));
        }
        self.check_vocab(ids)?;
        if self.tokens.len() + ids.len() > self.cache.max_ctx {
            return Err(Error::Invalid(format!(
                "{} tokens do not fit the context of {} (already {} in the cache); use a larger --ctx or a shorter prompt",
                ids.len(),
                self.cache.max_ctx,
                self.tokens.len()
            )));
        }
        Ok(())
    }

    /// Run the model over `ids` (appended after the cached tokens) in one verification step: `self.result` then
    /// holds every token's outputs (`row_argmax`, logits `[n, vocab]`, top-k `[n, k]`), each bit for bit what
    /// feeding the tokens one at a time would give. At most `attention_decode::MAX_TOKENS` tokens. The cache holds
    /// them all afterwards; [`Generator::truncate`] drops the rejected ones.
    pub fn verify(&mut self, ids: &[u32]) -> Result<()> {
        self.check_fits(ids)?;
        let pos = self.tokens.len();
        let sparse = self.sparse_at(pos + ids.len());
        let gpu = self.gpu;
        let step = self
            .plans
            .verify(gpu, self.model, &self.cache, self.outputs, ids.len(), sparse)?;
        step.run(gpu, StepInputs { tokens: ids, pos }, &mut self.result)?;
        self.tokens.extend_from_slice(ids);
        Ok(())
    }

    /// The cache's InfLLM-v2 compressed keys of the windows within the cached tokens, every layer's (see
    /// [`KvCache::compressed_keys`]).
    pub fn compressed_keys(&self) -> Result<Option<Vec<f32>>> {
        let Some(s) = &self.model.cfg.sparse else {
            return Ok(None);
        };
        let (fine, coarse) = s.windows();
        self.cache.compressed_keys(self.gpu, [fine, coarse], self.tokens.len())
    }

    /// The K/V the cache holds for the session's tokens, every layer's (see [`KvCache::prefix`]).
    pub fn cache_prefix(&self) -> Result<Vec<f32>> {
        self.cache.prefix(self.gpu, self.tokens.len())
    }

    /// The model the session runs.
    pub fn model(&self) -> &'a Llama {
        self.model
    }

    /// The device the session runs on.
    pub fn gpu(&self) -> &'a Gpu {
        self.gpu
    }

    /// Greedy drafting in one submission: run `ids` (at most `MAX_CHAIN`, in one step), then each step's argmax,
    /// `k` steps in all (a [`crate::model::Llama::chain_step`]); `self.result.row_argmax` then holds the `k`
    /// argmaxes, and the cache `ids` and the first `k - 1` of them. Other outputs are not read.
    pub fn feed_chain(&mut self, ids: &[u32], k: usize) -> Result<()> {
        self.feed_chain_with(ids, None, k)
    }

    /// [`Generator::feed_chain`] for an EAGLE head: `ids` with the target's `features` `[ids.len(), hidden]`; each
    /// later step takes the feature the one before predicted, on the device.
    pub fn feed_chain_with(&mut self, ids: &[u32], features: Option<&[f32]>, k: usize) -> Result<()> {
        self.check_chain(ids, k)?;
        self.check_features(ids, features)?;
        let (gpu, pos) = (self.gpu, self.tokens.len());
        let step = self.plans.chain(gpu, self.model, &self.cache, ids.len(), k)?;
        if let Some(f) = features {
            step.write_features(gpu, f)?;
        }
        step.run_chain(gpu, ids, pos, &mut self.result)?;
        self.tokens.extend_from_slice(ids);
        self.tokens.extend_from_slice(&self.result.row_argmax[..k - 1]);
        Ok(())
    }

    /// [`Generator::feed_chain`] on `draft` (a greedy chain of `k` drafts after `catch_up`, the tokens it has not
    /// cached, ending with the last chosen one) and this session's [`Generator::verify`] of that last token and the
    /// `k` drafts, in one submission: the drafts reach the verification's token ids on the device. `draft.result`
    /// then holds the drafts and `self.result` the verification's outputs, bit for bit the two separate steps'.
    /// Both sessions must run on the same device.
    pub fn verify_chain(&mut self, draft: &mut Generator<'_>, catch_up: &[u32], k: usize) -> Result<()> {
        self.verify_chain_with(draft, (catch_up, None), k)
    }

    /// [`Generator::verify_chain`] with an EAGLE head drafting: the catch-up tokens with the target's features
    /// `[catch_up.len(), hidden]` ([`Generator::feed_chain_with`]).
    pub fn verify_chain_with(
        &mut self,
        draft: &mut Generator<'_>,
        (catch_up, features): (&[u32], Option<&[f32]>),
        k: usize,
    ) -> Result<()> {
        draft.check_features(catch_up, features)?;
        if !std::ptr::eq(self.gpu, draft.gpu) {
            return Err(Error::Invalid(
                "a draft verified in the same submission must run on the target's device".into(),
            ));
        }
        let Some(&first) = catch_up.last() else {
            return Err(Error::Invalid("nothing to draft after: the catch-up is empty".into()));
        };
        if k > MAX_CHAIN || draft.model.cfg.vocab > self.model.cfg.vocab {
            return Err(Error::Invalid(format!(
                "a chain of {k} drafts (at most {MAX_CHAIN}) from a vocabulary of {} cannot be verified by a model of {}",
                draft.model.cfg.vocab, self.model.cfg.vocab
            )));
        }
        draft.check_chain(catch_up, k)?;
        let mut ids = [first; MAX_CHAIN + 1];
        self.check_fits(&ids[..=k])?;
        let pos = self.tokens.len();
        let sparse = self.sparse_at(pos + k + 1);
        let (gpu, model) = (self.gpu, self.model);
        let verify = self
            .plans
            .verify(gpu, model, &self.cache, self.outputs, k + 1, sparse)?;
        let dpos = draft.tokens.len();
        let chain = draft.plans.chain(gpu, draft.model, &draft.cache, catch_up.len(), k)?;
        if let Some(f) = features {
            chain.write_features(gpu, f)?;
        }
        chain.run_chain_then(
            gpu,
            (catch_up, dpos),
            &mut draft.result,
            (verify, first, pos),
            &mut self.result,
        )?;
        draft.tokens.extend_from_slice(catch_up);
        draft.tokens.extend_from_slice(&draft.result.row_argmax[..k - 1]);
        ids[1..=k].copy_from_slice(&draft.result.row_argmax);
        self.tokens.extend_from_slice(&ids[..=k]);
        Ok(())
    }

    /// An error unless an EAGLE head's step of `ids` has features `[ids.len(), hidden]` and other models' none.
    pub(super) fn check_features(&self, ids: &[u32], features: Option<&[f32]>) -> Result<()> {
        let h = self.model.cfg.hidden;
        if self.model.is_eagle() != features.is_some() || features.is_some_and(|f| f.len() != ids.len() * h) {
            return Err(Error::Invalid(format!(
                "a step of {} tokens: an EAGLE head takes [n, {h}] features, other models none",
                ids.len()
            )));
        }
        Ok(())
    }

    /// An error unless a chain of `k` steps after `ids` fits this session.
    fn check_chain(&self, ids: &[u32], k: usize) -> Result<()> {
        self.check_fits(ids)?;
        if k == 0 || self.tokens.len() + ids.len() + k - 1 > self.cache.max_ctx {
            return Err(Error::Invalid(format!(
                "a chain of {k} steps does not fit the context of {} after {} tokens",
                self.cache.max_ctx,
                self.tokens.len()
            )));
        }
        Ok(())
    }

    /// An EAGLE head's [`Generator::feed`]: token `ids[i]` with the feature `features[i * hidden ..]` (`[n, hidden]`).
    pub fn feed_with(&mut self, ids: &[u32], features: &[f32]) -> Result<()> {
        self.check_fits(ids)?;
        let h = self.model.cfg.hidden;
        if features.len() != ids.len() * h {
            return Err(Error::Invalid(format!(
                "{} feature values for {} tokens of hidden size {h}",
                features.len(),
                ids.len()
            )));
        }
        self.run_chunks(ids, Some(features))
    }

    /// Run the model over `ids` (appended after the cached tokens); `self.result` then holds the last token's outputs.
    pub fn feed(&mut self, ids: &[u32]) -> Result<()> {
        self.check_fits(ids)?;
        if self.model.is_eagle() {
            return Err(Error::Invalid(
                "an EAGLE head's steps take features: use feed_with".into(),
            ));
        }
        self.run_chunks(ids, None)
    }

    /// Run `ids` (checked to fit) in steps of `self.chunk` tokens, each with its rows of `features` (`[n, hidden]`,
    /// an EAGLE head's) when given.
    fn run_chunks(&mut self, ids: &[u32], features: Option<&[f32]>) -> Result<()> {
        let gpu = self.gpu;
        let chunk_len = self.chunk.max(1);
        let h = self.model.cfg.hidden;
        for (c, chunk) in ids.chunks(chunk_len).enumerate() {
            let pos = self.tokens.len();
            let inputs = StepInputs { tokens: chunk, pos };
            let sparse = self.sparse_at(pos + chunk.len());
            let step = self
                .plans
                .get(gpu, self.model, &self.cache, self.outputs, chunk.len(), sparse)?;
            if let Some(f) = features {
                let from = c * chunk_len * h;
                step.write_features(gpu, &f[from..from + chunk.len() * h])?;
            }
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
/// may return false to stop (Ctrl-C). The cache then holds the prompt and every generated token but the last.
pub fn generate(
    gen: &mut Generator<'_>,
    tok: &Tokenizer,
    sampler: &mut Sampler,
    prompt: &[u32],
    opts: &GenOptions,
    on_text: impl FnMut(&str) -> bool,
) -> Result<GenOutput> {
    let mut emit = Emitter::new(tok, opts, prompt, on_text);
    let t0 = Instant::now();
    gen.feed(prompt)?;
    emit.out.prefill_time = t0.elapsed();
    let t1 = Instant::now();
    let mut history: Vec<u32> = gen.tokens.clone();
    while !emit.done() {
        let next = choose(gen, sampler, 0, &history, &mut emit.out)?;
        history.push(next);
        if !emit.push(next)? {
            break;
        }
        if gen.tokens.len() >= gen.max_ctx() {
            emit.context_full();
            break;
        }
        gen.feed(&[next])?;
    }
    emit.out.decode_time = t1.elapsed();
    emit.finish()
}

/// The token the target chooses from row `row` of the last step's outputs (0 for a one-token step), after the tokens
/// `history` (the sampler's penalties and its position-keyed draw), recording the row's top-k in `out`.
fn choose(
    gen: &mut Generator<'_>,
    sampler: &mut Sampler,
    row: usize,
    history: &[u32],
    out: &mut GenOutput,
) -> Result<u32> {
    record_topk(gen, row, out);
    if !sampler.params.needs_logits() {
        if let Some(&a) = gen.result.row_argmax.get(row) {
            return Ok(a);
        }
    }
    Ok(sampler.sample(row_logits(gen, row)?, history))
}

/// Row `row`'s top-k (when the steps read it) appended to `out`.
fn record_topk(gen: &Generator<'_>, row: usize, out: &mut GenOutput) {
    let (k, r) = (gen.outputs.topk, &gen.result);
    if let (Some(ids), Some(logits)) = (
        r.topk_ids.get(row * k..(row + 1) * k),
        r.topk_logits.get(row * k..(row + 1) * k),
    ) {
        if k > 0 {
            out.topk.push((ids.to_vec(), logits.to_vec()));
        }
    }
}

/// Row `row`'s logits of the last step.
fn row_logits<'r>(gen: &'r mut Generator<'_>, row: usize) -> Result<&'r mut [f32]> {
    let vocab = gen.model.cfg.vocab;
    gen.result
        .logits
        .get_mut(row * vocab..(row + 1) * vocab)
        .ok_or_else(|| Error::Invalid("sampling needs logits but the step does not read them".into()))
}

impl Generator<'_> {
    /// Profile one decode step at the current position (per node: dispatches, traffic, GPU time).
    pub fn profile_decode(&mut self) -> Result<Vec<crate::graph::NodeProfile>> {
        let pos = self.tokens.len();
        let gpu = self.gpu;
        let inputs = StepInputs { tokens: &[0], pos };
        self.plan(1, pos)?.profile(gpu, inputs)
    }

    /// One verification step of `n` rows at the current position (the plan speculative decoding runs, logits or
    /// argmax for every row) timed per node; the cache is left as it was.
    pub fn profile_verify(&mut self, n: usize) -> Result<Vec<crate::graph::NodeProfile>> {
        let ids = vec![0; n];
        self.check_fits(&ids)?;
        let pos = self.tokens.len();
        let sparse = self.sparse_at(pos + n);
        let gpu = self.gpu;
        let step = self
            .plans
            .verify(gpu, self.model, &self.cache, self.outputs, n, sparse)?;
        step.profile(gpu, StepInputs { tokens: &ids, pos })
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

    /// Dispatches of one decode step at the current position.
    pub fn decode_dispatches(&mut self) -> Result<usize> {
        let pos = self.tokens.len();
        Ok(self.plan(1, pos)?.dispatch_count(pos))
    }
}
