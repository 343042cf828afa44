//! RoPE of q and k plus the K/V cache write from each model's stacked q|k|v rows (rotate-half, full head_dim), for
//! one token and a 512-token chunk: the fused replacement of `rope` (pair) and `kv_write` (pair).

use crate::common::{plan_of, Bench, MODELS};
use shaderlm::gpu::{DType, GpuTensor};
use shaderlm::graph::StepVars;
use shaderlm::ops::rope::{RopeConfig, RopeStyle};
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
    }
    v
}
