//! Compressed-key update after a decode step (1 token) and a prefill chunk (128 tokens) at context 32K, for the C1
//! (32/16) and C2 (128/64) windows of MiniCPM4-0.5B (2 KV heads, d 64) and MiniCPM4-8B (2 KV heads, d 128).
//! The decode position is one that completes a window, so the bench times real work. Cost: the windows a step
//! completes at most (keys read, rows written). The tree form: the window a 60-node draft tree's paths complete, along
//! each path (ten chains 6 deep under the root, the window ending 3 deep: 10 rows compute it), against the same
//! shapes' one-token update. Cost: every row completing it, an upper bound (only the 10 rows 3 deep compute here), so
//! its GB/s overstate.

use crate::common::{weight, Bench};
use shaderlm::gpu::DType;
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::attention_decode::{tree_table, TREE_W};
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
            let name = format!("kv_compress_tree {model} {wname} rows60 ctx{ctx}");
            v.push(Bench::new(name, move |gpu| {
                // Ten chains 6 deep under the root: node i (1..60) at level (i - 1) / 10 + 1 of chain (i - 1) % 10.
                let mut paths: Vec<Vec<u32>> = vec![vec![0]];
                for i in 1..60usize {
                    let parent = i.saturating_sub(10);
                    let mut path = paths[parent].clone();
                    path.push(i as u32);
                    paths.push(path);
                }
                let table = tree_table(paths.iter().map(Vec::as_slice))?;
                let kc = weight(gpu, "k_cache", &[n_kv, ctx, hd], DType::F32)?;
                let mut g = Graph::new();
                let k = g.external(&kc);
                let t = g.input("tree", &[60, TREE_W], DType::U32);
                g.kv_compress_tree(k, t, window)?;
                let plan = Plan::new(gpu, g)?;
                plan.write_input(gpu, t, bytemuck::cast_slice(&table))?;
                // The root 3 before the end of the second-to-last complete window.
                let end = (window.count(ctx) - 2) * window.stride + window.size;
                Ok((plan, StepVars { pos: (end - 4) as u32 }))
            }));
        }
    }
    v
}
