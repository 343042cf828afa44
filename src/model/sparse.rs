//! InfLLM-v2 sparse attention in a model (MiniCPM4's `sparse_config`, or `--sparse-attention` on any Llama-family
//! model): the compressed-key caches each session keeps, the four-op attention graph of one layer, and the same
//! computation on the CPU for the reference forward.
//!
//! Per layer and step: `kv_compress` (C1: windows of `kernel_size` keys every `kernel_stride`; C2: 4x both) after
//! the step's `kv_write`, in dense steps too, so a conversation crosses `dense_len` without recomputation. A step
//! whose KV length (`pos + n_tokens`) reaches `dense_len` then attends sparsely: `block_score` (stage-1 scores,
//! max-pooled to blocks), `block_topk` (init + local + top-scored blocks, `topk + window / block_size` in all) and
//! `attention_sparse`; shorter steps use the dense kernels. The switch is per step (per forward call), as in
//! MiniCPM4's model code: within a sparse step every token attends sparsely.

use super::config::SparseConfig;
use crate::error::Result;
use crate::gpu::{DType, Gpu, GpuTensor};
use crate::graph::{Graph, TensorId};
use crate::ops::attention_prefill::AttnShape;
use crate::ops::block_score::{ScoreConfig, ScoreShape};
use crate::ops::block_topk::BlockSelection;
use crate::ops::kv_compress::{CompressShape, Window};
use crate::ops::{attention_sparse, block_score, block_topk, kv_compress};

impl SparseConfig {
    /// C1 windows (scored) and C2 windows (the normalizer): MiniCPM4's (32, 16) and (128, 64).
    pub fn windows(&self) -> (Window, Window) {
        let fine = Window {
            size: self.kernel_size,
            stride: self.kernel_stride,
        };
        let coarse = Window {
            size: 4 * self.kernel_size,
            stride: 4 * self.kernel_stride,
        };
        (fine, coarse)
    }

    pub fn score_config(&self, max_ctx: usize) -> ScoreConfig {
        let (fine, coarse) = self.windows();
        ScoreConfig {
            fine,
            coarse,
            block_size: self.block_size,
            max_ctx,
        }
    }

    pub fn selection(&self) -> BlockSelection {
        BlockSelection::infllm_v2(self.block_size, self.init_blocks, self.window_size, self.topk)
    }

    /// Whether a step ending at KV length `kv_len` attends sparsely.
    pub fn is_sparse(&self, kv_len: usize) -> bool {
        kv_len >= self.dense_len
    }
}

/// One layer's compressed keys: C1 and C2, f32 `[n_kv, windows, head_dim]`.
pub struct CompressedKeys {
    pub c1: GpuTensor,
    pub c2: GpuTensor,
}

/// Compressed-key caches for every layer of a session of `max_ctx` positions; `None` when the context cannot hold
/// one C2 window (such a session never reaches a useful `dense_len`: it stays dense).
pub fn new_caches(
    gpu: &Gpu,
    s: &SparseConfig,
    n_layers: usize,
    n_kv: usize,
    head_dim: usize,
    max_ctx: usize,
) -> Result<Option<Vec<CompressedKeys>>> {
    let (fine, coarse) = s.windows();
    if coarse.count(max_ctx) == 0 || s.dense_len > max_ctx {
        return Ok(None);
    }
    let layer = |i: usize| -> Result<CompressedKeys> {
        Ok(CompressedKeys {
            c1: GpuTensor::zeros(
                gpu,
                &format!("blk.{i}.c1_cache"),
                &[n_kv, fine.count(max_ctx), head_dim],
                DType::F32,
            )?,
            c2: GpuTensor::zeros(
                gpu,
                &format!("blk.{i}.c2_cache"),
                &[n_kv, coarse.count(max_ctx), head_dim],
                DType::F32,
            )?,
        })
    };
    (0..n_layers).map(layer).collect::<Result<Vec<_>>>().map(Some)
}

/// Records the C1/C2 updates of a step of `n_tokens` (after its `kv_write`); returns the caches' ids.
pub fn compress(
    g: &mut Graph,
    s: &SparseConfig,
    keys: &CompressedKeys,
    k_cache: TensorId,
    n_tokens: usize,
) -> Result<(TensorId, TensorId)> {
    let (fine, coarse) = s.windows();
    let (c1, c2) = (g.external(&keys.c1), g.external(&keys.c2));
    g.kv_compress(k_cache, c1, n_tokens, fine)?;
    g.kv_compress(k_cache, c2, n_tokens, coarse)?;
    Ok((c1, c2))
}

/// Sparse attention of `q` `[n, n_heads, head_dim]` over the caches: scores, selection, attention. With `tree` (a
/// draft tree's table `[n, TREE_W]`), row r sits at position `pos + depth(r)` and reads its path's keys through the
/// table: each row as the one-token step along its path computes it, where the compressed keys hold every window
/// the root sees and the row's path completes at most one more window of each kind (computed per row here).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    g: &mut Graph,
    s: &SparseConfig,
    q: TensorId,
    k_cache: TensorId,
    v_cache: TensorId,
    (c1, c2): (TensorId, TensorId),
    max_ctx: usize,
    scale: f32,
    tree: Option<TensorId>,
) -> Result<TensorId> {
    let cfg = s.score_config(max_ctx);
    let Some(tree) = tree else {
        let scores = g.block_score(q, c1, c2, cfg, scale)?; // [n, n_kv, blocks]
        let sel = g.block_topk(scores, s.selection())?; // [n, n_kv, budget] u32
        return g.attention_sparse(q, k_cache, v_cache, sel, s.block_size, scale);
    };
    // Each row's own copies of the windows its path completes past the root (the caches hold the root's).
    let own = (
        g.kv_compress_tree(k_cache, tree, cfg.fine)?,
        g.kv_compress_tree(k_cache, tree, cfg.coarse)?,
    );
    let scores = g.block_score_tree(q, (c1, c2), own, cfg, scale, tree)?;
    let sel = g.block_topk_tree(scores, s.selection(), tree)?;
    g.attention_sparse_tree(q, (k_cache, v_cache), sel, (s.block_size, scale), tree)
}

/// The CPU counterpart of one layer's sparse attention for the reference forward: `q` `[n, n_heads, head_dim]`
/// of the step at `pos`, caches `[n_kv, max_ctx, head_dim]` holding every key up to `pos + n`. Returns
/// `[n, n_heads, head_dim]`.
pub fn reference(
    s: &SparseConfig,
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    shape: AttnShape,
    pos: usize,
) -> Vec<f32> {
    let (fine, coarse) = s.windows();
    let scale = 1.0 / (shape.head_dim as f32).sqrt();
    let caches = [fine, coarse].map(|window| {
        let cs = CompressShape {
            n_kv: shape.n_kv,
            max_ctx: shape.max_ctx,
            head_dim: shape.head_dim,
            window,
        };
        let mut c = vec![0f32; shape.n_kv * cs.n_windows() * shape.head_dim];
        kv_compress::reference(k_cache, &mut c, cs, 0, pos + shape.n_tokens);
        c
    });
    let ss = ScoreShape {
        n_tokens: shape.n_tokens,
        n_heads: shape.n_heads,
        n_kv: shape.n_kv,
        head_dim: shape.head_dim,
        cfg: s.score_config(shape.max_ctx),
    };
    let scores = block_score::reference(q, &caches[0], &caches[1], ss, pos, scale);
    let sel = block_topk::reference(&scores, shape.n_tokens, shape.n_kv, ss.n_blocks(), s.selection(), pos);
    attention_sparse::reference(q, k_cache, v_cache, &sel, shape, s.block_size, pos, scale)
}
