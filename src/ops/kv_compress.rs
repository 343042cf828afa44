//! InfLLM-v2 compressed keys: keep a cache of window means of one layer's K cache up to date, one step at a time.
//!
//! Window `i` covers key positions `[i * stride, i * stride + size)` and its compressed key is the mean of those
//! keys: `C[i] = mean(K[i * stride .. i * stride + size])` (InfLLM-V2, arXiv 2509.24663, section 3; the `CompressK`
//! mean pooling of MiniCPM4's model code and of OpenBMB/infllmv2_cuda_impl's tests; FastDeploy's
//! `docs/features/infllmv2_attention.md`: "each summary is the mean of K vectors in one complete window"). Only
//! complete windows exist: a cache of `max_ctx` positions has `(max_ctx - size) / stride + 1` of them, and a prefix
//! of `len` keys holds [`Window::count`]`(len)`. MiniCPM4 keeps two such caches per layer: C1 with (size 32,
//! stride 16) scores blocks, C2 with (128, 64) approximates the softmax normalizer (see `block_score`).
//!
//! Cache layout: `[n_kv_heads, n_windows, head_dim]` f32, each head's windows contiguous, beside the K cache
//! `[n_kv_heads, max_ctx, head_dim]` of `kv_write`. A step feeding `n_tokens` keys at positions `pos .. pos +
//! n_tokens` completes exactly the windows whose end `i * stride + size` falls in `(pos, pos + n_tokens]`; this op
//! computes those (and only those) from the K cache, so it runs after the step's `kv_write` and keeps the cache
//! current in dense and sparse steps alike. Steps must cover positions in order without gaps (as decoding does);
//! then incremental updates equal one computation over the whole prefix.
//!
//! Tree form ([`Graph::kv_compress_tree`]): a draft tree's step holds many paths at once, its nodes side by side in
//! the cache, so the window the paths complete past the root differs per path. It is computed once per path, at the
//! row where the path completes it, into a `[rows, n_kv, head_dim]` output (the cache keeps the root's windows), with
//! the plain form's sums in the same order: what plain decoding along the path would cache, bit for bit.

use super::attention_decode::{tree_key_slot, with_tree, TREE_W};
use super::block_topk::tree_positions;
use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{grid, Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};

/// Workgroup size of the shader.
const WG: usize = 64;
/// Workgroups per grid dimension before folding into y (WebGPU's guaranteed minimum).
const MAX_PER_DIM: u32 = 65535;

/// Compression windows: window `i` covers positions `[i * stride, i * stride + size)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    pub size: usize,
    pub stride: usize,
}

impl Window {
    /// Complete windows within positions `0 .. len` (those ending at or before `len`).
    pub fn count(&self, len: usize) -> usize {
        if len < self.size || self.stride == 0 {
            0
        } else {
            (len - self.size) / self.stride + 1
        }
    }

    /// Windows completed by a step covering positions `pos .. pos + n_tokens`: `first .. end`.
    pub fn completed(&self, pos: usize, n_tokens: usize) -> std::ops::Range<usize> {
        self.count(pos)..self.count(pos + n_tokens)
    }

    /// Most windows one step of `n_tokens` can complete (window ends are `stride` apart).
    pub fn most_per_step(&self, n_tokens: usize) -> usize {
        n_tokens.div_ceil(self.stride.max(1))
    }

    pub(crate) fn check(&self, op: &'static str) -> Result<()> {
        if self.size == 0 || self.stride == 0 {
            return Err(Error::shape(
                op,
                format!("window {self:?}: size and stride must be >= 1"),
            ));
        }
        Ok(())
    }
}

/// Shapes of a compressed-key cache and the K cache it summarizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompressShape {
    pub n_kv: usize,
    pub max_ctx: usize,
    pub head_dim: usize,
    pub window: Window,
}

impl CompressShape {
    /// Windows the cache holds: every complete window of a full K cache.
    pub fn n_windows(&self) -> usize {
        self.window.count(self.max_ctx)
    }

    /// Both forms' parameters: windows (tree form: rows) `first .. first + count`, the step at `pos`.
    fn params(&self, first: usize, count: usize, pos: u32) -> Params {
        Params::of(&CompressParams {
            n_kv: self.n_kv as u32,
            hd4: (self.head_dim / 4) as u32,
            max_ctx: self.max_ctx as u32,
            n_windows: self.n_windows() as u32,
            size: self.window.size as u32,
            stride: self.window.stride as u32,
            first: first as u32,
            count: count as u32,
            inv_size: 1.0 / self.window.size as f32,
            pos,
        })
    }

    /// The cost of computing `windows` compressed keys per head: `size` keys read and one row written each.
    fn cost(&self, windows: usize, kv_f16: bool) -> Cost {
        let rows = (windows * self.n_kv) as u64;
        let key_bytes = super::attention_prefill::kv_elem_bytes(kv_f16) * self.head_dim as u64;
        Cost {
            bytes_read: rows * self.window.size as u64 * key_bytes,
            bytes_written: rows * 4 * self.head_dim as u64,
            flops: rows * (self.window.size * self.head_dim) as u64,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct CompressParams {
    n_kv: u32,
    hd4: u32,
    max_ctx: u32,
    n_windows: u32,
    size: u32,
    stride: u32,
    /// First window completed this step, and how many.
    first: u32,
    count: u32,
    inv_size: f32,
    /// The tree form's root position (unused by the plain form).
    pos: u32,
}

#[derive(Debug)]
pub struct KvCompress {
    shape: CompressShape,
    n_tokens: usize,
    /// The K cache holds f16 (lib/kv_cache.wgsl); the compressed keys stay f32.
    kv_f16: bool,
}

fn key(kv_f16: bool, tree: bool) -> ShaderKey {
    with_tree(ShaderKey::new("kv_compress").flag("KV_F16", kv_f16), tree)
}

impl KvCompress {
    /// Windows the static grid covers: the most a step can complete.
    fn max_windows(&self) -> usize {
        self.shape
            .window
            .most_per_step(self.n_tokens)
            .min(self.shape.n_windows())
    }
    fn items(&self, windows: usize) -> usize {
        windows * self.shape.n_kv * self.shape.head_dim / 4
    }
}

impl Kernel for KvCompress {
    fn name(&self) -> &'static str {
        "kv_compress"
    }
    /// Node tensors: 0 k_cache, 1 c_cache.
    fn dispatches(&self, _: &Caps) -> Vec<Dispatch> {
        vec![Dispatch {
            shader: key(self.kv_f16, false),
            bindings: vec![Bind::Tensor(0), Bind::Tensor(1)],
            workgroups: grid(self.items(self.max_windows()), WG, MAX_PER_DIM),
        }]
    }
    fn params(&self, _: usize, vars: &StepVars) -> Params {
        let s = &self.shape;
        let done = s.window.completed(vars.pos as usize, self.n_tokens);
        let (first, end) = (done.start.min(s.n_windows()), done.end.min(s.n_windows()));
        // The grid covers max_windows(); a step never completes more (a guard all the same).
        s.params(first, (end - first).min(self.max_windows()), vars.pos)
    }
    /// The most a step computes: `max_windows` windows of `size` keys read, one row written each.
    fn cost(&self) -> Cost {
        self.shape.cost(self.max_windows(), self.kv_f16)
    }
    /// Node tensors: k_cache, c_cache (written in place).
    fn reference(&self, io: &[HostIo], vars: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| {
            let mut c = io[1].f32()?;
            reference(&io[0].f32()?, &mut c, self.shape, vars.pos as usize, self.n_tokens);
            Ok(vec![Expected::at(1, c)])
        })
    }
}

/// The tree form: the window a draft tree's paths complete past the root, along each path, at the row where it
/// completes.
#[derive(Debug)]
pub struct KvCompressTree {
    shape: CompressShape,
    rows: usize,
    kv_f16: bool,
}

impl Kernel for KvCompressTree {
    fn name(&self) -> &'static str {
        "kv_compress_tree"
    }
    /// Node tensors: 0 k_cache, 1 tree, 2 the rows' windows.
    fn dispatches(&self, _: &Caps) -> Vec<Dispatch> {
        let s = &self.shape;
        vec![Dispatch {
            shader: key(self.kv_f16, true),
            bindings: vec![Bind::Tensor(0), Bind::Tensor(1), Bind::Tensor(2)],
            workgroups: grid(self.rows * s.n_kv * s.head_dim / 4, WG, MAX_PER_DIM),
        }]
    }
    fn params(&self, _: usize, vars: &StepVars) -> Params {
        let first = self.shape.window.count(vars.pos as usize + 1);
        self.shape.params(first, self.rows, vars.pos)
    }
    /// At most every row completing the window: `size` keys read and one row written per row and head.
    fn cost(&self) -> Cost {
        self.shape.cost(self.rows, self.kv_f16)
    }
    /// Node tensors: k_cache, tree, the rows' windows.
    fn reference(&self, io: &[HostIo], vars: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| {
            let out = reference_tree(&io[0].f32()?, &io[1].u32(), self.shape, vars.pos as usize);
            Ok(vec![Expected::at(2, out)])
        })
    }
}

impl Graph {
    /// Update `c_cache` `[n_kv, window.count(max_ctx), head_dim]` with the windows of `k_cache` `[n_kv, max_ctx,
    /// head_dim]` (f32 or f16; `c_cache` f32) completed by this step's `n_tokens` keys at positions `vars.pos ..`: an effect node,
    /// recorded after the step's `kv_write`. `head_dim` must be a multiple of 4.
    pub fn kv_compress(&mut self, k_cache: TensorId, c_cache: TensorId, n_tokens: usize, window: Window) -> Result<()> {
        window.check("kv_compress")?;
        let (ks, cs) = (self.shape(k_cache).to_vec(), self.shape(c_cache).to_vec());
        let f32s = matches!(self.dtype(k_cache), DType::F32 | DType::F16) && self.dtype(c_cache) == DType::F32;
        let bad = |why: &str| {
            Err(Error::shape(
                "kv_compress",
                format!("k_cache {ks:?}, c_cache {cs:?}, window {window:?}, {n_tokens} tokens: {why}"),
            ))
        };
        if ks.len() != 3 || cs.len() != 3 || !f32s {
            return bad("expected k_cache [n_kv, max_ctx, head_dim] f32 or f16 and c_cache [n_kv, n_windows, head_dim] f32");
        }
        let shape = CompressShape {
            n_kv: ks[0],
            max_ctx: ks[1],
            head_dim: ks[2],
            window,
        };
        if shape.n_kv == 0 || shape.head_dim == 0 || !shape.head_dim.is_multiple_of(4) {
            return bad("need n_kv >= 1 and head_dim a nonzero multiple of 4");
        }
        if shape.n_windows() == 0 {
            return bad("the K cache is shorter than one window");
        }
        if cs != [shape.n_kv, shape.n_windows(), shape.head_dim] {
            return bad(&format!(
                "c_cache must be [n_kv, (max_ctx - size) / stride + 1, head_dim] = {:?}",
                [shape.n_kv, shape.n_windows(), shape.head_dim]
            ));
        }
        if n_tokens == 0 || n_tokens > shape.max_ctx {
            return bad("need 1 <= n_tokens <= max_ctx");
        }
        let kv_f16 = super::attention_prefill::kv_f16(self, k_cache);
        self.add_effect(KvCompress { shape, n_tokens, kv_f16 }, &[k_cache, c_cache])
    }

    /// For a draft tree's step at `vars.pos` (its keys written, row r's in slot `pos + r`): the first `window` the
    /// root does not complete (index `window.count(pos + 1)`) along the path of each row at the depth where it
    /// completes, from the keys of its path (`tree` `[rows, TREE_W]` u32, attention_decode's table); zeros in the
    /// other rows (a deeper row's is its ancestor's at that depth). Returns `[rows, n_kv, head_dim]` f32: what
    /// `kv_compress` would cache for that window along the row's path.
    pub fn kv_compress_tree(&mut self, k_cache: TensorId, tree: TensorId, window: Window) -> Result<TensorId> {
        window.check("kv_compress_tree")?;
        let (ks, ts) = (self.shape(k_cache).to_vec(), self.shape(tree).to_vec());
        let kf = matches!(self.dtype(k_cache), DType::F32 | DType::F16);
        let ok = ks.len() == 3 && kf && ks[0] > 0 && ks[2] > 0 && ks[2].is_multiple_of(4);
        if !ok || ts.len() != 2 || ts[0] == 0 || ts[1] != TREE_W || self.dtype(tree) != DType::U32 {
            return Err(Error::shape(
                "kv_compress_tree",
                format!(
                    "k_cache {ks:?}, tree {ts:?}: expected k_cache [n_kv, max_ctx, head_dim] f32 or f16 (head_dim a \
                     multiple of 4) and tree u32 [rows, {TREE_W}]"
                ),
            ));
        }
        let shape = CompressShape {
            n_kv: ks[0],
            max_ctx: ks[1],
            head_dim: ks[2],
            window,
        };
        let rows = ts[0];
        let kv_f16 = super::attention_prefill::kv_f16(self, k_cache);
        let out = self.add_node(
            KvCompressTree { shape, rows, kv_f16 },
            &[k_cache, tree],
            &[("tree_windows", &[rows, shape.n_kv, shape.head_dim], DType::F32)],
        )?;
        Ok(out[0])
    }
}

/// CPU reference (means in f64, stored as f32): write into `c_cache` `[n_kv, n_windows, head_dim]` the windows of
/// `k_cache` `[n_kv, max_ctx, head_dim]` completed by a step of `n_tokens` keys at `pos` (windows past the cache
/// dropped). `pos = 0, n_tokens = len` computes every window of a prefix of `len` keys at once.
pub fn reference(k_cache: &[f32], c_cache: &mut [f32], s: CompressShape, pos: usize, n_tokens: usize) {
    let (hd, n) = (s.head_dim, s.n_windows());
    let done = s.window.completed(pos, n_tokens);
    for h in 0..s.n_kv {
        for i in done.start.min(n)..done.end.min(n) {
            for d in 0..hd {
                let sum: f64 = (0..s.window.size)
                    .map(|j| k_cache[(h * s.max_ctx + i * s.window.stride + j) * hd + d] as f64)
                    .sum();
                c_cache[(h * n + i) * hd + d] = (sum / s.window.size as f64) as f32;
            }
        }
    }
}

/// CPU reference of [`Graph::kv_compress_tree`] (means in f64, stored as f32): `k_cache` `[n_kv, max_ctx,
/// head_dim]`, `table` `[rows, TREE_W]`, the root at `pos`. Returns `[rows, n_kv, head_dim]`.
pub fn reference_tree(k_cache: &[f32], table: &[u32], s: CompressShape, pos: usize) -> Vec<f32> {
    let (hd, w) = (s.head_dim, s.window);
    let first = w.count(pos + 1);
    let positions = tree_positions(table, pos);
    let mut out = vec![0f32; positions.len() * s.n_kv * hd];
    for (r, &at) in positions.iter().enumerate() {
        if at + 1 != first * w.stride + w.size {
            continue;
        }
        let row = &table[r * TREE_W..(r + 1) * TREE_W];
        let slot = |t: usize| tree_key_slot(row, pos, t);
        for h in 0..s.n_kv {
            for d in 0..hd {
                let sum: f64 = (0..w.size)
                    .map(|j| k_cache[(h * s.max_ctx + slot(first * w.stride + j)) * hd + d] as f64)
                    .sum();
                out[(r * s.n_kv + h) * hd + d] = (sum / w.size as f64) as f32;
            }
        }
    }
    out
}

pub fn variants() -> Vec<ShaderKey> {
    [false, true]
        .into_iter()
        .flat_map(|tree| [key(false, tree), key(true, tree)])
        .collect()
}
