//! RoPE of q and k plus the K/V cache write from each model's stacked q|k|v rows (rotate-half, full head_dim), for
//! one token and a 512-token chunk: the fused replacement of `rope` (pair) and `kv_write` (pair); and its tree form
//! for a 61-node draft tree (each node at its depth, cached in its slot) against 61 tokens in sequence.

use crate::common::{plan_of, Bench, MODELS};
use shaderlm::gpu::{DType, GpuTensor};
use shaderlm::graph::StepVars;
use shaderlm::ops::rope::{RopeConfig, RopeStyle};
use shaderlm::ops::attention_decode::{tree_table, TREE_W};
use shaderlm::ops::rope_kv::QkvSource;

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    for (model, _, _, heads, kv, head_dim, _) in MODELS {
        for tokens in [1usize, 512] {
            v.push(Bench::new(
                format!("rope_kv {model} {tokens}x({heads}+2x{kv})x{head_dim}"),
                move |gpu| {
                    let shape = [kv, 2048, head_dim];
                    let kc = GpuTensor::zeros(gpu, "k_cache", &shape, DType::F32)?;
                    let vc = GpuTensor::zeros(gpu, "v_cache", &shape, DType::F32)?;
                    let (plan, _) = plan_of(gpu, |g| {
                        let cols = (heads + 2 * kv) * head_dim;
                        let qkv = g.input("qkv", &[tokens, cols], DType::F32);
                        let (kc, vc) = (g.external(&kc), g.external(&vc));
                        let cfg = RopeConfig::new(RopeStyle::RotateHalf, 10000.0, head_dim);
                        g.rope_kv(QkvSource::stacked(qkv), None, cfg, kc, vc)?;
                        Ok(vec![(qkv, tokens * cols, DType::F32)])
                    })?;
                    Ok((plan, StepVars { pos: 1000 }))
                },
            ));
        }
        for tree in [false, true] {
            let form = if tree { "tree" } else { "rows" };
            v.push(Bench::new(format!("rope_kv {model} 61 {form} x({heads}+2x{kv})x{head_dim}"), move |gpu| {
                let (n, shape) = (61usize, [kv, 2048, head_dim]);
                let kc = GpuTensor::zeros(gpu, "k_cache", &shape, DType::F32)?;
                let vc = GpuTensor::zeros(gpu, "v_cache", &shape, DType::F32)?;
                let mut table_id = None;
                let (plan, _) = plan_of(gpu, |g| {
                    let cols = (heads + 2 * kv) * head_dim;
                    let qkv = g.input("qkv", &[n, cols], DType::F32);
                    let (kc, vc) = (g.external(&kc), g.external(&vc));
                    let cfg = RopeConfig::new(RopeStyle::RotateHalf, 10000.0, head_dim);
                    let t = tree.then(|| g.input("tree", &[n, TREE_W], DType::U32));
                    table_id = t;
                    g.rope_kv_tree(QkvSource::stacked(qkv), None, cfg, (kc, vc), t)?;
                    Ok(vec![(qkv, n * cols, DType::F32)])
                })?;
                if let Some(t) = table_id {
                    // Node i a child of node (i - 1) / 10: depths up to 2.
                    let paths: Vec<Vec<u32>> = (0..n as u32)
                        .map(|i| match i {
                            0 => vec![0],
                            1..=10 => vec![0, i],
                            _ => vec![0, 1 + (i - 11) / 5, i],
                        })
                        .collect();
                    let table = tree_table(paths.iter().map(Vec::as_slice))?;
                    plan.write_input(gpu, t, bytemuck::cast_slice(&table))?;
                }
                Ok((plan, StepVars { pos: 1000 }))
            }));
        }
    }
    v
}
