//! Stage-1 block scores for a decode step (1 token) and a prefill chunk (128 tokens) ending at contexts 1K, 4K, 16K
//! and 32K (max_ctx = context), MiniCPM4 windows (32/16 scored, 128/64 normalizer, blocks of 64), for
//! MiniCPM4-0.5B-like (16 query heads, 2 KV heads, d 64) and MiniCPM4-8B-like (32/2, d 128) shapes.
//! Cost: 2 flops per (row, window, dim) over all C1 and C2 windows; bytes as in `BlockScore::cost`.

use crate::common::{fill_inputs, weight, Bench};
use shaderlm::gpu::DType;
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::block_score::ScoreConfig;
use shaderlm::ops::kv_compress::Window;

/// (name, query heads, KV heads, head dim)
const MODELS: [(&str, usize, usize, usize); 2] = [("minicpm4-0.5b", 16, 2, 64), ("minicpm4-8b", 32, 2, 128)];

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    for (model, n_heads, n_kv, hd) in MODELS {
        for n_tokens in [1usize, 128] {
            for ctx in [1024usize, 4096, 16384, 32768] {
                let name = format!("block_score {model} t{n_tokens} ctx{ctx}");
                v.push(Bench::new(name, move |gpu| {
                    let cfg = ScoreConfig {
                        fine: Window { size: 32, stride: 16 },
                        coarse: Window { size: 128, stride: 64 },
                        block_size: 64,
                        max_ctx: ctx,
                    };
                    let c1 = weight(gpu, "c1", &[n_kv, cfg.fine.count(ctx), hd], DType::F32)?;
                    let c2 = weight(gpu, "c2", &[n_kv, cfg.coarse.count(ctx), hd], DType::F32)?;
                    let mut g = Graph::new();
                    let q = g.input("q", &[n_tokens, n_heads, hd], DType::F32);
                    let (t1, t2) = (g.external(&c1), g.external(&c2));
                    g.block_score(q, t1, t2, cfg, 1.0 / (hd as f32).sqrt())?;
                    let plan = Plan::new(gpu, g)?;
                    fill_inputs(gpu, &plan, &[(q, n_tokens * n_heads * hd, DType::F32)])?;
                    Ok((
                        plan,
                        StepVars {
                            pos: (ctx - n_tokens) as u32,
                        },
                    ))
                }));
            }
        }
    }
    v
}
