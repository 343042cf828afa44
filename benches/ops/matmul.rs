//! matmul throughput: one token (GEMV, both flavours) and a prefill chunk (GEMM) at the dense layers of each model:
//! SmolLM2 MLP up/down and its LM head, the 0.5B MLP up, the 8B MLP up (f32 there is 224 MiB: split into parts).
//! GB/s counts compulsory traffic (weights once, x, y), so at one token it is the weight stream.

use crate::common::{plan_of, weight, Bench, MODELS};
use shaderlm::gpu::DType;
use shaderlm::ops::matmul::MatmulPath;

pub fn benches() -> Vec<Bench> {
    let [(small, h0, f0, .., vocab0), (mid, h1, f1, ..), (big, h2, f2, ..)] = MODELS;
    // (model, layer, K, N, prefill rows, dtypes)
    let f32_f16 = &[DType::F32, DType::F16][..];
    let shapes = [
        (small, "up", h0, f0, 512, f32_f16),
        (small, "down", f0, h0, 512, f32_f16),
        (small, "lm_head", h0, vocab0, 32, f32_f16),
        (mid, "up", h1, f1, 128, f32_f16),
        (big, "up", h2, f2, 32, f32_f16),
    ];
    let mut v = Vec::new();
    for (model, layer, k, n, prefill, dtypes) in shapes {
        for &dtype in dtypes {
            let dt = if dtype == DType::F16 { "f16" } else { "f32" };
            let mut runs = vec![(1, MatmulPath::Auto, "auto"), (prefill, MatmulPath::Auto, "auto")];
            if model != big {
                runs.insert(1, (1, MatmulPath::GemvGpu, "gemv_gpu"));
            }
            for (m, path, label) in runs {
                v.push(Bench::new(
                    format!("matmul {model} {layer} {m}x{k}x{n} {dt} {label}"),
                    move |gpu| {
                        let w = weight(gpu, "w", &[n, k], dtype)?;
                        plan_of(gpu, |g| {
                            let x = g.input("x", &[m, k], DType::F32);
                            let tw = g.external(&w);
                            g.matmul_with(x, tw, None, path)?;
                            Ok(vec![(x, m * k, DType::F32)])
                        })
                    },
                ));
            }
        }
    }
    v
}
