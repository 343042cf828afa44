//! Decode attention (one query token) at kv_len 512 / 2048 / 8192 for SmolLM2-135M (9/3 heads, d 64) and
//! Llama3-8B (32/8 heads, d 128), with max_ctx = kv_len (so the split count is the one a cache of that size gets);
//! and Gemma 3 270M's shape (4/1 heads, d 256) at kv_len 4096 with and without its 512-key sliding window.
//! Cost: QK^T and PV flops (at full context, also for the window); bytes: K/V read once, plus q and the partials.
//! Each with an f32 and an f16 cache (`f16-cache`, `--kv-type f16`). The tree form: a 16-node draft tree (a chain of 4 and branches) after 2044 cached keys, SmolLM2's and 8B's shapes,
//! against the 16-token prefill chunk at the same place.

use crate::common::{fill_inputs, weight, Bench, MODELS};
use shaderlm::gpu::DType;
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::attention_decode::{splits_for, tree_table, TREE_W};

/// (model, q heads, kv heads, head dim, kv_len, sliding window)
type Shape = (&'static str, usize, usize, usize, usize, Option<usize>);

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    let mut shapes: Vec<Shape> = Vec::new();
    for (model, _, _, n_heads, n_kv, head_dim, _) in MODELS {
        if model.starts_with("qwen") {
            continue;
        }
        for kv_len in [512usize, 2048, 8192] {
            shapes.push((model, n_heads, n_kv, head_dim, kv_len, None));
        }
    }
    shapes.push(("gemma3-270m", 4, 1, 256, 4096, None));
    shapes.push(("gemma3-270m", 4, 1, 256, 4096, Some(512)));
    for ((model, n_heads, n_kv, head_dim, kv_len, window), kv) in
        shapes.into_iter().flat_map(|s| [(s, DType::F32), (s, DType::F16)])
    {
        let win = window.map_or(String::new(), |w| format!(" window{w}"));
        let cache = if kv == DType::F16 { " f16-cache" } else { "" };
        let name = format!("attention_decode {model} kv{kv_len}{win} splits{}{cache}", splits_for(kv_len));
        v.push(Bench::new(name, move |gpu| {
            let cache_shape = [n_kv, kv_len, head_dim];
            let kc = weight(gpu, "k_cache", &cache_shape, kv)?;
            let vc = weight(gpu, "v_cache", &cache_shape, kv)?;
            let mut g = Graph::new();
            let q = g.input("q", &[1, n_heads, head_dim], DType::F32);
            let (k, c) = (g.external(&kc), g.external(&vc));
            g.attention_decode_window(q, k, c, 1.0 / (head_dim as f32).sqrt(), window)?;
            let plan = Plan::new(gpu, g)?;
            fill_inputs(gpu, &plan, &[(q, n_heads * head_dim, DType::F32)])?;
            Ok((
                plan,
                StepVars {
                    pos: (kv_len - 1) as u32,
                },
            ))
        }));
    }
    for (model, _, _, n_heads, n_kv, head_dim, _) in MODELS {
        if model.starts_with("qwen") {
            continue;
        }
        for tree in [false, true] {
            let form = if tree { "tree16" } else { "prefill16" };
            v.push(Bench::new(format!("attention_decode {model} kv2060 {form}"), move |gpu| {
                let (n, pos, ctx) = (16usize, 2044usize, 4096usize);
                let cache_shape = [n_kv, ctx, head_dim];
                let kc = weight(gpu, "k_cache", &cache_shape, DType::F32)?;
                let vc = weight(gpu, "v_cache", &cache_shape, DType::F32)?;
                let mut g = Graph::new();
                let q = g.input("q", &[n, n_heads, head_dim], DType::F32);
                let (k, c) = (g.external(&kc), g.external(&vc));
                let scale = 1.0 / (head_dim as f32).sqrt();
                let t = tree.then(|| g.input("tree", &[n, TREE_W], DType::U32));
                match t {
                    Some(t) => g.attention_decode_tree(q, k, c, scale, None, t)?,
                    None => g.attention_prefill(q, k, c, scale)?,
                };
                let plan = Plan::new(gpu, g)?;
                fill_inputs(gpu, &plan, &[(q, n * n_heads * head_dim, DType::F32)])?;
                if let Some(t) = t {
                    // Nodes 0..=4 a chain, each later node a child of one of nodes 1..=3.
                    let paths: Vec<Vec<u32>> = (0..n as u32)
                        .map(|i| if i <= 4 { (0..=i).collect() } else { (0..=1 + i % 3).chain([i]).collect() })
                        .collect();
                    let table = tree_table(paths.iter().map(Vec::as_slice))?;
                    plan.write_input(gpu, t, bytemuck::cast_slice(&table))?;
                }
                Ok((plan, StepVars { pos: pos as u32 }))
            }));
        }
    }
    v
}
