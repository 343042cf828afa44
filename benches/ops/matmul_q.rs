//! matmul_q throughput: the GEMV (decode) at the projection shapes of the three models (N x K: SmolLM2 FFN down and
//! up, its 49152 x 576 LM head, Qwen2.5-0.5B FFN down, a 2048 x 8192, a 4096 x 4096 and Llama3-8B's FFN down), for
//! each 32-weight format and both layouts; the GEMM for a 128-token chunk; f32 vs f16 arithmetic in the rows layout; and the f16 `matmul`
//! GEMV at the same shapes as a baseline; the fused decode step's q|k|v and gate|up GEMVs with the norm in their
//! prologue against the GEMV alone and after `rms_norm`, and the q|k|v GEMVs with rope_kv's work in their epilogue
//! against them followed by `rope_kv`; and cold GEMVs, 256 MiB of distinct weight copies in one pass.
//! GB/s counts the packed weight bytes (quants, scales, mins) plus x and y. The super-block types (Q4_K, Q5_K, Q6_K,
//! IQ4_XS), at the shapes whose K is whole 256-weight super-blocks: their packed bytes are the repacked 32-weight
//! blocks (Q5_K 24 bytes per 32 weights, Q6_K 28, IQ4_XS 18), not the file's (22, 26.25, 17); Q2_K, Q3_K and Q4_K
//! read 10.5, 14.25 and 18.5 (the file's 10.5, 13.75 and 18).

use crate::common::{plan_of, Bench, MODELS};
use crate::embedding_q::blocks;
use shaderlm::gpu::{DType, GpuTensor};
use shaderlm::graph::StepVars;
use shaderlm::ops::rope::{RopeConfig, RopeStyle};
use shaderlm::ops::rope_kv::QkvSource;
use shaderlm::ops::matmul::MatmulPath;
use shaderlm::ops::matmul_q::{QMath, QPath};
use shaderlm::ops::silu_mul::Glu;
use shaderlm::gpu::packed::PackedWeight;
use shaderlm::quant::pack::Layout;
use shaderlm::quant::GgmlType;

/// (N, K) of the GEMV shapes.
fn shapes() -> Vec<(usize, usize)> {
    let (_, h, f, ..) = MODELS[0];
    let (_, h1, f1, ..) = MODELS[1];
    let (_, h2, f2, ..) = MODELS[2];
    vec![
        (h, f),
        (f, h),
        (MODELS[0].6, h),
        (h1, f1),
        (2048, 8192),
        (4096, 4096),
        (h2, f2),
    ]
}

/// [`blocks`] with finite, normal super-block factors for Q2_K and Q3_K (whose `d` sits where the random bytes
/// are): `d` 2^-12, Q2_K `dmin` 2^-10.
fn super_blocks(ty: GgmlType, n: usize, k: usize) -> Vec<u8> {
    let mut raw = blocks(ty, n, k);
    let at = match ty {
        GgmlType::Q2_K => Some((80, Some(82))),
        GgmlType::Q3_K => Some((108, None)),
        _ => None,
    };
    if let Some((d, dmin)) = at {
        let f16 = |v: f32| half::f16::from_f32(v).to_bits().to_le_bytes();
        for blk in raw.chunks_exact_mut(ty.type_size()) {
            blk[d..d + 2].copy_from_slice(&f16(1.0 / 4096.0));
            if let Some(m) = dmin {
                blk[m..m + 2].copy_from_slice(&f16(1.0 / 1024.0));
            }
        }
    }
    raw
}

/// A q|k|v weight of the rope-epilogue benches: its type and how many of q, k and v it stacks.
type Group = (GgmlType, usize);
/// A model's q|k|v for those benches: name, hidden size, q heads, KV heads, head_dim, weights.
type QkvShape = (&'static str, usize, usize, usize, usize, &'static [Group]);

fn layout_name(l: Layout) -> &'static str {
    match l {
        Layout::Tiled => "tiled",
        Layout::Rows => "rows",
    }
}

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    let formats = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::IQ4_NL,
    ];
    for (n, k) in shapes() {
        for layout in [Layout::Tiled, Layout::Rows] {
            for ty in formats {
                let name = format!("matmul_q gemv {ty} {} {n}x{k}", layout_name(layout));
                v.push(Bench::new(name, move |gpu| {
                    let w = PackedWeight::upload_with(gpu, "w", ty, layout, n, k, &blocks(ty, n, k))?;
                    plan_of(gpu, |g| {
                        let x = g.input("x", &[1, k], DType::F32);
                        g.matmul_q(x, &w, None)?;
                        Ok(vec![(x, k, DType::F32)])
                    })
                }));
            }
        }
        v.push(Bench::new(format!("matmul_q gemv f16-baseline {n}x{k}"), move |gpu| {
            let data: Vec<f32> = (0..n * k)
                .map(|i| ((i * 2654435761usize) % 1000) as f32 * 1e-4 - 0.05)
                .collect();
            let w = GpuTensor::upload_f16(gpu, "w", &[n, k], &data)?;
            plan_of(gpu, |g| {
                let x = g.input("x", &[1, k], DType::F32);
                let tw = g.external(&w);
                g.matmul_with(x, tw, None, MatmulPath::Auto)?;
                Ok(vec![(x, k, DType::F32)])
            })
        }));
    }
    // Every GEMV of one SmolLM2-135M decode step in one plan: 30 layers of q, k, v, o, gate, up, down (Q4_1, as in
    // its GGUF) and the tied Q8_0 LM head; then the same with q|k|v packed as one weight (rows concatenated) and
    // gate|up as one with the GLU epilogue (rows paired), as the model runs them: 90 dispatches fewer per token.
    let (_, h, f, heads, kv_heads, head_dim, vocab) = MODELS[0];
    let kv = kv_heads * head_dim;
    for fused in [false, true] {
        let name = format!(
            "matmul_q smollm2-135m token: 30 layers + head{}",
            if fused { ", fused" } else { "" }
        );
        v.push(Bench::new(name, move |gpu| {
            let per_layer: Vec<(usize, usize)> = if fused {
                vec![(heads * head_dim + 2 * kv, h), (h, h), (2 * f, h), (h, f)]
            } else {
                vec![(heads * head_dim, h), (kv, h), (kv, h), (h, h), (f, h), (f, h), (h, f)]
            };
            let mut ws = Vec::new();
            for _ in 0..30 {
                for &(n, k) in &per_layer {
                    ws.push(PackedWeight::upload(
                        gpu,
                        "w",
                        GgmlType::Q4_1,
                        n,
                        k,
                        &blocks(GgmlType::Q4_1, n, k),
                    )?);
                }
            }
            let head = PackedWeight::upload(gpu, "head", GgmlType::Q8_0, vocab, h, &blocks(GgmlType::Q8_0, vocab, h))?;
            plan_of(gpu, |g| {
                let xh = g.input("xh", &[1, h], DType::F32);
                let xf = g.input("xf", &[1, f], DType::F32);
                for w in &ws {
                    let x = if w.k == h { xh } else { xf };
                    if fused && w.n == 2 * f {
                        g.matmul_q_glu(x, w, Glu::Silu)?;
                    } else {
                        g.matmul_q(x, w, None)?;
                    }
                }
                g.matmul_q(xh, &head, None)?;
                Ok(vec![(xh, h, DType::F32), (xf, f, DType::F32)])
            })
        }));
    }
    // The FFN's gate|up matmul with the GLU epilogue against the same matmul followed by silu_mul (the unfused pair),
    // for one token and a 128-token chunk at SmolLM2's and Qwen2.5-0.5B's shapes, Q4_1, both layouts.
    for (model, h, f, ..) in &MODELS[..2] {
        let (model, h, f) = (*model, *h, *f);
        for layout in [Layout::Tiled, Layout::Rows] {
            for m in [1usize, 128] {
                for glu in [false, true] {
                    let how = if glu { "glu epilogue" } else { "then silu_mul" };
                    let name = format!("matmul_q gate|up Q4_1 {} {model} {m}x(2x{f})x{h} {how}", layout_name(layout));
                    v.push(Bench::new(name, move |gpu| {
                        let ty = GgmlType::Q4_1;
                        let w = PackedWeight::upload_with(gpu, "w", ty, layout, 2 * f, h, &blocks(ty, 2 * f, h))?;
                        plan_of(gpu, |g| {
                            let x = g.input("x", &[m, h], DType::F32);
                            if glu {
                                g.matmul_q_glu(x, &w, Glu::Silu)?;
                            } else {
                                let gu = g.matmul_q(x, &w, None)?;
                                g.glu_fused(gu, Glu::Silu)?;
                            }
                            Ok(vec![(x, m * h, DType::F32)])
                        })
                    }));
                }
            }
        }
    }
    // The fused decode step's q|k|v and gate|up (tiled GEMVs, the GLU epilogue on gate|up) with the layer's norm in
    // their prologue, against the same GEMV alone and after its own rms_norm dispatch: what the prologue costs at
    // SmolLM2's shapes (Q4_1) and at Qwen2.5-Coder-1.5B's (Q4_K, hidden 1536, FFN 8960, q|k|v 2048 rows).
    let normed = [
        ("smollm2-135m q|k|v", GgmlType::Q4_1, 960, 576, None),
        ("smollm2-135m gate|up", GgmlType::Q4_1, 2 * 1536, 576, Some(Glu::Silu)),
        ("qwen2.5-1.5b q|k|v", GgmlType::Q4_K, 2048, 1536, None),
        ("qwen2.5-1.5b gate|up", GgmlType::Q4_K, 2 * 8960, 1536, Some(Glu::Silu)),
    ];
    for (what, ty, n, h, glu) in normed {
        for how in ["alone", "after rms_norm", "norm prologue"] {
            let name = format!("matmul_q {what} {ty} tiled 1x{n}x{h} {how}");
            v.push(Bench::new(name, move |gpu| {
                let w = PackedWeight::upload_with(gpu, "w", ty, Layout::Tiled, n, h, &super_blocks(ty, n, h))?;
                plan_of(gpu, |g| {
                    let x = g.input("x", &[1, h], DType::F32);
                    let nw = g.input("norm", &[h], DType::F32);
                    match how {
                        "alone" => g.matmul_q_fused(x, &w, None, glu, None, None)?,
                        "after rms_norm" => {
                            let xn = g.rms_norm(x, nw, 1e-6)?;
                            g.matmul_q_fused(xn, &w, None, glu, None, None)?
                        }
                        _ => g.matmul_q_fused(x, &w, None, glu, Some((nw, 1e-6)), None)?,
                    };
                    Ok(vec![(x, h, DType::F32), (nw, h, DType::F32)])
                })
            }));
        }
    }
    // Gemma 3 270M's post-norm layers (hidden 640; its Q4_K_M file stores these in Q5_0 and Q8_0): gate|up (GELU
    // epilogue) with the post-norm and residual add in its prologue (`matmul_q_post_norm`) against the GEMV alone
    // and after `add_post_rms_norm`; q|k (Q5_0) and v (Q8_0) in one dispatch with that prologue
    // (`matmul_q_two_normed`) against `add_post_rms_norm` and two GEMVs.
    let h = 640;
    for how in ["alone", "after add_post_rms_norm", "post-norm prologue"] {
        let n = 2 * 2048;
        let name = format!("matmul_q gemma3-270m gate|up Q5_0 tiled 1x{n}x{h} {how}");
        v.push(Bench::new(name, move |gpu| {
            let ty = GgmlType::Q5_0;
            let w = PackedWeight::upload_with(gpu, "w", ty, Layout::Tiled, n, h, &super_blocks(ty, n, h))?;
            let glu = Some(Glu::GeluTanh);
            plan_of(gpu, |g| {
                let (x, r) = (g.input("x", &[1, h], DType::F32), g.input("r", &[1, h], DType::F32));
                let (nw, pw) = (g.input("norm", &[h], DType::F32), g.input("post", &[h], DType::F32));
                match how {
                    "alone" => g.matmul_q_fused(x, &w, None, glu, None, None)?,
                    "after add_post_rms_norm" => {
                        let (_, xn) = g.add_post_rms_norm(x, (r, pw), 1.0, nw, 1e-6)?;
                        g.matmul_q_fused(xn, &w, None, glu, None, None)?
                    }
                    _ => g.matmul_q_post_norm(x, &w, None, glu, (r, pw, 1.0), (nw, 1e-6))?.0,
                };
                Ok([x, r, nw, pw].map(|t| (t, h, DType::F32)).to_vec())
            })
        }));
    }
    for how in ["after add_post_rms_norm", "two_normed post-norm"] {
        let (na, nb) = (1280, 256);
        let name = format!("matmul_q gemma3-270m q|k Q5_0 + v Q8_0 tiled 1x({na}+{nb})x{h} {how}");
        v.push(Bench::new(name, move |gpu| {
            let (ta, tb) = (GgmlType::Q5_0, GgmlType::Q8_0);
            let wa = PackedWeight::upload_with(gpu, "wa", ta, Layout::Tiled, na, h, &super_blocks(ta, na, h))?;
            let wb = PackedWeight::upload_with(gpu, "wb", tb, Layout::Tiled, nb, h, &super_blocks(tb, nb, h))?;
            plan_of(gpu, |g| {
                let (x, r) = (g.input("x", &[1, h], DType::F32), g.input("r", &[1, h], DType::F32));
                let (nw, pw) = (g.input("norm", &[h], DType::F32), g.input("post", &[h], DType::F32));
                if how == "after add_post_rms_norm" {
                    let (_, xn) = g.add_post_rms_norm(x, (r, pw), 1.0, nw, 1e-6)?;
                    g.matmul_q(xn, &wa, None)?;
                    g.matmul_q(xn, &wb, None)?;
                } else {
                    g.matmul_q_two_normed(x, ((&wa, None), (&wb, None)), (nw, 1e-6), Some((r, pw, 1.0)))?;
                }
                Ok([x, r, nw, pw].map(|t| (t, h, DType::F32)).to_vec())
            })
        }));
    }
    // The fused decode step's q|k|v with rope_kv's work in its epilogue (`matmul_q_qkv_rope`) against the same GEMVs
    // then `rope_kv`, both with the norm prologue, f32 caches of 2048 positions at position 1000: SmolLM2's stacked
    // q|k|v (Q4_1) and Qwen2.5-Coder-1.5B's q|k (Q4_K) and v (Q6_K) apart, with biases (the epilogue's two weights in
    // one dispatch, matmul_q_tiled's TWO form).
    let qkvs: [QkvShape; 2] = [
        ("smollm2-135m", 576, 9, 3, 64, &[(GgmlType::Q4_1, 3)]),
        ("qwen2.5-1.5b", 1536, 12, 2, 128, &[(GgmlType::Q4_K, 2), (GgmlType::Q6_K, 1)]),
    ];
    for (model, h, heads, kv, hd, groups) in qkvs {
        for epilogue in [true, false] {
            let how = if epilogue { "rope epilogue" } else { "then rope_kv" };
            v.push(Bench::new(format!("matmul_q q|k|v {model} 1x({heads}+2x{kv})x{hd}x{h} {how}"), move |gpu| {
                let sizes = [heads * hd, kv * hd, kv * hd];
                let mut ws = Vec::new();
                let mut p = 0;
                for &(ty, count) in groups {
                    let n: usize = sizes[p..p + count].iter().sum();
                    let w = PackedWeight::upload_with(gpu, "w", ty, Layout::Tiled, n, h, &super_blocks(ty, n, h))?;
                    ws.push((w, GpuTensor::upload_f32(gpu, "bias", &[n], &vec![0.01; n])?, count));
                    p += count;
                }
                let shape = [kv, 2048, hd];
                let kc = GpuTensor::zeros(gpu, "k_cache", &shape, DType::F32)?;
                let vc = GpuTensor::zeros(gpu, "v_cache", &shape, DType::F32)?;
                let (plan, _) = plan_of(gpu, |g| {
                    let x = g.input("x", &[1, h], DType::F32);
                    let nw = g.input("norm", &[h], DType::F32);
                    let (kc, vc) = (g.external(&kc), g.external(&vc));
                    let cfg = RopeConfig::new(RopeStyle::Interleaved, 10000.0, hd);
                    let ws: Vec<_> = ws.iter().map(|(w, b, count)| (w, Some(g.external(b)), *count)).collect();
                    if epilogue {
                        g.matmul_q_qkv_rope(x, &ws, Some((nw, 1e-6)), cfg, (kc, vc))?;
                    } else {
                        let mut src = Vec::new();
                        for &(w, b, count) in &ws {
                            src.push((g.matmul_q_fused(x, w, b, None, Some((nw, 1e-6)), None)?, count));
                        }
                        g.rope_kv(QkvSource(src), None, cfg, kc, vc)?;
                    }
                    Ok(vec![(x, h, DType::F32), (nw, h, DType::F32)])
                })?;
                Ok((plan, StepVars { pos: 1000 }))
            }));
        }
    }
    // k-quant GEMVs: SmolLM2 FFN down, Qwen FFN down, 2048 x 8192, 4096 x 4096 and Llama3-8B FFN down.
    let k_quants = [
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_XS,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
    ];
    for (n, k) in shapes().into_iter().filter(|&(_, k)| k.is_multiple_of(256)) {
        for layout in [Layout::Tiled, Layout::Rows] {
            for ty in k_quants {
                let name = format!("matmul_q gemv {ty} {} {n}x{k}", layout_name(layout));
                v.push(Bench::new(name, move |gpu| {
                    let w = PackedWeight::upload_with(gpu, "w", ty, layout, n, k, &super_blocks(ty, n, k))?;
                    plan_of(gpu, |g| {
                        let x = g.input("x", &[1, k], DType::F32);
                        g.matmul_q(x, &w, None)?;
                        Ok(vec![(x, k, DType::F32)])
                    })
                }));
            }
        }
    }
    // f32 vs f16 arithmetic in the rows layout, the one with f16 kernels (forced; `Auto` picks by adapter): the GEMV
    // at 2048 x 8192 and Llama3-8B's FFN down, and the GEMM for a 128-token chunk through SmolLM2's FFN down.
    let maths = [("f32", QMath::F32), ("f16", QMath::F16)];
    let tokens = 128;
    for (n, k) in [(2048, 8192), (MODELS[2].1, MODELS[2].2)] {
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q4_K] {
            for (mname, math) in maths {
                v.push(Bench::new(
                    format!("matmul_q gemv {ty} rows {mname} {n}x{k}"),
                    move |gpu| {
                        let w = PackedWeight::upload_with(gpu, "w", ty, Layout::Rows, n, k, &blocks(ty, n, k))?;
                        plan_of(gpu, |g| {
                            let x = g.input("x", &[1, k], DType::F32);
                            g.matmul_q_math(x, &w, None, QPath::Auto, math)?;
                            Ok(vec![(x, k, DType::F32)])
                        })
                    },
                ));
            }
        }
    }
    let (n, k) = (MODELS[0].1, MODELS[0].2);
    for ty in [GgmlType::Q4_0, GgmlType::Q8_0] {
        for (mname, math) in maths {
            v.push(Bench::new(
                format!("matmul_q gemm {ty} rows {mname} {tokens}x{n}x{k}"),
                move |gpu| {
                    let w = PackedWeight::upload_with(gpu, "w", ty, Layout::Rows, n, k, &blocks(ty, n, k))?;
                    plan_of(gpu, |g| {
                        let x = g.input("x", &[tokens, k], DType::F32);
                        g.matmul_q_math(x, &w, None, QPath::Auto, math)?;
                        Ok(vec![(x, tokens * k, DType::F32)])
                    })
                },
            ));
        }
    }
    cold_gemvs(&mut v);
    // Batched sessions and short verifications: 1 to 4 and 8 rows through SmolLM2's FFN up, tiled (the GEMV for one
    // row, the 2-token GEMM for 2, the 4-token one for 3 and 4, the 8-token one for 8: a 7-draft chain), and 1 and 4
    // rows through its Q8_0 LM head (a verification step's biggest matmul); the weights are read once per call.
    let (n, k) = (MODELS[0].2, MODELS[0].1);
    let shapes =
        [GgmlType::Q4_1, GgmlType::Q8_0].into_iter().flat_map(|ty| [1usize, 2, 3, 4, 8].map(move |m| (ty, m, n)));
    for (ty, m, n) in shapes.chain([1, 4].map(|m| (GgmlType::Q8_0, m, 49152))) {
        v.push(Bench::new(format!("matmul_q rows {ty} tiled {m}x{n}x{k}"), move |gpu| {
            let w = PackedWeight::upload_with(gpu, "w", ty, Layout::Tiled, n, k, &blocks(ty, n, k))?;
            plan_of(gpu, |g| {
                let x = g.input("x", &[m, k], DType::F32);
                g.matmul_q(x, &w, None)?;
                Ok(vec![(x, m * k, DType::F32)])
            })
        }));
    }
    // Prefill: a 128-token chunk through SmolLM2's FFN up and Qwen's FFN down (and, for the k-quants, whose K must
    // be whole super-blocks, SmolLM2's FFN down instead of its up).
    for (n, k) in [(MODELS[0].1, MODELS[0].2), (MODELS[1].1, MODELS[1].2)] {
        for layout in [Layout::Tiled, Layout::Rows] {
            for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS] {
                let name = format!("matmul_q gemm {ty} {} {tokens}x{n}x{k}", layout_name(layout));
                v.push(Bench::new(name, move |gpu| {
                    let w = PackedWeight::upload_with(gpu, "w", ty, layout, n, k, &blocks(ty, n, k))?;
                    plan_of(gpu, |g| {
                        let x = g.input("x", &[tokens, k], DType::F32);
                        g.matmul_q(x, &w, None)?;
                        Ok(vec![(x, tokens * k, DType::F32)])
                    })
                }));
            }
        }
    }
    for (n, k) in [(MODELS[0].2, MODELS[0].1), (MODELS[1].1, MODELS[1].2)] {
        for layout in [Layout::Tiled, Layout::Rows] {
            for ty in formats {
                let name = format!("matmul_q gemm {ty} {} {tokens}x{n}x{k}", layout_name(layout));
                v.push(Bench::new(name, move |gpu| {
                    let w = PackedWeight::upload_with(gpu, "w", ty, layout, n, k, &blocks(ty, n, k))?;
                    plan_of(gpu, |g| {
                        let x = g.input("x", &[tokens, k], DType::F32);
                        g.matmul_q(x, &w, None)?;
                        Ok(vec![(x, tokens * k, DType::F32)])
                    })
                }));
            }
        }
    }
    v
}

/// Bytes of weights a cold GEMV bench streams in one pass: several times any last-level cache (an H100's L2 is
/// 50 MB, an H200's 60 MB, a desktop CPU's L3 up to about 100 MB).
const COLD_BYTES: u64 = 256 << 20;

/// GEMVs that cannot hit a cache: one plan (one pass, one submission) over as many distinct copies of the weight as
/// make [`COLD_BYTES`], each copy read once per pass, so the bandwidth is the memory's, not the cache's (a single
/// 4096 x 4096 Q4_0 matrix, 9.4 MB, fits a GPU's L2 and would time from it on every run after the first). The time
/// is the pass's; GB/s counts every copy's bytes. At 4096 x 4096 and Llama3-8B's FFN down, the three weight kinds
/// of an 8B Q4_0 / Q4_K_M file, in this adapter's layout.
fn cold_gemvs(v: &mut Vec<Bench>) {
    let (_, h2, f2, ..) = MODELS[2];
    for (n, k) in [(4096, 4096), (h2, f2)] {
        for ty in [GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q8_0] {
            let bytes = (n * k / ty.block_size() * ty.type_size()) as u64;
            let copies = COLD_BYTES.div_ceil(bytes).max(2) as usize;
            let name = format!("matmul_q gemv cold {ty} {n}x{k} x{copies}");
            v.push(Bench::new(name, move |gpu| {
                let raw = blocks(ty, n, k);
                let ws = (0..copies)
                    .map(|i| PackedWeight::upload(gpu, &format!("w{i}"), ty, n, k, &raw))
                    .collect::<shaderlm::Result<Vec<_>>>()?;
                plan_of(gpu, |g| {
                    let x = g.input("x", &[1, k], DType::F32);
                    for w in &ws {
                        g.matmul_q(x, w, None)?;
                    }
                    Ok(vec![(x, k, DType::F32)])
                })
            }));
        }
    }
}
