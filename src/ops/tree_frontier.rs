//! One round of EAGLE-2's draft-tree expansion on the device: from the last frontier's rows (their cumulative
//! scores and tree-table rows) and each row's top-k children (tokens, logits, log-sum-exp), the best children of
//! all become the next frontier: their tokens, table rows, scores and parent rows, ready for the next draft step
//! in the same submission.

use super::attention_decode::{MAX_TREE_DEPTH, MAX_TREE_ROWS, TREE_W};
use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct TreeFrontierParams {
    f: u32,
    k: u32,
    keep: u32,
    slot0: u32,
}

#[derive(Debug)]
pub struct TreeFrontier {
    f: usize,
    k: usize,
    keep: usize,
    slot0: usize,
}

fn key() -> ShaderKey {
    ShaderKey::new("tree_frontier").def("TREE_W", format!("{TREE_W}u"))
}

impl Kernel for TreeFrontier {
    fn name(&self) -> &'static str {
        "tree_frontier"
    }
    /// Node tensors: 0 scores, 1 table, 2 cand_ids, 3 cand_vals, 4 lse, 5 next_ids, 6 next_table, 7 next_scores,
    /// 8 parents, 9 chosen.
    fn dispatches(&self, _: &Caps) -> Vec<Dispatch> {
        vec![Dispatch {
            shader: key(),
            bindings: (0..10).map(Bind::Tensor).collect(),
            workgroups: [1, 1, 1],
        }]
    }
    fn params(&self, _: usize, _: &StepVars) -> Params {
        Params::of(&TreeFrontierParams {
            f: self.f as u32,
            k: self.k as u32,
            keep: self.keep as u32,
            slot0: self.slot0 as u32,
        })
    }
    /// Every candidate's logit, score and parent's lse once per kept child; the kept children's outputs.
    fn cost(&self) -> Cost {
        let n = (self.f * self.k) as u64;
        Cost {
            bytes_read: 12 * n * self.keep as u64 + 4 * (self.f * TREE_W) as u64,
            bytes_written: (4 * self.keep * (4 + TREE_W)) as u64,
            flops: 2 * n * self.keep as u64,
        }
    }
    fn reference(&self, io: &[HostIo], _: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| {
            let next = reference(
                (&io[0].f32()?, &io[1].u32()),
                (&io[2].u32(), &io[3].f32()?, &io[4].f32()?),
                self.keep,
                self.slot0,
            );
            let f = |v: &[u32]| v.iter().map(|&x| x as f32).collect();
            Ok(vec![
                Expected::at(5, f(&next.ids)),
                Expected::at(6, f(&next.table)),
                Expected::at(7, next.scores),
                Expected::at(8, f(&next.parents)),
                Expected::at(9, f(&next.chosen)),
            ])
        })
    }
    fn check_bound(&self, _: &Caps) -> f64 {
        0.0
    }
}

/// The next frontier's tensors: `ids` `[keep]` u32, `table` `[keep, TREE_W]` u32, `scores` `[keep]` f32, `parents`
/// `[keep]` u32 (rows of the last frontier), `chosen` `[keep]` u32 (candidate indices r k + j).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Frontier {
    pub ids: TensorId,
    pub table: TensorId,
    pub scores: TensorId,
    pub parents: TensorId,
    pub chosen: TensorId,
}

/// The host's frontier values ([`reference`]).
#[derive(Clone, Debug, PartialEq)]
pub struct FrontierValues {
    pub ids: Vec<u32>,
    pub table: Vec<u32>,
    pub scores: Vec<f32>,
    pub parents: Vec<u32>,
    pub chosen: Vec<u32>,
}

impl Graph {
    /// One expansion round of a draft tree: the last frontier's `scores` `[F]` f32 and tree `table` `[F, TREE_W]`
    /// u32, each row's `k` best children `cand_ids` `[F, k]` u32 with their logits `cand_vals` `[F, k]` f32 (best
    /// first, `topk`'s outputs) and the row's log-sum-exp `lse` `[F]` (or `[F, 1]`) f32. Returns the `keep` best
    /// children by score `scores[r] + (logit - lse[r])` (descending in f32's total order, then by index r k + j)
    /// as the next frontier: their tokens, table rows (the parent's path, then the own slot `slot0 + i`), scores,
    /// parent rows and candidate indices. `keep` is at most `F k` and [`MAX_TREE_ROWS`]; every parent at most `MAX_TREE_DEPTH - 1` deep.
    pub fn tree_frontier(
        &mut self,
        (scores, table): (TensorId, TensorId),
        (cand_ids, cand_vals, lse): (TensorId, TensorId, TensorId),
        keep: usize,
        slot0: usize,
    ) -> Result<Frontier> {
        let f = self.shape(scores).iter().product::<usize>();
        let k = self.shape(cand_ids).last().copied().unwrap_or(0);
        let types = [(scores, DType::F32), (table, DType::U32), (cand_ids, DType::U32), (cand_vals, DType::F32)]
            .into_iter()
            .chain([(lse, DType::F32)])
            .all(|(t, d)| self.dtype(t) == d);
        let ok = types
            && self.shape(scores) == [f]
            && (1..=MAX_TREE_ROWS).contains(&f)
            && self.shape(table) == [f, TREE_W]
            && self.shape(cand_ids) == [f, k]
            && self.shape(cand_vals) == [f, k]
            && self.shape(lse).iter().product::<usize>() == f
            && self.shape(lse)[0] == f
            && k >= 1
            && (1..=(f * k).min(MAX_TREE_ROWS)).contains(&keep)
            && slot0 + keep <= u32::MAX as usize;
        if !ok {
            return Err(Error::shape(
                "tree_frontier",
                format!(
                    "scores {:?} {:?}, table {:?}, candidates {:?} and {:?}, lse {:?}, keep {keep}: want f32 [F] (1 <= F <= \
                     {MAX_TREE_ROWS}), u32 [F, {TREE_W}], u32 and f32 [F, k], f32 [F], 1 <= keep <= min(F k, {MAX_TREE_ROWS})",
                    self.shape(scores),
                    self.dtype(scores),
                    self.shape(table),
                    self.shape(cand_ids),
                    self.shape(cand_vals),
                    self.shape(lse)
                ),
            ));
        }
        let o = self.add_node(
            TreeFrontier { f, k, keep, slot0 },
            &[scores, table, cand_ids, cand_vals, lse],
            &[
                ("tree_frontier.ids", &[keep], DType::U32),
                ("tree_frontier.table", &[keep, TREE_W], DType::U32),
                ("tree_frontier.scores", &[keep], DType::F32),
                ("tree_frontier.parents", &[keep], DType::U32),
                ("tree_frontier.chosen", &[keep], DType::U32),
            ],
        )?;
        Ok(Frontier {
            ids: o[0],
            table: o[1],
            scores: o[2],
            parents: o[3],
            chosen: o[4],
        })
    }
}

/// A candidate's score as the shader forms it: the parent's score plus the child's log-probability, in f32.
pub fn child_score(parent: f32, logit: f32, lse: f32) -> f32 {
    parent + (logit - lse)
}

/// CPU reference: the next frontier as the shader writes it, from the last frontier's `scores` `[F]` and `table`
/// `[F, TREE_W]` and the candidates `cand_ids`, `cand_vals` `[F, k]` with each row's `lse` `[F]`.
pub fn reference(
    (scores, table): (&[f32], &[u32]),
    (cand_ids, cand_vals, lse): (&[u32], &[f32], &[f32]),
    keep: usize,
    slot0: usize,
) -> FrontierValues {
    let f = scores.len();
    let k = cand_ids.len() / f.max(1);
    let score = |c: usize| child_score(scores[c / k], cand_vals[c], lse[c / k]);
    let mut order: Vec<usize> = (0..f * k).collect();
    order.sort_by(|&a, &b| score(b).total_cmp(&score(a)).then(a.cmp(&b)));
    let mut next = FrontierValues {
        ids: Vec::with_capacity(keep),
        table: Vec::with_capacity(keep * TREE_W),
        scores: Vec::with_capacity(keep),
        parents: Vec::with_capacity(keep),
        chosen: Vec::with_capacity(keep),
    };
    for (i, &c) in order.iter().take(keep).enumerate() {
        let r = c / k;
        let d = (table[r * TREE_W] as usize).min(MAX_TREE_DEPTH - 1);
        let own = (slot0 + i) as u32;
        next.ids.push(cand_ids[c]);
        next.scores.push(score(c));
        next.parents.push(r as u32);
        next.chosen.push(c as u32);
        next.table.push(d as u32 + 1);
        next.table.extend_from_slice(&table[r * TREE_W + 1..=r * TREE_W + 1 + d]);
        next.table.extend(std::iter::repeat_n(own, TREE_W - 2 - d));
    }
    next
}

pub fn variants() -> Vec<ShaderKey> {
    vec![key()]
}
