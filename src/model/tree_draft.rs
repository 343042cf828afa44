//! A draft tree grown on the device in one submission (EAGLE-2's expansion phase): the draft's catch-up step over
//! the tokens it has not cached, then DEPTH - 1 rounds, each a tree step over the frontier `tree_frontier` chose
//! from the last round's children (an EAGLE head's rows fed their parents' predicted features). Every round's
//! candidates (each row's top-k and log-sum-exp) and frontier come back for the host to rerank into the tree.

use super::llama::{Llama, StepContext};
use super::step::StepOutputs;
use super::KvCache;
use crate::error::{Error, Result};
use crate::gpu::{DType, Gpu};
use crate::graph::{Graph, Plan, StepVars, TensorId};
use crate::ops::attention_decode::{MAX_TREE_DEPTH, MAX_TREE_ROWS, TREE_W};

/// One round's read-backs: every row's `k` best children (token ids, logits) and log-sum-exp.
#[derive(Clone, Copy, Debug)]
struct Candidates {
    ids: TensorId,
    vals: TensorId,
    lse: TensorId,
}

/// The frontier a round ran: its tokens and parent rows (in the round before).
#[derive(Clone, Copy, Debug)]
struct Ran {
    ids: TensorId,
    parents: TensorId,
}

/// A planned draft-tree growth ([`Llama::tree_draft`]).
pub struct TreeDraft {
    plan: Plan,
    m: usize,
    ids: TensorId,
    features: Option<TensorId>,
    /// The root as a frontier of one: score `[1]` (0) and table row `[1, TREE_W]` (depth 0, slot 0).
    root: (TensorId, TensorId),
    /// Round 0 (the catch-up's last row: the root's children), then each tree round's.
    cands: Vec<Candidates>,
    /// Tree rounds 1 .. DEPTH - 1: the frontier each ran.
    ran: Vec<Ran>,
    vars: Vec<StepVars>,
}

/// What a [`TreeDraft`] run read back, per round (reused from run to run).
#[derive(Clone, Debug, Default)]
pub struct TreeDraftResult {
    /// Round j's candidates: `[rows_j, k]` token ids and logits, `[rows_j]` log-sum-exps (round 0: one row).
    pub cand_ids: Vec<Vec<u32>>,
    pub cand_vals: Vec<Vec<f32>>,
    pub lse: Vec<Vec<f32>>,
    /// Tree round j's frontier (index j - 1): tokens and parent rows in round j - 1.
    pub ran_ids: Vec<Vec<u32>>,
    pub parents: Vec<Vec<u32>>,
}

impl Llama {
    /// The plan growing a draft tree of `depth` rounds keeping `topk` nodes each ([`TreeDraft::run`]): link 0 runs
    /// `m` tokens at `pos` as [`Llama::step`] does (an EAGLE head with the target's features `[m, hidden]`) and
    /// takes the last row's `topk` best children; round j (1 .. depth) runs the `topk` best of the last round's
    /// children (`tree_frontier`) as a tree step at the root's position `pos + m - 1`, their K/V in the slots
    /// from `1 + (j - 1) topk` on past it, and takes each row's `topk` best children. Each link is the step its
    /// size and kind builds alone, so the read-backs equal those of the separate steps bit for bit. A restricted
    /// head's (FR-Spec) ids are mapped to token ids on the device. Dense attention only.
    pub fn tree_draft(&self, gpu: &Gpu, cache: &KvCache, m: usize, depth: usize, topk: usize) -> Result<TreeDraft> {
        if !self.can_chain() {
            return Err(Error::Invalid(
                "a draft tree grown on the device needs dense attention".into(),
            ));
        }
        let rows = 1 + (depth.max(1) - 1) * topk;
        if m == 0
            || !(1..=MAX_TREE_DEPTH).contains(&depth)
            || topk == 0
            || topk >= MAX_TREE_ROWS
            || m + rows > cache.max_ctx
        {
            return Err(Error::Invalid(format!(
                "a draft tree of depth {depth} (1..={MAX_TREE_DEPTH}) and top-k {topk} (1..{MAX_TREE_ROWS}) after {m} \
                 tokens in a context of {}",
                cache.max_ctx
            )));
        }
        let eagle = self.is_eagle();
        let mut g = Graph::new();
        let ids = g.input("ids", &[m], DType::U32);
        let features = eagle.then(|| g.input("features", &[m, self.cfg.hidden], DType::F32));
        let head_ids = self.head_ids_on_device().map(|t| g.external(t));
        let out = StepOutputs {
            hidden: eagle,
            ..StepOutputs::default()
        };
        // Link 0: the catch-up step; its last row is the root's.
        let ctx = StepContext::dense(gpu, vec![self.seq_context(&mut g, cache)], m);
        let f = self.forward(&mut g, gpu, &ctx, (ids, features), out, false)?;
        let mut feature = match f.hidden {
            Some(h) if m > 1 => Some(g.rows(h, m - 1, 1)?),
            h => h,
        };
        let mut cands = vec![candidates(&mut g, f.logits, topk, head_ids)?];
        let root = (
            g.input("root_score", &[1], DType::F32),
            g.input("root_table", &[1, TREE_W], DType::U32),
        );
        let (mut scores, mut table) = root;
        let mut ran = Vec::with_capacity(depth - 1);
        // The tree rounds take the kernels a tree step takes (rows equal to one-row steps).
        g.set_invariant_rows(MAX_TREE_ROWS);
        for j in 1..depth {
            let c = cands[j - 1];
            let fr = g.tree_frontier((scores, table), (c.ids, c.vals, c.lse), topk, 1 + (j - 1) * topk)?;
            for t in [fr.ids, fr.parents] {
                g.output(t);
            }
            g.set_seq(j);
            let ctx = StepContext {
                tree: Some(fr.table),
                ..StepContext::dense(gpu, vec![self.seq_context(&mut g, cache)], topk)
            };
            // Each row runs with its parent's predicted feature.
            let feats = feature.map(|h| g.embedding(fr.parents, h)).transpose()?;
            let f = self.forward(&mut g, gpu, &ctx, (fr.ids, feats), out, true)?;
            feature = f.hidden;
            cands.push(candidates(&mut g, f.logits, topk, head_ids)?);
            ran.push(Ran {
                ids: fr.ids,
                parents: fr.parents,
            });
            (scores, table) = (fr.scores, fr.table);
        }
        g.set_seq(0);
        Ok(TreeDraft {
            plan: Plan::new(gpu, g)?,
            m,
            ids,
            features,
            root,
            cands,
            ran,
            vars: Vec::with_capacity(depth),
        })
    }
}

/// Each row's `k` best children of `logits` `[rows, vocab]` (token ids through a restricted head's `head_ids`) and
/// its log-sum-exp, marked for read-back.
fn candidates(g: &mut Graph, logits: TensorId, k: usize, head_ids: Option<TensorId>) -> Result<Candidates> {
    let rows = g.shape(logits)[0];
    let (mut ids, vals) = g.topk(logits, k)?; // [rows, k]
    if let Some(map) = head_ids {
        let flat = g.reshape(ids, &[rows * k])?;
        let mapped = g.gather_cols(map, flat)?; // [rows * k] token ids
        ids = g.reshape(mapped, &[rows, k])?;
    }
    let lse = g.logsumexp(logits)?; // [rows, 1]
    for t in [ids, vals, lse] {
        g.output(t);
    }
    Ok(Candidates { ids, vals, lse })
}

impl TreeDraft {
    /// Run it (one submission): `tokens` `[m]` at `pos` (an EAGLE head's with `features` `[m, hidden]`), then the
    /// tree rounds at `pos + m - 1`; `out` then holds every round's read-backs.
    pub fn run(
        &mut self,
        gpu: &Gpu,
        (tokens, features): (&[u32], Option<&[f32]>),
        pos: usize,
        out: &mut TreeDraftResult,
    ) -> Result<()> {
        if tokens.len() != self.m || features.is_some() != self.features.is_some() {
            return Err(Error::Invalid(format!(
                "{} tokens (features: {}) given to a draft tree planned for {} (features: {})",
                tokens.len(),
                features.is_some(),
                self.m,
                self.features.is_some()
            )));
        }
        self.plan.write_input(gpu, self.ids, bytemuck::cast_slice(tokens))?;
        if let (Some(id), Some(f)) = (self.features, features) {
            self.plan.write_input(gpu, id, bytemuck::cast_slice(f))?;
        }
        self.plan.write_input(gpu, self.root.0, bytemuck::bytes_of(&0f32))?;
        self.plan
            .write_input(gpu, self.root.1, bytemuck::cast_slice(&[0u32; TREE_W]))?;
        self.vars.clear();
        self.vars.push(StepVars { pos: pos as u32 });
        let base = (pos + self.m - 1) as u32;
        self.vars.extend(self.ran.iter().map(|_| StepVars { pos: base }));
        self.plan.run_seqs(gpu, &self.vars)?;
        let n = self.cands.len();
        for v in [&mut out.cand_ids, &mut out.ran_ids, &mut out.parents] {
            v.resize_with(n, Vec::new);
        }
        for v in [&mut out.cand_vals, &mut out.lse] {
            v.resize_with(n, Vec::new);
        }
        for (j, c) in self.cands.iter().enumerate() {
            self.plan.read_into(c.ids, &mut out.cand_ids[j])?;
            self.plan.read_into(c.vals, &mut out.cand_vals[j])?;
            self.plan.read_into(c.lse, &mut out.lse[j])?;
        }
        out.ran_ids.truncate(self.ran.len());
        out.parents.truncate(self.ran.len());
        for (j, r) in self.ran.iter().enumerate() {
            self.plan.read_into(r.ids, &mut out.ran_ids[j])?;
            self.plan.read_into(r.parents, &mut out.parents[j])?;
        }
        Ok(())
    }
}
