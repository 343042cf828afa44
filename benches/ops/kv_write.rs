//! KV-cache append for each model's kv heads: one decode token and a 512-token prefill chunk, into a 4096 context.

use crate::common::{weight, Bench, MODELS};
use shaderlm::gpu::DType;
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    for (model, _, _, _, n_kv, head_dim, _) in MODELS {
        for tokens in [1usize, 512] {
            v.push(Bench::new(
                format!("kv_write {model} {tokens}x{n_kv}x{head_dim}"),
                move |gpu| {
                    let max_ctx = 4096;
                    let cache = weight(gpu, "k_cache", &[n_kv, max_ctx, head_dim], DType::F32)?;
                    let mut g = Graph::new();
                    let k = g.input("k", &[tokens, n_kv, head_dim], DType::F32);
                    let c = g.external(&cache);
                    g.kv_write(k, c)?;
                    let plan = Plan::new(gpu, g)?;
                    crate::common::fill_inputs(gpu, &plan, &[(k, tokens * n_kv * head_dim, DType::F32)])?;
                    Ok((
                        plan,
                        StepVars {
                            pos: (max_ctx - tokens) as u32,
                        },
                    ))
                },
            ));
        }
    }
    v
}
