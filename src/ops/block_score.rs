//! InfLLM-v2 stage-1 block scores: how relevant each 64-token block of the KV cache is to each query token, per
//! KV head, from the compressed keys of `kv_compress` (C1 scores, C2 normalizes). `block_topk` selects from them.
//!
//! Conventions (sources: InfLLM-V2, arXiv 2509.24663, section 3; OpenBMB/infllmv2_cuda_impl: the stage-1 kernel's
//! causal mask `apply_mask_stage1`, its torch reference `tests/stage1/complse_online_softmax.py` and
//! `max_pooling_1d`; FastDeploy `docs/features/infllmv2_attention.md`; all agree where they overlap):
//! - Query token `t` sits at position `p = pos + t`. A window `[s, s + size)` is visible to it when complete
//!   within keys `0 ..= p`: `s + size <= p + 1`, so `v(p + 1)` windows (`Window::count`). This is the CUDA
//!   kernel's causal rule (window `j` of stride 16 visible iff `j < (p - 15) / 16`, i.e. `16 j + 32 <= p + 1` for
//!   size 32; the same with stride 64 for the 128-windows) and equals its non-causal decode call, where every
//!   window of the cache is complete and so visible.
//! - Per query head `h'` of KV head `h`'s group: `lse[h'] = logsumexp_j (scale * q_h' . C2[j])` over the visible
//!   C2 windows, and `S[i] = sum_h' exp(scale * q_h' . C1[i] - lse[h'])` over the visible C1 windows: the C1
//!   softmax with the cheaper C2 normalizer (the "compressed LSE" of the CUDA implementation), summed over the
//!   GQA group.
//! - While no C2 window is visible (`p + 1 < 128` in MiniCPM4) the sources' normalizer is the log of an empty sum
//!   (`lse = -inf`, every score infinite); here the exact normalizer over the visible C1 windows is used
//!   instead. Those queries lie in blocks 0 and 1, which the initial and local blocks cover anyway.
//! - Block `b` scores the max of `S[i]` over the C1 windows overlapping it: `i*stride < (b+1)*B` and
//!   `i*stride + size > b*B`, i.e. `i` in [`block_windows`], clipped to the visible ones. For size 32, stride 16,
//!   B = 64 that is kernels `4b - 1 ..= 4b + 3`: the CUDA `max_pooling_1d` (kernel B/stride + 1, stride B/stride,
//!   padding 1) and FastDeploy's "fine window overlapping block b". A block with no visible window scores 0 (all
//!   real scores are positive; the CUDA pooling also reads masked, zero, scores). Once a query sees a window,
//!   every block below its own has a visible one (when B >= stride); its own block may not, and blocks past it
//!   never do. The init/local masking of `max_pooling_1d` (+inf/-inf) is `block_topk`'s job, not done here.
//!
//! Two dispatches, both with one compressed key per invocation and the query rows needed by all invocations at
//! once (shared by subgroup broadcasts where subgroups are available, else read from a uniform buffer when the
//! whole query fits one, as in decode: both much faster than same-address storage loads on CPU adapters): the C2
//! normalizers per tile of 64 C2 windows (partials in the node's second output), then one workgroup per (tile of
//! blocks, KV head, group of tokens) combines them, scores the tile's C1 windows and max-pools them into blocks.
//! See `shaders/block_score.wgsl`.

use super::attention_decode::{tree_path_slot, with_tree, TREE_W};
use super::attention_prefill::HEAD_DIMS;
use super::block_topk::tree_positions;
use super::kv_compress::Window;
use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{fits_uniform_array, Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};

/// Invocations per workgroup (both dispatches), one compressed key each: a tile of C2 windows in dispatch 1, the
/// C1 windows of a tile of blocks in dispatch 2 (which must fit).
const WG: usize = 64;
/// Tokens per workgroup, and rows (token x group head) whose normalizers a workgroup holds.
const TOKENS_MAX: usize = 16;
const ROWS_MAX: usize = 256;
/// Largest GQA group (query heads per KV head).
pub const MAX_GROUP: usize = ROWS_MAX;

/// Fixed per model: the two compression windows, the block size, and the cache length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScoreConfig {
    /// C1 windows: scored (MiniCPM4: size 32, stride 16).
    pub fine: Window,
    /// C2 windows: the softmax normalizer (MiniCPM4: size 128, stride 64).
    pub coarse: Window,
    /// Positions per block (MiniCPM4: 64).
    pub block_size: usize,
    /// Positions in the KV cache; the output has `ceil(max_ctx / block_size)` blocks per row.
    pub max_ctx: usize,
}

/// Shapes of a block_score node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScoreShape {
    pub n_tokens: usize,
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub cfg: ScoreConfig,
}

impl ScoreShape {
    pub fn group(&self) -> usize {
        self.n_heads / self.n_kv
    }
    pub fn n_blocks(&self) -> usize {
        self.cfg.max_ctx.div_ceil(self.cfg.block_size)
    }
    /// C1 and C2 windows in the caches.
    pub fn n1(&self) -> usize {
        self.cfg.fine.count(self.cfg.max_ctx)
    }
    pub fn n2(&self) -> usize {
        self.cfg.coarse.count(self.cfg.max_ctx)
    }
}

/// The C1 windows overlapping block `b` of `block_size` positions (before clipping to the visible ones).
pub fn block_windows(fine: Window, block_size: usize, b: usize) -> std::ops::Range<usize> {
    fine.count(b * block_size)..((b + 1) * block_size).div_ceil(fine.stride)
}

/// C2 tiles (normalizer partials per row) for caches of `n2` windows.
pub fn tiles_for(n2: usize) -> usize {
    n2.div_ceil(WG).max(1)
}

/// Blocks per workgroup of the scoring dispatch: the most (up to 64) whose C1 windows fit in `WG` for every tile.
fn tile_blocks(cfg: &ScoreConfig) -> Option<usize> {
    let (nb, n1) = (cfg.max_ctx.div_ceil(cfg.block_size), cfg.fine.count(cfg.max_ctx));
    (1..=WG).rev().find(|&per| {
        (0..nb.div_ceil(per)).all(|x| {
            let (b0, b1) = (x * per, ((x + 1) * per).min(nb) - 1);
            let lo = block_windows(cfg.fine, cfg.block_size, b0).start;
            let hi = block_windows(cfg.fine, cfg.block_size, b1).end.min(n1);
            hi.saturating_sub(lo) <= WG
        })
    })
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ScoreParams {
    n_tokens: u32,
    n_heads: u32,
    n_kv: u32,
    group: u32,
    pos: u32,
    n1: u32,
    size1: u32,
    stride1: u32,
    n2: u32,
    size2: u32,
    stride2: u32,
    tiles: u32,
    n_active: u32,
    block: u32,
    n_blocks: u32,
    tile_blocks: u32,
    tokens_per_wg: u32,
    scale: f32,
    /// A tree step: the C1 and C2 windows each path has its own copy of (the first ones the root does not complete).
    e1: u32,
    e2: u32,
}

#[derive(Debug)]
pub struct BlockScore {
    shape: ScoreShape,
    tiles: usize,
    tile_blocks: usize,
    tokens_per_wg: usize,
    scale: f32,
    /// A draft tree's step: token t at `pos` + its depth in the tree table (node tensor 3), the windows its path
    /// completes past the root in node tensors 4 (C1) and 5 (C2) at its ancestor's row, the outputs after them.
    tree: bool,
}

/// `sg`: subgroup broadcasts of the query; `qu`: the query is read from a uniform array; `tree`: a draft tree's
/// step.
fn key(head_dim: usize, lse: bool, sg: bool, qu: bool, tree: bool) -> ShaderKey {
    let key = ShaderKey::new("block_score")
        .def("HD", head_dim)
        .flag("LSE", lse)
        .flag("SUBGROUPS", sg)
        .flag("QU", qu);
    with_tree(key, tree)
}

impl BlockScore {
    /// Node tensor of slot `i` (0 q, 1 c1, 2 c2, 3 scores, 4 lse partials): the outputs come after a tree step's
    /// table and its rows' windows.
    fn at(&self, i: usize) -> usize {
        if i >= 3 && self.tree {
            i + 3
        } else {
            i
        }
    }
    /// C2 tiles the step's last token sees (at least 1: tile 0 also holds the C1 fallback).
    fn active_tiles(&self, vars: &StepVars) -> usize {
        let s = &self.shape;
        let visible = s.cfg.coarse.count(vars.pos as usize + s.n_tokens).min(s.n2());
        visible.div_ceil(WG).clamp(1, self.tiles)
    }
    /// Subgroup broadcasts need subgroups of at least 8 invocations.
    fn subgroups(caps: &Caps) -> bool {
        caps.subgroups && caps.subgroup_size >= 8
    }
    /// The query in a uniform array: when all of it fits.
    fn q_uniform(&self, caps: &Caps) -> bool {
        let s = &self.shape;
        fits_uniform_array(caps, (4 * s.n_tokens * s.n_heads * s.head_dim) as u64)
    }
    /// Bindings of a dispatch over node tensors `slots`, the query (slot 0) as a uniform when it is one, then a
    /// tree step's table and its rows' C1 windows (`lse`: and C2 windows).
    fn bindings(&self, caps: &Caps, slots: [usize; 4], lse: bool) -> Vec<Bind> {
        let q = self.q_uniform(caps);
        let tree = match (self.tree, lse) {
            (false, _) => vec![],
            (true, false) => vec![Bind::Tensor(3), Bind::Tensor(4)],
            (true, true) => vec![Bind::Tensor(3), Bind::Tensor(4), Bind::Tensor(5)],
        };
        slots
            .map(|s| if s == 0 && q { Bind::Uniform(0) } else { Bind::Tensor(self.at(s)) })
            .into_iter()
            .chain(tree)
            .collect()
    }
}

impl Kernel for BlockScore {
    fn name(&self) -> &'static str {
        "block_score"
    }
    /// Node tensors: 0 q, 1 c1, 2 c2, (a tree step: 3 tree), then scores and lse partials.
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        let s = &self.shape;
        let token_groups = s.n_tokens.div_ceil(self.tokens_per_wg) as u32;
        vec![
            Dispatch {
                shader: key(s.head_dim, true, Self::subgroups(caps), self.q_uniform(caps), self.tree),
                bindings: self.bindings(caps, [0, 1, 2, 4], true),
                workgroups: [self.tiles as u32, s.n_kv as u32, token_groups],
            },
            Dispatch {
                shader: key(s.head_dim, false, Self::subgroups(caps), self.q_uniform(caps), self.tree),
                bindings: self.bindings(caps, [0, 1, 4, 3], false),
                workgroups: [
                    s.n_blocks().div_ceil(self.tile_blocks) as u32,
                    s.n_kv as u32,
                    token_groups,
                ],
            },
        ]
    }
    fn params(&self, _: usize, vars: &StepVars) -> Params {
        let s = &self.shape;
        Params::of(&ScoreParams {
            n_tokens: s.n_tokens as u32,
            n_heads: s.n_heads as u32,
            n_kv: s.n_kv as u32,
            group: s.group() as u32,
            pos: vars.pos,
            n1: s.n1() as u32,
            size1: s.cfg.fine.size as u32,
            stride1: s.cfg.fine.stride as u32,
            n2: s.n2() as u32,
            size2: s.cfg.coarse.size as u32,
            stride2: s.cfg.coarse.stride as u32,
            tiles: self.tiles as u32,
            n_active: self.active_tiles(vars) as u32,
            block: s.cfg.block_size as u32,
            n_blocks: s.n_blocks() as u32,
            tile_blocks: self.tile_blocks as u32,
            tokens_per_wg: self.tokens_per_wg as u32,
            scale: self.scale * std::f32::consts::LOG2_E,
            e1: s.cfg.fine.count(vars.pos as usize + 1) as u32,
            e2: s.cfg.coarse.count(vars.pos as usize + 1) as u32,
        })
    }
    /// Assumes the step ends at `max_ctx` (cost has no step variables): every row dots its query with all C2
    /// windows and every C1 window. Bytes: C1 and C2 once per token group, q by every workgroup (uniform loads),
    /// partials, scores.
    fn cost(&self) -> Cost {
        let s = &self.shape;
        let row_bytes = 4 * (s.n_kv * s.head_dim) as u64;
        let token_groups = s.n_tokens.div_ceil(self.tokens_per_wg) as u64;
        let workgroups = (self.tiles + s.n_blocks().div_ceil(self.tile_blocks)) as u64;
        let q = 4 * (s.n_tokens * s.group() * s.head_dim) as u64 * workgroups;
        let partials = 8 * (s.n_tokens * s.n_heads * self.tiles) as u64;
        let scores = 4 * (s.n_tokens * s.n_kv * s.n_blocks()) as u64;
        Cost {
            bytes_read: (s.n1() + s.n2()) as u64 * row_bytes * token_groups + q + partials,
            bytes_written: partials + scores,
            flops: 2 * (s.n_tokens * s.n_heads * (s.n1() + s.n2()) * s.head_dim) as u64,
        }
    }
    /// Node tensors: q, c1, c2, (tree, x1, x2), scores, partial log-sum-exps (scratch, not checked).
    fn reference(&self, io: &[HostIo], vars: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| {
            let (q, c1, c2) = (io[0].f32()?, io[1].f32()?, io[2].f32()?);
            let pos = vars.pos as usize;
            let scores = match self.tree {
                true => {
                    let own = (&io[4].f32()?[..], &io[5].f32()?[..]);
                    reference_tree(&q, (&c1, &c2), own, self.shape, (&io[3].u32(), pos), self.scale)
                }
                false => reference(&q, &c1, &c2, self.shape, pos, self.scale),
            };
            Ok(vec![Expected::at(self.at(3), scores)])
        })
    }
}

impl Graph {
    /// Stage-1 block scores of `q` `[n_tokens, n_heads, head_dim]` (f32, post-RoPE, positions `vars.pos ..`)
    /// against the compressed keys `c1` `[n_kv, cfg.fine.count(max_ctx), head_dim]` and `c2` `[n_kv,
    /// cfg.coarse.count(max_ctx), head_dim]` (f32, from `kv_compress`, up to date for this step), dot products
    /// scaled by `scale`. Returns `[n_tokens, n_kv, ceil(max_ctx / block_size)]` f32 (conventions: module doc).
    pub fn block_score(
        &mut self,
        q: TensorId,
        c1: TensorId,
        c2: TensorId,
        cfg: ScoreConfig,
        scale: f32,
    ) -> Result<TensorId> {
        self.block_score_impl(q, (c1, c2), cfg, scale, None)
    }

    /// [`Graph::block_score`] for a draft tree's step: token t at position `vars.pos` plus its depth in `tree`
    /// `[n_tokens, TREE_W]` u32 (`attention_decode`'s tree table). `own` `(x1, x2)`, each `[n_tokens, n_kv,
    /// head_dim]` f32 (`kv_compress_tree`): the first C1 and C2 windows the root does not complete (`count(pos +
    /// 1)`) along the path of each row at the depth where it completes; a token that sees such a window takes its
    /// ancestor's copy. The caches must hold every window the root sees, and any past those two that a token sees.
    pub fn block_score_tree(
        &mut self,
        q: TensorId,
        (c1, c2): (TensorId, TensorId),
        own: (TensorId, TensorId),
        cfg: ScoreConfig,
        scale: f32,
        tree: TensorId,
    ) -> Result<TensorId> {
        self.block_score_impl(q, (c1, c2), cfg, scale, Some((tree, own)))
    }

    fn block_score_impl(
        &mut self,
        q: TensorId,
        (c1, c2): (TensorId, TensorId),
        cfg: ScoreConfig,
        scale: f32,
        tree: Option<(TensorId, (TensorId, TensorId))>,
    ) -> Result<TensorId> {
        let (qs, c1s, c2s) = (self.shape(q).to_vec(), self.shape(c1).to_vec(), self.shape(c2).to_vec());
        let bad = |why: &str| {
            Err(Error::shape(
                "block_score",
                format!("q {qs:?}, c1 {c1s:?}, c2 {c2s:?}, {cfg:?}: {why}"),
            ))
        };
        cfg.fine.check("block_score")?;
        cfg.coarse.check("block_score")?;
        let f32s = [q, c1, c2].iter().all(|&t| self.dtype(t) == DType::F32);
        if qs.len() != 3 || c1s.len() != 3 || c2s.len() != 3 || !f32s {
            return bad("expected f32 q [n_tokens, n_heads, head_dim] and caches [n_kv, windows, head_dim]");
        }
        let shape = ScoreShape {
            n_tokens: qs[0],
            n_heads: qs[1],
            n_kv: c1s[0],
            head_dim: qs[2],
            cfg,
        };
        if !HEAD_DIMS.contains(&shape.head_dim) {
            return bad(&format!("head_dim must be one of {HEAD_DIMS:?}"));
        }
        if shape.n_kv == 0 || shape.n_heads == 0 || !shape.n_heads.is_multiple_of(shape.n_kv) {
            return bad("n_heads must be a nonzero multiple of n_kv_heads");
        }
        if shape.group() > MAX_GROUP {
            return bad(&format!("at most {MAX_GROUP} query heads per KV head"));
        }
        if cfg.block_size == 0 || shape.n1() == 0 || shape.n2() == 0 {
            return bad("need block_size >= 1 and max_ctx at least one window of each size");
        }
        let want1 = [shape.n_kv, shape.n1(), shape.head_dim];
        let want2 = [shape.n_kv, shape.n2(), shape.head_dim];
        if c1s != want1 || c2s != want2 {
            return bad(&format!("expected c1 {want1:?} and c2 {want2:?}"));
        }
        if shape.n_tokens == 0 || shape.n_tokens > cfg.max_ctx {
            return bad("need 1 <= n_tokens <= max_ctx");
        }
        if !scale.is_finite() {
            return bad(&format!("scale {scale} is not finite"));
        }
        let Some(tile_blocks) = tile_blocks(&cfg) else {
            return bad(&format!("one block overlaps more than {WG} C1 windows"));
        };
        if cfg.fine.count(cfg.coarse.size - 1) > WG {
            return bad(&format!(
                "a query before the first C2 window sees more than {WG} C1 windows (its normalizer's fallback)"
            ));
        }
        let tokens_per_wg = (ROWS_MAX / shape.group()).min(TOKENS_MAX);
        let tiles = tiles_for(shape.n2());
        let grid_ok = shape.n_blocks().div_ceil(tile_blocks).max(tiles) <= u16::MAX as usize
            && shape.n_tokens.div_ceil(tokens_per_wg) <= u16::MAX as usize;
        if !grid_ok {
            return bad("too many blocks or tokens for one dispatch");
        }
        if let Some((t, _)) = tree.filter(|&(t, _)| self.shape(t) != [shape.n_tokens, TREE_W] || self.dtype(t) != DType::U32) {
            return bad(&format!("tree {:?}: expected u32 [n_tokens, {TREE_W}]", self.shape(t)));
        }
        let own_shape = [shape.n_tokens, shape.n_kv, shape.head_dim];
        if let Some((_, (x1, x2))) = tree {
            if [x1, x2].iter().any(|&x| self.shape(x) != own_shape || self.dtype(x) != DType::F32) {
                return bad(&format!(
                    "the rows' own windows {:?} and {:?}: expected f32 {own_shape:?}",
                    self.shape(x1),
                    self.shape(x2)
                ));
            }
        }
        let (n, h, nb) = (shape.n_tokens, shape.n_heads, shape.n_blocks());
        let kernel = BlockScore {
            shape,
            tiles,
            tile_blocks,
            tokens_per_wg,
            scale,
            tree: tree.is_some(),
        };
        let tree_inputs = tree.map(|(t, (x1, x2))| [t, x1, x2]);
        let inputs: Vec<TensorId> = [q, c1, c2].into_iter().chain(tree_inputs.into_iter().flatten()).collect();
        let outs = self.add_node(
            kernel,
            &inputs,
            &[
                ("block_scores", &[n, shape.n_kv, nb], DType::F32),
                ("block_lse_partial", &[n, h, tiles, 2], DType::F32),
            ],
        )?;
        Ok(outs[0])
    }
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum()
}

fn logsumexp(xs: &[f64]) -> f64 {
    let m = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    m + xs.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
}

/// CPU reference in f64: `q` `[n_tokens, n_heads, head_dim]` at positions `pos ..`, caches `c1` `[n_kv, n1,
/// head_dim]` and `c2` `[n_kv, n2, head_dim]` (as `kv_compress` stores them). Returns `[n_tokens, n_kv,
/// n_blocks]` with the conventions of the module doc, natural-log domain.
pub fn reference(q: &[f32], c1: &[f32], c2: &[f32], s: ScoreShape, pos: usize, scale: f32) -> Vec<f32> {
    let positions: Vec<usize> = (pos..pos + s.n_tokens).collect();
    reference_at(q, (c1, c2), s, &positions, scale)
}

/// CPU reference of the tree form: token t at `pos` plus its depth in `table` `[n_tokens, TREE_W]`, where it sees
/// the window `count(pos + 1)` of C1 (C2) taking its ancestor's copy from `x1` (`x2`) `[n_tokens, n_kv, head_dim]`
/// (the row at the depth where the window completes) in place of the cache's.
pub fn reference_tree(
    q: &[f32],
    (c1, c2): (&[f32], &[f32]),
    (x1, x2): (&[f32], &[f32]),
    s: ScoreShape,
    (table, pos): (&[u32], usize),
    scale: f32,
) -> Vec<f32> {
    let one = ScoreShape { n_tokens: 1, ..s };
    let (hd, row_q, row_x) = (s.head_dim, s.n_heads * s.head_dim, s.n_kv * s.head_dim);
    let own = |c: &[f32], x: &[f32], w: Window, n: usize, t: usize, at: usize| -> Vec<f32> {
        let mut c = c.to_vec();
        let e = w.count(pos + 1);
        if w.count(at + 1) > e && e < n {
            let a = tree_path_slot(&table[t * TREE_W..][..TREE_W], e * w.stride + w.size - 1 - pos);
            for h in 0..s.n_kv {
                c[(h * n + e) * hd..][..hd].copy_from_slice(&x[a * row_x + h * hd..][..hd]);
            }
        }
        c
    };
    let positions = tree_positions(table, pos);
    let mut out = Vec::with_capacity(s.n_tokens * s.n_kv * s.n_blocks());
    for (t, &at) in positions.iter().enumerate() {
        let c1t = own(c1, x1, s.cfg.fine, s.n1(), t, at);
        let c2t = own(c2, x2, s.cfg.coarse, s.n2(), t, at);
        out.extend(reference_at(&q[t * row_q..][..row_q], (&c1t, &c2t), one, &[at], scale));
    }
    out
}

/// [`reference`] with token t at `positions[t]`.
pub fn reference_at(q: &[f32], (c1, c2): (&[f32], &[f32]), s: ScoreShape, positions: &[usize], scale: f32) -> Vec<f32> {
    let (hd, g, nb) = (s.head_dim, s.group(), s.n_blocks());
    let (n1, n2) = (s.n1(), s.n2());
    let scale = scale as f64;
    let mut out = vec![0f32; s.n_tokens * s.n_kv * nb];
    for (t, &at) in positions.iter().enumerate() {
        let len = at + 1;
        let (v1, v2) = (s.cfg.fine.count(len).min(n1), s.cfg.coarse.count(len).min(n2));
        if v1 == 0 {
            continue;
        }
        for h in 0..s.n_kv {
            let row1 = |i: usize| &c1[(h * n1 + i) * hd..][..hd];
            let row2 = |j: usize| &c2[(h * n2 + j) * hd..][..hd];
            let mut score = vec![0f64; v1];
            for gi in 0..g {
                let qh = &q[(t * s.n_heads + h * g + gi) * hd..][..hd];
                let fine: Vec<f64> = (0..v1).map(|i| scale * dot(qh, row1(i))).collect();
                let lse = if v2 > 0 {
                    logsumexp(&(0..v2).map(|j| scale * dot(qh, row2(j))).collect::<Vec<_>>())
                } else {
                    logsumexp(&fine)
                };
                for (sc, f) in score.iter_mut().zip(&fine) {
                    *sc += (f - lse).exp();
                }
            }
            for b in 0..nb {
                let w = block_windows(s.cfg.fine, s.cfg.block_size, b);
                let best = (w.start..w.end.min(v1)).map(|i| score[i]).fold(0f64, f64::max);
                out[(t * s.n_kv + h) * nb + b] = best as f32;
            }
        }
    }
    out
}

/// Every variant: both dispatches per head dim, with and without subgroups, q in storage or in a uniform array.
pub fn variants() -> Vec<ShaderKey> {
    let mut v = Vec::new();
    for &d in &HEAD_DIMS {
        for lse in [true, false] {
            for sg in [false, true] {
                for qu in [false, true] {
                    for tree in [false, true] {
                        v.push(key(d, lse, sg, qu, tree));
                    }
                }
            }
        }
    }
    v
}
