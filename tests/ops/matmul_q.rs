//! matmul_q vs a CPU reference: f64 accumulation over the CPU dequantization of the very blocks that were packed
//! (`pack::dequantize_packed`: for super-block types the 32-weight blocks they are repacked into, whose constants
//! are rounded to f16; Q2_K and Q3_K: ggml's own values, which the kernels form exactly), so the test measures the
//! kernel, not the quantization. Formats: every packable type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q4_K, Q5_K,
//! Q6_K, IQ4_XS, Q2_K, Q3_K); both layouts (tiled and rows, each run on this adapter); GEMV and GEMM; bias; W split into row parts; the
//! fallback device. k-quants need K a multiple of 256, so each grid K is rounded up to one for them.
//!
//! Weights are random raw blocks (every nibble / byte / high-bit pattern, -128 included; f16 scales of 2^-5..2^-4,
//! Q4_1 and Q5_1 mins of either sign; IQ4_XS: every 6-bit scale code; k-quants: every 6-bit or i8 sub-block code, super-block factors that make sub-block scales up
//! to about 2^-3 and mins up to 2^-2), x uniform in [-1, 1].
//!
//! Metric: NMSE, bound 1e-9. Why: the kernels sum in f32 in another order than the f64 reference. Per block they
//! form `s = sum q x` with q up to 15 (5-bit: 31, 6-bit: 63, Q8: |q| <= 128, codebook: |q| <= 127), then fold the
//! offset as `d (s - c sum x)` (c = 8 for Q4_0, 16 for Q5_0; Q4_1 and Q5_1: `d s + m sum x`; Q6_K sums each half
//! of a block apart, c = 32), which cancels: |s| is about 2x the folded sum (the quants' range is centred on c),
//! so the rounding of s weighs about 4x in squared error whatever the width. With per-step error eps = 2^-24 on running sums of L terms
//! growing like sqrt(j), the NMSE is about eps^2 L^2 / (2K) <= eps^2 K / 2 for one chain over all of K; with
//! K = 4096 and the 4x fold that is 2.9e-11. The bound leaves 30x margin, while one wrong nibble order, scale, block
//! or row offset gives 1e-3 or more (k-quant cases measure 1e-14..1e-11).
//!
//! The f16 arithmetic (rows layout, forced with `QMath::F16`; the cases named `_f16`): over the same grid, with the
//! bound derived from f16's unit roundoff u = 2^-11. Each product w x is formed from x rounded to f16 (one rounding)
//! and rounded (another); an f16 partial sum of L <= 8 products adds at most L - 1 roundings of partial sums whose
//! squares average at most the sum of the L terms' squares; the scale and the running sum are f32 (negligible).
//! With independent relative errors of variance u^2 / 3, an output's error variance is at most
//! u^2 (L + 1) / 3 sum_k (w_k x_k)^2, so the bound is 10 u^2 (L + 1) / 3 sum (w x)^2 / sum y^2 (plus the f32
//! bound): 10x the expected NMSE, which a sum of squared Gaussian errors exceeds with probability under 0.2% even
//! for one output. For x uniform in [-1, 1] and random quants sum (w x)^2 / sum y^2 is about 1, so the bound is
//! about 7e-6 and the cases measure 1e-8..6e-7 (f32: 1e-14..1e-11). Cases with identical values everywhere (the
//! f16 range cases) have errors of one sign and use the worst case instead: ((L + 1) u)^2 sum (sum |w x|)^2 /
//! sum y^2. x entries below f16's smallest normal 2^-14 lose relative precision: their absolute error (2^-25) is
//! negligible here.

use crate::common::{exact, gpu_fallback, nmse, Case, Check, Rng};
use shaderlm::gpu::{DType, Gpu, GpuOptions, GpuTensor};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::matmul_q::{self, QMath, QPath};
use shaderlm::ops::kv_write;
use shaderlm::ops::rope::{RopeConfig, RopeStyle};
use shaderlm::ops::rope_kv::QkvSource;
use shaderlm::ops::silu_mul::{reference_paired, Glu};
use shaderlm::gpu::packed::PackedWeight;
use shaderlm::quant::pack::{dequantize_packed, Format, Layout, PACKABLE};
use shaderlm::quant::GgmlType;
use std::sync::OnceLock;

const BOUND: f64 = 1e-9;
/// The GLU epilogue's bound over the matmul's: y = act(g) u has error act'(g) u dg + act(g) du with |act'| < 1.13
/// (SiLU and tanh-GELU), so for gate and up sums of one distribution its NMSE is at most about
/// NMSE_sum * (1.3 E[g^2] / E[act(g)^2] + 1), and E[g^2] / E[act(g)^2] is about 2 for symmetric gates (the
/// negative half nearly vanishes); exp's few ulp are negligible. Cases measure well inside the matmul bound.
const GLU_FACTOR: f64 = 4.0;
/// f16's unit roundoff (11-bit significand).
const U16: f64 = 1.0 / 2048.0;
/// Most products in one f16 partial sum of the f16 kernels.
const L16: f64 = 8.0;

const FORMATS: [GgmlType; 12] = PACKABLE;

/// A device whose storage bindings are capped at 32 KiB, so small weights split into several row parts.
pub fn gpu_split() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| {
        let opts = GpuOptions {
            max_binding_override: Some(32 << 10),
            ..Default::default()
        };
        crate::common::new_gpu(&opts)
    })
}

/// Random raw GGUF blocks of a [n, k] tensor: all quant patterns, f16 scales in [2^-5, 2^-4), signed mins.
/// k-quants: all sub-block codes; Q4_K / Q5_K `d` in [2^-10, 2^-9) (sub-block scales up to 63 d < 2^-3) and `dmin`
/// of either sign below 2^-8 (mins up to 2^-2); Q6_K `d` in [2^-11, 2^-10) (|scale| up to 128 d < 2^-3); IQ4_XS
/// `d` in [2^-10, 2^-9) (sub-block scales up to 32 d = 2^-4, as the 32-weight types); Q2_K `d` in [2^-8, 2^-7)
/// (scales up to 15 d < 2^-3) and `dmin` of either sign below 2^-8 (mins up to 15 dmin < 2^-4); Q3_K `d` in
/// [2^-10, 2^-9) (|sc - 32| <= 32: scales up to 2^-4).
pub fn random_blocks(ty: GgmlType, n: usize, k: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let bb = ty.type_size();
    let mut raw = vec![0u8; n * k / ty.block_size() * bb];
    let f16_at = |blk: &mut [u8], at: usize, v: f32| {
        blk[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
    };
    for blk in raw.chunks_exact_mut(bb) {
        for b in blk.iter_mut() {
            *b = rng.below(256) as u8;
        }
        match ty {
            GgmlType::Q4_K | GgmlType::Q5_K => {
                f16_at(blk, 0, (1.0 + rng.f32().abs()) / 1024.0);
                f16_at(blk, 2, rng.f32() / 256.0);
            }
            GgmlType::Q6_K => f16_at(blk, 208, (1.0 + rng.f32().abs()) / 2048.0),
            GgmlType::IQ4_XS => f16_at(blk, 0, (1.0 + rng.f32().abs()) / 1024.0),
            GgmlType::Q2_K => {
                f16_at(blk, 80, (1.0 + rng.f32().abs()) / 256.0);
                f16_at(blk, 82, rng.f32() / 256.0);
            }
            GgmlType::Q3_K => f16_at(blk, 108, (1.0 + rng.f32().abs()) / 1024.0),
            _ => {
                f16_at(blk, 0, (1.0 + rng.f32().abs()) / 32.0);
                if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                    f16_at(blk, 2, rng.f32() * 0.25);
                }
            }
        }
    }
    raw
}

/// Whether `ty` is a k-quant (256-weight super-blocks).
pub fn k_quant(ty: GgmlType) -> bool {
    ty.block_size() == 256
}

#[derive(Clone, Copy, Debug)]
struct Shape {
    ty: GgmlType,
    layout: Layout,
    m: usize,
    k: usize,
    n: usize,
    bias: bool,
    path: QPath,
    math: QMath,
    /// The GLU epilogue: W's n rows are (gate, up) pairs, y is `[m, n / 2]`.
    glu: Option<Glu>,
}

impl Shape {
    fn name(&self) -> String {
        let b = if self.bias { "_bias" } else { "" };
        let layout = match self.layout {
            Layout::Tiled => "tiled",
            Layout::Rows => "rows",
        };
        let path = match self.path {
            QPath::Auto => "auto",
            QPath::Gemv => "gemv",
            QPath::Gemm => "gemm",
        };
        let math = match self.math {
            QMath::Auto => "",
            QMath::F32 => "_f32",
            QMath::F16 => "_f16",
        };
        let glu = match self.glu {
            None => "",
            Some(Glu::Silu) => "_silu",
            Some(Glu::GeluTanh) => "_gelu",
        };
        format!(
            "{}_{layout}_{path}_m{}_k{}_n{}{b}{math}{glu}",
            self.ty, self.m, self.k, self.n
        )
    }
}

/// Run one matmul_q on `gpu` and compare with the reference; returns (check, parts of W).
fn run(gpu: &Gpu, s: Shape) -> shaderlm::Result<(Check, usize)> {
    run_with(gpu, s, |_, _| {}, false)
}

/// [`run`] with x (uniform in [-1, 1]) and the raw blocks edited by `edit` first; with `worst`, the f16 bound is the
/// worst case (for data whose rounding errors need not be independent).
fn run_with(
    gpu: &Gpu,
    s: Shape,
    edit: impl Fn(&mut [f32], &mut [u8]),
    worst: bool,
) -> shaderlm::Result<(Check, usize)> {
    let (m, k, n) = (s.m, s.k, s.n);
    let seed = (m * 1_000_003 + k * 1009 + n) as u64 + s.ty.id() as u64;
    let mut raw = random_blocks(s.ty, n, k, seed);
    let mut rng = Rng::new(seed ^ 0x5eed);
    let mut x = rng.vec(m * k, 1.0);
    edit(&mut x, &mut raw);
    let b = rng.vec(n, 1.0);
    let w = PackedWeight::upload_with(gpu, "w", s.ty, s.layout, n, k, &raw)?;
    let bt = GpuTensor::upload_f32(gpu, "bias", &[n], &b)?;
    let mut g = Graph::new();
    let tx = g.input("x", &[m, k], DType::F32);
    let tb = s.bias.then(|| g.external(&bt));
    let y = match s.glu {
        Some(act) => g.matmul_q_glu_with(tx, &w, s.path, s.math, act)?,
        None => g.matmul_q_math(tx, &w, tb, s.path, s.math)?,
    };
    g.output(y);
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, tx, bytemuck::cast_slice(&x))?;
    plan.run(gpu, &StepVars::default())?;
    let got = plan.read_f32(y)?;
    let wf = dequantize_packed(s.ty, &raw)?;
    let want = matmul_q::reference(&x, &wf, s.bias.then_some(b.as_slice()), m, k, n);
    let max = if worst {
        worst_bound(s.math, &x, &wf, &want, k)
    } else {
        bound(s.math, &x, &wf, &want, k)
    };
    match s.glu {
        Some(act) => Ok((nmse(&got, &reference_paired(&want, act), GLU_FACTOR * max), w.parts().len())),
        None => Ok((nmse(&got, &want, max), w.parts().len())),
    }
}

fn case(prefix: &str, s: Shape, on: fn() -> Option<&'static Gpu>) -> Case {
    Case::new("matmul_q", format!("{prefix}{}", s.name()), move |gpu| {
        Ok(run(on().unwrap_or(gpu), s)?.0)
    })
}

fn default_gpu() -> Option<&'static Gpu> {
    None
}

fn fallback_gpu() -> Option<&'static Gpu> {
    Some(gpu_fallback())
}

/// A shape (positional, to keep the case tables short); K rounded up to whole blocks of `ty` (256 for k-quants).
fn shape(ty: GgmlType, layout: Layout, (m, k, n): (usize, usize, usize), bias: bool, path: QPath) -> Shape {
    Shape {
        ty,
        layout,
        m,
        k: k.next_multiple_of(ty.block_size()),
        n,
        bias,
        path,
        math: QMath::Auto,
        glu: None,
    }
}

/// The NMSE bound of a case computed with `math` (f32 on the test adapter unless forced to f16), for x [m, k], the
/// dequantized w [n, k] and the reference y [m, n]: f16 arithmetic adds 10 u^2 (L + 1) / 3 sum (w x)^2 / sum y^2.
fn bound(math: QMath, x: &[f32], w: &[f32], want: &[f32], k: usize) -> f64 {
    if math != QMath::F16 {
        return BOUND;
    }
    let (m, n) = (x.len() / k, w.len() / k);
    let mut t2 = 0f64;
    for i in 0..m {
        for j in 0..n {
            let (xr, wr) = (&x[i * k..(i + 1) * k], &w[j * k..(j + 1) * k]);
            t2 += xr
                .iter()
                .zip(wr)
                .map(|(a, b)| (*a as f64 * *b as f64).powi(2))
                .sum::<f64>();
        }
    }
    let y2: f64 = want.iter().map(|v| (*v as f64).powi(2)).sum();
    BOUND + 10.0 * U16 * U16 * (L16 + 1.0) / 3.0 * t2 / y2
}

/// The worst-case form of [`bound`]: every term's error at most (L + 1) u |w x| (x's rounding, the product's and
/// L - 1 additions, to first order; 1.1 covers the rest), all of one sign: ((L + 1) u)^2 sum (sum |w x|)^2 / sum y^2.
fn worst_bound(math: QMath, x: &[f32], w: &[f32], want: &[f32], k: usize) -> f64 {
    if math != QMath::F16 {
        return BOUND;
    }
    let (m, n) = (x.len() / k, w.len() / k);
    let mut e2 = 0f64;
    for i in 0..m {
        for j in 0..n {
            let (xr, wr) = (&x[i * k..(i + 1) * k], &w[j * k..(j + 1) * k]);
            e2 += xr
                .iter()
                .zip(wr)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum::<f64>()
                .powi(2);
        }
    }
    let y2: f64 = want.iter().map(|v| (*v as f64).powi(2)).sum();
    BOUND + 1.1 * ((L16 + 1.0) * U16).powi(2) * e2 / y2
}

/// The case of `s` on the test adapter, and in the rows layout (the one with f16 kernels) also forced to f16 (where
/// the format has f16 kernels).
fn both_maths(v: &mut Vec<Case>, s: Shape) {
    v.push(case("", s, default_gpu));
    let f16 = Format::new(s.ty).expect("packable").f16_kernels();
    if s.layout == Layout::Rows && f16 {
        v.push(case("", Shape { math: QMath::F16, ..s }, default_gpu));
    }
}

pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    let layouts = [Layout::Tiled, Layout::Rows];
    // GEMV (M = 1) over K x N. K: 32 (one block), 64, 576, 1536, 4096. N: 1 (one row of a 32-row tile), 4, 7
    // (under one 4-row group), 129 (one past 4 tiles), 576, 1000 (not a multiple of the tile).
    let gemv = [
        (32, 1),
        (64, 7),
        (32, 129),
        (576, 4),
        (576, 576),
        (1536, 1000),
        (4096, 129),
        (64, 1000),
        (1536, 7),
    ];
    for (i, &(k, n)) in gemv.iter().enumerate() {
        for (f, ty) in FORMATS.into_iter().enumerate() {
            for layout in layouts {
                let bias = (i + f).is_multiple_of(2);
                both_maths(&mut v, shape(ty, layout, (1, k, n), bias, QPath::Auto));
            }
        }
    }
    // M > 1: M 3 (the tiled layout's Auto picks GEMVs; the rows GEMM under one 4-token block), 8 (whole blocks),
    // 17 (one past the blocks).
    let gemm = [
        (3, 64, 129),
        (8, 576, 576),
        (17, 1536, 1000),
        (17, 32, 7),
        (3, 4096, 4),
        (8, 4096, 33),
    ];
    for (i, &mkn) in gemm.iter().enumerate() {
        for (f, ty) in FORMATS.into_iter().enumerate() {
            for layout in layouts {
                let bias = (i + f) % 2 == 1;
                both_maths(&mut v, shape(ty, layout, mkn, bias, QPath::Auto));
            }
        }
    }
    // Forced paths are right for any M: the GEMV at M > 1 (one row of x per grid z), the GEMM at M = 1 and 2 (token
    // blocks mostly past M); x of 5 x 4096 f32 (80 KiB) is over one uniform binding, so the GEMV reads it from
    // storage.
    for ty in FORMATS {
        for layout in layouts {
            for (mkn, path) in [
                ((3, 576, 129), QPath::Gemv),
                ((1, 576, 129), QPath::Gemm),
                ((2, 576, 129), QPath::Gemm),
                ((5, 4096, 33), QPath::Gemv),
            ] {
                both_maths(&mut v, shape(ty, layout, mkn, true, path));
            }
        }
    }
    // The fallback device (no subgroups): x loaded at uniform indices, workgroup-memory reductions.
    for ty in FORMATS {
        for layout in layouts {
            for mkn in [(1, 576, 129), (8, 1536, 576), (17, 64, 1000)] {
                v.push(case(
                    "fallback_",
                    shape(ty, layout, mkn, true, QPath::Auto),
                    fallback_gpu,
                ));
            }
        }
    }
    // W split into row parts (32 KiB bindings): one dispatch per part, the last one shorter. Tiled parts are whole
    // 32-row tiles: 4-bit K=1024 (16 KiB per tile) 2 tiles a part, [1000, 1024] in 16 parts; 5- and 6-bit (20 and
    // 24 KiB per tile) 1 tile a part, 32 parts; Q8 [300, 256] 4 tiles a part, 3 parts. Rows parts (4-row granules):
    // 4-bit K=1024 (512 B a row) 64 rows a part, 16 parts; 5-bit (640 B) 48 rows, 21 parts; 6-bit (768 B) 40 rows,
    // 25 parts; Q8 [300, 256] 128 rows a part, 3 parts. (Q4_K and IQ4_XS pack as 4-bit, Q5_K as 5-bit.) Q2_K
    // (2 words a block, 8 KiB of quants per tile, the largest buffer) 4 tiles a part, 8 parts; rows layout 256 B
    // a row: 128 rows, 8 parts. Q3_K (3 words, 12 KiB per tile) 2 tiles a part, 16 parts; rows 384 B a row: 21
    // granules of 4 (84 rows), 12 parts.
    for ty in FORMATS {
        for layout in layouts {
            let f = Format::new(ty).expect("packable");
            let (k, n, parts) = match (f.q8(), f.high_bits(), layout) {
                _ if ty == GgmlType::Q2_K => (1024, 1000, 8),
                _ if ty == GgmlType::Q3_K => (1024, 1000, if layout == Layout::Tiled { 16 } else { 12 }),
                (true, _, _) => (256, 300, 3),
                (false, 0, _) => (1024, 1000, 16),
                (false, _, Layout::Tiled) => (1024, 1000, 32),
                (false, 1, Layout::Rows) => (1024, 1000, 21),
                (false, _, Layout::Rows) => (1024, 1000, 25),
            };
            for (m, math) in [(1, QMath::Auto), (5, QMath::Auto), (1, QMath::F16), (5, QMath::F16)] {
                if math == QMath::F16 && (layout == Layout::Tiled || !f.f16_kernels()) {
                    continue;
                }
                let s = Shape {
                    math,
                    ..shape(ty, layout, (m, k, n), true, QPath::Auto)
                };
                v.push(Case::new("matmul_q", format!("split{parts}_{}", s.name()), move |_| {
                    let (check, got) = run(gpu_split(), s)?;
                    if got != parts {
                        return Ok(exact(&[got], &[parts]));
                    }
                    Ok(check)
                }));
            }
        }
    }
    // Block constants of every f16 kind decode exactly: subnormal, zero, negative and normal scales (and Q4_1
    // mins), mixed per block. A decoder that flushes subnormals (a denormals-are-zero FPU mode) or drops the sign
    // fails here: rows whose scales are all subnormal would come out zero. (The 32-weight formats: super-block
    // types go through the same decoder once repacked.)
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::IQ4_NL,
    ] {
        for (layout, math) in [
            (Layout::Tiled, QMath::Auto),
            (Layout::Rows, QMath::Auto),
            (Layout::Rows, QMath::F16),
        ] {
            let name = format!(
                "{ty}_{}_f16_constants_of_every_kind{}",
                if layout == Layout::Tiled { "tiled" } else { "rows" },
                if math == QMath::F16 { "_f16_math" } else { "" }
            );
            v.push(Case::new("matmul_q", name, move |gpu| {
                let (n, k) = (40, 128);
                let mut raw = random_blocks(ty, n, k, 99);
                let bb = ty.type_size();
                let mut rng = Rng::new(5);
                for (i, blk) in raw.chunks_exact_mut(bb).enumerate() {
                    // Rows 0..8: subnormal constants only; then a mix by block.
                    let kind = if i < 8 * k / 32 { 0 } else { rng.below(4) };
                    let mut h = || -> u16 {
                        let sign = (rng.below(2) as u16) << 15;
                        sign | match kind {
                            0 => 1 + rng.below(0x3ff) as u16,
                            1 => 0,
                            _ => 0x2000 + rng.below(0x1000) as u16,
                        }
                    };
                    blk[0..2].copy_from_slice(&h().to_le_bytes());
                    if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                        blk[2..4].copy_from_slice(&h().to_le_bytes());
                    }
                }
                let x = Rng::new(6).vec(k, 1.0);
                let w = PackedWeight::upload_with(gpu, "w", ty, layout, n, k, &raw)?;
                let mut g = Graph::new();
                let tx = g.input("x", &[1, k], DType::F32);
                let y = g.matmul_q_math(tx, &w, None, QPath::Auto, math)?;
                g.output(y);
                let mut plan = Plan::new(gpu, g)?;
                plan.write_input(gpu, tx, bytemuck::cast_slice(&x))?;
                plan.run(gpu, &StepVars::default())?;
                let got = plan.read_f32(y)?;
                let wf = dequantize_packed(ty, &raw)?;
                let want = matmul_q::reference(&x, &wf, None, 1, k, n);
                // The subnormal rows alone, so that their tiny values are not drowned by the others.
                let sub = nmse(&got[..8], &want[..8], bound(math, &x, &wf[..8 * k], &want[..8], k));
                Ok(if sub.passed() {
                    nmse(&got, &want, bound(math, &x, &wf, &want, k))
                } else {
                    sub
                })
            }));
        }
    }
    // f16 range: x values of magnitude X16_MAX = 512 or more make their quant word sum in f32 (an f16 sum of 8
    // products of them could overflow; x beyond 65504 is infinite in f16 already). Outliers of 600, -5000, 1e5 and
    // 512 in a few words: a kernel without the guard gives infinities here.
    for ty in FORMATS {
        let s = Shape {
            math: QMath::F16,
            ..shape(ty, Layout::Rows, (2, 1024, 129), false, QPath::Auto)
        };
        v.push(Case::new(
            "matmul_q",
            format!("{}_x_outliers_sum_in_f32", s.name()),
            move |gpu| {
                let outliers = |x: &mut [f32], _: &mut [u8]| {
                    for (i, v) in [(5, 600.0), (100, -5000.0), (1500, 1e5), (2047, 512.0)] {
                        x[i] = v;
                    }
                };
                Ok(run_with(gpu, s, outliers, false)?.0)
            },
        ));
    }
    // The worst case around the limit: every quant the largest in magnitude in f16 form (nibble 0, centred to -8;
    // Q5_0 quant 0, (0 - 16) / 2 = -8; IQ4_NL index 0, -127 / 16; Q8 byte -128, as -16), every x the same, so each f16 partial sum is 64 x. Just under the limit (511.75) that
    // is 32752: finite, in f16. Over it (1100) it would be 70400, past 65504: infinite unless summed in f32, so a
    // guard that is missing or set above 1023 fails here. All errors have one sign: the worst-case bound.
    for (ty, byte) in [
        (GgmlType::Q4_0, 0u8),
        (GgmlType::Q5_0, 0),
        (GgmlType::IQ4_NL, 0),
        (GgmlType::Q8_0, 0x80),
    ] {
        let s = Shape {
            math: QMath::F16,
            ..shape(ty, Layout::Rows, (2, 1024, 129), false, QPath::Auto)
        };
        for (name, xv) in [("under", 511.75f32), ("over", 1100.0)] {
            v.push(Case::new(
                "matmul_q",
                format!("{}_worst_quants_x_{name}_f16_limit", s.name()),
                move |gpu| {
                    let edit = |x: &mut [f32], raw: &mut [u8]| {
                        x.fill(xv);
                        for blk in raw.chunks_exact_mut(ty.type_size()) {
                            blk[2..].fill(byte);
                        }
                    };
                    Ok(run_with(gpu, s, edit, true)?.0)
                },
            ));
        }
    }
    batch_rows(&mut v);
    glu_cases(&mut v);
    fused_cases(&mut v);
    rope_epilogue_cases(&mut v);
    // Forcing f16 takes effect where the adapter has f16: Q4_0 at K = 4096 then has an NMSE of about 2e-7 (f16
    // rounding), far above what f32 arithmetic gives (about 1e-11). Without f16 the same run must match f32's bound.
    v.push(Case::new("matmul_q", "f16_forced_rounds_in_f16", |gpu| {
        let s = Shape {
            math: QMath::F16,
            ..shape(GgmlType::Q4_0, Layout::Rows, (1, 4096, 576), false, QPath::Auto)
        };
        let (check, _) = run(gpu, s)?;
        Ok(match check {
            Check::Nmse { value, .. } if gpu.caps.f16 && value < 1e-8 => {
                println!("f16_forced_rounds_in_f16: NMSE {value:.2e} is f32's, not f16's");
                exact(&[false], &[true])
            }
            Check::Nmse { value, .. } if !gpu.caps.f16 => Check::Nmse { value, max: BOUND },
            other => other,
        })
    }));
    // Bad input gives an error value, never a node: K not a multiple of 32 (of 256 for a k-quant), a byte count
    // that does not match [N, K] (a truncated k-quant tensor too), a type that is not packable, x of another K or
    // dtype, a bias of the wrong length.
    v.push(Case::new("matmul_q", "bad_input_is_an_error", |gpu| {
        let kq = random_blocks(GgmlType::Q6_K, 2, 512, 1);
        let kq_errors = [
            PackedWeight::upload(gpu, "w", GgmlType::Q6_K, 4, 256, &kq).is_ok(),
            PackedWeight::upload(gpu, "w", GgmlType::Q6_K, 1, 1024, &kq).is_ok(),
            PackedWeight::upload(gpu, "w", GgmlType::Q6_K, 2, 288, &kq[..2 * 9 * 26]).is_err(),
            PackedWeight::upload(gpu, "w", GgmlType::Q6_K, 2, 512, &kq[..kq.len() - 1]).is_err(),
            PackedWeight::upload(gpu, "w", GgmlType::Q6_K, 1, 512, &kq[..420]).is_ok(),
            PackedWeight::upload(gpu, "w", GgmlType::Q4_K, 2, 512, &kq).is_err(),
            PackedWeight::upload(gpu, "w", GgmlType::Q3_K, 2, 512, &kq).is_err(),
        ];
        if kq_errors != [true; 7] {
            return Ok(exact(&kq_errors, &[true; 7]));
        }
        let raw = random_blocks(GgmlType::Q4_0, 4, 64, 1);
        let w = PackedWeight::upload(gpu, "w", GgmlType::Q4_0, 4, 64, &raw)?;
        let mut g = Graph::new();
        let x32 = g.input("x", &[2, 32], DType::F32);
        let xu = g.input("x", &[2, 64], DType::U32);
        let x = g.input("x", &[2, 64], DType::F32);
        let b5 = g.input("b", &[5], DType::F32);
        let errors = [
            PackedWeight::upload(gpu, "w", GgmlType::Q4_0, 4, 48, &raw).is_err(),
            PackedWeight::upload(gpu, "w", GgmlType::Q4_0, 8, 64, &raw).is_err(),
            PackedWeight::upload(gpu, "w", GgmlType::Q4_0, 4, 64, &raw[1..]).is_err(),
            PackedWeight::upload(gpu, "w", GgmlType::Q4_1, 4, 64, &raw).is_err(),
            PackedWeight::upload(gpu, "w", GgmlType::F16, 4, 64, &raw).is_err(),
            g.matmul_q(x32, &w, None).is_err(),
            g.matmul_q(xu, &w, None).is_err(),
            g.matmul_q(x, &w, Some(b5)).is_err(),
            g.node_count() == 0,
        ];
        Ok(exact(&errors, &[true; 9]))
    }));
    v
}

/// Rows of x per batch in the batch-invariance cases (speculative verification takes up to 8, a prefill chunk more).
const BATCH_ROWS: [usize; 8] = [2, 3, 4, 5, 8, 16, 33, 64];

/// Batch invariance: row r of an M-row matmul (whatever kernel Auto picks for M) equals the one-row result bit for
/// bit, for every format, layout and arithmetic. Speculative verification depends on it: a verified token must see
/// exactly the logits plain decoding would have computed.
fn batch_rows(v: &mut Vec<Case>) {
    for ty in FORMATS {
        for (layout, math) in [(Layout::Tiled, QMath::Auto), (Layout::Rows, QMath::Auto), (Layout::Rows, QMath::F16)] {
            if math == QMath::F16 && !Format::new(ty).expect("packable").f16_kernels() {
                continue;
            }
            let s = Shape {
                math,
                ..shape(ty, layout, (1, 512, 200), true, QPath::Auto)
            };
            v.push(Case::new("matmul_q", format!("batch_rows_equal_one_row_{}", s.name()), move |gpu| {
                batch_rows_check(gpu, s)
            }));
            let glu = Shape {
                glu: Some(Glu::Silu),
                bias: false,
                ..s
            };
            v.push(Case::new("matmul_q", format!("batch_rows_equal_one_row_{}", glu.name()), move |gpu| {
                batch_rows_check(gpu, glu)
            }));
            // The fallback device (no subgroups: x at uniform indices, from a uniform buffer in the GEMV).
            if math == QMath::Auto && matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_K | GgmlType::Q6_K | GgmlType::Q3_K) {
                let name = format!("fallback_batch_rows_equal_one_row_{}", s.name());
                v.push(Case::new("matmul_q", name, move |_| batch_rows_check(gpu_fallback(), s)));
            }
        }
    }
}

fn batch_rows_check(gpu: &Gpu, s: Shape) -> shaderlm::Result<Check> {
    let (k, n, cols) = (s.k, s.n, if s.glu.is_some() { s.n / 2 } else { s.n });
    let most = BATCH_ROWS[BATCH_ROWS.len() - 1];
    let raw = random_blocks(s.ty, n, k, 11);
    let w = PackedWeight::upload_with(gpu, "w", s.ty, s.layout, n, k, &raw)?;
    let bias = GpuTensor::upload_f32(gpu, "bias", &[n], &Rng::new(12).vec(n, 1.0))?;
    let x = Rng::new(13).vec(most * k, 1.0);
    let plan_of = |m: usize| -> shaderlm::Result<(Plan, shaderlm::graph::TensorId, shaderlm::graph::TensorId)> {
        let mut g = Graph::new();
        let tx = g.input("x", &[m, k], DType::F32);
        let tb = g.external(&bias);
        let y = match s.glu {
            Some(act) => g.matmul_q_glu_with(tx, &w, QPath::Auto, s.math, act)?,
            None => g.matmul_q_math(tx, &w, Some(tb), QPath::Auto, s.math)?,
        };
        g.output(y);
        Ok((Plan::new(gpu, g)?, tx, y))
    };
    let (mut one, tx, y) = plan_of(1)?;
    let mut want = Vec::with_capacity(most * n);
    for r in 0..most {
        one.write_input(gpu, tx, bytemuck::cast_slice(&x[r * k..(r + 1) * k]))?;
        one.run(gpu, &StepVars::default())?;
        want.extend(one.read_f32(y)?.iter().map(|v| v.to_bits()));
    }
    for m in BATCH_ROWS {
        let (mut plan, tx, y) = plan_of(m)?;
        plan.write_input(gpu, tx, bytemuck::cast_slice(&x[..m * k]))?;
        plan.run(gpu, &StepVars::default())?;
        let got: Vec<u32> = plan.read_f32(y)?.iter().map(|v| v.to_bits()).collect();
        let check = exact(&got, &want[..m * cols]);
        if !check.passed() {
            println!("batch of {m} rows differs from one row at a time");
            return Ok(check);
        }
    }
    Ok(exact(&want[..0], &want[..0]))
}

/// The GLU epilogue (W's rows (gate, up) pairs, y = act(gate) * up) against the CPU reference, for every format in
/// both layouts: the GEMV, the GEMM with 4 and 8 rows of x (tiled) or 4 per workgroup (rows), f16 arithmetic in the
/// rows layout, both activations, output counts that end inside a 4-row group and inside a 32-row tile (n = 2 * 13,
/// 2 * 45); W split into row parts; the fallback device.
fn glu_cases(v: &mut Vec<Case>) {
    for (i, ty) in FORMATS.into_iter().enumerate() {
        let act = if i % 2 == 0 { Glu::Silu } else { Glu::GeluTanh };
        for layout in [Layout::Tiled, Layout::Rows] {
            for (m, n, path) in [(1, 26, QPath::Auto), (3, 90, QPath::Gemm), (9, 26, QPath::Gemm)] {
                let s = Shape {
                    glu: Some(act),
                    ..shape(ty, layout, (m, 64, n), false, path)
                };
                both_maths(v, s);
            }
        }
    }
    for (ty, layout) in [(GgmlType::Q4_0, Layout::Tiled), (GgmlType::Q4_K, Layout::Rows)] {
        for m in [1, 5] {
            let s = Shape {
                glu: Some(Glu::Silu),
                ..shape(ty, layout, (m, 1024, 600), false, QPath::Auto)
            };
            v.push(Case::new("matmul_q", format!("split_{}", s.name()), move |_| {
                let (check, parts) = run(gpu_split(), s)?;
                if parts < 2 {
                    return Ok(exact(&[parts], &[2]));
                }
                Ok(check)
            }));
            v.push(case("fallback_", s, fallback_gpu));
        }
    }
}

/// The fused tiled GEMV (`matmul_q_fused`: the RMSNorm in its prologue, or the residual add in its epilogue) equals
/// `rms_norm` then `matmul_q`, or `matmul_q` then `add`, bit for bit: a fused decode step and an unfused
/// verification step must agree exactly. Every format, one row (the fused GEMV's), K with and without a partial last round of the
/// norm's sum (576 = 9 x 64, 608; super-block formats 768), with a bias and with the GLU epilogue.
fn fused_cases(v: &mut Vec<Case>) {
    for (i, ty) in FORMATS.into_iter().enumerate() {
        use GgmlType::*;
        let superblocks = matches!(ty, Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ4_XS);
        let k = match (superblocks, i % 2) {
            (true, _) => 768,
            (false, 0) => 576,
            _ => 608,
        };
        // The fused GEMV serves matmul_q::TILED_GEMV_MAX_M rows (one): with and without the GLU epilogue.
        for glu in [None, Some(Glu::Silu)] {
            let m = matmul_q::TILED_GEMV_MAX_M;
            let name = format!("fused_norm_and_add_equal_unfused_{}_m{m}_k{k}_glu{}", ty.name(), glu.is_some());
            v.push(Case::new("matmul_q", name, move |gpu| fused_check(gpu, ty, (m, k, 96), glu)));
        }
    }
    // The post-norm prologue (Gemma's): every format, with a bias, the GLU epilogue (GELU, Gemma's), and enough
    // tiles that workgroups share the prologue.
    for (i, ty) in FORMATS.into_iter().enumerate() {
        let k = if k_quant(ty) || ty == GgmlType::IQ4_XS { 768 } else { [576, 608][i % 2] };
        for (n, glu) in [(96, None), (259 * 32, Some(Glu::GeluTanh))] {
            let name = format!("fused_post_norm_equals_add_post_rms_norm_{}_n{n}_k{k}_glu{}", ty.name(), glu.is_some());
            v.push(Case::new("matmul_q", name, move |gpu| post_norm_check(gpu, ty, (k, n), glu)));
        }
    }
    // Two weights in one dispatch (q|k and v in different formats) with the norm or the post-norm prologue, y their
    // columns side by side: with and without biases, rows that fill workgroups of shared prologues partly.
    let pairs = [
        (GgmlType::Q4_K, GgmlType::Q6_K),
        (GgmlType::Q5_0, GgmlType::Q8_0),
        (GgmlType::Q8_0, GgmlType::Q4_1),
        (GgmlType::Q6_K, GgmlType::Q4_K),
    ];
    for (i, (a, b)) in pairs.into_iter().enumerate() {
        for (bias, post) in [(false, false), (true, false), (false, true), (true, true)] {
            let (na, nb) = ([1280, 96, 4128, 320][i], [256, 64, 1056, 160][i]);
            let name = format!("two_normed_equals_unfused_{}_{}_{na}_{nb}_bias{bias}_post{post}", a.name(), b.name());
            v.push(Case::new("matmul_q", name, move |gpu| two_normed_check(gpu, (a, b), (na, nb), bias, post)));
        }
    }
    // Enough tiles (259 of 32 rows) that the tiles of a workgroup share the norm prologue, the last workgroup only
    // partly filled.
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
        let (m, k, n) = (matmul_q::TILED_GEMV_MAX_M, 768, 259 * 32);
        for glu in [None, Some(Glu::Silu)] {
            let name = format!("fused_norm_shared_equals_unfused_{}_n{n}_k{k}_glu{}", ty.name(), glu.is_some());
            v.push(Case::new("matmul_q", name, move |gpu| fused_check(gpu, ty, (m, k, n), glu)));
        }
    }
}

fn fused_check(gpu: &Gpu, ty: GgmlType, (m, k, n): (usize, usize, usize), glu: Option<Glu>) -> shaderlm::Result<Check> {
    let cols = if glu.is_some() { n / 2 } else { n };
    if !matmul_q::can_fuse(&gpu.caps, &PackedWeight::upload_with(gpu, "probe", ty, Layout::Tiled, n, k, &random_blocks(ty, n, k, 1))?, m) {
        return Err(shaderlm::Error::Invalid("this adapter has no fused GEMV (needs a CPU adapter with subgroups)".into()));
    }
    let w = PackedWeight::upload_with(gpu, "w", ty, Layout::Tiled, n, k, &random_blocks(ty, n, k, 21))?;
    let bias = GpuTensor::upload_f32(gpu, "bias", &[n], &Rng::new(22).vec(n, 1.0))?;
    let norm = GpuTensor::upload_f32(gpu, "norm", &[k], &Rng::new(23).vec(k, 2.0))?;
    let x = Rng::new(24).vec(m * k, 3.0);
    let res = Rng::new(25).vec(m * cols, 1.0);
    let (eps, alpha) = (1e-5f32, 1.4f32);
    let run = |fused: bool, add: bool| -> shaderlm::Result<Vec<u32>> {
        let mut g = Graph::new();
        let tx = g.input("x", &[m, k], DType::F32);
        let tr = g.input("res", &[m, cols], DType::F32);
        let (tb, tn) = (g.external(&bias), g.external(&norm));
        let tb = (glu.is_none() && !add).then_some(tb);
        let y = match (fused, add) {
            (true, false) => g.matmul_q_fused(tx, &w, tb, glu, Some((tn, eps)), None)?,
            (true, true) => g.matmul_q_fused(tx, &w, None, None, None, Some((tr, alpha)))?,
            (false, false) => {
                let xn = g.rms_norm(tx, tn, eps)?;
                match glu {
                    Some(act) => g.matmul_q_glu(xn, &w, act)?,
                    None => g.matmul_q(xn, &w, tb)?,
                }
            }
            (false, true) => {
                let y = g.matmul_q(tx, &w, None)?;
                g.add_scaled(tr, y, alpha)?
            }
        };
        g.output(y);
        let mut plan = Plan::new(gpu, g)?;
        plan.write_input(gpu, tx, bytemuck::cast_slice(&x))?;
        plan.write_input(gpu, tr, bytemuck::cast_slice(&res))?;
        plan.run(gpu, &StepVars::default())?;
        Ok(plan.read_f32(y)?.iter().map(|v| v.to_bits()).collect())
    };
    let norm_check = exact(&run(true, false)?, &run(false, false)?);
    if !norm_check.passed() || glu.is_some() {
        return Ok(norm_check);
    }
    Ok(exact(&run(true, true)?, &run(false, true)?))
}

/// `matmul_q_post_norm` (the norm prologue over `x + alpha * rms_norm(r)`) equals `add_post_rms_norm` then the GEMV
/// bit for bit: the product and the residual stream it writes.
fn post_norm_check(gpu: &Gpu, ty: GgmlType, (k, n): (usize, usize), glu: Option<Glu>) -> shaderlm::Result<Check> {
    let probe = PackedWeight::upload_with(gpu, "probe", ty, Layout::Tiled, n, k, &random_blocks(ty, n, k, 1))?;
    if !matmul_q::can_fuse(&gpu.caps, &probe, 1) {
        return Err(shaderlm::Error::Invalid("this adapter has no fused GEMV (needs a CPU adapter with subgroups)".into()));
    }
    let w = PackedWeight::upload_with(gpu, "w", ty, Layout::Tiled, n, k, &random_blocks(ty, n, k, 31))?;
    let bias = GpuTensor::upload_f32(gpu, "bias", &[n], &Rng::new(32).vec(n, 1.0))?;
    let norm = GpuTensor::upload_f32(gpu, "norm", &[k], &Rng::new(33).vec(k, 2.0))?;
    let post = GpuTensor::upload_f32(gpu, "post", &[k], &Rng::new(34).vec(k, 2.0))?;
    let (x, r) = (Rng::new(35).vec(k, 3.0), Rng::new(36).vec(k, 5.0));
    let (eps, alpha) = (1e-6f32, 0.7f32);
    let run = |fused: bool| -> shaderlm::Result<Vec<u32>> {
        let mut g = Graph::new();
        let tx = g.input("x", &[1, k], DType::F32);
        let tr = g.input("r", &[1, k], DType::F32);
        let (tb, tn, tp) = (g.external(&bias), g.external(&norm), g.external(&post));
        let tb = glu.is_none().then_some(tb);
        let (y, h) = if fused {
            g.matmul_q_post_norm(tx, &w, tb, glu, (tr, tp, alpha), (tn, eps))?
        } else {
            let (h, xn) = g.add_post_rms_norm(tx, (tr, tp), alpha, tn, eps)?;
            let y = match glu {
                Some(act) => g.matmul_q_glu(xn, &w, act)?,
                None => g.matmul_q(xn, &w, tb)?,
            };
            (y, h)
        };
        g.output(y);
        g.output(h);
        let mut plan = Plan::new(gpu, g)?;
        plan.write_input(gpu, tx, bytemuck::cast_slice(&x))?;
        plan.write_input(gpu, tr, bytemuck::cast_slice(&r))?;
        plan.run(gpu, &StepVars::default())?;
        let (y, h) = (plan.read_f32(y)?, plan.read_f32(h)?);
        Ok(y.iter().chain(&h).map(|v| v.to_bits()).collect())
    };
    Ok(exact(&run(true)?, &run(false)?))
}

/// `matmul_q_two_normed` (two weights' GEMVs in one dispatch, norm or post-norm prologue) equals `rms_norm` or
/// `add_post_rms_norm` then one GEMV per weight bit for bit: y (a's columns, then b's) and the residual stream.
fn two_normed_check(
    gpu: &Gpu,
    (ta, tb): (GgmlType, GgmlType),
    (na, nb): (usize, usize),
    bias: bool,
    post: bool,
) -> shaderlm::Result<Check> {
    let k = 768;
    let probe = PackedWeight::upload_with(gpu, "probe", ta, Layout::Tiled, na, k, &random_blocks(ta, na, k, 1))?;
    if !matmul_q::can_fuse(&gpu.caps, &probe, 1) {
        return Err(shaderlm::Error::Invalid("this adapter has no fused GEMV (needs a CPU adapter with subgroups)".into()));
    }
    let wa = PackedWeight::upload_with(gpu, "wa", ta, Layout::Tiled, na, k, &random_blocks(ta, na, k, 41))?;
    let wb = PackedWeight::upload_with(gpu, "wb", tb, Layout::Tiled, nb, k, &random_blocks(tb, nb, k, 42))?;
    let ba = GpuTensor::upload_f32(gpu, "ba", &[na], &Rng::new(43).vec(na, 1.0))?;
    let bb = GpuTensor::upload_f32(gpu, "bb", &[nb], &Rng::new(44).vec(nb, 1.0))?;
    let norm = GpuTensor::upload_f32(gpu, "norm", &[k], &Rng::new(45).vec(k, 2.0))?;
    let pw = GpuTensor::upload_f32(gpu, "post", &[k], &Rng::new(46).vec(k, 2.0))?;
    let (x, r) = (Rng::new(47).vec(k, 3.0), Rng::new(48).vec(k, 5.0));
    let (eps, alpha) = (1e-6f32, 1.3f32);
    let run = |fused: bool| -> shaderlm::Result<Vec<u32>> {
        let mut g = Graph::new();
        let tx = g.input("x", &[1, k], DType::F32);
        let tr = g.input("r", &[1, k], DType::F32);
        let (tn, tp) = (g.external(&norm), g.external(&pw));
        let (tba, tbb) = (g.external(&ba), g.external(&bb));
        let (tba, tbb) = (bias.then_some(tba), bias.then_some(tbb));
        let mut outs = Vec::new();
        if fused {
            let branch = post.then_some((tr, tp, alpha));
            let (y, h) = g.matmul_q_two_normed(tx, ((&wa, tba), (&wb, tbb)), (tn, eps), branch)?;
            outs.push(y);
            outs.extend(h);
        } else {
            let (h, xn) = match post {
                true => {
                    let (h, xn) = g.add_post_rms_norm(tx, (tr, tp), alpha, tn, eps)?;
                    (Some(h), xn)
                }
                false => (None, g.rms_norm(tx, tn, eps)?),
            };
            outs.push(g.matmul_q(xn, &wa, tba)?);
            outs.push(g.matmul_q(xn, &wb, tbb)?);
            outs.extend(h);
        }
        for &o in &outs {
            g.output(o);
        }
        let mut plan = Plan::new(gpu, g)?;
        plan.write_input(gpu, tx, bytemuck::cast_slice(&x))?;
        plan.write_input(gpu, tr, bytemuck::cast_slice(&r))?;
        plan.run(gpu, &StepVars::default())?;
        let mut bits = Vec::new();
        for o in outs {
            bits.extend(plan.read_f32(o)?.iter().map(|v| v.to_bits()));
        }
        Ok(bits)
    };
    Ok(exact(&run(true)?, &run(false)?))
}

/// The q|k|v GEMV with rope_kv as its epilogue (`matmul_q_qkv_rope`) equals `matmul_q_fused` then `rope_kv` bit for
/// bit: q and both whole caches (random before the write, so a stray or missing write shows), at SmolLM2's heads (9
/// q, 3 kv, head_dim 64), over f32 and f16 caches, frequency divisors, a partial rotation, the first position and
/// the cache's last; and a position past the cache writes nothing. Then q|k|v split over two or three weights (as
/// Q4_K_M files store v, or k and v, in another format: Q8_0 here, and the pairs of the Qwen2.5-Coder files), with
/// biases: two weights with the norm run in one dispatch (matmul_q_tiled's TWO form), three in three.
fn rope_epilogue_cases(v: &mut Vec<Case>) {
    use GgmlType::*;
    let grid = [(false, false, 64, 0u32), (true, false, 64, 77), (false, true, 32, 130), (true, true, 64, 255), (false, false, 64, 256)];
    for (i, ty) in [Q4_1, Q8_0, Q4_K, Q6_K].into_iter().enumerate() {
        for (j, (kv_f16, factors, rot_dim, pos)) in grid.into_iter().enumerate() {
            let norm = (i + j) % 2 == 0;
            let name = format!(
                "qkv_rope_equals_rope_kv_{}_f16{kv_f16}_factors{factors}_rot{rot_dim}_pos{pos}_norm{norm}",
                ty.name()
            );
            v.push(Case::new("matmul_q", name, move |gpu| {
                rope_check(gpu, 1, [ty, ty], (kv_f16, factors, norm), (64, rot_dim), pos, (&[3], false))
            }));
        }
    }
    let splits: [(&[usize], bool, bool, u32); 4] =
        [(&[2, 1], true, true, 77), (&[1, 2], true, false, 0), (&[1, 1, 1], false, true, 255), (&[3], true, false, 130)];
    for ty in [[Q4_1, Q8_0], [Q4_K, Q8_0]] {
        for (split, bias, kv_f16, pos) in splits {
            let name = format!("qkv_rope_split{split:?}_bias{bias}_equals_rope_kv_{}_f16{kv_f16}_pos{pos}", ty[0].name());
            v.push(Case::new("matmul_q", name, move |gpu| {
                rope_check(gpu, 1, ty, (kv_f16, false, true), (64, 64), pos, (split, bias))
            }));
        }
    }
    // head_dim 40: k and v of 120 rows end in partial tiles, whose padding rows must not write.
    let pairs = [([Q5_0, Q8_0], [2, 1], true, 64), ([Q4_K, Q6_K], [2, 1], false, 40), ([Q6_K, Q4_0], [1, 2], true, 40)];
    for (ty, split, factors, hd) in pairs {
        let name = format!("qkv_rope_split{split:?}_{}_{}_factors{factors}_hd{hd}_equals_rope_kv", ty[0].name(), ty[1].name());
        v.push(Case::new("matmul_q", name, move |gpu| {
            rope_check(gpu, 1, ty, (true, factors, true), (hd, hd), 200, (&split, true))
        }));
    }
    // A chain of 2, 4 or 7 tokens (a verification step) through the tiled GEMM with the rope epilogue, the norm
    // done before; the last chain ends at the cache's last position, and one runs past it (those rows write nothing).
    let chains: [(GgmlType, usize, &[usize], u32); 6] =
        [(Q4_1, 2, &[3], 0), (Q4_K, 4, &[2, 1], 77), (Q6_K, 7, &[3], 130), (Q8_0, 4, &[1, 2], 252), (Q5_0, 7, &[2, 1], 249), (Q4_1, 4, &[3], 254)];
    for (i, (ty, m, split, pos)) in chains.into_iter().enumerate() {
        let (kv_f16, factors) = (i % 2 == 1, i % 3 == 0);
        let name = format!("qkv_rope_chain{m}_split{split:?}_{}_f16{kv_f16}_factors{factors}_pos{pos}", ty.name());
        v.push(Case::new("matmul_q", name, move |gpu| {
            rope_check(gpu, m, [ty, Q8_0], (kv_f16, factors, false), (64, 64), pos, (split, i % 2 == 0))
        }));
    }
}

fn rope_check(
    gpu: &Gpu,
    m: usize,
    [ty, ty2]: [GgmlType; 2],
    (kv_f16, factors, norm): (bool, bool, bool),
    (hd, rot_dim): (usize, usize),
    pos: u32,
    (split, bias): (&[usize], bool),
) -> shaderlm::Result<Check> {
    let (n_heads, n_kv, max_ctx) = (9, 3, 256);
    let k = if [ty, ty2].iter().any(|t| matches!(t, GgmlType::Q4_K | GgmlType::Q6_K)) { 768 } else { 576 };
    let sizes = [n_heads * hd, n_kv * hd, n_kv * hd];
    // One weight (and bias) per group of projections; groups after the first in ty2.
    let mut ws = Vec::new();
    let mut p = 0;
    for (i, &count) in split.iter().enumerate() {
        let n: usize = sizes[p..p + count].iter().sum();
        let t = if i == 0 { ty } else { ty2 };
        let w = PackedWeight::upload_with(gpu, "w", t, Layout::Tiled, n, k, &random_blocks(t, n, k, 41 + i as u64))?;
        let b = GpuTensor::upload_f32(gpu, "bias", &[n], &Rng::new(45 + i as u64).vec(n, 1.0))?;
        ws.push((w, b, count));
        p += count;
    }
    if !matmul_q::can_fuse(&gpu.caps, &ws[0].0, 1) {
        return Err(shaderlm::Error::Invalid("this adapter has no fused GEMV (needs a CPU adapter with subgroups)".into()));
    }
    let weight = GpuTensor::upload_f32(gpu, "norm", &[k], &Rng::new(42).vec(k, 2.0))?;
    let divisors: Vec<f32> = (0..rot_dim / 2).map(|j| 1.0 + 0.25 * j as f32).collect();
    let divisors = GpuTensor::upload_f32(gpu, "factors", &[rot_dim / 2], &divisors)?;
    let x = Rng::new(43).vec(m * k, 3.0);
    let init = kv_write::round_f16(&Rng::new(44).vec(n_kv * max_ctx * hd, 1.0));
    let shape = [n_kv, max_ctx, hd];
    let run = |fused: bool| -> shaderlm::Result<Vec<u32>> {
        let cache = |name: &str| match kv_f16 {
            true => GpuTensor::upload_f16(gpu, name, &shape, &init),
            false => GpuTensor::upload_f32(gpu, name, &shape, &init),
        };
        let (kc, vc) = (cache("k_cache")?, cache("v_cache")?);
        let mut g = Graph::new();
        let tx = g.input("x", &[m, k], DType::F32);
        let (tk, tv) = (g.external(&kc), g.external(&vc));
        let tn = norm.then(|| (g.external(&weight), 1e-5f32));
        let mut cfg = RopeConfig::new(RopeStyle::Interleaved, 10000.0, rot_dim);
        cfg.freq_scale = 0.5;
        cfg.factors = factors.then(|| g.external(&divisors));
        let groups: Vec<_> = ws.iter().map(|(w, b, count)| (w, bias.then(|| g.external(b)), *count)).collect();
        let q = if fused {
            let groups: Vec<_> = groups.iter().map(|&(w, b, count)| (w, b, count)).collect();
            g.matmul_q_qkv_rope(tx, &groups, tn, cfg, (tk, tv))?
        } else {
            let mut src = Vec::new();
            for &(w, b, count) in &groups {
                let y = match tn {
                    Some(tn) => g.matmul_q_fused(tx, w, b, None, Some(tn), None)?,
                    None => g.matmul_q(tx, w, b)?,
                };
                src.push((y, count));
            }
            let q = g.rope_kv(QkvSource(src), None, cfg, tk, tv)?;
            g.reshape(q, &[m, n_heads * hd])?
        };
        g.output(q);
        let mut plan = Plan::new(gpu, g)?;
        let dispatches = plan.dispatch_count(&StepVars { pos });
        // Fused: one dispatch per weight, but one for two weights with the norm prologue.
        let want = if split.len() == 2 && norm { 1 } else { split.len() };
        if fused && dispatches != want {
            return Err(shaderlm::Error::Invalid(format!("{dispatches} dispatches for {split:?}, expected {want}")));
        }
        plan.write_input(gpu, tx, bytemuck::cast_slice(&x))?;
        plan.run(gpu, &StepVars { pos })?;
        let out = [plan.read_f32(q)?, kc.download_f32(gpu)?, vc.download_f32(gpu)?].concat();
        Ok(out.iter().map(|v| v.to_bits()).collect())
    };
    let (fused, unfused) = (run(true)?, run(false)?);
    if pos as usize >= max_ctx && fused[n_heads * hd..] != bytemuck::cast_slice::<f32, u32>(&[init.clone(), init.clone()].concat())[..] {
        return Err(shaderlm::Error::Invalid("a position past the cache wrote into it".into()));
    }
    Ok(exact(&fused, &unfused))
}
