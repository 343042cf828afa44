//! EAGLE-2's rerank on the device: every expansion round's candidates gathered into one list (`tree_select_collect`,
//! as each round's children are known), then the best `size` of all made into the draft tree that the target
//! verifies (`tree_select_rerank`): its tokens and tree table, ready for the verification in the same submission.

use super::attention_decode::{MAX_TREE_DEPTH, MAX_TREE_ROWS, TREE_W};
use super::tree_frontier::child_score;
use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};

/// Words of a candidate row: its score's f32 bits, its token, its parent's row ([`ROOT`] for the root's children).
pub const CAND_W: usize = 3;
/// The parent of the root's children.
pub const ROOT: u32 = u32::MAX;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct CollectParams {
    f: u32,
    k: u32,
    offset: u32,
    parent_base: u32,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct RerankParams {
    nc: u32,
    size: u32,
}

/// Writes one round's candidates into the list.
#[derive(Debug)]
pub struct TreeSelectCollect {
    f: usize,
    k: usize,
    offset: usize,
    parent_base: u32,
}

/// Takes the draft tree from the list.
#[derive(Debug)]
pub struct TreeSelect {
    nc: usize,
    size: usize,
}

fn key(form: &'static str) -> ShaderKey {
    ShaderKey::new(form).def("TREE_W", format!("{TREE_W}u"))
}

fn as_f32(v: &[u32]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

impl Kernel for TreeSelectCollect {
    fn name(&self) -> &'static str {
        "tree_select"
    }
    /// Node tensors: 0 cands (written in place), 1 scores, 2 chosen, 3 cand_ids, 4 cand_vals, 5 lse.
    fn dispatches(&self, _: &Caps) -> Vec<Dispatch> {
        vec![Dispatch {
            shader: key("tree_select_collect"),
            bindings: (0..6).map(Bind::Tensor).collect(),
            workgroups: [1, 1, 1],
        }]
    }
    fn params(&self, _: usize, _: &StepVars) -> Params {
        Params::of(&CollectParams {
            f: self.f as u32,
            k: self.k as u32,
            offset: self.offset as u32,
            parent_base: self.parent_base,
        })
    }
    fn cost(&self) -> Cost {
        let n = (self.f * self.k) as u64;
        Cost {
            bytes_read: 8 * n + 12 * self.f as u64,
            bytes_written: 4 * CAND_W as u64 * n,
            flops: 2 * n,
        }
    }
    fn reference(&self, io: &[HostIo], _: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| {
            let mut cands = io[0].u32();
            let round = (&io[1].f32()?[..], &io[2].u32()[..]);
            let children = (&io[3].u32()[..], &io[4].f32()?[..], &io[5].f32()?[..]);
            collect_reference(&mut cands, round, children, self.offset, self.parent_base);
            Ok(vec![Expected::at(0, as_f32(&cands))])
        })
    }
    fn check_bound(&self, _: &Caps) -> f64 {
        0.0
    }
}

impl Kernel for TreeSelect {
    fn name(&self) -> &'static str {
        "tree_select"
    }
    /// Node tensors: 0 cands, 1 ids, 2 table.
    fn dispatches(&self, _: &Caps) -> Vec<Dispatch> {
        vec![Dispatch {
            shader: key("tree_select_rerank"),
            bindings: (0..3).map(Bind::Tensor).collect(),
            workgroups: [1, 1, 1],
        }]
    }
    fn params(&self, _: usize, _: &StepVars) -> Params {
        Params::of(&RerankParams {
            nc: self.nc as u32,
            size: self.size as u32,
        })
    }
    /// Every candidate's score once per kept one; the tree's tokens and table.
    fn cost(&self) -> Cost {
        Cost {
            bytes_read: 4 * (self.nc * self.size) as u64,
            bytes_written: 4 * (self.size + (self.size + 1) * TREE_W) as u64,
            flops: (self.nc * self.size) as u64,
        }
    }
    fn reference(&self, io: &[HostIo], _: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| {
            let s = reference(&io[0].u32(), self.size);
            Ok(vec![Expected::at(1, as_f32(&s.ids)), Expected::at(2, as_f32(&s.table))])
        })
    }
    fn check_bound(&self, _: &Caps) -> f64 {
        0.0
    }
}

impl Graph {
    /// Write one expansion round's candidates into `cands` `[NC, CAND_W]` u32, rows `offset .. offset + F k`: row
    /// `offset + r k + j` is child j of frontier row r, from the frontier's `scores` `[F]` f32 and `chosen` `[F]`
    /// u32 (each row's candidate index in the round before, `tree_frontier`'s), the children `cand_ids` `[F, k]`
    /// u32, `cand_vals` `[F, k]` f32 and each row's `lse` `[F]` (or `[F, 1]`) f32: (bits of `scores[r] + (logit -
    /// lse[r])`, token, `parent_base + chosen[r]`), or [`ROOT`] as the parent when `parent_base` is `None` (the
    /// root's children; `chosen` is then not read). An effect on `cands` (a [`Graph::uninit`] list, each row written
    /// by one round).
    pub fn tree_select_collect(
        &mut self,
        cands: TensorId,
        (scores, chosen): (TensorId, TensorId),
        (cand_ids, cand_vals, lse): (TensorId, TensorId, TensorId),
        offset: usize,
        parent_base: Option<usize>,
    ) -> Result<()> {
        let f = self.shape(scores).iter().product::<usize>();
        let k = self.shape(cand_ids).last().copied().unwrap_or(0);
        let nc = self.shape(cands).first().copied().unwrap_or(0);
        let types = [(cands, DType::U32), (scores, DType::F32), (chosen, DType::U32), (cand_ids, DType::U32)]
            .into_iter()
            .chain([(cand_vals, DType::F32), (lse, DType::F32)])
            .all(|(t, d)| self.dtype(t) == d);
        let ok = types
            && self.shape(cands) == [nc, CAND_W]
            && self.shape(scores) == [f]
            && self.shape(chosen) == [f]
            && self.shape(cand_ids) == [f, k]
            && self.shape(cand_vals) == [f, k]
            && self.shape(lse).iter().product::<usize>() == f
            && f >= 1
            && k >= 1
            && offset + f * k <= nc
            && nc < ROOT as usize
            && parent_base.is_none_or(|b| b < offset);
        if !ok {
            return Err(Error::shape(
                "tree_select_collect",
                format!(
                    "list {:?}, scores {:?}, chosen {:?}, candidates {:?} and {:?}, lse {:?}, rows {offset}.. and parents \
                     from {parent_base:?}: want u32 [NC, {CAND_W}], f32 and u32 [F], u32 and f32 [F, k], f32 [F], the \
                     F k rows within the list and parents before them",
                    self.shape(cands),
                    self.shape(scores),
                    self.shape(chosen),
                    self.shape(cand_ids),
                    self.shape(cand_vals),
                    self.shape(lse)
                ),
            ));
        }
        let parent_base = parent_base.map_or(ROOT, |b| b as u32);
        let kernel = TreeSelectCollect {
            f,
            k,
            offset,
            parent_base,
        };
        self.add_effect(kernel, &[cands, scores, chosen, cand_ids, cand_vals, lse])
    }

    /// EAGLE-2's rerank of the candidate list `cands` `[NC, CAND_W]` u32 (parents before children): the draft tree
    /// of the `size` best (see [`reference`]). Returns `(ids [size] u32, table [size + 1, TREE_W] u32)`: the
    /// tokens of nodes 1 ..= size (node 0, the root, is the caller's) and every node's tree-table row, node i in
    /// slot i. `size` is at most NC and `MAX_TREE_ROWS - 1`.
    pub fn tree_select(&mut self, cands: TensorId, size: usize) -> Result<(TensorId, TensorId)> {
        let nc = self.shape(cands).first().copied().unwrap_or(0);
        if self.dtype(cands) != DType::U32
            || self.shape(cands) != [nc, CAND_W]
            || !(1..=nc.min(MAX_TREE_ROWS - 1)).contains(&size)
        {
            return Err(Error::shape(
                "tree_select",
                format!(
                    "list {:?} {:?}, size {size}: want u32 [NC, {CAND_W}] and 1 <= size <= min(NC, {})",
                    self.shape(cands),
                    self.dtype(cands),
                    MAX_TREE_ROWS - 1
                ),
            ));
        }
        let o = self.add_node(
            TreeSelect { nc, size },
            &[cands],
            &[
                ("tree_select.ids", &[size], DType::U32),
                ("tree_select.table", &[size + 1, TREE_W], DType::U32),
            ],
        )?;
        Ok((o[0], o[1]))
    }
}

/// CPU reference of `tree_select_collect`: rows `offset ..` of `cands` as the shader writes them.
pub fn collect_reference(
    cands: &mut [u32],
    (scores, chosen): (&[f32], &[u32]),
    (cand_ids, cand_vals, lse): (&[u32], &[f32], &[f32]),
    offset: usize,
    parent_base: u32,
) {
    let k = cand_ids.len() / scores.len().max(1);
    for (c, (&token, &val)) in cand_ids.iter().zip(cand_vals).enumerate() {
        let r = c / k;
        let parent = if parent_base == ROOT {
            ROOT
        } else {
            parent_base.wrapping_add(chosen[r])
        };
        let o = (offset + c) * CAND_W;
        cands[o..o + CAND_W].copy_from_slice(&[child_score(scores[r], val, lse[r]).to_bits(), token, parent]);
    }
}

/// A reranked draft tree: node i + 1 is candidate `cands[i]`, under node `parents[i]` (0: the root); `ids`
/// `[size]` and `table` `[size + 1, TREE_W]` as `tree_select` writes them (padding rows past the nodes).
#[derive(Clone, Debug, PartialEq)]
pub struct Selected {
    pub cands: Vec<usize>,
    pub parents: Vec<usize>,
    pub ids: Vec<u32>,
    pub table: Vec<u32>,
}

/// CPU reference of `tree_select` (EAGLE-2's rerank): the `size` best candidates of `cands` `[NC, CAND_W]` by score
/// (descending in f32's total order, then by row) are kept; one whose parent was not kept (or does not come before
/// it) goes, and so do its descendants. Nodes: the spine first (from the root, the best kept child each time; a
/// target most often keeps a prefix of it, and nodes 1 ..= d then already sit at the positions of depths 1 ..= d,
/// no K/V to move), then the other kept candidates in row order; a node deeper than `MAX_TREE_DEPTH` is left out.
pub fn reference(cands: &[u32], size: usize) -> Selected {
    let nc = cands.len() / CAND_W;
    let score = |c: usize| f32::from_bits(cands[c * CAND_W]);
    let parent = |c: usize| cands[c * CAND_W + 2];
    let mut order: Vec<usize> = (0..nc).collect();
    order.sort_by(|&a, &b| score(b).total_cmp(&score(a)).then(a.cmp(&b)));
    let mut keep = vec![false; nc];
    for &c in order.iter().take(size) {
        keep[c] = true;
    }
    for c in 0..nc {
        let p = parent(c);
        keep[c] &= p == ROOT || ((p as usize) < c && keep[p as usize]);
    }
    let mut spine = Vec::new();
    let mut at = ROOT;
    while let Some(&best) = order.iter().find(|&&c| keep[c] && parent(c) == at) {
        spine.push(best);
        at = best as u32;
    }
    let rest = (0..nc).filter(|&c| keep[c] && !spine.contains(&c));
    let mut node_of: Vec<Option<usize>> = vec![None; nc];
    let mut s = Selected {
        cands: Vec::new(),
        parents: Vec::new(),
        ids: vec![0; size],
        table: vec![0; TREE_W],
    };
    let mut depth = vec![0usize];
    for c in spine.clone().into_iter().chain(rest) {
        let pn = match parent(c) {
            ROOT => Some(0),
            p => node_of[p as usize],
        };
        let Some(pn) = pn.filter(|&pn| depth[pn] < MAX_TREE_DEPTH) else {
            continue;
        };
        let m = s.cands.len() + 1;
        node_of[c] = Some(m);
        s.cands.push(c);
        s.parents.push(pn);
        depth.push(depth[pn] + 1);
        s.ids[m - 1] = cands[c * CAND_W + 1];
        let d = depth[pn];
        let path: Vec<u32> = s.table[pn * TREE_W + 1..=pn * TREE_W + 1 + d].to_vec();
        s.table.push(d as u32 + 1);
        s.table.extend(path);
        s.table.extend(std::iter::repeat_n(m as u32, TREE_W - 2 - d));
    }
    for m in s.cands.len() + 1..=size {
        s.table.push(0);
        s.table.extend(std::iter::repeat_n(m as u32, TREE_W - 1));
    }
    s
}

pub fn variants() -> Vec<ShaderKey> {
    vec![key("tree_select_collect"), key("tree_select_rerank")]
}
