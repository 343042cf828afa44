//! InfLLM-v2 block selection (stage 5): from block scores `[n_tokens, n_kv, nb]`, the KV blocks each query token's
//! sparse attention reads, per KV head: `sel` `[n_tokens, n_kv, budget]` u32, ascending block ids, padded with
//! [`EMPTY`].
//!
//! The rule, for the token at absolute position `p = pos + t`, its query block `qb = p / block_size` (clamped to
//! `nb - 1`), `I = init_blocks`, `L = local_blocks`:
//! - forced: the init blocks `0 .. I` and the local blocks `qb - L ..= qb` (the query's own block and the `L`
//!   before it), both clipped to `0 ..= qb`, each counted once where they overlap;
//! - then the candidates `I <= b < qb - L`, by score descending, ties to the lower block id, until `budget` blocks
//!   are selected in total or none remain. Blocks after `qb` are never selected and their scores never read.
//!   Candidates compare by a total order on the f32 bits: NaN below every number (-inf included), -0 equal to +0.
//!
//! Counting, from the sources: `budget` is the total, forced blocks included. MiniCPM4's model code
//! (`modeling_minicpm.py`, `compressed_attention`) sets `local_blocks = window_size / block_size` and selects
//! `topk = sparse_config.topk + local_blocks` blocks per (token, KV head) with `torch.topk` over block scores in
//! which the init blocks and the blocks `b` with `b <= qb <= b + local_blocks` (so the current block counts as well
//! as the `local_blocks` before it) are +inf (OpenBMB/infllmv2_cuda_impl, `max_pooling_1d`), then drops ids past
//! `qb`. PaddlePaddle/FastDeploy's InfLLM-v2 backend documents the same: 96 blocks for MiniCPM4 (topk 64, window
//! 2048, block 64), of which 34 forced (1 init, 32 local, the current one) and at most 62 by score, with ties to
//! the lower block id (`torch.topk` leaves ties unspecified; this op fixes them so). [`BlockSelection::infllm_v2`]
//! builds that configuration. Short contexts (below `dense_len`) use dense attention in those implementations;
//! that switch belongs to the model, and with `budget >= qb + 1` this op selects every block `0 ..= qb` anyway.

use super::attention_decode::{tree_row_depth, with_tree, TREE_W};
use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{grid, Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};
use super::topk::descending;

/// Padding of the unused selection slots (after the selected ids).
pub const EMPTY: u32 = u32::MAX;

/// The selection rule's parameters, fixed when the graph is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSelection {
    /// Keys per block (64 in MiniCPM4).
    pub block_size: usize,
    /// Blocks at the start of the sequence always selected.
    pub init_blocks: usize,
    /// Blocks before the query's own block always selected (the query's block is selected as well).
    pub local_blocks: usize,
    /// Blocks selected per (token, KV head), forced ones included; at least `init_blocks + local_blocks + 1`.
    pub budget: usize,
}

impl BlockSelection {
    /// The selection of a MiniCPM4 `sparse_config` (`block_size`, `init_blocks`, `window_size`, `topk`):
    /// `local_blocks = window_size / block_size`, `budget = topk + local_blocks` (see the module doc).
    pub fn infllm_v2(block_size: usize, init_blocks: usize, window_size: usize, topk: usize) -> BlockSelection {
        let local_blocks = window_size / block_size.max(1);
        BlockSelection {
            block_size,
            init_blocks,
            local_blocks,
            budget: topk + local_blocks,
        }
    }

    /// Most forced blocks a token can have.
    pub fn max_forced(&self) -> usize {
        self.init_blocks + self.local_blocks + 1
    }

    fn check(&self, op: &'static str) -> Result<()> {
        if self.block_size == 0 || self.budget == 0 || self.budget < self.max_forced() {
            return Err(Error::shape(
                op,
                format!("{self:?}: need block_size >= 1 and budget >= init_blocks + local_blocks + 1"),
            ));
        }
        if [self.block_size, self.init_blocks, self.local_blocks, self.budget]
            .iter()
            .any(|&x| x > u32::MAX as usize / 2)
        {
            return Err(Error::shape(op, format!("{self:?}: parameters must be below 2^31")));
        }
        Ok(())
    }
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct BlockTopkParams {
    rows: u32,
    n_kv: u32,
    nb: u32,
    budget: u32,
    block_size: u32,
    init_blocks: u32,
    local_blocks: u32,
    pos: u32,
}

#[derive(Debug)]
pub struct BlockTopk {
    n_tokens: usize,
    n_kv: usize,
    nb: usize,
    sel: BlockSelection,
    /// `None`: by adapter.
    variant: Option<TopkVariant>,
    /// A draft tree's step: token t at `pos` + its depth in the tree table (node tensor 1).
    tree: bool,
}

impl BlockTopk {
    fn variant(&self, caps: &Caps) -> TopkVariant {
        self.variant.unwrap_or(if caps.cpu_adapter {
            TopkVariant::Serial
        } else {
            TopkVariant::Workgroup
        })
    }
}

/// Which kernel selects: the default picks by adapter (`Serial` on CPU adapters, `Workgroup` elsewhere).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopkVariant {
    /// One invocation per row, no barriers or workgroup atomics (lavapipe runs a workgroup as 8-lane chunks and
    /// switches between them at each barrier). 128 tokens x 2 KV heads at nb 512: 3.2 ms on lavapipe (Workgroup:
    /// 31 ms), 0.70 ms on an H200.
    Serial,
    /// One workgroup of 64 per row: the histograms and scans shared, the row's blocks split among invocations.
    /// The same 256 rows: 0.085 ms on an H200.
    Workgroup,
}

/// Workgroup sizes: 8 rows per workgroup (one lavapipe SIMD chunk) for `Serial`, 64 invocations per row otherwise.
const WG_SERIAL: usize = 8;
const WG_ROW: usize = 64;

fn key(variant: TopkVariant, tree: bool) -> ShaderKey {
    let serial = variant == TopkVariant::Serial;
    let key = ShaderKey::new("block_topk")
        .def("WG", format!("{}u", if serial { WG_SERIAL } else { WG_ROW }))
        .flag("SERIAL", serial);
    with_tree(key, tree)
}

impl Kernel for BlockTopk {
    fn name(&self) -> &'static str {
        "block_topk"
    }
    /// Node tensors: 0 scores, 1 sel; a tree step's: 0 scores, 1 tree, 2 sel.
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        let variant = self.variant(caps);
        let per = if variant == TopkVariant::Serial { WG_SERIAL } else { 1 };
        let bindings = match self.tree {
            true => vec![Bind::Tensor(0), Bind::Tensor(2), Bind::Tensor(1)],
            false => vec![Bind::Tensor(0), Bind::Tensor(1)],
        };
        vec![Dispatch {
            shader: key(variant, self.tree),
            bindings,
            workgroups: grid(self.n_tokens * self.n_kv, per, caps.max_workgroups_per_dim),
        }]
    }
    fn params(&self, _: usize, vars: &StepVars) -> Params {
        Params::of(&BlockTopkParams {
            rows: (self.n_tokens * self.n_kv) as u32,
            n_kv: self.n_kv as u32,
            nb: self.nb as u32,
            budget: self.sel.budget as u32,
            block_size: self.sel.block_size as u32,
            init_blocks: self.sel.init_blocks as u32,
            local_blocks: self.sel.local_blocks as u32,
            pos: vars.pos,
        })
    }
    /// Assumes every row's query block is the last (cost has no step variables): the candidate scores are read
    /// by the 8 radix passes and the 2 final passes; the selection is written.
    fn cost(&self) -> Cost {
        let rows = (self.n_tokens * self.n_kv) as u64;
        Cost {
            bytes_read: 10 * 4 * rows * self.nb as u64,
            bytes_written: 4 * rows * self.sel.budget as u64,
            // No arithmetic: one key and comparison per score and pass, counted as the op's work.
            flops: 10 * rows * self.nb as u64,
        }
    }
    /// Node tensors: 0 scores, 1 sel (a tree step's: 1 tree, 2 sel). The rule fixes ties (to the lower id), so the
    /// selection from the node's own scores is one list.
    fn reference(&self, io: &[HostIo], vars: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| {
            let (kv, nb, pos) = (self.n_kv, self.nb, vars.pos as usize);
            let positions = match self.tree {
                true => tree_positions(&io[1].u32(), pos),
                false => (pos..pos + self.n_tokens).collect(),
            };
            let sel = reference_at(&io[0].f32()?, kv, nb, self.sel, &positions);
            Ok(vec![Expected::at(1 + usize::from(self.tree), sel.iter().map(|&b| b as f32).collect())])
        })
    }
    /// Exact, as the op tests: the kernel compares keys and copies ids.
    fn check_bound(&self, _: &Caps) -> f64 {
        0.0
    }
}

impl Graph {
    /// The InfLLM-v2 block selection of `scores` `[n_tokens, n_kv, nb]` f32 (block scores of the tokens at
    /// positions `vars.pos ..`): `sel` `[n_tokens, n_kv, sel.budget]` u32, ascending block ids padded with
    /// [`EMPTY`], by the rule of the module doc.
    pub fn block_topk(&mut self, scores: TensorId, sel: BlockSelection) -> Result<TensorId> {
        self.block_topk_impl(scores, sel, None, None)
    }

    /// [`Graph::block_topk`] for a draft tree's step: token t at position `vars.pos` plus its depth in `tree`
    /// `[n_tokens, TREE_W]` u32 (`attention_decode`'s tree table).
    pub fn block_topk_tree(&mut self, scores: TensorId, sel: BlockSelection, tree: TensorId) -> Result<TensorId> {
        self.block_topk_impl(scores, sel, None, Some(tree))
    }

    /// [`Graph::block_topk_tree`] with the kernel variant forced.
    pub fn block_topk_tree_variant(
        &mut self,
        scores: TensorId,
        sel: BlockSelection,
        tree: TensorId,
        v: TopkVariant,
    ) -> Result<TensorId> {
        self.block_topk_impl(scores, sel, Some(v), Some(tree))
    }

    /// [`Graph::block_topk`] with the kernel variant forced (tests and benches run both on one adapter).
    pub fn block_topk_variant(&mut self, scores: TensorId, sel: BlockSelection, v: TopkVariant) -> Result<TensorId> {
        self.block_topk_impl(scores, sel, Some(v), None)
    }

    fn block_topk_impl(
        &mut self,
        scores: TensorId,
        sel: BlockSelection,
        variant: Option<TopkVariant>,
        tree: Option<TensorId>,
    ) -> Result<TensorId> {
        let shape = self.shape(scores).to_vec();
        if shape.len() != 3 || self.dtype(scores) != DType::F32 || shape.contains(&0) {
            return Err(Error::shape(
                "block_topk",
                format!(
                    "scores {shape:?} {:?}: expected f32 [n_tokens, n_kv, nb], all nonzero",
                    self.dtype(scores)
                ),
            ));
        }
        sel.check("block_topk")?;
        let (n_tokens, n_kv, nb) = (shape[0], shape[1], shape[2]);
        if nb > u32::MAX as usize / 2 || n_tokens * n_kv * nb.max(sel.budget) > u32::MAX as usize {
            return Err(Error::shape(
                "block_topk",
                format!("scores {shape:?} with budget {}: too large", sel.budget),
            ));
        }
        if let Some(t) = tree.filter(|&t| self.shape(t) != [n_tokens, TREE_W] || self.dtype(t) != DType::U32) {
            return Err(Error::shape(
                "block_topk",
                format!("tree {:?}: expected u32 [{n_tokens}, {TREE_W}]", self.shape(t)),
            ));
        }
        let kernel = BlockTopk {
            n_tokens,
            n_kv,
            nb,
            sel,
            variant,
            tree: tree.is_some(),
        };
        let out = [n_tokens, n_kv, sel.budget];
        let inputs: Vec<TensorId> = std::iter::once(scores).chain(tree).collect();
        Ok(self.add_node(kernel, &inputs, &[("block_sel", &out, DType::U32)])?[0])
    }
}

/// The query block of the token at absolute position `p` among `nb` blocks of `block_size` (clamped to `nb - 1`).
pub fn query_block(p: usize, block_size: usize, nb: usize) -> usize {
    (p / block_size.max(1)).min(nb.saturating_sub(1))
}

/// The positions of a tree step's tokens: `pos` plus each row's depth in `table` `[n, TREE_W]`.
pub fn tree_positions(table: &[u32], pos: usize) -> Vec<usize> {
    table.chunks(TREE_W).map(|row| pos + tree_row_depth(row)).collect()
}

/// CPU reference: `scores` `[n_tokens, n_kv, nb]` of the tokens at positions `pos ..` -> `sel` `[n_tokens, n_kv,
/// budget]`, straight from the rule of the module doc (forced blocks, then a stable sort of the candidates).
pub fn reference(scores: &[f32], n_tokens: usize, n_kv: usize, nb: usize, s: BlockSelection, pos: usize) -> Vec<u32> {
    let positions: Vec<usize> = (pos..pos + n_tokens).collect();
    reference_at(scores, n_kv, nb, s, &positions)
}

/// [`reference`] with token t at `positions[t]`.
pub fn reference_at(scores: &[f32], n_kv: usize, nb: usize, s: BlockSelection, positions: &[usize]) -> Vec<u32> {
    let mut out = Vec::with_capacity(positions.len() * n_kv * s.budget);
    for (t, &p) in positions.iter().enumerate() {
        let qb = query_block(p, s.block_size, nb);
        let local_lo = qb.saturating_sub(s.local_blocks);
        for h in 0..n_kv {
            let row = &scores[(t * n_kv + h) * nb..][..nb];
            let mut chosen: Vec<usize> = (0..=qb).filter(|&b| b < s.init_blocks || b >= local_lo).collect();
            let mut cands: Vec<usize> = (s.init_blocks..local_lo).collect();
            // A larger score first, NaN after every number, -0 equal to +0; ties to the lower id.
            cands.sort_by(|&a, &b| descending(row[a], row[b]).then(a.cmp(&b)));
            let room = s.budget.saturating_sub(chosen.len());
            chosen.extend(cands.into_iter().take(room));
            chosen.sort_unstable();
            chosen.resize(s.budget, EMPTY as usize);
            out.extend(chosen.iter().map(|&b| b as u32));
        }
    }
    out
}

pub fn variants() -> Vec<ShaderKey> {
    [false, true]
        .into_iter()
        .flat_map(|tree| [key(TopkVariant::Serial, tree), key(TopkVariant::Workgroup, tree)])
        .collect()
}
