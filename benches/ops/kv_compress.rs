//! Compressed-key update after a decode step (1 token) and a prefill chunk (128 tokens) at context 32K, for the C1
//! (32/16) and C2 (128/64) windows of MiniCPM4-0.5B (2 KV heads, d 64) and MiniCPM4-8B (2 KV heads, d 128).
//! The decode position is one that completes a window, so the bench times real work. Cost: the windows a step
//! completes at most (keys read, rows written).

use crate::common::{weight, Bench};
use shaderlm::gpu::DType;
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::kv_compress::{CompressShape, Window};

/// (name, KV heads, head dim)
const MINICPM4: [(&str, usize, usize); 2] = [("minicpm4-0.5b", 2, 64), ("minicpm4-8b", 2, 128)];

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    let ctx = 32768;
    for (model, n_kv, hd) in MINICPM4 {
        for (wname, window) in [
            ("c1", Window { size: 32, stride: 16 }),
            ("c2", Window { size: 128, stride: 64 }),
        ] {
            for n_tokens in [1usize, 128] {
                let name = format!("kv_compress {model} {wname} t{n_tokens} ctx{ctx}");
                v.push(Bench::new(name, move |gpu| {
                    let s = CompressShape {
                        n_kv,
                        max_ctx: ctx,
                        head_dim: hd,
                        window,
                    };
                    let kc = weight(gpu, "k_cache", &[n_kv, ctx, hd], DType::F32)?;
                    let cc = weight(gpu, "c_cache", &[n_kv, s.n_windows(), hd], DType::F32)?;
                    let mut g = Graph::new();
                    let (k, c) = (g.external(&kc), g.external(&cc));
                    g.kv_compress(k, c, n_tokens, window)?;
                    // The step ends at the cache's last complete window.
                    let end = (s.n_windows() - 1) * window.stride + window.size;
                    Ok((
                        Plan::new(gpu, g)?,
                        StepVars {
                            pos: (end - n_tokens) as u32,
                        },
                    ))
                }));
            }
        }
    }
    v
}
