//! RoPE of each model's query heads (rotate-half, full head_dim), for one token and a 512-token chunk.

use crate::common::{plan_of, Bench, MODELS};
use shaderlm::gpu::DType;
use shaderlm::graph::StepVars;
use shaderlm::ops::rope::{RopeConfig, RopeStyle};

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    for (model, _, _, heads, _, head_dim, _) in MODELS {
        for tokens in [1usize, 512] {
            v.push(Bench::new(
                format!("rope {model} {tokens}x{heads}x{head_dim}"),
                move |gpu| {
                    let (plan, _) = plan_of(gpu, |g| {
                        let x = g.input("x", &[tokens, heads, head_dim], DType::F32);
                        g.rope(x, RopeConfig::new(RopeStyle::RotateHalf, 10000.0, head_dim))?;
                        Ok(vec![(x, tokens * heads * head_dim, DType::F32)])
                    })?;
                    Ok((plan, StepVars { pos: 1000 }))
                },
            ));
        }
    }
    v
}
