//! Planning a Llama's steps: one forward step over new tokens (prefill chunks, decode, verification rows), a
//! batched step over several sessions, a greedy draft loop chained on the device, and the read-backs each asks for.

use super::*;
use crate::graph::Plan;

impl Llama {
    /// Record one forward step over `n_tokens` new tokens at positions `vars.pos ..`, writing their K/V into the
    /// cache; the outputs are those of the last token.
    pub fn step(&self, gpu: &Gpu, cache: &KvCache, n_tokens: usize, out: StepOutputs) -> Result<Step> {
        self.step_with(gpu, cache, n_tokens, out, false)
    }

    /// [`Llama::step`] with InfLLM-v2 sparse attention when `sparse` (the cache must have compressed keys: see
    /// [`KvCache::sparse_at`]); the compressed keys are kept up to date in dense steps too.
    pub fn step_with(
        &self,
        gpu: &Gpu,
        cache: &KvCache,
        n_tokens: usize,
        out: StepOutputs,
        sparse: bool,
    ) -> Result<Step> {
        self.build_step(gpu, cache, n_tokens, out, sparse, false)
    }

    /// A verification step: [`Llama::step_with`] whose outputs cover every one of its `n_tokens` rows (logits
    /// `[n, vocab]`, argmax `[n]`, top-k `[n, k]`), each equal bit for bit to what a one-token step at that
    /// position computes (the kernels are batch invariant for up to `attention_decode::MAX_TOKENS` rows).
    pub fn verify_step(
        &self,
        gpu: &Gpu,
        cache: &KvCache,
        n_tokens: usize,
        out: StepOutputs,
        sparse: bool,
    ) -> Result<Step> {
        if n_tokens > crate::ops::attention_decode::MAX_TOKENS {
            return Err(Error::Invalid(format!(
                "a verification step of {n_tokens} tokens (at most {})",
                crate::ops::attention_decode::MAX_TOKENS
            )));
        }
        self.build_step(gpu, cache, n_tokens, out, sparse, true)
    }

    /// Whether [`Llama::batch_step`] serves this model on `gpu`: not an EAGLE head, dense attention (no InfLLM-v2
    /// stages), and rows
    /// of the q|k|v projections and of the attention output that start at the adapter's storage-offset alignment
    /// (each sequence binds its own rows).
    pub fn can_batch(&self, gpu: &Gpu) -> bool {
        let c = &self.cfg;
        let align = gpu.caps.storage_align.max(1) as usize;
        let aligned = |cols: usize| (4 * cols).is_multiple_of(align);
        c.sparse.is_none()
            && self.eagle.is_none()
            && aligned(c.n_heads * c.head_dim)
            && self
                .layers
                .iter()
                .all(|l| l.qkv.groups.iter().all(|(w, _, _)| aligned(w.shape().0)))
    }

    /// One decode step for several sequences at once: row `r` is the next token of the session whose cache is
    /// `caches[r]`, at that session's own position (the run passes one position per row: [`Step::run_batch`]).
    /// The matmuls and norms read each weight once for every row; each row's RoPE, K/V write and attention run
    /// on its own cache. The outputs cover every row, each equal bit for bit to that session's one-token step
    /// (the kernels are batch invariant). At most `MAX_BATCH` rows; see [`Llama::can_batch`].
    pub fn batch_step(&self, gpu: &Gpu, caches: &[&KvCache], out: StepOutputs) -> Result<Step> {
        if caches.is_empty() || caches.len() > MAX_BATCH {
            return Err(Error::Invalid(format!(
                "a batched step of {} sequences (1..={MAX_BATCH})",
                caches.len()
            )));
        }
        if !self.can_batch(gpu) {
            return Err(Error::Invalid(
                "this model cannot batch sessions on this adapter (an EAGLE head, sparse attention, or unaligned rows)"
                    .into(),
            ));
        }
        let n = caches.len();
        let mut g = Graph::new();
        let ids = g.input("ids", &[n], DType::U32);
        let seqs = caches.iter().map(|&cache| self.seq_context(&mut g, cache)).collect();
        let ctx = StepContext::dense(gpu, seqs, n);
        self.plan_step(gpu, g, &ctx, (ids, None), out, true)
    }

    /// A greedy draft loop in one step: `k` decode steps chained on the device (the links, sequence j of the plan:
    /// [`Step::run_chain`]). Link 0 runs `m` given tokens at positions `pos ..` (a draft model catching up with the
    /// accepted tokens); link j > 0 runs the argmax of link j - 1 at position `pos + m + j - 1`. Each link is the
    /// step of its size that [`Llama::step`] builds, so the `k` argmaxes read back are what `k` separate steps would
    /// choose, in one submission. A restricted head's (FR-Spec) argmax, an index into its ids, is mapped to the
    /// token id on the device (`gather_cols` over the ids). An EAGLE head's link 0 takes the target's features
    /// `[m, hidden]` ([`Step::write_features`]) and link j > 0 the feature link j - 1 predicted (its output, on the
    /// device). Not for sparse attention.
    pub fn chain_step(&self, gpu: &Gpu, cache: &KvCache, m: usize, k: usize) -> Result<Step> {
        if !self.can_chain() {
            return Err(Error::Invalid("a chained draft step needs dense attention".into()));
        }
        if k == 0 || k > MAX_CHAIN || m == 0 || m > MAX_CHAIN || m + k - 1 > cache.max_ctx {
            return Err(Error::Invalid(format!(
                "a chain of {k} steps after {m} tokens (1..={MAX_CHAIN} each, context {})",
                cache.max_ctx
            )));
        }
        let mut g = Graph::new();
        let ids = g.input("ids", &[m], DType::U32);
        // A restricted head's token ids `[n]` u32, in logit order.
        let head_ids = self.head_subset.as_ref().map(|s| g.external(&s.ids_on_device));
        let features = self
            .is_eagle()
            .then(|| g.input("features", &[m, self.cfg.hidden], DType::F32));
        let (mut token, mut feature) = (ids, features);
        let mut chain = Vec::with_capacity(k);
        let out = StepOutputs {
            hidden: self.is_eagle(),
            ..StepOutputs::default()
        };
        for j in 0..k {
            let n_tokens = if j == 0 { m } else { 1 };
            g.set_seq(j);
            let ctx = StepContext::dense(gpu, vec![self.seq_context(&mut g, cache)], n_tokens);
            let f = self.forward(&mut g, gpu, &ctx, (token, feature), out, false)?;
            // An EAGLE head's predicted feature `[1, hidden]`: the next link's input.
            if let Some(h) = f.hidden {
                feature = Some(if n_tokens > 1 { g.rows(h, n_tokens - 1, 1)? } else { h });
            }
            let best = g.argmax(f.logits)?; // [1, 1]: the last row's
            let best = match head_ids {
                Some(t) => {
                    let index = g.reshape(best, &[1])?;
                    g.gather_cols(t, index)? // [1]: the token id
                }
                None => best,
            };
            g.output(best);
            chain.push(best);
            token = g.reshape(best, &[1])?;
        }
        g.set_seq(0);
        Ok(Step {
            plan: Plan::new(gpu, g)?,
            n_tokens: m,
            features,
            vars: Vec::with_capacity(k),
            vocab_ids: None,
            ids,
            logits: None,
            argmax: None,
            topk: None,
            lse: None,
            router: Vec::new(),
            hidden: None,
            aux: Vec::new(),
            chain,
            tree: None,
            path: None,
        })
    }

    /// The number of q|k|v projection groups of layer `i` (1 when all three are stored alike).
    pub(in crate::model) fn qkv_groups(&self, i: usize) -> usize {
        self.layers.get(i).map_or(0, |l| l.qkv.groups.len())
    }

    /// Whether [`Llama::chain_step`] serves this model.
    pub fn can_chain(&self) -> bool {
        self.cfg.sparse.is_none()
    }

    /// The step graph: outputs of the last token, or of every token when `all_rows`.
    fn build_step(
        &self,
        gpu: &Gpu,
        cache: &KvCache,
        n_tokens: usize,
        out: StepOutputs,
        sparse: bool,
        all_rows: bool,
    ) -> Result<Step> {
        let sparse_keys = self.sparse_keys(cache, sparse)?;
        if n_tokens == 0 || n_tokens > cache.max_ctx {
            return Err(Error::Invalid(format!(
                "a step of {n_tokens} tokens (context {})",
                cache.max_ctx
            )));
        }
        let mut g = Graph::new();
        let ids = g.input("ids", &[n_tokens], DType::U32);
        let ctx = StepContext {
            sparse,
            sparse_keys,
            ..StepContext::dense(gpu, vec![self.seq_context(&mut g, cache)], n_tokens)
        };
        // An EAGLE head's second input: the target's features `[n, hidden]`, one per token.
        let features = self
            .eagle
            .as_ref()
            .map(|_| g.input("features", &[n_tokens, self.cfg.hidden], DType::F32));
        self.plan_step(gpu, g, &ctx, (ids, features), out, all_rows)
    }

    /// A step's view of one session: its cache and its rotations as graph settings.
    pub(in crate::model) fn seq_context<'a>(&self, g: &mut Graph, cache: &'a KvCache) -> SeqContext<'a> {
        SeqContext {
            cache,
            ropes: cache.rope.iter().map(|t| self.rope(g, t)).collect(),
        }
    }

    /// Record the forward pass and the read-backs `out` asks for into `g`, and plan it: a step over `ctx`'s rows,
    /// whose inputs are `ids` (and an EAGLE head's features).
    pub(in crate::model) fn plan_step(
        &self,
        gpu: &Gpu,
        g: Graph,
        ctx: &StepContext<'_>,
        inputs: (TensorId, Option<TensorId>),
        out: StepOutputs,
        all_rows: bool,
    ) -> Result<Step> {
        self.plan_step_then(gpu, g, ctx, inputs, out, all_rows, |_, _| Ok(None))
    }

    /// [`Llama::plan_step`], then `then` records more nodes after the read-backs (given the argmax tensor, if read
    /// back) and may name a tree path tensor to read back (`StepResult::tree_path`).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::model) fn plan_step_then(
        &self,
        gpu: &Gpu,
        mut g: Graph,
        ctx: &StepContext<'_>,
        (ids, features): (TensorId, Option<TensorId>),
        out: StepOutputs,
        all_rows: bool,
        then: impl FnOnce(&mut Graph, Option<TensorId>) -> Result<Option<TensorId>>,
    ) -> Result<Step> {
        let f = self.forward(&mut g, gpu, ctx, (ids, features), out, all_rows)?;
        let (logits, argmax, topk, lse) = read_backs(&mut g, f.logits, out)?;
        let path = then(&mut g, argmax)?;
        Ok(Step {
            plan: Plan::new(gpu, g)?,
            n_tokens: ctx.n_tokens,
            features,
            vars: Vec::with_capacity(ctx.seqs.len()),
            vocab_ids: self.head_ids().map(<[u32]>::to_vec),
            ids,
            logits,
            argmax,
            topk,
            lse,
            router: f.router,
            hidden: f.hidden,
            aux: f.aux,
            chain: Vec::new(),
            tree: None,
            path,
        })
    }
}

/// A step's read-back tensors: logits, argmax, top-k (ids, values), log-sum-exp.
type ReadBacks = (
    Option<TensorId>,
    Option<TensorId>,
    Option<(TensorId, TensorId)>,
    Option<TensorId>,
);

/// Marks the read-backs `out` asks for on the last token's `logits`: the logits, their argmax, their top-k, their
/// log-sum-exp.
fn read_backs(g: &mut Graph, logits: TensorId, out: StepOutputs) -> Result<ReadBacks> {
    let step_logits = if out.logits {
        g.output(logits);
        Some(logits)
    } else {
        None
    };
    let argmax = if out.argmax {
        let a = g.argmax(logits)?;
        g.output(a);
        Some(a)
    } else {
        None
    };
    let topk = if out.topk > 0 {
        let (ti, tv) = g.topk(logits, out.topk)?;
        g.output(ti);
        g.output(tv);
        Some((ti, tv))
    } else {
        None
    };
    let lse = if out.lse {
        let l = g.logsumexp(logits)?;
        g.output(l);
        Some(l)
    } else {
        None
    };
    Ok((step_logits, argmax, topk, lse))
}
