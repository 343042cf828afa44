//! A planned forward step as its callers see it: token ids and a position in, the outputs that were asked for
//! (logits, argmax, top-k, router weights) read back into buffers the caller keeps, so a decode loop allocates
//! nothing and submits once per token. Built by [`super::Llama::step`].

use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::graph::StepVars;
use crate::graph::{CheckOptions, NodeCheck, NodeProfile, Plan, TensorId};

/// What a step reads back.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepOutputs {
    /// Read back the last token's logits `[vocab]` (a verification step: every token's, `[n, vocab]`).
    pub logits: bool,
    /// Read back the argmax of the last token's logits (greedy decoding without a logits read-back; a verification
    /// step: every token's).
    pub argmax: bool,
    /// Read back the top-k ids and logits of the last token (0 = none; a verification step: every token's).
    pub topk: usize,
    /// Read back the log-sum-exp of the last token's logits (a verification or tree step: every token's), so
    /// that the top-k's log-probabilities are their logits minus it (a draft tree's scores without the logits).
    pub lse: bool,
    /// Read back each BlockFFN layer's router weights `[n_tokens, E]` (sparsity statistics).
    pub router: bool,
    /// Read back the final-normed hidden state of every token of the step `[n, hidden]` (the LM head's input; an
    /// EAGLE head's own: its layer's output), the features an EAGLE draft head predicts from.
    pub hidden: bool,
    /// Read back the hidden states entering the three layers an EAGLE-3 head reads (`eagle3::feature_layers`),
    /// every token's, side by side: `[n, 3 hidden]`.
    pub aux_hidden: bool,
}

/// One step's input: `tokens` at positions `pos ..` (after `pos` tokens already in the cache).
#[derive(Clone, Copy, Debug)]
pub struct StepInputs<'a> {
    pub tokens: &'a [u32],
    pub pos: usize,
}

/// What the last step read back; the outputs not asked for stay empty. Reused from step to step.
#[derive(Clone, Debug, Default)]
pub struct StepResult {
    /// Raw logits `[vocab]` of the last token (a verification step: `[n, vocab]`, every token's); with a restricted
    /// head (FR-Spec) over its ids, `Llama::head_ids`.
    pub logits: Vec<f32>,
    /// Argmax of the last token's logits.
    pub argmax: Option<u32>,
    /// Argmax of each token's logits `[n]` (a verification step; else the last token's alone).
    pub row_argmax: Vec<u32>,
    /// Top-k ids and logits, best first (a verification step: `[n, k]`, every token's).
    pub topk_ids: Vec<u32>,
    pub topk_logits: Vec<f32>,
    /// Log-sum-exp of the last token's logits (a verification or tree step: `[n]`, every token's).
    pub lse: Vec<f32>,
    /// Router weights `[n_tokens, E]` of each BlockFFN layer, for every token of the step.
    pub router: Vec<Vec<f32>>,
    /// Every token's final-normed hidden state `[n_tokens, hidden]` (the LM head's input).
    pub hidden: Vec<f32>,
    /// EAGLE-3's features: every token's hidden states entering the three layers, side by side `[n_tokens, 3
    /// hidden]`.
    pub aux_hidden: Vec<f32>,
    /// The three layers' read-backs before they are interleaved (kept to reuse their memory).
    aux_parts: [Vec<f32>; 3],
    /// A tree step that accepted on the device: the rows of the greedy path from the root (row 0), whose K/V the
    /// step already moved to consecutive positions.
    pub tree_path: Vec<u32>,
}

/// A planned forward step over `n_tokens` tokens.
pub struct Step {
    pub(super) plan: Plan,
    pub(super) n_tokens: usize,
    /// An EAGLE head's features input `[n_tokens, hidden]`.
    pub(super) features: Option<TensorId>,
    /// A chained draft step's argmax of each link, `[1, 1]` each ([`super::Llama::chain_step`]).
    pub(super) chain: Vec<TensorId>,
    /// The vars of each sequence for the next run (kept: the decode loop allocates nothing).
    pub(super) vars: Vec<StepVars>,
    /// The token id of each logit when the head is restricted (FR-Spec): argmax and top-k ids are mapped through it.
    pub(super) vocab_ids: Option<Vec<u32>>,
    /// Token ids `[n_tokens]`.
    pub(super) ids: TensorId,
    pub(super) logits: Option<TensorId>,
    pub(super) argmax: Option<TensorId>,
    pub(super) topk: Option<(TensorId, TensorId)>,
    pub(super) lse: Option<TensorId>,
    /// Router weights `[n_tokens, E]` of each BlockFFN layer, when asked for.
    pub(super) router: Vec<TensorId>,
    /// The LM head's input `[rows, hidden]`, when asked for.
    pub(super) hidden: Option<TensorId>,
    /// The hidden states entering EAGLE-3's three layers, `[n, hidden]` each, when asked for.
    pub(super) aux: Vec<TensorId>,
    /// A tree step's table `[n_tokens, TREE_W]` ([`super::Llama::tree_step`]).
    pub(super) tree: Option<TensorId>,
    /// A tree step that accepts on the device: the greedy path `[tree_accept::PATH_LEN]` (its length, then rows).
    pub(super) path: Option<TensorId>,
}

impl Step {
    /// Run the step (one submission) and read what was asked for into `out`.
    pub fn run(&mut self, gpu: &Gpu, inputs: StepInputs<'_>, out: &mut StepResult) -> Result<()> {
        self.write_tokens(gpu, inputs.tokens)?;
        self.plan.run(gpu, &vars(inputs.pos))?;
        self.read(out)
    }

    /// Run a batched step ([`super::Llama::batch_step`]): `tokens[r]` at position `positions[r]` of sequence `r`'s
    /// cache; `out` then holds every row's outputs.
    pub fn run_batch(&mut self, gpu: &Gpu, tokens: &[u32], positions: &[usize], out: &mut StepResult) -> Result<()> {
        if positions.len() != self.plan.seqs() {
            return Err(Error::Invalid(format!(
                "{} positions given to a step of {} sequences",
                positions.len(),
                self.plan.seqs()
            )));
        }
        self.write_tokens(gpu, tokens)?;
        self.vars.clear();
        self.vars.extend(positions.iter().map(|&p| vars(p)));
        self.plan.run_seqs(gpu, &self.vars)?;
        self.read(out)
    }

    /// Write an EAGLE head step's features `[n_tokens, hidden]` (the target's, or the head's own last output) for
    /// the next run.
    pub fn write_features(&self, gpu: &Gpu, features: &[f32]) -> Result<()> {
        let id = self
            .features
            .ok_or_else(|| Error::Invalid("features given to a step that takes none (not an EAGLE head)".into()))?;
        self.plan.write_input(gpu, id, bytemuck::cast_slice(features))
    }

    /// Run a chained draft step ([`super::Llama::chain_step`]): `tokens` at positions `pos ..`, then each link's
    /// argmax at the next position; `out.row_argmax` then holds the chain's argmaxes, `[k]`.
    pub fn run_chain(&mut self, gpu: &Gpu, tokens: &[u32], pos: usize, out: &mut StepResult) -> Result<()> {
        if self.chain.is_empty() {
            return Err(Error::Invalid("run_chain on a step that is not a chain".into()));
        }
        self.write_tokens(gpu, tokens)?;
        self.set_chain_vars(tokens.len(), pos);
        self.plan.run_seqs(gpu, &self.vars)?;
        self.read_chain(out)
    }

    /// A chain's vars: link 0 runs `m` tokens at `pos`, link j > 0 one token at `pos + m + j - 1`.
    fn set_chain_vars(&mut self, m: usize, pos: usize) {
        self.vars.clear();
        self.vars
            .extend((0..self.chain.len()).map(|j| vars(if j == 0 { pos } else { pos + m + j - 1 })));
    }

    /// The chain's argmaxes into `out.row_argmax`.
    fn read_chain(&self, out: &mut StepResult) -> Result<()> {
        out.row_argmax.clear();
        for &id in &self.chain {
            let bytes = self.plan.read(id)?;
            out.row_argmax.push(bytemuck::pod_read_unaligned::<u32>(&bytes[..4]));
        }
        out.argmax = out.row_argmax.last().copied();
        Ok(())
    }

    /// Run this chained draft step as [`Step::run_chain`] does and then `verify`, a verification step of another
    /// model (the target's, on the same device) over `first` and the chain's argmaxes, at position `vpos`, in one
    /// submission: the argmaxes are copied into the verification's token ids on the device, so the draft loop and
    /// the verification cost one round trip. `out` then holds the drafts, `vout` the verification's outputs.
    pub fn run_chain_then(
        &mut self,
        gpu: &Gpu,
        (tokens, pos): (&[u32], usize),
        out: &mut StepResult,
        (verify, first, vpos): (&mut Step, u32, usize),
        vout: &mut StepResult,
    ) -> Result<()> {
        let k = self.chain.len();
        if k == 0 || verify.n_tokens != k + 1 || self.vocab_ids.is_some() {
            return Err(Error::Invalid(format!(
                "a chain of {k} drafts with a plain head cannot feed a verification of {} tokens",
                verify.n_tokens
            )));
        }
        self.write_tokens(gpu, tokens)?;
        self.set_chain_vars(tokens.len(), pos);
        // Row 0 is `first`; the copies fill rows 1..=k after the queue's write.
        let mut ids = [0u32; super::llama::MAX_CHAIN + 1];
        ids[0] = first;
        verify.write_tokens(gpu, &ids[..k + 1])?;
        verify.vars.clear();
        verify.vars.push(vars(vpos));
        let to = verify.ids;
        let copies = self.chain.iter().enumerate().map(|(j, &a)| (a, to, 4 * (j as u64 + 1)));
        self.plan
            .run_then(gpu, &self.vars, (&mut verify.plan, &verify.vars), copies)?;
        self.read_chain(out)?;
        verify.read(vout)
    }

    /// Run a tree step ([`super::Llama::tree_step`]): `tokens` the nodes of a draft tree with their `table`
    /// (`[n, TREE_W]`, `attention_decode::tree_table`), row r at position `pos + depth(r)` and cached in slot
    /// `pos + slot(r)`; `out` then holds every row's outputs.
    pub fn run_tree(
        &mut self,
        gpu: &Gpu,
        tokens: &[u32],
        table: &[u32],
        pos: usize,
        out: &mut StepResult,
    ) -> Result<()> {
        let id = self
            .tree
            .ok_or_else(|| Error::Invalid("run_tree on a step that is not a tree step".into()))?;
        self.write_tokens(gpu, tokens)?;
        self.plan.write_input(gpu, id, bytemuck::cast_slice(table))?;
        self.plan.run(gpu, &vars(pos))?;
        self.read(out)
    }

    /// Sequences the step runs (1 unless it is a batched step).
    pub fn seqs(&self) -> usize {
        self.plan.seqs()
    }

    /// Run the step once, timing every node (see [`Plan::profile`]).
    pub fn profile(&mut self, gpu: &Gpu, inputs: StepInputs<'_>) -> Result<Vec<NodeProfile>> {
        self.write_tokens(gpu, inputs.tokens)?;
        self.plan.profile(gpu, &vars(inputs.pos))
    }

    /// Run the step node by node, checking each against its op's CPU reference (see [`Plan::check`]).
    pub fn check(&mut self, gpu: &Gpu, inputs: StepInputs<'_>, opts: &CheckOptions) -> Result<Vec<NodeCheck>> {
        self.write_tokens(gpu, inputs.tokens)?;
        self.plan.check(gpu, &vars(inputs.pos), opts)
    }

    /// Dispatches of a run at position `pos`.
    pub fn dispatch_count(&self, pos: usize) -> usize {
        self.plan.dispatch_count(&vars(pos))
    }

    pub(super) fn write_tokens(&self, gpu: &Gpu, tokens: &[u32]) -> Result<()> {
        if tokens.len() != self.n_tokens {
            return Err(Error::Invalid(format!(
                "{} tokens given to a step of {}",
                tokens.len(),
                self.n_tokens
            )));
        }
        self.plan.write_input(gpu, self.ids, bytemuck::cast_slice(tokens))
    }

    pub(super) fn read(&self, out: &mut StepResult) -> Result<()> {
        if let Some(id) = self.logits {
            self.plan.read_into(id, &mut out.logits)?;
        }
        out.tree_path.clear();
        if let Some(id) = self.path {
            // [length, rows.., zeros]: the rows kept.
            self.plan.read_into(id, &mut out.tree_path)?;
            if !out.tree_path.is_empty() {
                let len = out.tree_path.remove(0) as usize;
                out.tree_path.truncate(len);
            }
        }
        match self.argmax {
            Some(id) => {
                self.plan.read_into(id, &mut out.row_argmax)?;
                out.argmax = out.row_argmax.last().copied();
            }
            None => {
                out.row_argmax.clear();
                out.argmax = None;
            }
        }
        if let Some((ids, vals)) = self.topk {
            self.plan.read_into(ids, &mut out.topk_ids)?;
            self.plan.read_into(vals, &mut out.topk_logits)?;
        }
        if let Some(id) = self.lse {
            self.plan.read_into(id, &mut out.lse)?;
        }
        if let Some(map) = &self.vocab_ids {
            let token = |i: &mut u32| *i = map.get(*i as usize).copied().unwrap_or(u32::MAX);
            out.row_argmax.iter_mut().for_each(token);
            out.topk_ids.iter_mut().for_each(token);
            out.argmax = out.row_argmax.last().copied();
        }
        match self.hidden {
            Some(id) => self.plan.read_into(id, &mut out.hidden)?,
            None => out.hidden.clear(),
        }
        out.aux_hidden.clear();
        if let [a, b, c] = self.aux[..] {
            let [pa, pb, pc] = &mut out.aux_parts;
            self.plan.read_into(a, pa)?;
            self.plan.read_into(b, pb)?;
            self.plan.read_into(c, pc)?;
            let h = pa.len() / self.n_tokens.max(1);
            for r in 0..self.n_tokens {
                for part in [&*pa, &*pb, &*pc] {
                    out.aux_hidden.extend_from_slice(&part[r * h..(r + 1) * h]);
                }
            }
        }
        out.router.resize_with(self.router.len(), Vec::new);
        for (&id, r) in self.router.iter().zip(&mut out.router) {
            self.plan.read_into(id, r)?;
        }
        Ok(())
    }
}

pub(super) fn vars(pos: usize) -> StepVars {
    StepVars { pos: pos as u32 }
}
