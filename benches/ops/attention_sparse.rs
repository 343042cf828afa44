//! InfLLM-v2 sparse attention for one decode token at contexts 1K, 4K, 16K, 32K, for MiniCPM4-0.5B-like (16 / 2
//! heads, d 64) and MiniCPM4-8B-like (32 / 2 heads, d 128) shapes, with MiniCPM4's selection (blocks of 64, budget
//! 96 = topk 64 + 32 local, of which 34 forced), next to the dense attention_decode at the same contexts.
//! Cost: QK^T and PV flops over the selected keys; bytes: their K/V, q, the selection and the partials.

use crate::block_topk::scores;
use crate::common::{fill_inputs, weight, Bench};
use shaderlm::gpu::DType;
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::block_topk::{self, BlockSelection};

/// (name, q heads, kv heads, head dim)
const SHAPES: [(&str, usize, usize, usize); 2] = [("minicpm4-0.5b", 16, 2, 64), ("minicpm4-8b", 32, 2, 128)];

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    for (model, n_heads, n_kv, head_dim) in SHAPES {
        for ctx in [1024usize, 4096, 16384, 32768] {
            for dense in [false, true] {
                let name = if dense {
                    format!("attention_sparse dense attention_decode {model} ctx{ctx}")
                } else {
                    format!("attention_sparse {model} ctx{ctx} budget96")
                };
                v.push(Bench::new(name, move |gpu| {
                    let sel_cfg = BlockSelection::infllm_v2(64, 1, 2048, 64);
                    let cache_shape = [n_kv, ctx, head_dim];
                    let kc = weight(gpu, "k_cache", &cache_shape, DType::F32)?;
                    let vc = weight(gpu, "v_cache", &cache_shape, DType::F32)?;
                    let mut g = Graph::new();
                    let q = g.input("q", &[1, n_heads, head_dim], DType::F32);
                    let (k, c) = (g.external(&kc), g.external(&vc));
                    let scale = 1.0 / (head_dim as f32).sqrt();
                    let pos = ctx - 1;
                    let sel = if dense {
                        g.attention_decode(q, k, c, scale)?;
                        None
                    } else {
                        let sel = g.input("sel", &[1, n_kv, sel_cfg.budget], DType::U32);
                        g.attention_sparse(q, k, c, sel, 64, scale)?;
                        Some(sel)
                    };
                    let plan = Plan::new(gpu, g)?;
                    fill_inputs(gpu, &plan, &[(q, n_heads * head_dim, DType::F32)])?;
                    if let Some(sel) = sel {
                        // A selection as block_topk makes it from score-like values (full budget past 6K).
                        let nb = ctx / 64;
                        let ids = block_topk::reference(&scores(n_kv * nb), 1, n_kv, nb, sel_cfg, pos);
                        plan.write_input(gpu, sel, bytemuck::cast_slice(&ids))?;
                    }
                    Ok((plan, StepVars { pos: pos as u32 }))
                }));
            }
        }
    }
    v
}
