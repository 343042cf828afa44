//! InfLLM-v2 sparse attention (stage 6): causal GQA attention of each query token over the keys of its selected KV
//! blocks only (the `block_topk` selection), flash-style.
//!
//! Inputs as `attention_prefill` / `attention_decode` (q `[n_tokens, n_heads, head_dim]` at positions `vars.pos ..`,
//! caches `[n_kv, max_ctx, head_dim]`, `scale`), plus `sel` `[n_tokens, n_kv, budget]` u32: for each token and KV
//! head, ascending unique block ids padded with `block_topk::EMPTY`, shared by the query heads of that KV head's
//! group. Block `b` covers keys `b * block_size .. (b + 1) * block_size`; query `t` attends to the keys of its
//! selected blocks at positions `<= pos + t` (and `< max_ctx`); ids past the query's block are ignored. A
//! selection that covers every block `0 ..= (pos + t) / block_size` gives dense causal attention. A row that sees
//! no key (an empty selection; `block_topk` always selects the query's own block) gets output 0.
//!
//! Two variants, by chunk size: decode (`n_tokens <= MAX_TOKENS`) splits each selection's slots across workgroups
//! (each writes a partial output with its running max and sum) and a second dispatch combines them, launching only
//! the splits that can hold a selected block at this step (counts set per step, like `attention_decode`); prefill
//! (longer chunks) runs one workgroup per (token, KV head, group of up to 16 query heads) over the whole selection.

use super::attention_decode::{tree_key_slot, tree_row_depth, with_tree, CombineParams, MAX_TREE_ROWS, TREE_W};
use super::attention_prefill::{kv_elem_bytes, kv_f16, AttnShape, HEAD_DIMS};
use super::block_topk::query_block;
use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{grid, Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};

/// Most query tokens for the split (decode) variant; longer chunks use the prefill variant.
pub const MAX_TOKENS: usize = 8;
/// Most splits per (token, KV head) in the decode variant, and the fewest selection slots a split covers (4 blocks
/// of 64 = 256 keys, like `attention_decode::MIN_SPLIT_KEYS`).
pub const MAX_SPLITS: usize = 32;
pub const MIN_SPLIT_SLOTS: usize = 4;
/// Query heads of one GQA group per workgroup; a larger group takes more workgroups along z.
const ROWS: usize = 16;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct SparseParams {
    n_tokens: u32,
    n_heads: u32,
    n_kv: u32,
    group: u32,
    max_ctx: u32,
    pos: u32,
    budget: u32,
    block_size: u32,
    splits: u32,
    slots_per_split: u32,
    row_blocks: u32,
    scale: f32,
}

/// How the selection slots are cut: `splits` workgroups of `slots` slots each (one of all slots for prefill).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotSplit {
    pub splits: usize,
    pub slots: usize,
}

/// The decode variant's split of `budget` slots: at least `MIN_SPLIT_SLOTS` slots each, at most `MAX_SPLITS`.
pub fn split_for(budget: usize) -> SlotSplit {
    let slots = budget.div_ceil(MAX_SPLITS).max(MIN_SPLIT_SLOTS);
    SlotSplit {
        splits: budget.div_ceil(slots).max(1),
        slots,
    }
}

#[derive(Debug)]
pub struct AttentionSparse {
    shape: AttnShape,
    budget: usize,
    block_size: usize,
    scale: f32,
    /// `Some` for the decode variant (split + combine), `None` for prefill.
    split: Option<SlotSplit>,
    /// The caches hold f16 (lib/kv_cache.wgsl).
    kv_f16: bool,
    /// A draft tree's step (the decode variant; node tensor 4 the tree table, the outputs after it).
    tree: bool,
}

fn main_key(head_dim: usize, direct: bool, kv_f16: bool, tree: bool) -> ShaderKey {
    let key = ShaderKey::new("attention_sparse")
        .def("HD", format!("{head_dim}u"))
        .def("ROWS", format!("{ROWS}u"))
        .flag("DIRECT", direct)
        .flag("KV_F16", kv_f16);
    with_tree(key, tree)
}

fn combine_key(head_dim: usize) -> ShaderKey {
    ShaderKey::new("attention_sparse")
        .def("HD", format!("{head_dim}u"))
        .flag("COMBINE", true)
}

impl AttentionSparse {
    /// Node tensor of slot `i` (0 q, 1 k_cache, 2 v_cache, 3 sel, 4 out, 5 partial_o, 6 partial_ml): the outputs
    /// come after a tree step's table.
    fn at(&self, i: usize) -> usize {
        if i >= 4 && self.tree {
            i + 1
        } else {
            i
        }
    }
    fn row_blocks(&self) -> usize {
        self.shape.group().div_ceil(ROWS)
    }
    fn slots(&self) -> SlotSplit {
        self.split.unwrap_or(SlotSplit {
            splits: 1,
            slots: self.budget,
        })
    }
    /// Splits that can hold a selected block this step: the selections are ascending unique ids up to the last
    /// token's query block, so at most `qb_last + 1` slots are filled.
    fn active_splits(&self, vars: &StepVars) -> usize {
        let s = &self.shape;
        let SlotSplit { splits, slots } = self.slots();
        let nb = s.max_ctx.div_ceil(self.block_size);
        let last = (vars.pos as usize + s.n_tokens).min(s.max_ctx).max(1) - 1;
        let filled = (query_block(last, self.block_size, nb) + 1).min(self.budget);
        filled.div_ceil(slots).clamp(1, splits)
    }
}

impl Kernel for AttentionSparse {
    fn name(&self) -> &'static str {
        "attention_sparse"
    }
    /// Node tensors: 0 q, 1 k_cache, 2 v_cache, 3 sel, (a tree step: 4 tree), then out and (decode) partial_o,
    /// partial_ml.
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        let s = &self.shape;
        let z = (s.n_tokens * self.row_blocks()) as u32;
        match self.split {
            None => vec![Dispatch {
                shader: main_key(s.head_dim, true, self.kv_f16, false),
                bindings: (0..5).map(Bind::Tensor).collect(),
                workgroups: [1, s.n_kv as u32, z],
            }],
            Some(split) => vec![
                Dispatch {
                    shader: main_key(s.head_dim, false, self.kv_f16, self.tree),
                    bindings: [0, 1, 2, 3, 5, 6]
                        .map(|i| Bind::Tensor(self.at(i)))
                        .into_iter()
                        .chain(self.tree.then_some(Bind::Tensor(4)))
                        .collect(),
                    workgroups: [split.splits as u32, s.n_kv as u32, z],
                },
                Dispatch {
                    shader: combine_key(s.head_dim),
                    bindings: [5, 6, 4].map(|i| Bind::Tensor(self.at(i))).to_vec(),
                    workgroups: grid(s.n_tokens * s.n_heads * s.head_dim / 4, 64, caps.max_workgroups_per_dim),
                },
            ],
        }
    }
    fn params(&self, i: usize, vars: &StepVars) -> Params {
        let s = &self.shape;
        let split = self.slots();
        if i == 0 {
            Params::of(&SparseParams {
                n_tokens: s.n_tokens as u32,
                n_heads: s.n_heads as u32,
                n_kv: s.n_kv as u32,
                group: s.group() as u32,
                max_ctx: s.max_ctx as u32,
                pos: vars.pos,
                budget: self.budget as u32,
                block_size: self.block_size as u32,
                splits: split.splits as u32,
                slots_per_split: split.slots as u32,
                row_blocks: self.row_blocks() as u32,
                scale: self.scale,
            })
        } else {
            Params::of(&CombineParams {
                n_rows: (s.n_tokens * s.n_heads) as u32,
                splits: split.splits as u32,
                first: 0,
                end: self.active_splits(vars) as u32,
            })
        }
    }
    /// Decode: only the splits that can hold selected blocks this step are launched.
    fn step_workgroups(&self, i: usize, vars: &StepVars) -> Option<[u32; 3]> {
        let s = &self.shape;
        (i == 0 && self.split.is_some()).then(|| {
            [
                self.active_splits(vars) as u32,
                s.n_kv as u32,
                (s.n_tokens * self.row_blocks()) as u32,
            ]
        })
    }
    /// Assumes a full cache and full selections (cost has no step variables): each token attends to
    /// `min(budget * block_size, max_ctx)` keys. Flops: QK^T and PV over them. Bytes read: K and V of those keys
    /// once per (token, KV head, row block), q, the selections, and the partials (decode); written: output and
    /// partials.
    fn cost(&self) -> Cost {
        let s = &self.shape;
        let keys = (self.budget * self.block_size).min(s.max_ctx) as u64;
        let rows = (s.n_tokens * s.n_kv * self.row_blocks()) as u64;
        let kv = 2 * kv_elem_bytes(self.kv_f16) * keys * s.head_dim as u64 * rows;
        let act = 4 * (s.n_tokens * s.n_heads * s.head_dim) as u64;
        let sel = 4 * (s.n_tokens * s.n_kv * self.budget) as u64;
        let partials = self.split.map_or(0, |sp| {
            4 * (s.n_tokens * s.n_heads * sp.splits * (s.head_dim + 2)) as u64
        });
        Cost {
            bytes_read: kv + act + sel + partials,
            bytes_written: partials + act,
            flops: 4 * keys * (s.n_tokens * s.n_heads * s.head_dim) as u64,
        }
    }
    /// Node tensors: 0 q, 1 k_cache, 2 v_cache, 3 sel, (4 tree), then out (the decode variant's partials are
    /// scratch).
    fn reference(&self, io: &[HostIo], vars: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| {
            let (q, k, v) = (io[0].f32()?, io[1].f32()?, io[2].f32()?);
            let (pos, sel) = (vars.pos as usize, io[3].u32());
            let (s, b, scale) = (self.shape, self.block_size, self.scale);
            let y = match self.tree {
                true => reference_tree(&q, (&k, &v), &sel, (s, b), (pos, &io[4].u32()), scale),
                false => reference(&q, &k, &v, &sel, s, b, pos, scale),
            };
            Ok(vec![Expected::at(self.at(4), y)])
        })
    }
}

impl Graph {
    /// Causal attention of `q` `[n_tokens, n_heads, head_dim]` (f32, positions `vars.pos ..`) over the keys of the
    /// blocks in `sel` `[n_tokens, n_kv, budget]` (u32, from `block_topk`) of the caches `[n_kv, max_ctx,
    /// head_dim]`, scores scaled by `scale`. Returns `[n_tokens, n_heads, head_dim]` f32. The caches must already
    /// hold this step's keys and values (`kv_write` before this node).
    pub fn attention_sparse(
        &mut self,
        q: TensorId,
        k_cache: TensorId,
        v_cache: TensorId,
        sel: TensorId,
        block_size: usize,
        scale: f32,
    ) -> Result<TensorId> {
        self.attention_sparse_impl(q, (k_cache, v_cache), sel, (block_size, scale), None)
    }

    /// [`Graph::attention_sparse`] for the nodes of a draft tree: row r at position `vars.pos + depth(r)` seeing
    /// its selected blocks of the keys before `vars.pos` and of its path, in the slots `tree` `[n, TREE_W]` u32
    /// (`attention_decode`'s tree table) names. Row r equals the one-query step at its position over a cache
    /// holding its path in order, bit for bit. At most `MAX_TREE_ROWS` rows.
    pub fn attention_sparse_tree(
        &mut self,
        q: TensorId,
        (k_cache, v_cache): (TensorId, TensorId),
        sel: TensorId,
        (block_size, scale): (usize, f32),
        tree: TensorId,
    ) -> Result<TensorId> {
        self.attention_sparse_impl(q, (k_cache, v_cache), sel, (block_size, scale), Some(tree))
    }

    fn attention_sparse_impl(
        &mut self,
        q: TensorId,
        (k_cache, v_cache): (TensorId, TensorId),
        sel: TensorId,
        (block_size, scale): (usize, f32),
        tree: Option<TensorId>,
    ) -> Result<TensorId> {
        let op = "attention_sparse";
        let shape = AttnShape::check(self, op, q, k_cache, v_cache)?;
        let ss = self.shape(sel).to_vec();
        if ss.len() != 3
            || ss[0] != shape.n_tokens
            || ss[1] != shape.n_kv
            || ss[2] == 0
            || self.dtype(sel) != DType::U32
        {
            return Err(Error::shape(
                op,
                format!(
                    "sel {ss:?} {:?}: expected u32 [n_tokens = {}, n_kv = {}, budget >= 1]",
                    self.dtype(sel),
                    shape.n_tokens,
                    shape.n_kv
                ),
            ));
        }
        if block_size == 0 || block_size > u32::MAX as usize / 2 || !scale.is_finite() {
            return Err(Error::shape(
                op,
                format!("block_size {block_size} (need >= 1), scale {scale} (need finite)"),
            ));
        }
        let budget = ss[2];
        let row_blocks = shape.group().div_ceil(ROWS);
        if shape.n_tokens * row_blocks > u16::MAX as usize || shape.n_tokens * shape.n_kv * budget > u32::MAX as usize {
            return Err(Error::shape(
                op,
                format!(
                    "{} tokens x {row_blocks} row blocks, budget {budget}: too large",
                    shape.n_tokens
                ),
            ));
        }
        let (n, h, d) = (shape.n_tokens, shape.n_heads, shape.head_dim);
        if let Some(t) = tree {
            if n > MAX_TREE_ROWS || self.shape(t) != [n, TREE_W] || self.dtype(t) != DType::U32 {
                return Err(Error::shape(
                    op,
                    format!(
                        "tree {:?} {:?} for {n} queries: want u32 [n, {TREE_W}], n <= {MAX_TREE_ROWS}",
                        self.shape(t),
                        self.dtype(t)
                    ),
                ));
            }
        }
        // A tree's rows take the decode variant, as a one-query step does.
        let split = (n <= MAX_TOKENS || tree.is_some()).then(|| split_for(budget));
        let kernel = AttentionSparse {
            shape,
            budget,
            block_size,
            scale,
            split,
            kv_f16: kv_f16(self, k_cache),
            tree: tree.is_some(),
        };
        let inputs: Vec<TensorId> = [q, k_cache, v_cache, sel].into_iter().chain(tree).collect();
        let outs = match split {
            Some(sp) => self.add_node(
                kernel,
                &inputs,
                &[
                    ("attn_out", &[n, h, d], DType::F32),
                    ("attn_partial_o", &[n, h, sp.splits, d], DType::F32),
                    ("attn_partial_ml", &[n, h, sp.splits, 2], DType::F32),
                ],
            )?,
            None => self.add_node(kernel, &inputs, &[("attn_out", &[n, h, d], DType::F32)])?,
        };
        Ok(outs[0])
    }
}

/// CPU reference in f64 with a two-pass softmax: query `t` (position `pos + t`) of head `h` attends to the keys
/// `j <= pos + t`, `j < max_ctx`, of the distinct blocks in its KV head's row of `sel` `[n_tokens, n_kv, budget]`
/// (ids past its block ignored); no key gives 0. Returns `[n_tokens, n_heads, head_dim]`.
#[allow(clippy::too_many_arguments)]
pub fn reference(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    sel: &[u32],
    s: AttnShape,
    block_size: usize,
    pos: usize,
    scale: f32,
) -> Vec<f32> {
    let rows = |t: usize| (pos + t, None);
    reference_rows(q, (k_cache, v_cache), sel, (s, block_size), rows, scale)
}

/// [`reference`] for a draft tree's step: row r at position `pos + depth(r)`, its keys at positions `>= pos` in
/// the slots of its path (`table` `[n_tokens, TREE_W]`, `attention_decode`'s tree table).
pub fn reference_tree(
    q: &[f32],
    (k_cache, v_cache): (&[f32], &[f32]),
    sel: &[u32],
    (s, block_size): (AttnShape, usize),
    (pos, table): (usize, &[u32]),
    scale: f32,
) -> Vec<f32> {
    let rows = |t: usize| {
        let row = &table[t * TREE_W..(t + 1) * TREE_W];
        (pos + tree_row_depth(row), Some(row))
    };
    reference_rows(q, (k_cache, v_cache), sel, (s, block_size), rows, scale)
}

/// The reference with row t at `rows(t).0`, its keys at positions `>= pos` through the tree row `rows(t).1`.
fn reference_rows<'a>(
    q: &[f32],
    (k_cache, v_cache): (&[f32], &[f32]),
    sel: &[u32],
    (s, block_size): (AttnShape, usize),
    rows: impl Fn(usize) -> (usize, Option<&'a [u32]>),
    scale: f32,
) -> Vec<f32> {
    let (hd, ctx) = (s.head_dim, s.max_ctx);
    let budget = sel.len() / (s.n_tokens * s.n_kv).max(1);
    let mut out = vec![0f32; s.n_tokens * s.n_heads * hd];
    for t in 0..s.n_tokens {
        let (at, tree_row) = rows(t);
        let end = (at + 1).min(ctx);
        // The cache slot of the key at position j: a tree row's path keys sit in its slots.
        let base = at - tree_row.map_or(0, tree_row_depth);
        let slot = |j: usize| match tree_row {
            Some(r) => tree_key_slot(r, base, j).min(ctx - 1),
            None => j,
        };
        for kvh in 0..s.n_kv {
            let mut blocks: Vec<usize> = sel[(t * s.n_kv + kvh) * budget..][..budget]
                .iter()
                .map(|&b| b as usize)
                .filter(|&b| b <= (end - 1) / block_size)
                .collect();
            blocks.sort_unstable();
            blocks.dedup();
            let keys: Vec<usize> = blocks
                .iter()
                .flat_map(|&b| b * block_size..((b + 1) * block_size).min(end))
                .map(slot)
                .collect();
            for h in kvh * s.group()..(kvh + 1) * s.group() {
                let qr = &q[(t * s.n_heads + h) * hd..][..hd];
                let scores: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        let kr = &k_cache[(kvh * ctx + j) * hd..][..hd];
                        qr.iter().zip(kr).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * scale as f64
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let mut sum = 0f64;
                let mut acc = vec![0f64; hd];
                for (&j, &sc) in keys.iter().zip(&scores) {
                    let p = (sc - max).exp();
                    sum += p;
                    let vr = &v_cache[(kvh * ctx + j) * hd..][..hd];
                    acc.iter_mut().zip(vr).for_each(|(a, &v)| *a += p * v as f64);
                }
                let o = &mut out[(t * s.n_heads + h) * hd..][..hd];
                if sum > 0.0 {
                    o.iter_mut().zip(&acc).for_each(|(o, a)| *o = (a / sum) as f32);
                }
            }
        }
    }
    out
}

pub fn variants() -> Vec<ShaderKey> {
    HEAD_DIMS
        .iter()
        .flat_map(|&d| {
            [false, true]
                .into_iter()
                .flat_map(move |f| [main_key(d, false, f, false), main_key(d, true, f, false), main_key(d, false, f, true)])
                .chain([combine_key(d)])
        })
        .collect()
}
