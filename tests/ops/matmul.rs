//! matmul vs a CPU reference with f64 accumulation, over GEMV (both flavours), GEMM, f32 and f16 weights, bias,
//! weights split into row parts, and the fallback device (no subgroups, no f16 feature).
//!
//! Metric: NMSE, bound 1e-10. Why: inputs are uniform in [-1, 1], so every product is exact in f64 and the GPU's
//! only error is f32 rounding in its sums. A chain of L additions of partial sums that grow like sqrt(j) gives an
//! error variance of about eps^2 * var(term) * L^2 / 2 against a result variance of K * var(term), i.e. an NMSE near
//! eps^2 * L^2 / (2K) <= eps^2 * K / 2 = 2.8e-12 for K = 1536 (eps = 2^-24), even for one sequential chain; the
//! kernels' chains are 4 to 64 times shorter. The bound leaves 35x margin over that worst case, while a missed
//! tail, a wrong row or a wrong part offset gives an NMSE of 1e-4 or more. f16 weights are rounded to f16 on the CPU
//! first, so the test measures the kernel, not the quantization (unpack2x16float is exact).

use crate::common::{exact, gpu_fallback, nmse, Case, Check, Rng};
use shaderlm::gpu::{DType, Gpu, GpuOptions, GpuTensor};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::matmul::{self, MatmulPath, GEMV_MAX_M};
use shaderlm::ops::silu_mul::{reference_paired, Glu};
use std::sync::OnceLock;

const BOUND: f64 = 1e-10;
/// The GLU epilogue's bound over the matmul's (see GLU_FACTOR in tests/ops/matmul_q.rs).
const GLU_FACTOR: f64 = 4.0;

/// A device whose storage bindings are capped at 64 KiB, so small weights split into several row parts.
fn gpu_split() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| {
        let opts = GpuOptions {
            max_binding_override: Some(64 << 10),
            ..Default::default()
        };
        crate::common::new_gpu(&opts)
    })
}

#[derive(Clone, Copy, Debug)]
struct Shape {
    /// Leading dims of x (their product is M).
    lead: [usize; 2],
    k: usize,
    n: usize,
    dtype: DType,
    bias: bool,
    path: MatmulPath,
}

impl Shape {
    fn m(&self) -> usize {
        self.lead[0] * self.lead[1]
    }
    fn name(&self) -> String {
        let path = match self.path {
            MatmulPath::Auto => "auto",
            MatmulPath::GemvCpu => "gemv_cpu",
            MatmulPath::GemvGpu => "gemv_gpu",
            MatmulPath::Gemm => "gemm",
            MatmulPath::Gemv => "gemv",
        };
        let dt = if self.dtype == DType::F16 { "f16" } else { "f32" };
        let b = if self.bias { "_bias" } else { "" };
        format!("{path}_{dt}_m{}_k{}_n{}{b}", self.m(), self.k, self.n)
    }
}

/// Run one matmul on `gpu` and compare with the reference; returns (check, parts of W).
fn run(gpu: &Gpu, s: Shape) -> shaderlm::Result<(Check, usize)> {
    run_act(gpu, s, None)
}

/// [`run`], with a GLU epilogue when `glu` (W's rows (gate, up) pairs; the bias is not used).
fn run_act(gpu: &Gpu, s: Shape, glu: Option<Glu>) -> shaderlm::Result<(Check, usize)> {
    let (m, k, n) = (s.m(), s.k, s.n);
    let mut rng = Rng::new((m * 1_000_003 + k * 1009 + n) as u64);
    let x = rng.vec(m * k, 1.0);
    let mut w = rng.vec(n * k, 1.0);
    if s.dtype == DType::F16 {
        w.iter_mut().for_each(|v| *v = half::f16::from_f32(*v).to_f32());
    }
    let b = rng.vec(n, 1.0);
    let wt = match s.dtype {
        DType::F16 => GpuTensor::upload_f16(gpu, "w", &[n, k], &w)?,
        _ => GpuTensor::upload_f32(gpu, "w", &[n, k], &w)?,
    };
    let bt = GpuTensor::upload_f32(gpu, "bias", &[n], &b)?;
    let mut g = Graph::new();
    let shape: Vec<usize> = if s.lead[0] == 1 {
        vec![s.lead[1], k]
    } else {
        vec![s.lead[0], s.lead[1], k]
    };
    let tx = g.input("x", &shape, DType::F32);
    let tw = g.external(&wt);
    let tb = s.bias.then(|| g.external(&bt));
    let y = match glu {
        Some(act) => g.matmul_glu_with(tx, tw, s.path, act)?,
        None => g.matmul_with(tx, tw, tb, s.path)?,
    };
    g.output(y);
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, tx, bytemuck::cast_slice(&x))?;
    plan.run(gpu, &StepVars::default())?;
    let got = plan.read_f32(y)?;
    let bias = (s.bias && glu.is_none()).then_some(b.as_slice());
    let want = matmul::reference(&x, &w, bias, m, k, n);
    Ok(match glu {
        Some(act) => (nmse(&got, &reference_paired(&want, act), GLU_FACTOR * BOUND), wt.parts.len()),
        None => (nmse(&got, &want, BOUND), wt.parts.len()),
    })
}

fn case(prefix: &str, s: Shape, on: fn() -> Option<&'static Gpu>) -> Case {
    Case::new("matmul", format!("{prefix}{}", s.name()), move |gpu| {
        Ok(run(on().unwrap_or(gpu), s)?.0)
    })
}

fn default_gpu() -> Option<&'static Gpu> {
    None
}

fn fallback_gpu() -> Option<&'static Gpu> {
    Some(gpu_fallback())
}

pub fn cases() -> Vec<Case> {
    use MatmulPath::*;
    let mut v = Vec::new();
    let dtypes = [DType::F32, DType::F16];
    // GEMV (M = 1), both flavours. K: 1 (one product), 7 (no whole vector; f16 row padded to a whole word),
    // 12 (f16 rows not 8-aligned; f32 odd vec4 count), 64, 576, 1000 (odd count of 8-half vectors), 1536.
    // N: 1 and 3 (less than one 4-row block), 129 (one row past a block), 576.
    let gemv = [
        (1, 3),
        (7, 129),
        (12, 1),
        (64, 576),
        (576, 129),
        (1000, 3),
        (1536, 576),
        (576, 1),
    ];
    for (i, &(k, n)) in gemv.iter().enumerate() {
        for dtype in dtypes {
            for path in [GemvCpu, GemvGpu] {
                let bias = (i + (dtype == DType::F16) as usize).is_multiple_of(2);
                v.push(case(
                    "",
                    Shape {
                        lead: [1, 1],
                        k,
                        n,
                        dtype,
                        bias,
                        path,
                    },
                    default_gpu,
                ));
            }
        }
    }
    // GEMM (M > 1) and the GEMM forced at M = 1. M: 2, 5 (under one 8-row block), 33 (one past 4 blocks),
    // 67 (64 + a remainder), 1.
    let gemm = [
        (2, 64, 129),
        (5, 7, 3),
        (33, 576, 129),
        (67, 1000, 576),
        (33, 1536, 576),
        (5, 1, 129),
        (2, 1536, 1),
        (1, 576, 3),
    ];
    for (i, &(m, k, n)) in gemm.iter().enumerate() {
        for dtype in dtypes {
            let bias = (i + (dtype == DType::F16) as usize).is_multiple_of(2);
            v.push(case(
                "",
                Shape {
                    lead: [1, m],
                    k,
                    n,
                    dtype,
                    bias,
                    path: Gemm,
                },
                default_gpu,
            ));
        }
    }
    // Auto picks per M and adapter; x with two leading dims (3 x 11 = 33 rows) flattens into M.
    for (lead, dtype) in [([1, 1], DType::F16), ([3, 11], DType::F32)] {
        let s = Shape {
            lead,
            k: 576,
            n: 576,
            dtype,
            bias: true,
            path: Auto,
        };
        v.push(case("", s, default_gpu));
    }
    // The GEMV flavours at M > 1 (one row of x per grid z), so a forced path is right for any M.
    for path in [GemvCpu, GemvGpu] {
        let s = Shape {
            lead: [1, 5],
            k: 64,
            n: 129,
            dtype: DType::F16,
            bias: false,
            path,
        };
        v.push(case("", s, default_gpu));
    }
    // Batch invariance: up to GEMV_MAX_M rows (a verification step), row r equals the one-row result bit for bit.
    for dtype in dtypes {
        for (k, n) in [(576, 129), (64, 1000), (12, 7)] {
            let name = format!("batch_rows_equal_one_row_{dtype:?}_k{k}_n{n}");
            v.push(Case::new("matmul", name, move |gpu| batch_rows(gpu, dtype, k, n, None, GEMV_MAX_M)));
        }
        let name = format!("batch_rows_equal_one_row_{dtype:?}_k576_n130_silu");
        v.push(Case::new("matmul", name, move |gpu| {
            batch_rows(gpu, dtype, 576, 130, Some(Glu::Silu), GEMV_MAX_M)
        }));
        // A draft tree's step (Graph::set_invariant_rows): up to 64 rows, every one the one-row result.
        let name = format!("tree_rows_equal_one_row_{dtype:?}_k576_n129");
        v.push(Case::new("matmul", name, move |gpu| batch_rows(gpu, dtype, 576, 129, None, 64)));
    }
    // The GLU epilogue (W's rows (gate, up) pairs, y = act(gate) * up) on every kernel, f32 and f16 weights, both
    // activations; N = 2 * 13 and 2 * 65 end inside a 4-row group; K = 7 and 12 take the unaligned kernels;
    // W split into row parts (f32 [700, 96]: 170 rows per part: even part starts); the fallback device.
    for (i, (k, n)) in [(64, 26), (7, 130), (576, 130), (12, 26)].into_iter().enumerate() {
        for dtype in dtypes {
            for (m, path) in [(1, GemvCpu), (1, GemvGpu), (3, GemvCpu), (5, Gemm), (33, Gemm), (1, Auto)] {
                let act = if (i + m) % 2 == 0 { Glu::Silu } else { Glu::GeluTanh };
                let s = Shape {
                    lead: [1, m],
                    k,
                    n,
                    dtype,
                    bias: false,
                    path,
                };
                let name = format!("{}_{act:?}", s.name());
                v.push(Case::new("matmul", name, move |gpu| Ok(run_act(gpu, s, Some(act))?.0)));
            }
        }
    }
    for (m, path) in [(1, GemvCpu), (1, GemvGpu), (5, Gemm)] {
        let s = Shape {
            lead: [1, m],
            k: 96,
            n: 700,
            dtype: DType::F32,
            bias: false,
            path,
        };
        v.push(Case::new("matmul", format!("split5_{}_silu", s.name()), move |_| {
            let (check, got) = run_act(gpu_split(), s, Some(Glu::Silu))?;
            if got != 5 {
                return Ok(exact(&[got], &[5]));
            }
            Ok(check)
        }));
        v.push(Case::new("matmul", format!("fallback_{}_gelu", s.name()), move |_| {
            Ok(run_act(gpu_fallback(), s, Some(Glu::GeluTanh))?.0)
        }));
    }
    // The fallback device: the shared-memory reduction of the GPU GEMV, f16 weights without the f16 feature.
    for (k, dtype, path, m) in [
        (576, DType::F32, GemvGpu, 1),
        (1000, DType::F16, GemvGpu, 1),
        (7, DType::F16, GemvGpu, 1),
        (576, DType::F16, GemvCpu, 1),
        (576, DType::F16, Gemm, 33),
    ] {
        let s = Shape {
            lead: [1, m],
            k,
            n: 129,
            dtype,
            bias: true,
            path,
        };
        v.push(case("fallback_", s, fallback_gpu));
    }
    // Weights split into row parts (64 KiB bindings): one dispatch per part, the last part shorter.
    // f32 [700, 96]: 170 rows per part, 5 parts; f16 [1100, 64]: 512 rows per part, 3 parts;
    // f16 [1200, 100] (rows not 8-aligned): 327 rows per part, 4 parts.
    for (k, n, dtype, parts) in [
        (96, 700, DType::F32, 5),
        (64, 1100, DType::F16, 3),
        (100, 1200, DType::F16, 4),
    ] {
        for (m, path) in [(1, GemvCpu), (1, GemvGpu), (5, Gemm), (5, Auto)] {
            let s = Shape {
                lead: [1, m],
                k,
                n,
                dtype,
                bias: true,
                path,
            };
            v.push(Case::new("matmul", format!("split{parts}_{}", s.name()), move |_| {
                let (check, got) = run(gpu_split(), s)?;
                if got != parts {
                    return Ok(exact(&[got], &[parts]));
                }
                Ok(check)
            }));
        }
    }
    // Every finite f16 bit pattern (zeros, subnormals, normals) decodes exactly: y = x . W^T with x one-hot picks
    // single weights, so the result must equal the weight bit for bit (as a value: -0 + 0 gives +0). K = 8 reads
    // 8-half vectors (M = 8, x the identity); K = 1 reads single padded words (M = 1, x = [1]).
    for (k, path) in [
        (8, Gemm),
        (8, GemvCpu),
        (8, GemvGpu),
        (1, Gemm),
        (1, GemvCpu),
        (1, GemvGpu),
    ] {
        v.push(Case::new(
            "matmul",
            format!("f16_every_finite_half_exact_k{k}_{path:?}"),
            move |gpu| {
                let w: Vec<f32> = (0..=u16::MAX)
                    .map(|b| half::f16::from_bits(b).to_f32())
                    .filter(|v| v.is_finite())
                    .collect();
                let n = w.len() / k;
                let x: Vec<f32> = (0..k * k).map(|i| if i % (k + 1) == 0 { 1.0 } else { 0.0 }).collect();
                let wt = GpuTensor::upload_f16(gpu, "w", &[n, k], &w)?;
                let mut g = Graph::new();
                let tx = g.input("x", &[k, k], DType::F32);
                let tw = g.external(&wt);
                let y = g.matmul_with(tx, tw, None, path)?;
                g.output(y);
                let mut plan = Plan::new(gpu, g)?;
                plan.write_input(gpu, tx, bytemuck::cast_slice(&x))?;
                plan.run(gpu, &StepVars::default())?;
                let got = plan.read_f32(y)?;
                let want = matmul::reference(&x, &w, None, k, k, n);
                Ok(exact(&got, &want))
            },
        ));
    }
    // More workgroups than one grid dimension holds (65535): the GPU GEMV's 4-row groups fold into y, and the one
    // extra group of the rounded-up fold must write nothing (262147 rows: 65537 groups, a 32769 x 2 grid).
    v.push(case(
        "folded_grid_",
        Shape {
            lead: [1, 1],
            k: 1,
            n: 262147,
            dtype: DType::F32,
            bias: true,
            path: GemvGpu,
        },
        default_gpu,
    ));
    // The builder rejects mismatched shapes and dtypes with an error instead of recording a node.
    v.push(Case::new("matmul", "rejects_bad_shapes", |_| {
        let mut g = Graph::new();
        let x = g.input("x", &[2, 64], DType::F32);
        let w = g.input("w", &[10, 63], DType::F32);
        let w2 = g.input("w2", &[10, 64], DType::F32);
        let b = g.input("b", &[9], DType::F32);
        let xi = g.input("xi", &[2, 64], DType::U32);
        let w3 = g.input("w3", &[2, 5, 64], DType::F32);
        let errs = [
            g.matmul(x, w, None).is_err(),
            g.matmul(x, w2, Some(b)).is_err(),
            g.matmul(xi, w2, None).is_err(),
            g.matmul(x, w3, None).is_err(),
            g.matmul(x, w2, None).is_ok(),
        ];
        Ok(exact(&errs, &[true; 5]))
    }));
    v
}

/// Bitwise: M-row matmuls (Auto, M = 2..=GEMV_MAX_M, then 9, 16, 33 and 64 up to `most`, in graphs whose rows must be
/// invariant up to `most`) against one-row matmuls of each row (with a GLU epilogue when `glu`).
fn batch_rows(gpu: &Gpu, dtype: DType, k: usize, n: usize, glu: Option<Glu>, most: usize) -> shaderlm::Result<Check> {
    let mut rng = Rng::new(77);
    let x = rng.vec(most * k, 1.0);
    let w = rng.vec(n * k, 1.0);
    let wt = match dtype {
        DType::F16 => GpuTensor::upload_f16(gpu, "w", &[n, k], &w)?,
        _ => GpuTensor::upload_f32(gpu, "w", &[n, k], &w)?,
    };
    let run = |m: usize, x: &[f32]| -> shaderlm::Result<Vec<u32>> {
        let mut g = Graph::new();
        if most > GEMV_MAX_M {
            g.set_invariant_rows(most);
        }
        let tx = g.input("x", &[m, k], DType::F32);
        let tw = g.external(&wt);
        let y = match glu {
            Some(act) => g.matmul_glu(tx, tw, act)?,
            None => g.matmul(tx, tw, None)?,
        };
        g.output(y);
        let mut plan = Plan::new(gpu, g)?;
        plan.write_input(gpu, tx, bytemuck::cast_slice(x))?;
        plan.run(gpu, &StepVars::default())?;
        Ok(plan.read_f32(y)?.iter().map(|v| v.to_bits()).collect())
    };
    let mut want = Vec::new();
    for r in 0..most {
        want.extend(run(1, &x[r * k..(r + 1) * k])?);
    }
    for m in (2..=GEMV_MAX_M).chain([9, 16, 33, 64]).filter(|&m| m <= most) {
        let cols = if glu.is_some() { n / 2 } else { n };
        let check = exact(&run(m, &x[..m * k])?, &want[..m * cols]);
        if !check.passed() {
            println!("{m} rows differ from one row at a time");
            return Ok(check);
        }
    }
    Ok(exact(&want, &want))
}
