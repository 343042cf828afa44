//! RMSNorm at each model's hidden size, for one token and a 512-token chunk; plus the GPU workgroup layout forced
//! at the largest shape, to compare the two layouts on whatever adapter runs the bench.

use crate::common::{plan_of, Bench, MODELS};
use shaderlm::gpu::DType;
use shaderlm::ops::rms_norm::WG_GPU;

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    for (model, hidden, ..) in MODELS {
        for tokens in [1usize, 512] {
            v.push(Bench::new(format!("rms_norm {model} {tokens}x{hidden}"), move |gpu| {
                plan_of(gpu, |g| {
                    let x = g.input("x", &[tokens, hidden], DType::F32);
                    let w = g.input("w", &[hidden], DType::F32);
                    g.rms_norm(x, w, 1e-5)?;
                    Ok(vec![(x, tokens * hidden, DType::F32), (w, hidden, DType::F32)])
                })
            }));
        }
    }
    let (model, hidden, ..) = MODELS[2];
    v.push(Bench::new(
        format!("rms_norm {model} 512x{hidden} wg{WG_GPU}"),
        move |gpu| {
            plan_of(gpu, |g| {
                let x = g.input("x", &[512, hidden], DType::F32);
                let w = g.input("w", &[hidden], DType::F32);
                g.rms_norm_with_workgroup(x, w, 1e-5, WG_GPU)?;
                Ok(vec![(x, 512 * hidden, DType::F32), (w, hidden, DType::F32)])
            })
        },
    ));
    v
}
