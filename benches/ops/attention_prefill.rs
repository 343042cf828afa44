//! Causal prefill attention: a 512-token chunk at position 0 for SmolLM2-135M (9/3 heads, d 64) and Llama3-8B
//! (32/8 heads, d 128). Cost: QK^T and PV flops over the causal pairs; bytes: the K/V tiles loaded.

use crate::common::{fill_inputs, weight, Bench, MODELS};
use shaderlm::gpu::DType;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::StepVars;

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    for (model, _, _, n_heads, n_kv, head_dim, _) in MODELS {
        if model.starts_with("qwen") {
            continue;
        }
        let tokens = 512usize;
        v.push(Bench::new(
            format!("attention_prefill {model} {tokens}tok pos0"),
            move |gpu| {
                let cache_shape = [n_kv, tokens, head_dim];
                let kc = weight(gpu, "k_cache", &cache_shape, DType::F32)?;
                let vc = weight(gpu, "v_cache", &cache_shape, DType::F32)?;
                let mut g = Graph::new();
                let q = g.input("q", &[tokens, n_heads, head_dim], DType::F32);
                let (k, c) = (g.external(&kc), g.external(&vc));
                g.attention_prefill(q, k, c, 1.0 / (head_dim as f32).sqrt())?;
                let plan = Plan::new(gpu, g)?;
                fill_inputs(gpu, &plan, &[(q, tokens * n_heads * head_dim, DType::F32)])?;
                Ok((plan, StepVars { pos: 0 }))
            },
        ));
    }
    v
}
