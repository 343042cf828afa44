//! Causal GQA attention for a few query tokens (decode, speculative verification), split along the keys across
//! workgroups (flash-decoding), then combined.
//!
//! KV cache layout (see `kv_write`): K and V caches are f32 or f16 `[n_kv_heads, max_ctx, head_dim]`, each head's
//! positions contiguous. Query `i` sits at position `vars.pos + i` and attends to keys `0 ..= pos + i`; the keys
//! present are `kv_len = pos + n_q`, re-read from the params each run, so one plan serves every decode step.
//! The splits are fixed when the graph is built (from `max_ctx`): split `s` covers the absolute keys `[s * chunk,
//! (s + 1) * chunk)`, and only the splits that hold keys some query sees are launched. Because the split and tile
//! boundaries depend on key positions alone, never on the number of queries, row `r` of a step of many queries
//! equals the one-query step at the same position bit for bit (keys a row does not see add exact zeros): speculative
//! verification computes what plain decoding would. Dispatch 1 writes each split's unnormalized output with its
//! running max and sum (the node's extra outputs `attn_partial_o` and `attn_partial_ml`); dispatch 2 combines them.
//! When one split holds every key of the step (short contexts), that split writes the output and dispatch 2 is
//! not recorded: the same arithmetic as the combine of one split, one dispatch fewer per layer.
//! Tree form ([`Graph::attention_decode_tree`]): the rows are the nodes of a speculative draft tree, written side by
//! side into the cache; each row attends to the cached prefix and its own path (lib/attn_tree.wgsl), and equals
//! the one-query step over a cache holding that path in order, bit for bit.

use super::attention_prefill::{check_window, cpu_kernel, kv_elem_bytes, kv_f16, AttnShape, DENSE_HEAD_DIMS};
use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{grid, Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};

/// Most query tokens per call (a longer chunk belongs to `attention_prefill`).
pub const MAX_TOKENS: usize = 8;
/// A tree step's table `[n_q, TREE_W]` u32: per row its depth, then the slots (relative to `pos`) of its path at
/// depths 0 ..= depth (its own last), then its own slot repeated. Rows sit at positions `pos + depth`.
pub const TREE_W: usize = 16;
/// The deepest node of a tree step.
pub const MAX_TREE_DEPTH: usize = TREE_W - 2;
/// Most rows of a tree step.
pub const MAX_TREE_ROWS: usize = 64;
/// Most splits per kv head, and the fewest keys a split covers at full context.
pub const MAX_SPLITS: usize = 32;
pub const MIN_SPLIT_KEYS: usize = 256;
/// Rows (query token x head of a GQA group) per workgroup of dispatch 1; more rows take more workgroups along z.
/// Fewer for head_dim 256, so the queries and scores stay within WebGPU's guaranteed 16 KiB of workgroup memory.
fn rows_for(head_dim: usize) -> usize {
    if head_dim > 128 {
        8
    } else {
        16
    }
}

/// Splits for a cache of `max_ctx` positions: each covers at least `MIN_SPLIT_KEYS` keys at full context.
pub fn splits_for(max_ctx: usize) -> usize {
    (max_ctx / MIN_SPLIT_KEYS).clamp(1, MAX_SPLITS)
}

/// Keys per split for a cache of `max_ctx` positions in `splits` splits: at least `MIN_SPLIT_KEYS`, whole key tiles
/// (64, `TK` in lib/attn_tile.wgsl), and `splits * chunk >= max_ctx`.
fn chunk_for(max_ctx: usize, splits: usize) -> usize {
    max_ctx.div_ceil(splits).max(MIN_SPLIT_KEYS).next_multiple_of(64)
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct SplitParams {
    n_q: u32,
    n_heads: u32,
    n_kv: u32,
    group: u32,
    max_ctx: u32,
    pos: u32,
    splits: u32,
    scale: f32,
    window: u32,
    chunk: u32,
    first: u32,
    single: u32,
}

/// The combine dispatch's parameters (lib/attn_combine.wgsl), shared with `attention_sparse`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(super) struct CombineParams {
    pub n_rows: u32,
    /// Stride of the partials.
    pub splits: u32,
    /// Splits `first .. end` were written this step; the rest hold stale partials and are skipped.
    pub first: u32,
    pub end: u32,
}

#[derive(Debug)]
pub struct AttentionDecode {
    shape: AttnShape,
    splits: usize,
    scale: f32,
    /// Sliding window (keys per query), 0 for none.
    window: usize,
    /// The tree form: node tensor 3 is the tree table, and the others follow it.
    tree: bool,
    /// The caches hold f16 (lib/kv_cache.wgsl).
    kv_f16: bool,
}

/// The tree form's flag and table width (also `rope_kv`'s).
pub(crate) fn with_tree(key: ShaderKey, tree: bool) -> ShaderKey {
    match tree {
        true => key.flag("TREE", true).def("TREE_W", format!("{TREE_W}u")),
        false => key,
    }
}

fn split_key(head_dim: usize, tree: bool, kv_f16: bool) -> ShaderKey {
    let key = ShaderKey::new("attention_decode")
        .def("HD", head_dim)
        .def("ROWS", rows_for(head_dim))
        .flag("KV_F16", kv_f16);
    with_tree(key, tree)
}

/// The split kernel for CPU adapters with subgroups of 8 or more (attention_decode_cpu.wgsl): one 8-lane workgroup
/// per query row and split, no workgroup memory or barriers. On lavapipe a decode step's attention at position 64
/// took about 230 us per layer in the workgroup kernel, mostly its barriers. A workgroup serves `rg` heads of a GQA
/// group ([`group_rows`]), which share each key and value load.
fn cpu_key(head_dim: usize, tree: bool, kv_f16: bool, rg: usize) -> ShaderKey {
    let key = ShaderKey::new("attention_decode_cpu")
        .def("HD", head_dim)
        .def("RG", format!("{rg}u"))
        .flag("SUBGROUPS", true)
        .flag("KV_F16", kv_f16);
    with_tree(key, tree)
}

/// Most query heads per workgroup of the CPU kernel, times the vec4 columns each lane owns (head_dim / 32): the
/// rows' queries and accumulators stay near the registers.
const MAX_GROUP_COLUMNS: usize = 8;

/// Heads of a GQA group of `group` per workgroup of the CPU kernel at `head_dim`: the largest divisor of the group
/// within [`MAX_GROUP_COLUMNS`].
fn group_rows(group: usize, head_dim: usize) -> usize {
    (1..=most_group_rows(head_dim).min(group)).rev().find(|r| group.is_multiple_of(*r)).unwrap_or(1)
}

/// Most heads per workgroup of the CPU kernel at `head_dim` ([`MAX_GROUP_COLUMNS`]).
fn most_group_rows(head_dim: usize) -> usize {
    (MAX_GROUP_COLUMNS / head_dim.div_ceil(32)).max(1)
}

fn combine_key(head_dim: usize) -> ShaderKey {
    ShaderKey::new("attention_decode")
        .def("HD", head_dim)
        .flag("COMBINE", true)
}

impl AttentionDecode {
    fn chunk(&self) -> usize {
        chunk_for(self.shape.max_ctx, self.splits)
    }

    /// The splits `first .. end` that hold keys some query sees this step: from the first key query 0 sees (0, or
    /// its window's start) to `kv_len`.
    fn active_splits(&self, vars: &StepVars) -> (usize, usize) {
        let s = &self.shape;
        let kv_len = (vars.pos as usize + self.span()).min(s.max_ctx).max(1);
        let begin = match self.window {
            0 => 0,
            w => (vars.pos as usize + 1).saturating_sub(w).min(kv_len - 1),
        };
        let chunk = self.chunk();
        let end = kv_len.div_ceil(chunk).clamp(1, self.splits);
        ((begin / chunk).min(end - 1), end)
    }
    fn rows(&self) -> usize {
        rows_for(self.shape.head_dim)
    }
    /// Positions past `pos` whose keys some row may see: the step's tokens, or a tree's deepest path.
    fn span(&self) -> usize {
        if self.tree {
            TREE_W - 1
        } else {
            self.shape.n_tokens
        }
    }
    /// The node tensor index of tensor `i` of the plain form (0 q, 1 k_cache, 2 v_cache, 3 out, 4 partial_o, 5
    /// partial_ml): the tree form has its table at 3 and the rest one later.
    fn at(&self, i: usize) -> usize {
        if self.tree && i >= 3 {
            i + 1
        } else {
            i
        }
    }
    /// Traffic over `keys` cached keys, `pairs` (query, key) pairs per head, `splits` partials per row.
    fn cost_for(&self, keys: usize, pairs: u64, splits: usize) -> Cost {
        let s = &self.shape;
        let row_blocks = self.row_blocks() as u64;
        let kv = 2 * kv_elem_bytes(self.kv_f16) * (s.n_kv * keys * s.head_dim) as u64 * row_blocks;
        let act = 4 * (s.n_tokens * s.n_heads * s.head_dim) as u64;
        let partials = 4 * (s.n_tokens * s.n_heads * splits * (s.head_dim + 2)) as u64;
        Cost {
            bytes_read: kv + act + partials,
            bytes_written: partials + act,
            flops: 4 * pairs * (s.n_heads * s.head_dim) as u64,
        }
    }

    /// Workgroups along z of the GPU kernel: blocks of `rows()` rows (the tree form: of one token's).
    fn row_blocks(&self) -> usize {
        let s = &self.shape;
        if self.tree {
            s.n_tokens * s.group().div_ceil(self.rows())
        } else {
            (s.n_tokens * s.group()).div_ceil(self.rows())
        }
    }

    /// Whether one split holds every key of this step: it then writes the output itself.
    fn single(&self, vars: &StepVars) -> bool {
        let (first, end) = self.active_splits(vars);
        end - first == 1
    }
}

impl Kernel for AttentionDecode {
    fn name(&self) -> &'static str {
        "attention_decode"
    }
    /// Node tensors: 0 q, 1 k_cache, 2 v_cache, 3 out, 4 partial_o, 5 partial_ml (`out` is an input of the node
    /// when it writes into given rows: [`Graph::attention_decode_into`]); the tree form has its table at 3 and the
    /// rest one later.
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        let s = &self.shape;
        let (shader, z) = if cpu_kernel(caps) {
            let rg = group_rows(s.group(), s.head_dim);
            (cpu_key(s.head_dim, self.tree, self.kv_f16, rg), s.n_tokens * s.group() / rg)
        } else {
            (split_key(s.head_dim, self.tree, self.kv_f16), self.row_blocks())
        };
        let mut bindings: Vec<Bind> = [0, 1, 2, 4, 5, 3].map(|i| Bind::Tensor(self.at(i))).to_vec();
        if self.tree {
            bindings.push(Bind::Tensor(3));
        }
        vec![
            Dispatch {
                shader,
                bindings,
                workgroups: [self.splits as u32, s.n_kv as u32, z as u32],
            },
            Dispatch {
                shader: combine_key(s.head_dim),
                bindings: [4, 5, 3].map(|i| Bind::Tensor(self.at(i))).to_vec(),
                workgroups: grid(s.n_tokens * s.n_heads * s.head_dim / 4, 64, caps.max_workgroups_per_dim),
            },
        ]
    }
    fn params(&self, i: usize, vars: &StepVars) -> Params {
        let s = &self.shape;
        if i == 0 {
            Params::of(&SplitParams {
                n_q: s.n_tokens as u32,
                n_heads: s.n_heads as u32,
                n_kv: s.n_kv as u32,
                group: s.group() as u32,
                max_ctx: s.max_ctx as u32,
                pos: vars.pos,
                splits: self.splits as u32,
                scale: self.scale,
                window: self.window as u32,
                chunk: self.chunk() as u32,
                first: self.active_splits(vars).0 as u32,
                single: u32::from(self.single(vars)),
            })
        } else {
            let (first, end) = self.active_splits(vars);
            Params::of(&CombineParams {
                n_rows: (s.n_tokens * s.n_heads) as u32,
                splits: self.splits as u32,
                first: first as u32,
                end: end as u32,
            })
        }
    }
    /// Only the splits this step's keys fill are launched (the shader's `chunk` rule, mirrored here); the combine
    /// only when there are several.
    fn step_workgroups(&self, i: usize, vars: &StepVars) -> Option<[u32; 3]> {
        let (first, end) = self.active_splits(vars);
        Some(if i == 0 {
            // y and z: the static grid of the adapter's kernel.
            [(end - first) as u32, u32::MAX, u32::MAX]
        } else if self.single(vars) {
            [0, 0, 0]
        } else {
            [u32::MAX; 3] // the static grid
        })
    }
    /// Assumes a full cache (`kv_len = max_ctx`; cost has no step variables). Flops: QK^T and PV over the pairs
    /// the causal mask keeps. Bytes read: K and V of every key once per block of `ROWS` rows, q, and the partials
    /// (by the combine); written: partials and output.
    fn cost(&self) -> Cost {
        let s = &self.shape;
        self.cost_for(s.max_ctx, s.pairs_at_full_context(), self.splits)
    }
    /// The keys this step reads: `kv_len = pos + n_q`, each query's causal prefix, the active splits.
    fn step_cost(&self, vars: &StepVars) -> Cost {
        let s = &self.shape;
        let kv_len = (vars.pos as usize + self.span()).min(s.max_ctx);
        // A tree's rows: counted as if each were at the first position.
        let depth = |i: usize| if self.tree { 0 } else { i };
        let pairs = (0..s.n_tokens).map(|i| (vars.pos as usize + depth(i) + 1).min(s.max_ctx) as u64).sum();
        let (first, end) = self.active_splits(vars);
        let splits = if end - first == 1 { 0 } else { end - first };
        self.cost_for(kv_len, pairs, splits)
    }
    fn reference(&self, io: &[HostIo], vars: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| {
            let (q, k, v) = (io[0].f32()?, io[1].f32()?, io[2].f32()?);
            let window = (self.window > 0).then_some(self.window);
            let pos = vars.pos as usize;
            let y = if self.tree {
                let table = io[3].u32();
                reference_tree(&q, &k, &v, self.shape, (pos, &table), self.scale, window)
            } else {
                super::attention_prefill::reference_window(&q, &k, &v, self.shape, pos, self.scale, window)
            };
            Ok(vec![Expected::at(self.at(3), y)])
        })
    }
}

impl Graph {
    /// Causal attention of `q` `[n_q, n_heads, head_dim]` (f32, `n_q <= MAX_TOKENS`, positions `vars.pos ..`)
    /// against the caches `[n_kv_heads, max_ctx, head_dim]`, scores scaled by `scale`. Returns `[n_q, n_heads,
    /// head_dim]` f32. The caches must already hold this step's keys and values (`kv_write` before this node).
    pub fn attention_decode(
        &mut self,
        q: TensorId,
        k_cache: TensorId,
        v_cache: TensorId,
        scale: f32,
    ) -> Result<TensorId> {
        self.attention_decode_window(q, k_cache, v_cache, scale, None)
    }

    /// [`Graph::attention_decode`] where each query sees only the last `window` keys (sliding-window layers).
    pub fn attention_decode_window(
        &mut self,
        q: TensorId,
        k_cache: TensorId,
        v_cache: TensorId,
        scale: f32,
        window: Option<usize>,
    ) -> Result<TensorId> {
        let shape = AttnShape::check(self, "attention_decode", q, k_cache, v_cache)?;
        if shape.n_tokens > MAX_TOKENS {
            return Err(Error::shape(
                "attention_decode",
                format!(
                    "{} query tokens, at most {MAX_TOKENS} (use attention_prefill)",
                    shape.n_tokens
                ),
            ));
        }
        self.attention_split_kv(q, k_cache, v_cache, scale, window, (None, None))
    }

    /// [`Graph::attention_decode_window`] writing its output into `out` `[n_q, n_heads, head_dim]` f32 (a
    /// [`Graph::row_view`] of a larger tensor: a batched step's sequences each write their rows of one attention
    /// output) instead of a new tensor. The same kernels, bit for bit.
    pub fn attention_decode_into(
        &mut self,
        q: TensorId,
        k_cache: TensorId,
        v_cache: TensorId,
        scale: f32,
        window: Option<usize>,
        out: TensorId,
    ) -> Result<()> {
        let (q_shape, shape) = (self.shape(q).to_vec(), self.shape(out).to_vec());
        if q_shape.first().is_none_or(|&n| n > MAX_TOKENS) || shape != q_shape || self.dtype(out) != DType::F32 {
            return Err(Error::shape(
                "attention_decode",
                format!("output {shape:?} {:?} for queries {q_shape:?} (at most {MAX_TOKENS})", self.dtype(out)),
            ));
        }
        self.attention_split_kv(q, k_cache, v_cache, scale, window, (Some(out), None))?;
        Ok(())
    }

    /// The split-KV kernel for any number of queries: `attention_decode` without its token limit. Chunks of many
    /// tokens share each K/V read among only `rows_for(head_dim)` rows (the tiled prefill kernel shares it among
    /// 64), so `attention_prefill` sends here only the head dims its own kernel does not serve. Writes `into` a
    /// given output, or takes a draft tree's table (its tree form), not both.
    pub(super) fn attention_split_kv(
        &mut self,
        q: TensorId,
        k_cache: TensorId,
        v_cache: TensorId,
        scale: f32,
        window: Option<usize>,
        (into, tree): (Option<TensorId>, Option<TensorId>),
    ) -> Result<TensorId> {
        let window = check_window("attention_decode", window)?;
        let shape = AttnShape::check(self, "attention_decode", q, k_cache, v_cache)?;
        if (shape.n_tokens * shape.group()).div_ceil(rows_for(shape.head_dim)) > u16::MAX as usize {
            return Err(Error::shape(
                "attention_decode",
                format!("{} query tokens exceed one dispatch", shape.n_tokens),
            ));
        }
        if !scale.is_finite() {
            return Err(Error::shape("attention_decode", format!("scale {scale} is not finite")));
        }
        let splits = splits_for(shape.max_ctx);
        let (n, h, d) = (shape.n_tokens, shape.n_heads, shape.head_dim);
        let kernel = AttentionDecode {
            shape,
            splits,
            scale,
            window,
            tree: tree.is_some(),
            kv_f16: kv_f16(self, k_cache),
        };
        let partials: [(&str, &[usize], DType); 2] = [
            ("attn_partial_o", &[n, h, splits, d], DType::F32),
            ("attn_partial_ml", &[n, h, splits, 2], DType::F32),
        ];
        match (into, tree) {
            (Some(out), None) => {
                self.add_node(kernel, &[q, k_cache, v_cache, out], &partials)?;
                Ok(out)
            }
            (None, tree) => {
                let mut inputs = vec![q, k_cache, v_cache];
                inputs.extend(tree);
                let outs = self.add_node(
                    kernel,
                    &inputs,
                    &[("attn_out", &[n, h, d], DType::F32), partials[0], partials[1]],
                )?;
                Ok(outs[0])
            }
            (Some(_), Some(_)) => Err(Error::shape("attention_decode", "a tree step writes its own output")),
        }
    }
}

impl Graph {
    /// Attention for the nodes of a draft tree ([`TREE_W`]): `q` `[n_q, n_heads, head_dim]` f32 (`n_q <=
    /// MAX_TREE_ROWS`), row r at position `vars.pos + depth(r)` seeing the cached keys before `vars.pos` and the keys
    /// of its path, in the slots `tree` `[n_q, TREE_W]` u32 names. Returns `[n_q, n_heads, head_dim]` f32; row r
    /// equals the one-query [`Graph::attention_decode_window`] over a cache holding its path in order, bit for bit.
    pub fn attention_decode_tree(
        &mut self,
        q: TensorId,
        k_cache: TensorId,
        v_cache: TensorId,
        scale: f32,
        window: Option<usize>,
        tree: TensorId,
    ) -> Result<TensorId> {
        let n = AttnShape::check(self, "attention_decode", q, k_cache, v_cache)?.n_tokens;
        if n > MAX_TREE_ROWS || self.shape(tree) != [n, TREE_W] || self.dtype(tree) != DType::U32 {
            return Err(Error::shape(
                "attention_decode",
                format!(
                    "tree {:?} {:?} for {n} queries: want u32 [n_q, {TREE_W}], n_q <= {MAX_TREE_ROWS}",
                    self.shape(tree),
                    self.dtype(tree)
                ),
            ));
        }
        self.attention_split_kv(q, k_cache, v_cache, scale, window, (None, Some(tree)))
    }
}

/// A tree table's row ([`TREE_W`] entries): its depth, clamped to [`MAX_TREE_DEPTH`] (the CPU side of
/// lib/tree_table.wgsl).
pub fn tree_row_depth(row: &[u32]) -> usize {
    (row[0] as usize).min(MAX_TREE_DEPTH)
}

/// The slot (relative to the step's position) of a tree table row's path at depth `d` (clamped): the row of its
/// ancestor there.
pub fn tree_path_slot(row: &[u32], d: usize) -> usize {
    row[1 + d.min(MAX_TREE_DEPTH)] as usize
}

/// The cache slot of the key at absolute position `t` on a tree table row's path, the step at `pos`: the cached
/// prefix before `pos`, the path's slots from there.
pub fn tree_key_slot(row: &[u32], pos: usize, t: usize) -> usize {
    if t < pos {
        t
    } else {
        pos + tree_path_slot(row, t - pos)
    }
}

/// The table of a tree step ([`TREE_W`]) from each row's path: the cache slots (relative to the step's position)
/// of its nodes from the root (depth 0) to itself. An error for an empty path or one deeper than `MAX_TREE_DEPTH`.
pub fn tree_table<'p>(paths: impl IntoIterator<Item = &'p [u32]>) -> Result<Vec<u32>> {
    let mut table = Vec::new();
    for path in paths {
        let Some(&own) = path.last() else {
            return Err(Error::Invalid("a tree row with an empty path".into()));
        };
        if path.len() > MAX_TREE_DEPTH + 1 {
            return Err(Error::Invalid(format!(
                "a draft tree node at depth {} (at most {MAX_TREE_DEPTH})",
                path.len() - 1
            )));
        }
        table.push((path.len() - 1) as u32);
        table.extend_from_slice(path);
        table.extend(std::iter::repeat_n(own, TREE_W - 1 - path.len()));
    }
    Ok(table)
}

/// CPU reference of the tree form: each row `r` as one query at position `pos + depth` over a cache holding the
/// prefix and then its path in order (`table` `[n_q, TREE_W]`, see [`TREE_W`]).
pub fn reference_tree(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    s: AttnShape,
    (pos, table): (usize, &[u32]),
    scale: f32,
    window: Option<usize>,
) -> Vec<f32> {
    let (hd, ctx) = (s.head_dim, s.max_ctx);
    let row_len = s.n_heads * hd;
    let mut out = Vec::with_capacity(s.n_tokens * row_len);
    for r in 0..s.n_tokens {
        let row = &table[r * TREE_W..(r + 1) * TREE_W];
        let len = pos + tree_row_depth(row) + 1;
        // The row's keys in order: slot t for t < pos, then its path's slots.
        let slot = |t: usize| tree_key_slot(row, pos, t);
        let gather = |cache: &[f32]| -> Vec<f32> {
            let mut c = Vec::with_capacity(s.n_kv * len * hd);
            for h in 0..s.n_kv {
                for t in 0..len {
                    let at = (h * ctx + slot(t).min(ctx - 1)) * hd;
                    c.extend_from_slice(&cache[at..at + hd]);
                }
            }
            c
        };
        let one = AttnShape {
            n_tokens: 1,
            max_ctx: len,
            ..s
        };
        let qr = &q[r * row_len..(r + 1) * row_len];
        let (k, v) = (gather(k_cache), gather(v_cache));
        out.extend(super::attention_prefill::reference_window(qr, &k, &v, one, len - 1, scale, window));
    }
    out
}

/// CPU reference: the same causal attention as `attention_prefill::reference` (f64, two-pass softmax).
pub fn reference(q: &[f32], k_cache: &[f32], v_cache: &[f32], s: AttnShape, pos: usize, scale: f32) -> Vec<f32> {
    super::attention_prefill::reference(q, k_cache, v_cache, s, pos, scale)
}

pub fn variants() -> Vec<ShaderKey> {
    DENSE_HEAD_DIMS
        .iter()
        .flat_map(|&d| {
            [(false, false), (true, false), (false, true), (true, true)]
                .into_iter()
                .flat_map(move |(t, f)| {
                    let cpu = (1..=most_group_rows(d)).map(move |rg| cpu_key(d, t, f, rg));
                    cpu.chain([split_key(d, t, f)])
                })
                .chain([combine_key(d)])
        })
        .collect()
}
