//! A draft tree grown on the device in one submission (EAGLE-2's expansion and rerank): the draft's catch-up step
//! over the tokens it has not cached, then DEPTH - 1 rounds, each a tree step over the frontier `tree_frontier` chose
//! from the last round's children (an EAGLE head's rows fed their parents' predicted features), every round's
//! children gathered into one list and reranked into the tree (`tree_select`). The tree can feed the target's
//! verification in the same submission. Every round's candidates (each row's top-k and log-sum-exp), frontier and
//! the tree come back, for the host to check against its own rerank.

use super::llama::{Llama, StepContext};
use super::step::{vars, Step, StepOutputs, StepResult};
use super::KvCache;
use crate::error::{Error, Result};
use crate::gpu::{DType, Gpu};
use crate::graph::{Graph, Plan, StepVars, TensorId};
use crate::ops::attention_decode::{MAX_TREE_DEPTH, MAX_TREE_ROWS, TREE_W};
use crate::ops::tree_select::CAND_W;

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
    /// The root as a frontier of one: score `[1]` (0), table row `[1, TREE_W]` (depth 0, slot 0) and candidate
    /// index `[1]` (0; not read).
    root: (TensorId, TensorId, TensorId),
    /// Round 0 (the catch-up's last row: the root's children), then each tree round's.
    cands: Vec<Candidates>,
    /// Tree rounds 1 .. DEPTH - 1: the frontier each ran.
    ran: Vec<Ran>,
    /// The reranked tree: tokens of nodes 1 ..= size `[size]` and every node's table row `[size + 1, TREE_W]`.
    tree: (TensorId, TensorId),
    size: usize,
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
    /// The tree `tree_select` made: tokens of nodes 1 ..= size and the table `[size + 1, TREE_W]`.
    pub tree_ids: Vec<u32>,
    pub tree_table: Vec<u32>,
}

impl Llama {
    /// The plan growing a draft tree of `depth` rounds keeping `topk` nodes each and reranking it to `size` nodes
    /// (at most the candidates and `MAX_TREE_ROWS - 1`; [`tree_size`]) ([`TreeDraft::run`]): link 0 runs
    /// `m` tokens at `pos` as [`Llama::step`] does (an EAGLE head with the target's features `[m, hidden]`) and
    /// takes the last row's `topk` best children; round j (1 .. depth) runs the `topk` best of the last round's
    /// children (`tree_frontier`) as a tree step at the root's position `pos + m - 1`, their K/V in the slots
    /// from `1 + (j - 1) topk` on past it, and takes each row's `topk` best children. Each link is the step its
    /// size and kind builds alone, so the read-backs equal those of the separate steps bit for bit. A restricted
    /// head's (FR-Spec) ids are mapped to token ids on the device. Every round's children are collected into one
    /// list, and `tree_select` reranks it into the tree. Dense attention only.
    pub fn tree_draft(
        &self,
        gpu: &Gpu,
        cache: &KvCache,
        m: usize,
        (depth, topk, size): (usize, usize, usize),
    ) -> Result<TreeDraft> {
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
            || size != tree_size(depth, topk, size)
            || size == 0
        {
            return Err(Error::Invalid(format!(
                "a draft tree of depth {depth} (1..={MAX_TREE_DEPTH}), top-k {topk} (1..{MAX_TREE_ROWS}) and size {size} \
                 (1..={}) after {m} tokens in a context of {}",
                tree_size(depth, topk, MAX_TREE_ROWS),
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
            g.input("root_chosen", &[1], DType::U32),
        );
        let (mut scores, mut table, mut chosen) = root;
        // Every round's children, gathered for the rerank: round j's rows from `offset`, their parents' from
        // `parent_base` (the round before's).
        let list = g.uninit("tree.candidates", &[candidate_count(depth, topk), CAND_W], DType::U32);
        let (mut offset, mut parent_base) = (0, None);
        let mut ran = Vec::with_capacity(depth - 1);
        // The tree rounds take the kernels a tree step takes (rows equal to one-row steps).
        g.set_invariant_rows(MAX_TREE_ROWS);
        for j in 1..depth {
            let c = cands[j - 1];
            g.tree_select_collect(list, (scores, chosen), (c.ids, c.vals, c.lse), offset, parent_base)?;
            (parent_base, offset) = (Some(offset), offset + g.shape(c.ids)[0] * topk);
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
            (scores, table, chosen) = (fr.scores, fr.table, fr.chosen);
        }
        let c = cands[depth - 1];
        g.tree_select_collect(list, (scores, chosen), (c.ids, c.vals, c.lse), offset, parent_base)?;
        let tree = g.tree_select(list, size)?;
        g.output(tree.0);
        g.output(tree.1);
        g.set_seq(0);
        Ok(TreeDraft {
            plan: Plan::new(gpu, g)?,
            m,
            ids,
            features,
            root,
            cands,
            ran,
            tree,
            size,
            vars: Vec::with_capacity(depth),
        })
    }
}

/// Candidates of a draft tree of `depth` rounds keeping `topk` each: the root's children, then each round's.
pub fn candidate_count(depth: usize, topk: usize) -> usize {
    topk + depth.saturating_sub(1) * topk * topk
}

/// Nodes (the root not counted) of a tree reranked to `size` from the candidates of `depth` rounds of `topk`.
pub fn tree_size(depth: usize, topk: usize, size: usize) -> usize {
    size.min(candidate_count(depth, topk)).min(MAX_TREE_ROWS - 1)
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
    /// tree rounds at `pos + m - 1`; `out` then holds every round's read-backs and the tree.
    pub fn run(
        &mut self,
        gpu: &Gpu,
        (tokens, features): (&[u32], Option<&[f32]>),
        pos: usize,
        out: &mut TreeDraftResult,
    ) -> Result<()> {
        self.prepare(gpu, (tokens, features), pos)?;
        self.plan.run_seqs(gpu, &self.vars)?;
        self.read(out)
    }

    /// [`TreeDraft::run`], then in the same submission `verify`, the target's tree step accepting on the device
    /// ([`Llama::tree_step`] over `size + 1` rows) at `vpos`: row 0 the root `root`, rows 1 .. the tree's nodes
    /// with its table, copied on the device. `out` then holds the draft's read-backs, `vout` the verification's.
    pub fn run_then_verify(
        &mut self,
        gpu: &Gpu,
        (tokens, features): (&[u32], Option<&[f32]>),
        pos: usize,
        out: &mut TreeDraftResult,
        (verify, root, vpos): (&mut Step, u32, usize),
        vout: &mut StepResult,
    ) -> Result<()> {
        let n = self.size() + 1;
        let Some(table) = verify.tree.filter(|_| verify.n_tokens == n && verify.path.is_some()) else {
            return Err(Error::Invalid(format!(
                "a draft tree of {n} nodes cannot feed a step of {} rows that is no tree step accepting on the device",
                verify.n_tokens
            )));
        };
        self.prepare(gpu, (tokens, features), pos)?;
        // Row 0 is the root; the copies fill rows 1 .. and the table after the queue's write.
        let mut ids = [0u32; MAX_TREE_ROWS];
        ids[0] = root;
        verify.write_tokens(gpu, &ids[..n])?;
        verify.vars.clear();
        verify.vars.push(vars(vpos));
        let copies = [(self.tree.0, verify.ids, 4), (self.tree.1, table, 0)];
        self.plan
            .run_then(gpu, &self.vars, (&mut verify.plan, &verify.vars), copies)?;
        self.read(out)?;
        verify.read(vout)
    }

    /// Nodes of the tree (the root not counted).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Write the inputs and vars of a run.
    fn prepare(&mut self, gpu: &Gpu, (tokens, features): (&[u32], Option<&[f32]>), pos: usize) -> Result<()> {
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
        self.plan.write_input(gpu, self.root.2, bytemuck::bytes_of(&0u32))?;
        self.vars.clear();
        self.vars.push(StepVars { pos: pos as u32 });
        let base = (pos + self.m - 1) as u32;
        self.vars.extend(self.ran.iter().map(|_| StepVars { pos: base }));
        Ok(())
    }

    /// Every round's read-backs and the tree into `out`.
    fn read(&self, out: &mut TreeDraftResult) -> Result<()> {
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
        self.plan.read_into(self.tree.0, &mut out.tree_ids)?;
        self.plan.read_into(self.tree.1, &mut out.tree_table)?;
        Ok(())
    }
}
