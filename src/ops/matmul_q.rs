//! Quantized dense layer `y[.., N] = x[.., K] · W[N, K]^T (+ bias[N])`, W in any packable type (Q4_0, Q4_1, Q5_0,
//! Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) packed by [`crate::quant::pack`] (super-blocks as 32-weight
//! blocks) and dequantized in registers (W4A16 / W8A16, f32 accumulation; f16 products on GPUs with SHADER_F16,
//! [`QMath`]): a GEMV for one token and a GEMM that reuses each weight load for several tokens, in the kernel
//! family of W's layout (chunk-tiled for CPU adapters, row-major for GPUs). One dispatch per row part of W.
//! With a GLU epilogue (`matmul_q_glu`) W's rows are (gate, up) pairs and the kernel writes `act(gate) * up`.
//! A decode step's q|k|v stored as two weights in different formats runs as one dispatch ([`two`]).
//! The graph methods that record its nodes, plain and fused, are in `nodes`.

use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{fits_uniform_array, grid, Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};
use crate::gpu::packed::PackedWeight;
use crate::ops::rope::{RopeConfig, RopeStyle};
use crate::ops::rope_kv::{QkvDims, RopeFields, KV_CACHE_PAIR};
use crate::ops::silu_mul::{epilogue_flags, reference_paired, Glu};
use crate::quant::pack::{kernel_formats, unpack, Format, HostPart, Layout, QK, TILE};
use crate::quant::GgmlType;

/// GEMV or GEMM. `Auto` picks the GEMV for one row of x (in the tiled layout for up to [`TILED_GEMV_MAX_M`] rows)
/// and the GEMM for more; the others force one, for any M (tests and benches).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum QPath {
    #[default]
    Auto,
    /// One row of x per invocation or workgroup (grid z = rows of x).
    Gemv,
    /// Several rows of x per invocation (tiled) or workgroup (rows) share each weight load.
    Gemm,
}

/// Arithmetic of the dequantized products. f16 (adapters with SHADER_F16, rows-layout kernels): quants dequantized
/// to f16, the products and each quant word's partial sum (up to 8 products) in f16, scales and the running sum in
/// f32; a word whose x holds a value of 512 or more is summed in f32 (f16 range); Q2_K and Q3_K have no f16 kernel
/// yet and compute in f32. The tiled layout, which only CPU
/// adapters get, has no f16 kernel: on lavapipe a Q4 f16 tiled GEMV measured 2 to 10x slower than the f32 one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum QMath {
    /// f16 where the adapter has it and [`f16_default`] says so, f32 otherwise.
    #[default]
    Auto,
    /// f32 everywhere.
    F32,
    /// f16 wherever the adapter has SHADER_F16 and W's layout has an f16 kernel (rows); f32 otherwise.
    F16,
}

/// Whether [`QMath::Auto`] computes in f16 on an adapter with SHADER_F16: on GPUs, as the W4A16 design asks, not on
/// CPU adapters. lavapipe has no f16 ALU (LLVM widens each f16 operation to f32 and rounds back): its rows-layout f16
/// GEMV and GEMM measured 1.1 to 2.6x slower than f32. The GPU choice is not yet backed by a GPU timing; the GEMV is
/// bound by weight reads there, and f16 costs some precision (NMSE ~2e-7 per matmul instead of ~1e-11).
pub fn f16_default(caps: &Caps) -> bool {
    !caps.cpu_adapter
}

/// Invocations per workgroup of the tiled kernels: one tile of 32 rows (8 lanes), so that even a 192-row matrix
/// spreads over several workgroups (llvmpipe threads); the per-workgroup cost is small on lavapipe.
const WG_TILED: usize = 8;
/// Most tiles per workgroup of a tiled GEMV with the norm prologue, which runs once per workgroup: as many tiles as
/// keep at least [`NORM_MIN_GROUPS`] workgroups, a power of two up to this. Measured on lavapipe with one thread
/// (`LP_NUM_THREADS=0 cargo bench --bench ops -- q|k|v gate|up`, least of 6 to 10 runs), the prologue's cost over
/// the GEMV alone: Qwen2.5-Coder-1.5B's gate|up (Q4_K, 560 tiles, 5.5 to 5.9 ms alone) 0.8 ms when each tile ran
/// it, 0.5 to 0.7 ms shared by 8 tiles and 0.4 by 32 (so most of it is the barriers' cost per SIMD chunk, which
/// sharing does not remove); its q|k|v (64 tiles, 0.68 ms) 0.12 ms per tile, 0.05 shared; SmolLM2's gate|up (96
/// tiles, 0.39 ms) 0.06 vs 0.03-0.05. A separate rms_norm costs one dispatch and 0 to 0.1 ms there.
const NORM_MAX_TILES: usize = 8;
/// Every count of tiles per workgroup [`MatmulQ::wg`] picks for the norm prologue.
const NORM_TILE_COUNTS: [usize; 4] = [1, 2, 4, NORM_MAX_TILES];
/// Fewest workgroups of a GEMV whose tiles share the norm prologue: enough to spread over a CPU adapter's threads.
const NORM_MIN_GROUPS: usize = 8;
/// Largest K of a GEMV with the norm prologue: its normalized x fills a 16 KiB workgroup array (WebGPU's default
/// `max_compute_workgroup_storage_size`).
pub const NORM_PROLOGUE_K: usize = 4096;
/// Rows of x the tiled layout runs as a GEMV; more take the GEMM with 2, 4 or 8 rows per invocation. Measured on
/// lavapipe (batched decode of 2 and 3 sessions): Qwen2.5-Coder-0.5B Q4_K_M steps of 2 rows 13.6 -> 21.2 tokens/s
/// and of 3 rows 12.9 -> 21.0 against the GEMV of 2 and 3 rows; SmolLM2 Q4_1 39 -> 53 and 42 -> 54.
pub const TILED_GEMV_MAX_M: usize = 1;
/// Most rows of x (a chain of tokens) of a q|k|v matmul with the rope epilogue ([`Graph::matmul_q_qkv_rope`]): a
/// verification step's.
pub const ROPE_MAX_M: usize = 8;
/// Rows of x per invocation of the tiled GEMM for 2 rows.
const TM_TILED_PAIR: usize = 2;
/// Rows of x per invocation of the tiled GEMM, and per workgroup of the rows-layout GEMM.
const TM_TILED: usize = 8;
/// Rows of x per invocation of the tiled GEMM for at most this many rows (a speculative verification step of 4).
const TM_TILED_SMALL: usize = 4;
const TM_ROWS: usize = 4;
/// Rows of W per workgroup of the rows-layout kernel (`NR` in the shader).
const ROWS_PER_GROUP: usize = 4;
/// WebGPU's guaranteed minimum of `max_compute_workgroups_per_dimension` (the grid's z).
const MAX_GROUPS: usize = 65535;

mod nodes;
mod two;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct MatmulQParams {
    m: u32,
    k: u32,
    n: u32,
    row0: u32,
    rows: u32,
    groups: u32,
    xv: u32,
    tiles: u32,
    alpha: f32,
    eps: f32,
    /// The rope epilogue's (zeros without it).
    rope: RopeFields,
    qkv0: u32,
    /// The second weight of a two-format GEMV (zeros without one: [`two`]): its first workgroup, tiles and rows.
    wg_b: u32,
    tiles_b: u32,
    rows_b: u32,
}

#[derive(Debug)]
pub struct MatmulQ {
    m: usize,
    k: usize,
    n: usize,
    format: Format,
    layout: Layout,
    bias: bool,
    /// (first row, rows) of each part of W.
    parts: Vec<(usize, usize)>,
    /// Device bytes of W (quants, scales, mins).
    wbytes: u64,
    path: QPath,
    math: QMath,
    /// GLU epilogue: W's rows are (gate, up) pairs and y `[M, N / 2]` is `act(gate) * up`.
    glu: Option<Glu>,
    /// Fused prologue and epilogue ([`Fused`]).
    fused: Fused,
}

/// What a fused tiled GEMV ([`Graph::matmul_q_fused`]) does around the product: x RMSNorm'ed first (a weight input
/// `[K]` and this epsilon), and/or y = res + alpha * (x · W^T) (a residual input `[M, N]` and this alpha), or
/// rope_kv's work on a stacked q|k|v ([`Graph::matmul_q_qkv_rope`]). With `post` (and the norm; neither the add nor
/// rope) the row normed is `x + alpha * rms_norm(r, rw)` (inputs r `[1, K]` and rw `[K]` after the norm weight, this
/// alpha), written as a second output ([`Graph::matmul_q_post_norm`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Fused {
    pub norm: Option<f32>,
    pub add: Option<f32>,
    pub rope: Option<FusedRope>,
    pub post: Option<f32>,
}

/// The rope_kv epilogue of a q|k|v GEMV: the heads, the rotation (interleaved pairs), the caches' element type and
/// which rows of q|k|v the weight holds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FusedRope {
    pub dims: QkvDims,
    pub cfg: RopeConfig,
    pub kv_f16: bool,
    /// The weight's first row in q|k|v (a weight holding some of the projections).
    pub qkv0: usize,
}

impl FusedRope {
    /// Input tensors after the norm weight: k_cache, v_cache and the frequency divisors.
    fn inputs(&self) -> usize {
        2 + usize::from(self.cfg.factors.is_some())
    }

    /// A rope epilogue with f16 or f32 caches, with or without frequency divisors: what its shader variant depends
    /// on (the variant lists).
    fn variant(kv_f16: bool, factors: bool) -> FusedRope {
        FusedRope {
            dims: QkvDims {
                n_tokens: 1,
                n_heads: 1,
                n_kv: 1,
                head_dim: 4,
                max_ctx: 1,
            },
            cfg: RopeConfig {
                factors: factors.then_some(TensorId(0)),
                ..RopeConfig::new(RopeStyle::Interleaved, 1e4, 4)
            },
            kv_f16,
            qkv0: 0,
        }
    }
}

/// Most tiles of a GEMV whose norm prologue costs less than a separate `rms_norm` dispatch on a CPU adapter (the
/// prologue's barriers cost per SIMD chunk, [`NORM_MAX_TILES`]): measured on lavapipe, SmolLM2's gate|up (96 tiles)
/// takes it for 0.03 to 0.05 ms; with it in Qwen2.5-Coder's (304 and 560 tiles) the fused step decoded 5 and 10%
/// slower than the unfused one (0.5B 9.6 vs 10.2, 1.5B 3.6 vs 4.0 tokens/s, three alternating runs each), with
/// `rms_norm` before the GEMV 7 and 6% faster (10.6 vs 9.9, 4.5 vs 4.3).
pub const NORM_PROLOGUE_TILES: usize = 128;

/// Whether `w`'s GEMV takes its input's RMSNorm in its prologue rather than after a separate `rms_norm`
/// ([`NORM_PROLOGUE_TILES`], [`NORM_PROLOGUE_K`]).
pub fn norm_prologue_pays(w: &PackedWeight) -> bool {
    w.n.div_ceil(TILE) <= NORM_PROLOGUE_TILES && w.k <= NORM_PROLOGUE_K
}

/// Whether [`Graph::matmul_q_fused`] can run `w` for `m` rows of x on this adapter: the tiled layout's GEMV (one
/// row) with 8-lane subgroups (the norm prologue mirrors `rms_norm`'s CPU-adapter reduction exactly).
pub fn can_fuse(caps: &Caps, w: &PackedWeight, m: usize) -> bool {
    w.layout == Layout::Tiled && m <= TILED_GEMV_MAX_M && subgroups8(caps) && caps.cpu_adapter
}

/// The subgroup broadcast of x in the tiled kernels needs 8 lanes per subgroup.
fn subgroups8(caps: &Caps) -> bool {
    caps.subgroups && caps.subgroup_size >= 8
}

/// A tiled-layout kernel: the GEMV (`tm` None) or the GEMM with `tm` rows of x per invocation.
fn tiled_key(format: Format, bias: bool, xu: bool, subgroups: bool, tm: Option<usize>) -> ShaderKey {
    tiled_key_wg(format, bias, xu, subgroups, tm, WG_TILED)
}

/// [`tiled_key`] with `wg` invocations per workgroup (a multiple of 8).
fn tiled_key_wg(format: Format, bias: bool, xu: bool, subgroups: bool, tm: Option<usize>, wg: usize) -> ShaderKey {
    let mut key = format
        .shader_flags(ShaderKey::new(if tm.is_some() {
            "matmul_q_tiled_mm"
        } else {
            "matmul_q_tiled"
        }))
        .def("W_AT", "1u")
        .flag("BIAS", bias)
        .flag("SUBGROUPS", subgroups)
        .def("WG", format!("{wg}u"));
    if let Some(tm) = tm {
        key = key.def("TM", format!("{tm}u")).flag("T2", tm >= 2).flag("T4", tm >= 4).flag("T8", tm >= 8);
    }
    key.flag("XU", xu)
}

/// A rows-layout kernel with `tm` rows of x per workgroup (1: the GEMV), with f16 products when `f16`.
fn rows_key(format: Format, bias: bool, subgroups: bool, tm: usize, f16: bool) -> ShaderKey {
    format
        .shader_flags(ShaderKey::new("matmul_q_rows"))
        .flag("BIAS", bias)
        .flag("SUBGROUPS", subgroups)
        .def("TM", format!("{tm}u"))
        .flag("F16", f16)
}

/// The flags and binding numbers of a fused GEMV (y at `y_at`, then res, then the norm weight, then r and its norm
/// weight, then the caches and factors; the post-norm's h last).
fn fused_flags(key: ShaderKey, f: Fused, y_at: usize) -> ShaderKey {
    let mut key = key
        .flag("NORM", f.norm.is_some())
        .flag("ADD", f.add.is_some())
        .flag("POST", f.post.is_some());
    if f.add.is_some() {
        key = key.def("RES_AT", format!("{}u", y_at + 1));
    }
    let norm_at = y_at + 1 + usize::from(f.add.is_some());
    if f.norm.is_some() {
        key = key.def("NORM_AT", format!("{norm_at}u"));
    }
    if f.post.is_some() {
        key = key
            .def("POST_R_AT", format!("{}u", norm_at + 1))
            .def("POST_W_AT", format!("{}u", norm_at + 2))
            .def("H_AT", format!("{}u", norm_at + 3));
    }
    if let Some(r) = f.rope {
        let kc = y_at + 1 + usize::from(f.add.is_some()) + usize::from(f.norm.is_some());
        key = key
            .flag("ROPE", true)
            .flag("KV_F16", r.kv_f16)
            .def("KC_AT", format!("{kc}u"))
            .def("VC_AT", format!("{}u", kc + 1));
        if r.cfg.factors.is_some() {
            key = key.flag("FACTORS", true).def("FACTORS_AT", format!("{}u", kc + 2));
        }
    }
    key
}

/// Invocations per workgroup of a GEMV over `tiles` tiles with the norm prologue: as many tiles as keep
/// [`NORM_MIN_GROUPS`] workgroups, a power of two up to [`NORM_MAX_TILES`].
fn norm_wg(tiles: usize) -> usize {
    let per = (tiles / NORM_MIN_GROUPS).clamp(1, NORM_MAX_TILES);
    WG_TILED << per.ilog2()
}

impl MatmulQ {
    fn path(&self) -> QPath {
        match self.path {
            QPath::Auto if self.layout == Layout::Tiled && self.m <= TILED_GEMV_MAX_M => QPath::Gemv,
            QPath::Auto if self.m > 1 => QPath::Gemm,
            QPath::Auto => QPath::Gemv,
            p => p,
        }
    }

    /// Rows of x per invocation (tiled) or workgroup (rows).
    fn tm(&self) -> usize {
        match (self.path(), self.layout) {
            (QPath::Gemm, Layout::Tiled) if self.m <= TM_TILED_PAIR => TM_TILED_PAIR,
            (QPath::Gemm, Layout::Tiled) if self.m <= TM_TILED_SMALL => TM_TILED_SMALL,
            (QPath::Gemm, Layout::Tiled) => TM_TILED,
            (QPath::Gemm, Layout::Rows) => TM_ROWS,
            _ => 1,
        }
    }

    /// The tiled kernels read x from a uniform array when all of it fits: every GEMV on a CPU adapter and the GEMM
    /// of a few rows (a verification step's), whose x loads lavapipe then gathers in one go instead of a load per
    /// lane and component (`bench --spec lookup`: verification 1.63 to 1.69 times a plain step, against 1.69 to
    /// 1.76 from storage).
    fn x_uniform(&self, caps: &Caps) -> bool {
        self.layout == Layout::Tiled && fits_uniform_array(caps, (self.m * self.k * 4) as u64)
    }

    /// Whether the kernel computes its products in f16.
    fn f16(&self, caps: &Caps) -> bool {
        let has = caps.f16 && self.layout == Layout::Rows && self.format.f16_kernels();
        match self.math {
            QMath::Auto => has && f16_default(caps),
            QMath::F32 => false,
            QMath::F16 => has,
        }
    }

    fn key(&self, caps: &Caps) -> ShaderKey {
        let gemm = self.path() == QPath::Gemm;
        let key = match self.layout {
            Layout::Tiled => tiled_key_wg(
                self.format,
                self.bias,
                self.x_uniform(caps),
                subgroups8(caps),
                gemm.then_some(self.tm()),
                self.wg(),
            ),
            Layout::Rows => rows_key(self.format, self.bias, caps.subgroups, self.tm(), self.f16(caps)),
        };
        fused_flags(epilogue_flags(key, self.glu), self.fused, self.y_binding())
    }

    /// Invocations per workgroup of the tiled kernels: [`WG_TILED`] (one tile), or for a GEMV that norms x in its
    /// prologue, up to [`NORM_MAX_TILES`] tiles that share it ([`NORM_MIN_GROUPS`]).
    fn wg(&self) -> usize {
        let tiles = self.parts.iter().map(|p| p.1.div_ceil(TILE)).max().unwrap_or(0);
        match self.fused.norm {
            Some(_) => norm_wg(tiles),
            None => WG_TILED,
        }
    }

    /// Binding of y: after x, the packed buffers and the bias.
    fn y_binding(&self) -> usize {
        3 + usize::from(self.format.third_buffer(self.layout)) + usize::from(self.bias)
    }

    /// Columns of y: N, or N / 2 with the GLU epilogue (the rope epilogue writes its N rows into q and the caches).
    fn y_cols(&self) -> usize {
        if self.glu.is_some() {
            self.n / 2
        } else {
            self.n
        }
    }
}

impl Kernel for MatmulQ {
    fn name(&self) -> &'static str {
        "matmul_q"
    }
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        let shader = self.key(caps);
        let nw = 3 + usize::from(self.format.third_buffer(self.layout));
        self.parts
            .iter()
            .enumerate()
            .map(|(i, &(_, rows))| {
                let mut bindings = vec![if self.x_uniform(caps) { Bind::Uniform(0) } else { Bind::Tensor(0) }];
                bindings.extend((1..nw).map(|s| Bind::Part(s, i)));
                if self.bias {
                    bindings.push(Bind::Tensor(nw));
                }
                // Inputs: x, the packed buffers, (bias), (res), (norm weight), (r, rw), (caches, factors); then y
                // (and the post-norm's h).
                let extra = usize::from(self.fused.add.is_some())
                    + usize::from(self.fused.norm.is_some())
                    + 2 * usize::from(self.fused.post.is_some())
                    + self.fused.rope.map_or(0, |r| r.inputs());
                let y = nw + usize::from(self.bias) + extra;
                bindings.push(Bind::Tensor(y));
                bindings.extend((y - extra..y).map(Bind::Tensor));
                if self.fused.post.is_some() {
                    bindings.push(Bind::Tensor(y + 1));
                }
                let [x, y, _] = match self.layout {
                    Layout::Tiled => grid(rows.div_ceil(TILE) * 8, self.wg(), caps.max_workgroups_per_dim),
                    Layout::Rows => grid(rows, ROWS_PER_GROUP, caps.max_workgroups_per_dim),
                };
                Dispatch {
                    shader: shader.clone(),
                    bindings,
                    workgroups: [x, y, self.m.div_ceil(self.tm()) as u32],
                }
            })
            .collect()
    }
    fn params(&self, i: usize, vars: &StepVars) -> Params {
        let (row0, rows) = self.parts[i];
        Params::of(&MatmulQParams {
            m: self.m as u32,
            k: self.k as u32,
            n: self.n as u32,
            row0: row0 as u32,
            rows: rows as u32,
            groups: (self.k / QK) as u32,
            xv: (self.k / 4) as u32,
            tiles: rows.div_ceil(TILE) as u32,
            alpha: self.fused.add.or(self.fused.post).unwrap_or(1.0),
            eps: self.fused.norm.unwrap_or(0.0),
            rope: self
                .fused
                .rope
                .map_or_else(RopeFields::default, |r| RopeFields::new(r.dims, &r.cfg, vars.pos)),
            qkv0: self.fused.rope.map_or(0, |r| r.qkv0 as u32),
            wg_b: 0,
            tiles_b: 0,
            rows_b: 0,
        })
    }
    /// Compulsory traffic: packed W once, x once, bias once, y once (the GLU: 5 flops per output; the post-norm's r
    /// and rw read and h written once).
    fn cost(&self) -> Cost {
        let (m, k, n, cols) = (self.m as u64, self.k as u64, self.n as u64, self.y_cols() as u64);
        let post = if self.fused.post.is_some() { 4 * k } else { 0 };
        Cost {
            bytes_read: self.wbytes + 4 * m * k + if self.bias { 4 * n } else { 0 } + 2 * post,
            bytes_written: 4 * m * cols + post,
            flops: 2 * m * n * k + if self.bias { m * n } else { 0 } + if self.glu.is_some() { 5 * m * cols } else { 0 },
        }
    }
    /// Node tensors: x, the packed buffers (row parts), (bias), y; W as the CPU dequantization of those very words.
    fn reference(&self, io: &[HostIo], vars: &StepVars) -> Option<Result<Vec<Expected>>> {
        let nw = 2 + usize::from(self.format.third_buffer(self.layout));
        expect(|| {
            let w = dequantize_io(self.format, self.layout, self.n, self.k, &self.parts, &io[1..=nw])?;
            let bias = if self.bias { Some(io[1 + nw].f32()?) } else { None };
            let mut at = 1 + nw + usize::from(self.bias);
            let res = match self.fused.add {
                Some(_) => {
                    at += 1;
                    Some(io[at - 1].f32()?)
                }
                None => None,
            };
            let mut x = io[0].f32()?;
            let mut h = None;
            if let Some(eps) = self.fused.norm {
                let nw = io[at].f32()?;
                at += 1;
                if let Some(alpha) = self.fused.post {
                    let r = super::rms_norm::reference(&io[at].f32()?, &io[at + 1].f32()?, eps);
                    x = super::add::reference(&x, &r, alpha);
                    h = Some(x.clone());
                    at += 2;
                }
                x = super::rms_norm::reference(&x, &nw, eps);
            }
            let mut y = reference(&x, &w, bias.as_deref(), self.m, self.k, self.n);
            if let Some(act) = self.glu {
                y = reference_paired(&y, act);
            }
            if let (Some(alpha), Some(res)) = (self.fused.add, res) {
                y = y.iter().zip(&res).map(|(&y, &r)| r + alpha * y).collect();
            }
            match (self.fused.rope, h) {
                (Some(r), _) => rope_reference(&r, &y, &io[at..], vars.pos, at),
                (None, Some(h)) => Ok(vec![Expected::at(at, y), Expected::at(at + 1, h)]),
                (None, None) => Ok(vec![Expected::at(at, y)]),
            }
        })
    }
    /// f32 products: the op tests' 1e-9; f16 products: x rounded to f16 (about 1e-7 at K = 4096) with margin. The
    /// GLU multiplies the two sums' relative errors into one output (about twice the NMSE) and adds exp's few ulp.
    fn check_bound(&self, caps: &Caps) -> f64 {
        if self.fused.rope.is_some_and(|r| r.kv_f16) {
            // As rope_kv: an f16 cache may round a key the other way where the f32 math differs in its last bit.
            return 1e-6;
        }
        let glu = if self.glu.is_some() { 4.0 } else { 1.0 };
        glu * if self.f16(caps) { 1e-5 } else { 1e-9 }
    }
}

/// A weight and its bias `[N]`, if any.
pub type BiasedWeight<'w> = (&'w PackedWeight, Option<TensorId>);


/// The rope epilogue's expected outputs from the product `y` `[m, rows]` of a weight holding rows `r.qkv0 ..` of
/// q|k|v: rope_kv's reference over the node tensors from the caches on (`io` from slot `at`: k_cache, v_cache,
/// (factors), q_out), what the weight does not hold left as it was.
fn rope_reference(r: &FusedRope, y: &[f32], io: &[HostIo], pos: u32, at: usize) -> Result<Vec<Expected>> {
    let d = r.dims;
    let (qn, kn) = (d.n_heads * d.head_dim, d.n_kv * d.head_dim);
    let width = y.len() / d.n_tokens.max(1);
    let holds = |from: usize, len: usize| r.qkv0 <= from && from + len <= r.qkv0 + width;
    // Each row of q|k|v, zeros where the weight has no rows.
    let full: Vec<f32> = y
        .chunks_exact(width.max(1))
        .flat_map(|row| {
            let mut f = vec![0.0; qn + 2 * kn];
            f[r.qkv0..r.qkv0 + width].copy_from_slice(row);
            f
        })
        .collect();
    let cols = |from: usize, width: usize| -> Vec<f32> {
        full.chunks_exact(qn + 2 * kn).flat_map(|row| row[from..from + width].to_vec()).collect()
    };
    let (q, k, v) = (cols(0, qn), cols(qn, kn), cols(qn + kn, kn));
    let factors = match r.cfg.factors {
        Some(_) => Some(io[2].f32()?),
        None => None,
    };
    let host = super::rope_kv::HostQkv {
        q: &q,
        k: &k,
        v: &v,
        qk_norm: None,
        factors: factors.as_deref(),
    };
    let (k0, v0) = (io[0].f32()?, io[1].f32()?);
    let (mut kc, mut vc) = (k0.clone(), v0.clone());
    let mut q_out = super::rope_kv::reference(d, &r.cfg, &host, pos, &mut kc, &mut vc);
    if r.kv_f16 {
        (kc, vc) = (super::kv_write::round_f16(&kc), super::kv_write::round_f16(&vc));
    }
    let q_at = at + r.inputs();
    if !holds(0, qn) {
        q_out = io[q_at - at].f32()?;
    }
    if !holds(qn, kn) {
        kc = k0;
    }
    if !holds(qn + kn, kn) {
        vc = v0;
    }
    Ok(vec![Expected::at(at, kc), Expected::at(at + 1, vc), Expected::at(q_at, q_out)])
}

/// The `[n, k]` weights packed words hold, from host copies of the buffers (quants, scales, and mins where the
/// layout has them; `parts` the (first row, rows) of each part): the CPU dequantization of the kernels' 32-weight
/// blocks, their constants formed as the kernels form them.
pub fn dequantize_io(
    format: Format,
    layout: Layout,
    n: usize,
    k: usize,
    parts: &[(usize, usize)],
    bufs: &[HostIo],
) -> Result<Vec<f32>> {
    let words: Vec<Vec<Vec<u32>>> = bufs.iter().map(HostIo::part_words).collect();
    let host: Vec<HostPart> = parts
        .iter()
        .enumerate()
        .map(|(i, &(row0, rows))| HostPart {
            row0,
            rows,
            quants: words[0][i].clone(),
            scales: words[1][i].clone(),
            mins: words.get(2).map_or(Vec::new(), |m| m[i].clone()),
        })
        .collect();
    let blocks = unpack(format.ty, layout, n, k, &host)?;
    let mut w = vec![0f32; n * k];
    match format.ty {
        GgmlType::Q2_K => crate::quant::q2_k::dequantize_blocks32(&blocks, &mut w)?,
        GgmlType::Q3_K => crate::quant::q3_k::dequantize_blocks32(&blocks, &mut w)?,
        GgmlType::Q4_K => crate::quant::q4_k::dequantize_blocks32(&blocks, &mut w)?,
        GgmlType::Q6_K => crate::quant::q6_k::dequantize_blocks32(&blocks, &mut w)?,
        _ => crate::quant::dequantize_into(format.kernel_ty(), &blocks, &mut w)?,
    }
    Ok(w)
}

/// CPU reference: [`super::matmul::reference`] (f64 accumulation) with `w` [n, k] the CPU dequantization of the
/// packed weights.
pub use super::matmul::reference;

/// Every variant: layout x path x format x (bias or a GLU epilogue) x subgroups (x f16 in the rows layout); the
/// tiled kernels with x in storage and in a uniform.
/// Formats with the same kernel blocks (Q4_K and Q4_1, Q5_K and Q5_1, IQ4_XS and IQ4_NL) share variants.
pub fn variants() -> Vec<ShaderKey> {
    let mut v = Vec::new();
    let epilogues = [(false, None), (true, None), (false, Some(Glu::Silu)), (false, Some(Glu::GeluTanh))];
    for format in kernel_formats() {
        for (bias, glu) in epilogues {
            for sg in [false, true] {
                let mut keys = Vec::new();
                for xu in [false, true] {
                    keys.push(tiled_key(format, bias, xu, sg, None));
                    for tm in [TM_TILED_PAIR, TM_TILED_SMALL, TM_TILED] {
                        keys.push(tiled_key(format, bias, xu, sg, Some(tm)));
                    }
                }
                for tm in [1, TM_ROWS] {
                    for f16 in [false, format.f16_kernels()] {
                        keys.push(rows_key(format, bias, sg, tm, f16));
                    }
                }
                v.extend(keys.into_iter().map(|k| epilogue_flags(k, glu)));
            }
        }
    }
    // The fused tiled GEMVs (subgroups only; y at binding 3, plus one for a third buffer and one for a bias).
    for format in kernel_formats() {
        for xu in [false, true] {
            for (bias, glu) in epilogues {
                // One tile per workgroup first (every fused form), then the workgroups that share the norm prologue.
                let keys = NORM_TILE_COUNTS
                    .map(|per| epilogue_flags(tiled_key_wg(format, bias, xu, true, None, WG_TILED * per), glu));
                let key = keys[0].clone();
                let y_at = 3 + usize::from(format.third_buffer(Layout::Tiled)) + usize::from(bias);
                let norm = Fused {
                    norm: Some(1e-6),
                    ..Default::default()
                };
                v.extend(keys.iter().map(|k| fused_flags(k.clone(), norm, y_at)));
                let post = Fused {
                    post: Some(1.0),
                    ..norm
                };
                v.extend(keys.iter().map(|k| fused_flags(k.clone(), post, y_at)));
                if glu.is_none() {
                    let add = Fused {
                        add: Some(1.0),
                        ..Default::default()
                    };
                    v.push(fused_flags(key.clone(), add, y_at));
                    // The rope epilogue, with and without the norm: f32 and f16 caches, with and without factors.
                    for (kv_f16, factors) in [(false, false), (true, false), (false, true), (true, true)] {
                        let rope = FusedRope::variant(kv_f16, factors);
                        v.push(fused_flags(key.clone(), Fused { rope: Some(rope), ..Default::default() }, y_at));
                        let f = Fused {
                            norm: Some(1e-6),
                            rope: Some(rope),
                            ..Default::default()
                        };
                        v.extend(keys.iter().map(|k| fused_flags(k.clone(), f, y_at)));
                    }
                }
            }
        }
    }
    // The tiled GEMM with the rope epilogue (a verification step's chain of tokens), with and without subgroups, x in
    // storage or a uniform.
    for format in kernel_formats() {
        for (bias, sg) in [(false, false), (false, true), (true, false), (true, true)] {
            let y_at = 3 + usize::from(format.third_buffer(Layout::Tiled)) + usize::from(bias);
            for tm in [TM_TILED_PAIR, TM_TILED_SMALL, TM_TILED] {
                for (kv_f16, factors) in [(false, false), (true, false), (false, true), (true, true)] {
                    let rope = Some(FusedRope::variant(kv_f16, factors));
                    for xu in [false, true] {
                        let key = tiled_key(format, bias, xu, sg, Some(tm));
                        v.push(fused_flags(key, Fused { rope, ..Default::default() }, y_at));
                    }
                }
            }
        }
    }
    v.extend(two::variants());
    v.dedup();
    v
}
