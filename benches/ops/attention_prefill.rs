//! Causal prefill attention: a 512-token chunk at position 0 for SmolLM2-135M (9/3 heads, d 64) and Llama3-8B
//! (32/8 heads, d 128); and a 128-token chunk at position 1280 with a 512-key sliding window for SmolLM2's shape
//! (the tiled kernel) and Gemma 3 270M's (4/1 heads, d 256: the split-KV kernel). Cost: QK^T and PV flops over the
//! causal pairs (at full context); bytes: the K/V tiles loaded. Each with an f32 and an f16 cache (`f16-cache`).

use crate::common::{fill_inputs, weight, Bench, MODELS};
use shaderlm::gpu::DType;
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};

/// (model, q heads, kv heads, head dim, tokens, position, sliding window)
type Shape = (&'static str, usize, usize, usize, usize, usize, Option<usize>);

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    let mut shapes: Vec<Shape> = Vec::new();
    for (model, _, _, n_heads, n_kv, head_dim, _) in MODELS {
        if model.starts_with("qwen") {
            continue;
        }
        shapes.push((model, n_heads, n_kv, head_dim, 512, 0, None));
    }
    shapes.push(("smollm2-135m", 9, 3, 64, 128, 1280, Some(512)));
    shapes.push(("gemma3-270m", 4, 1, 256, 128, 1280, Some(512)));
    for ((model, n_heads, n_kv, head_dim, tokens, pos, window), kv) in
        shapes.into_iter().flat_map(|s| [(s, DType::F32), (s, DType::F16)])
    {
        let win = window.map_or(String::new(), |w| format!(" window{w}"));
        let cache = if kv == DType::F16 { " f16-cache" } else { "" };
        v.push(Bench::new(
            format!("attention_prefill {model} {tokens}tok pos{pos}{win}{cache}"),
            move |gpu| {
                let cache_shape = [n_kv, pos + tokens, head_dim];
                let kc = weight(gpu, "k_cache", &cache_shape, kv)?;
                let vc = weight(gpu, "v_cache", &cache_shape, kv)?;
                let mut g = Graph::new();
                let q = g.input("q", &[tokens, n_heads, head_dim], DType::F32);
                let (k, c) = (g.external(&kc), g.external(&vc));
                g.attention_prefill_window(q, k, c, 1.0 / (head_dim as f32).sqrt(), window)?;
                let plan = Plan::new(gpu, g)?;
                fill_inputs(gpu, &plan, &[(q, tokens * n_heads * head_dim, DType::F32)])?;
                Ok((plan, StepVars { pos: pos as u32 }))
            },
        ));
    }
    v
}
