//! Causal GQA attention of a chunk of queries against the KV cache: tiled, flash-style (online softmax).
//!
//! KV cache layout (see `kv_write`): K and V caches are f32 or f16 `[n_kv_heads, max_ctx, head_dim]`, each head's
//! positions contiguous. Query `i` of the chunk sits at absolute position `vars.pos + i` and attends to cache
//! positions `0 ..= pos + i`, so a chunk after earlier chunks sees the whole prefix. Query head `h` reads kv head
//! `h / (n_heads / n_kv_heads)`. One workgroup serves 64 (token, head) rows of one GQA group and stages K/V tiles of
//! `BK` keys in workgroup memory, shared by all its rows: for a decode-sized chunk `attention_decode` is the op.

use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};

/// Head dims with a shader variant (the private accumulators have constant size) in every attention op; this
/// op's own tiled kernel serves exactly these.
pub const HEAD_DIMS: [usize; 5] = [32, 64, 80, 96, 128];
/// Head dims of the dense ops (this one and `attention_decode`): also Gemma's 256, which this op runs through
/// `attention_decode`'s split-KV kernel. The tiled kernel keeps a row's query and output accumulator per
/// invocation (512 floats at head_dim 256): on lavapipe (Vulkan and GL alike) it gave wrong results once a row saw
/// more than about 450 keys (NMSE ~1; cause not found), and on GPUs that much private state spills anyway.
pub const DENSE_HEAD_DIMS: [usize; 6] = [32, 64, 80, 96, 128, 256];

/// Rows (query token x head of a GQA group) per workgroup.
const ROWS_PER_WG: usize = 64;
/// Rows per workgroup of the CPU-adapter kernel (`attention_prefill_cpu.wgsl`, one 8-lane subgroup): each key and
/// value a lane loads serves this many rows.
const ROWS_PER_WG_CPU: usize = 4;

/// Keys per tile: K and V tiles take 2 * BK * head_dim * 4 bytes, kept within WebGPU's guaranteed 16 KiB.
fn tile_keys(head_dim: usize) -> usize {
    if head_dim <= 64 {
        32
    } else {
        16
    }
}

/// Keys per tile on CPU adapters (where this kernel runs only without subgroups: llvmpipe's GL, or lavapipe with
/// subgroups turned off). llvmpipe unrolls the tile's key loop into the head-dimension loops, and its GL compiler
/// took 75 s for the head_dim 64 kernel at 32 keys per tile, 18 s at 16 and 5 s at 8 (an empty shader cache; each
/// test run on GL paid it once).
const CPU_TILE_KEYS: usize = 8;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct PrefillParams {
    n_tokens: u32,
    n_heads: u32,
    n_kv: u32,
    group: u32,
    max_ctx: u32,
    pos: u32,
    scale: f32,
    window: u32,
}

/// Shapes of an attention node, checked once for both attention ops.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_tokens: usize,
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub max_ctx: usize,
}

impl AttnShape {
    pub fn group(&self) -> usize {
        self.n_heads / self.n_kv
    }

    /// Check `q` `[n_tokens, n_heads, head_dim]` f32 and both caches `[n_kv, max_ctx, head_dim]`, both f32 or both
    /// f16 ([`kv_f16`] tells which).
    pub fn check(g: &Graph, op: &'static str, q: TensorId, k: TensorId, v: TensorId) -> Result<AttnShape> {
        let (qs, kcs, vcs) = (g.shape(q), g.shape(k), g.shape(v));
        let kv_type = matches!(g.dtype(k), DType::F32 | DType::F16) && g.dtype(k) == g.dtype(v);
        let f32s = g.dtype(q) == DType::F32 && kv_type;
        let bad = |why: &str| {
            Err(Error::shape(
                op,
                format!("q {qs:?}, k_cache {kcs:?}, v_cache {vcs:?}: {why}"),
            ))
        };
        if qs.len() != 3 || kcs.len() != 3 || kcs != vcs || !f32s {
            return bad("expected f32 q [n_tokens, n_heads, head_dim] and caches [n_kv, max_ctx, head_dim], both f32 or f16");
        }
        let s = AttnShape {
            n_tokens: qs[0],
            n_heads: qs[1],
            n_kv: kcs[0],
            head_dim: qs[2],
            max_ctx: kcs[1],
        };
        if kcs[2] != s.head_dim {
            return bad("q and cache head_dim differ");
        }
        if !DENSE_HEAD_DIMS.contains(&s.head_dim) {
            return bad(&format!("head_dim must be one of {DENSE_HEAD_DIMS:?}"));
        }
        if s.n_kv == 0 || s.n_heads == 0 || !s.n_heads.is_multiple_of(s.n_kv) {
            return bad("n_heads must be a nonzero multiple of n_kv_heads");
        }
        if s.n_tokens == 0 || s.n_tokens > s.max_ctx {
            return bad("need 1 <= n_tokens <= max_ctx");
        }
        Ok(s)
    }

    /// Query-key pairs the causal mask keeps when the chunk ends at `max_ctx` (the cost models' assumption).
    pub fn pairs_at_full_context(&self) -> u64 {
        let (n, pos) = (self.n_tokens as u64, (self.max_ctx - self.n_tokens) as u64);
        n * pos + n * (n + 1) / 2
    }
}

/// Whether a KV cache holds f16 (the kernels' KV_F16 variants, lib/kv_cache.wgsl) rather than f32.
pub fn kv_f16(g: &Graph, cache: TensorId) -> bool {
    g.dtype(cache) == DType::F16
}

/// Bytes of one cached element.
pub(super) fn kv_elem_bytes(f16: bool) -> u64 {
    if f16 {
        2
    } else {
        4
    }
}

#[derive(Debug)]
pub struct AttentionPrefill {
    shape: AttnShape,
    kv_f16: bool,
    scale: f32,
    /// Sliding window (keys per query), 0 for none.
    window: usize,
}

impl AttentionPrefill {
    fn workgroups(&self, rows_per_wg: usize) -> [u32; 3] {
        let rows = self.shape.n_tokens * self.shape.group();
        [rows.div_ceil(rows_per_wg) as u32, self.shape.n_kv as u32, 1]
    }
}

/// The tiled kernel, with [`CPU_TILE_KEYS`] keys per tile when `cpu` (a CPU adapter).
fn key(head_dim: usize, kv_f16: bool, cpu: bool) -> ShaderKey {
    let bk = if cpu { CPU_TILE_KEYS } else { tile_keys(head_dim) };
    ShaderKey::new("attention_prefill")
        .def("HD", head_dim)
        .def("BK", bk)
        .flag("KV_F16", kv_f16)
}

/// The kernel for CPU adapters with 8-lane subgroups: no workgroup memory or barriers, the lanes splitting the head
/// dimension, each load serving [`ROWS_PER_WG_CPU`] rows. On lavapipe a 512-token SmolLM2 chunk's attention took
/// 109 ms per layer in the tiled kernel (2.8 GFLOP/s), which keeps K/V tiles in workgroup memory behind barriers.
fn cpu_key(head_dim: usize, kv_f16: bool) -> ShaderKey {
    ShaderKey::new("attention_prefill_cpu")
        .def("HD", head_dim)
        .def("R", format!("{ROWS_PER_WG_CPU}u"))
        .flag("SUBGROUPS", true)
        .flag("KV_F16", kv_f16)
}

/// Whether the adapter runs the CPU-adapter attention kernels (`attention_prefill_cpu.wgsl`, and so
/// [`Graph::attention_prefill_wide`] at head_dim 256; `attention_decode_cpu.wgsl`): a CPU adapter with subgroups of
/// at least 8 lanes.
pub fn cpu_kernel(caps: &Caps) -> bool {
    caps.cpu_adapter && caps.subgroups && caps.subgroup_size >= 8
}

impl Kernel for AttentionPrefill {
    fn name(&self) -> &'static str {
        "attention_prefill"
    }
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        let (hd, f16) = (self.shape.head_dim, self.kv_f16);
        // Head dim 256 exists only in the CPU kernel ([`Graph::attention_prefill_wide`]).
        let (shader, workgroups) = match cpu_kernel(caps) || !HEAD_DIMS.contains(&hd) {
            true => (cpu_key(hd, f16), self.workgroups(ROWS_PER_WG_CPU)),
            false => (key(hd, f16, caps.cpu_adapter), self.workgroups(ROWS_PER_WG)),
        };
        vec![Dispatch {
            shader,
            bindings: (0..4).map(Bind::Tensor).collect(),
            workgroups,
        }]
    }
    fn params(&self, _: usize, vars: &StepVars) -> Params {
        let s = &self.shape;
        Params::of(&PrefillParams {
            n_tokens: s.n_tokens as u32,
            n_heads: s.n_heads as u32,
            n_kv: s.n_kv as u32,
            group: s.group() as u32,
            max_ctx: s.max_ctx as u32,
            pos: vars.pos,
            scale: self.scale,
            window: self.window as u32,
        })
    }
    /// Assumes the chunk ends at `max_ctx` (cost has no step variables). Flops: QK^T and PV over the pairs the
    /// causal mask keeps. Bytes read: the K/V tiles each workgroup loads (a workgroup loads every key its last row
    /// sees) plus q; written: the output.
    fn cost(&self) -> Cost {
        let s = &self.shape;
        let pos = s.max_ctx - s.n_tokens;
        let rows = s.n_tokens * s.group();
        let kv_keys: u64 = (0..rows.div_ceil(ROWS_PER_WG))
            .map(|w| {
                let last = ((w + 1) * ROWS_PER_WG).min(rows) - 1;
                (pos + last / s.group() + 1) as u64
            })
            .sum();
        let act = 4 * (s.n_tokens * s.n_heads * s.head_dim) as u64;
        Cost {
            bytes_read: 2 * kv_elem_bytes(self.kv_f16) * kv_keys * (s.n_kv * s.head_dim) as u64 + act,
            bytes_written: act,
            flops: 4 * s.pairs_at_full_context() * (s.n_heads * s.head_dim) as u64,
        }
    }
    fn reference(&self, io: &[HostIo], vars: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| {
            let (q, k, v) = (io[0].f32()?, io[1].f32()?, io[2].f32()?);
            let window = (self.window > 0).then_some(self.window);
            let y = reference_window(&q, &k, &v, self.shape, vars.pos as usize, self.scale, window);
            Ok(vec![Expected::at(3, y)])
        })
    }
}

impl Graph {
    /// Causal attention of `q` `[n_tokens, n_heads, head_dim]` (f32, positions `vars.pos ..`) against the caches
    /// `[n_kv_heads, max_ctx, head_dim]`, scores scaled by `scale`. Returns `[n_tokens, n_heads, head_dim]` f32.
    /// The caches must already hold this chunk's keys and values (`kv_write` before this node).
    pub fn attention_prefill(
        &mut self,
        q: TensorId,
        k_cache: TensorId,
        v_cache: TensorId,
        scale: f32,
    ) -> Result<TensorId> {
        self.attention_prefill_window(q, k_cache, v_cache, scale, None)
    }

    /// [`Graph::attention_prefill`] where each query sees only the last `window` keys (sliding-window layers).
    pub fn attention_prefill_window(
        &mut self,
        q: TensorId,
        k_cache: TensorId,
        v_cache: TensorId,
        scale: f32,
        window: Option<usize>,
    ) -> Result<TensorId> {
        let shape = AttnShape::check(self, "attention_prefill", q, k_cache, v_cache)?;
        if !HEAD_DIMS.contains(&shape.head_dim) {
            return self.attention_split_kv(q, k_cache, v_cache, scale, window, (None, None));
        }
        self.prefill_node(shape, (q, k_cache, v_cache), scale, window)
    }

    /// [`Graph::attention_prefill_window`] for adapters with the CPU kernel ([`cpu_kernel`]), which also serves head
    /// dim 256 (Gemma 3) there instead of the split-KV kernel: on lavapipe Gemma 3 270M's 128-token chunk at
    /// position 1280 took 52.0 ms against 75.8 (f16 cache: 40.4 against 49.2). The plan fails on other adapters.
    pub fn attention_prefill_wide(
        &mut self,
        q: TensorId,
        k_cache: TensorId,
        v_cache: TensorId,
        scale: f32,
        window: Option<usize>,
    ) -> Result<TensorId> {
        let shape = AttnShape::check(self, "attention_prefill", q, k_cache, v_cache)?;
        self.prefill_node(shape, (q, k_cache, v_cache), scale, window)
    }

    fn prefill_node(
        &mut self,
        shape: AttnShape,
        (q, k_cache, v_cache): (TensorId, TensorId, TensorId),
        scale: f32,
        window: Option<usize>,
    ) -> Result<TensorId> {
        let window_keys = check_window("attention_prefill", window)?;
        if !scale.is_finite() {
            return Err(Error::shape(
                "attention_prefill",
                format!("scale {scale} is not finite"),
            ));
        }
        let rows = shape.n_tokens * shape.group();
        if rows.div_ceil(ROWS_PER_WG_CPU) > u16::MAX as usize {
            return Err(Error::shape(
                "attention_prefill",
                format!("{rows} rows exceed one dispatch"),
            ));
        }
        let out_shape = [shape.n_tokens, shape.n_heads, shape.head_dim];
        let kernel = AttentionPrefill {
            shape,
            kv_f16: kv_f16(self, k_cache),
            scale,
            window: window_keys,
        };
        Ok(self.add_node(kernel, &[q, k_cache, v_cache], &[("attn_out", &out_shape, DType::F32)])?[0])
    }
}

/// A window as the kernels take it: 0 for none; a zero or oversized window is an error.
pub(super) fn check_window(op: &'static str, window: Option<usize>) -> Result<usize> {
    match window {
        None => Ok(0),
        Some(w) if w > 0 && w <= u32::MAX as usize / 2 => Ok(w),
        Some(w) => Err(Error::shape(op, format!("sliding window {w} is out of range"))),
    }
}

/// CPU reference in f64 with a two-pass softmax: `q` `[n_tokens, n_heads, head_dim]` at positions `pos ..`,
/// caches `[n_kv, max_ctx, head_dim]`; query `i` attends to keys `0 ..= pos + i`. Returns `[n_tokens, n_heads,
/// head_dim]`.
pub fn reference(q: &[f32], k_cache: &[f32], v_cache: &[f32], s: AttnShape, pos: usize, scale: f32) -> Vec<f32> {
    reference_window(q, k_cache, v_cache, s, pos, scale, None)
}

/// [`reference`] where query `i` sees only keys `pos + i + 1 - window ..= pos + i` (sliding window).
pub fn reference_window(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    s: AttnShape,
    pos: usize,
    scale: f32,
    window: Option<usize>,
) -> Vec<f32> {
    let (hd, ctx) = (s.head_dim, s.max_ctx);
    let mut out = vec![0f32; s.n_tokens * s.n_heads * hd];
    let mut scores = vec![0f64; ctx];
    let mut acc = vec![0f64; hd];
    for t in 0..s.n_tokens {
        let n_keys = (pos + t + 1).min(ctx);
        let first = window.map_or(0, |w| (pos + t + 1).saturating_sub(w));
        for h in 0..s.n_heads {
            let kvh = h / s.group();
            let qr = &q[(t * s.n_heads + h) * hd..][..hd];
            for (j, sc) in scores[..n_keys].iter_mut().enumerate() {
                if j < first {
                    *sc = f64::NEG_INFINITY;
                    continue;
                }
                let kr = &k_cache[(kvh * ctx + j) * hd..][..hd];
                *sc = qr.iter().zip(kr).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * scale as f64;
            }
            let max = scores[..n_keys].iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let mut sum = 0f64;
            acc.iter_mut().for_each(|a| *a = 0.0);
            for (j, &sc) in scores[..n_keys].iter().enumerate().skip(first) {
                let p = (sc - max).exp();
                sum += p;
                let vr = &v_cache[(kvh * ctx + j) * hd..][..hd];
                acc.iter_mut().zip(vr).for_each(|(a, &v)| *a += p * v as f64);
            }
            let o = &mut out[(t * s.n_heads + h) * hd..][..hd];
            o.iter_mut().zip(&acc).for_each(|(o, a)| *o = (a / sum) as f32);
        }
    }
    out
}

pub fn variants() -> Vec<ShaderKey> {
    HEAD_DIMS
        .iter()
        .flat_map(|&d| [false, true].map(|f16| [key(d, f16, false), key(d, f16, true), cpu_key(d, f16)]))
        .flatten()
        .chain([cpu_key(256, false), cpu_key(256, true)])
        .collect()
}
