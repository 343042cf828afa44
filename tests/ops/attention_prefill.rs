//! attention_prefill vs an f64 CPU reference (two-pass softmax), over GQA ratios, head dims, chunk lengths and
//! chunk positions; both kernels (the CPU-adapter one on lavapipe, the workgroup one on a device without subgroups).
//!
//! Metric: NMSE. Bound 1e-10, from f32 arithmetic: scores are dots of head_dim products (relative error about
//! sqrt(head_dim) * 6e-8 ~ 1e-6 of the score's magnitude, |score| <~ 10 here, so ~1e-5 absolute), exp2 on a GPU may
//! be off by a couple of ulp (2.4e-7 relative), and the output sums up to a few thousand p * v terms with a running
//! rescale (sqrt(n) * 6e-8 relative). A score error e changes each weight by a factor exp(e) ~ 1 + e, so the output
//! error stays near 1e-5 relative per element at worst and ~1e-6 typical: NMSE ~1e-12, bound 1e-10. Measured on
//! lavapipe: 0 to 9e-13 here and in attention_decode (100x margin). Injected masking, bounds and GQA bugs gave
//! NMSE 1e-5 to 1 or NaN.

use crate::common::{gpu_fallback, nmse, Case, Check, Rng};
use shaderlm::gpu::{DType, Gpu, GpuTensor};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::attention_prefill::{self, AttnShape};
use shaderlm::ops::kv_write::round_f16;

/// NMSE bound for f32 attention against the f64 reference (reason in the module comment).
pub const NMSE_MAX: f64 = 1e-10;

/// Random caches `[n_kv, max_ctx, head_dim]`: keys in [-amp, amp], values in [-1, 1] at positions below `kv_len`,
/// NaN at and after it, so that reading a key past the current length poisons the output.
pub fn caches(rng: &mut Rng, s: AttnShape, kv_len: usize, amp: f32) -> (Vec<f32>, Vec<f32>) {
    let n = s.n_kv * s.max_ctx * s.head_dim;
    let (mut k, mut v) = (rng.vec(n, amp), rng.vec(n, 1.0));
    for h in 0..s.n_kv {
        let tail = (h * s.max_ctx + kv_len) * s.head_dim..(h + 1) * s.max_ctx * s.head_dim;
        k[tail.clone()].iter_mut().for_each(|x| *x = f32::NAN);
        v[tail].iter_mut().for_each(|x| *x = f32::NAN);
    }
    (k, v)
}

/// A cache `[n_kv, max_ctx, head_dim]` on the device as `kv` (f32, or f16: the values rounded).
pub fn upload_cache(gpu: &Gpu, name: &str, shape: &[usize], data: &[f32], kv: DType) -> shaderlm::Result<GpuTensor> {
    match kv {
        DType::F16 => GpuTensor::upload_f16(gpu, name, shape, data),
        _ => GpuTensor::upload_f32(gpu, name, shape, data),
    }
}

/// One f16 ulp, relative, and the smallest f16 subnormal: the bound of a value rounded to f16 (to nearest or
/// toward zero, as Vulkan allows).
pub const F16_RTOL: f64 = 1.0 / 1024.0;
pub const F16_ATOL: f64 = 5.97e-8;

/// [`caches`] on the device as `kv` with the host values they hold (rounded to f16 for an f16 cache).
pub fn kv_caches(
    gpu: &Gpu,
    rng: &mut Rng,
    s: AttnShape,
    kv_len: usize,
    amp: f32,
    kv: DType,
) -> shaderlm::Result<[(GpuTensor, Vec<f32>); 2]> {
    let (kc, vc) = caches(rng, s, kv_len, amp);
    let (kc, vc) = match kv {
        DType::F16 => (round_f16(&kc), round_f16(&vc)),
        _ => (kc, vc),
    };
    let shape = [s.n_kv, s.max_ctx, s.head_dim];
    Ok([
        (upload_cache(gpu, "k_cache", &shape, &kc, kv)?, kc),
        (upload_cache(gpu, "v_cache", &shape, &vc, kv)?, vc),
    ])
}

/// An [`AttnShape`] from its five sizes.
pub fn shape(n_tokens: usize, n_heads: usize, n_kv: usize, head_dim: usize, max_ctx: usize) -> AttnShape {
    AttnShape {
        n_tokens,
        n_heads,
        n_kv,
        head_dim,
        max_ctx,
    }
}

/// Scores scale * q.k with q, k uniform in [-amp, amp] have std amp^2 / 3: amp 3 gives a peaked softmax (std 3).
pub const AMP: f32 = 3.0;

fn run(gpu: &Gpu, s: AttnShape, pos: usize, amp: f32, seed: u64) -> shaderlm::Result<Check> {
    run_window(gpu, s, pos, (amp, DType::F32), seed, None)
}

/// [`run`] with a sliding window of `window` keys per query, over caches of `kv`.
pub fn run_window(
    gpu: &Gpu,
    s: AttnShape,
    pos: usize,
    (amp, kv): (f32, DType),
    seed: u64,
    window: Option<usize>,
) -> shaderlm::Result<Check> {
    run_node(gpu, s, pos, (amp, kv), seed, (window, false))
}

/// [`run_window`] through `attention_prefill_wide` (the CPU-adapter kernel at any head dim) when `wide`.
fn run_node(
    gpu: &Gpu,
    s: AttnShape,
    pos: usize,
    (amp, kv): (f32, DType),
    seed: u64,
    (window, wide): (Option<usize>, bool),
) -> shaderlm::Result<Check> {
    let mut rng = Rng::new(seed);
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    let q = rng.vec(s.n_tokens * s.n_heads * s.head_dim, amp);
    let [(kt, kc), (vt, vc)] = kv_caches(gpu, &mut rng, s, pos + s.n_tokens, amp, kv)?;
    let mut g = Graph::new();
    let tq = g.input("q", &[s.n_tokens, s.n_heads, s.head_dim], DType::F32);
    let (tk, tv) = (g.external(&kt), g.external(&vt));
    let o = match wide {
        true => g.attention_prefill_wide(tq, tk, tv, scale, window)?,
        false => g.attention_prefill_window(tq, tk, tv, scale, window)?,
    };
    g.output(o);
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, tq, bytemuck::cast_slice(&q))?;
    plan.run(gpu, &StepVars { pos: pos as u32 })?;
    let want = attention_prefill::reference_window(&q, &kc, &vc, s, pos, scale, window);
    Ok(nmse(&plan.read_f32(o)?, &want, NMSE_MAX))
}

/// Two chunks through kv_write + attention_prefill in one plan (the model's path): the second chunk must see the
/// first chunk's keys, written by the first run.
fn two_chunks(gpu: &Gpu, s: AttnShape, first: usize, seed: u64) -> shaderlm::Result<Check> {
    let mut rng = Rng::new(seed);
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    let n = s.n_tokens;
    let cache_shape = [s.n_kv, s.max_ctx, s.head_dim];
    let kt = GpuTensor::zeros(gpu, "k_cache", &cache_shape, DType::F32)?;
    let vt = GpuTensor::zeros(gpu, "v_cache", &cache_shape, DType::F32)?;
    let mut g = Graph::new();
    let tq = g.input("q", &[n, s.n_heads, s.head_dim], DType::F32);
    let tk_new = g.input("k", &[n, s.n_kv, s.head_dim], DType::F32);
    let tv_new = g.input("v", &[n, s.n_kv, s.head_dim], DType::F32);
    let (tk, tv) = (g.external(&kt), g.external(&vt));
    g.kv_write(tk_new, tk)?;
    g.kv_write(tv_new, tv)?;
    let o = g.attention_prefill(tq, tk, tv, scale)?;
    g.output(o);
    let mut plan = Plan::new(gpu, g)?;
    let mut kc = vec![0f32; s.n_kv * s.max_ctx * s.head_dim];
    let mut vc = kc.clone();
    let mut last = (Vec::new(), Vec::new());
    for pos in [0, first] {
        let q = rng.vec(n * s.n_heads * s.head_dim, AMP);
        let k = rng.vec(n * s.n_kv * s.head_dim, AMP);
        let v = rng.vec(n * s.n_kv * s.head_dim, 1.0);
        plan.write_input(gpu, tq, bytemuck::cast_slice(&q))?;
        plan.write_input(gpu, tk_new, bytemuck::cast_slice(&k))?;
        plan.write_input(gpu, tv_new, bytemuck::cast_slice(&v))?;
        plan.run(gpu, &StepVars { pos: pos as u32 })?;
        shaderlm::ops::kv_write::reference(&k, &mut kc, s.n_kv, s.max_ctx, s.head_dim, pos);
        shaderlm::ops::kv_write::reference(&v, &mut vc, s.n_kv, s.max_ctx, s.head_dim, pos);
        last = (
            plan.read_f32(o)?,
            attention_prefill::reference(&q, &kc, &vc, s, pos, scale),
        );
    }
    Ok(nmse(&last.0, &last.1, NMSE_MAX))
}

/// (name, n_heads, n_kv, head_dim, n_tokens, pos, max_ctx, amp, sliding window)
type Extra = (
    &'static str,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    f32,
    Option<usize>,
);

pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    let mut seed = 2000u64;
    let heads = [(1usize, 1usize), (3, 1), (9, 3), (4, 1), (8, 1), (14, 2)];
    for (n_heads, n_kv) in heads {
        for head_dim in [64usize, 128] {
            for n_tokens in [1usize, 5, 37, 130] {
                // pos 0: the first chunk; pos 100: a chunk after a prefix (not a multiple of the tile).
                for pos in [0usize, 100] {
                    seed += 1;
                    // 19 slots past the chunk hold NaN: the kernel must not read past pos + n_tokens.
                    let s = AttnShape {
                        n_tokens,
                        n_heads,
                        n_kv,
                        head_dim,
                        max_ctx: pos + n_tokens + 19,
                    };
                    let name = format!("h{n_heads}_kv{n_kv}_d{head_dim}_t{n_tokens}_pos{pos}");
                    v.push(Case::new("attention_prefill", name, move |gpu| {
                        run(gpu, s, pos, AMP, seed)
                    }));
                }
            }
        }
    }
    // Other head dims, the chunk ending exactly at max_ctx, large scores (exp range), GQA ratio 8 with 4 kv heads.
    let extra: [Extra; 16] = [
        ("head_dim_32", 8, 2, 32, 37, 5, 42, AMP, None),
        ("head_dim_80", 6, 2, 80, 37, 5, 50, AMP, None),
        ("head_dim_96", 12, 4, 96, 20, 33, 60, AMP, None),
        ("ends_at_max_ctx", 4, 2, 64, 64, 64, 128, AMP, None),
        ("large_scores", 4, 1, 64, 37, 30, 80, 8.0, None),
        ("gqa8_kv4", 32, 4, 128, 9, 300, 320, AMP, None),
        ("long_prefix", 3, 1, 64, 5, 2000, 2010, AMP, None),
        // Sliding windows (Gemma 3): keys before a row's window are finite random values, so reading them changes
        // the result; tiles start unaligned to the window.
        ("window1", 4, 1, 64, 37, 0, 56, AMP, Some(1)),
        ("window5_first_chunk", 4, 2, 64, 37, 0, 56, AMP, Some(5)),
        ("window7_after_prefix", 8, 2, 128, 70, 100, 189, AMP, Some(7)),
        ("window64_rows_cross_tiles", 9, 3, 64, 130, 50, 199, AMP, Some(64)),
        ("window_past_everything", 4, 1, 64, 20, 10, 49, AMP, Some(4096)),
        ("head_dim_256", 4, 1, 256, 37, 5, 61, AMP, Some(4096)),
        ("head_dim_256_window", 4, 1, 256, 70, 40, 129, AMP, Some(33)),
        // Gemma 3 270M's shape: a 128-token chunk deep into a 2048-position cache, the window a full 512 behind.
        ("gemma3_chunk_past_window", 4, 1, 256, 128, 1280, 2048, AMP, Some(512)),
        // The tiled kernel went wrong at head_dim 256 once a row saw ~450 keys (see DENSE_HEAD_DIMS).
        ("head_dim_256_rows_see_500_keys", 4, 1, 256, 16, 500, 600, AMP, None),
    ];
    for (name, n_heads, n_kv, head_dim, n_tokens, pos, max_ctx, amp, window) in extra {
        seed += 1;
        let s = AttnShape {
            n_tokens,
            n_heads,
            n_kv,
            head_dim,
            max_ctx,
        };
        v.push(Case::new("attention_prefill", name, move |gpu| {
            run_window(gpu, s, pos, (amp, DType::F32), seed, window)
        }));
    }
    // The workgroup kernel of GPUs and of adapters without subgroups, on a device without them (CPU adapters with
    // subgroups run attention_prefill_cpu.wgsl in the cases above).
    let fallback: [Extra; 5] = [
        ("workgroup_kernel_h9_kv3_d64", 9, 3, 64, 130, 100, 249, AMP, None),
        ("workgroup_kernel_h8_kv1_d128", 8, 1, 128, 37, 0, 56, AMP, None),
        ("workgroup_kernel_head_dim_80", 6, 2, 80, 37, 5, 50, AMP, None),
        ("workgroup_kernel_window64", 9, 3, 64, 130, 50, 199, AMP, Some(64)),
        ("workgroup_kernel_large_scores", 4, 1, 32, 37, 30, 80, 8.0, None),
    ];
    for (name, n_heads, n_kv, head_dim, n_tokens, pos, max_ctx, amp, window) in fallback {
        seed += 1;
        let s = shape(n_tokens, n_heads, n_kv, head_dim, max_ctx);
        v.push(Case::new("attention_prefill", name, move |_| {
            run_window(gpu_fallback(), s, pos, (amp, DType::F32), seed, window)
        }));
    }
    // Head dim 256 through the CPU kernel (`attention_prefill_wide`, what CPU adapters run for Gemma 3), f32 and
    // f16 caches, past the ~450 keys where the tiled kernel failed at this size.
    let wide: [(Extra, DType); 4] = [
        (("wide_head_dim_256", 4, 1, 256, 37, 5, 61, AMP, None), DType::F32),
        (("wide_head_dim_256_rows_see_500_keys", 4, 1, 256, 16, 500, 600, AMP, None), DType::F32),
        (("wide_gemma3_chunk_past_window", 4, 1, 256, 128, 1280, 1420, AMP, Some(512)), DType::F32),
        (("wide_head_dim_256_f16_window", 8, 2, 256, 70, 40, 129, AMP, Some(33)), DType::F16),
    ];
    for ((name, n_heads, n_kv, head_dim, n_tokens, pos, max_ctx, amp, window), kv) in wide {
        seed += 1;
        let s = shape(n_tokens, n_heads, n_kv, head_dim, max_ctx);
        v.push(Case::new("attention_prefill", name, move |gpu| {
            run_node(gpu, s, pos, (amp, kv), seed, (window, true))
        }));
    }
    for (n_heads, n_kv, head_dim, n_tokens, first) in [(9, 3, 64, 37, 37), (8, 2, 128, 20, 50)] {
        seed += 1;
        let s = AttnShape {
            n_tokens,
            n_heads,
            n_kv,
            head_dim,
            max_ctx: first + n_tokens,
        };
        let name = format!("two_chunks_via_kv_write_h{n_heads}_kv{n_kv}_d{head_dim}_t{n_tokens}");
        v.push(Case::new("attention_prefill", name, move |gpu| {
            two_chunks(gpu, s, first, seed)
        }));
    }
    v
}
