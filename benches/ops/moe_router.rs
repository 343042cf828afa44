//! BlockFFN's router (ReLU, RMSNorm over the experts, active list) over logits of 40 and 64 experts, one token
//! and a 32-token chunk.

use crate::common::{plan_of, Bench};
use shaderlm::gpu::DType;
use shaderlm::ops::moe_router::RouterNorm;

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    for experts in [40usize, 64] {
        for m in [1usize, 32] {
            v.push(Bench::new(format!("moe_router e{experts} m{m} rms"), move |gpu| {
                plan_of(gpu, |g| {
                    let logits = g.input("logits", &[m, experts], DType::F32);
                    let weight = g.input("router_norm", &[experts], DType::F32);
                    g.moe_route(logits, RouterNorm::Rms { weight, eps: 1e-6 })?;
                    Ok(vec![(logits, m * experts, DType::F32), (weight, experts, DType::F32)])
                })
            }));
        }
    }
    v
}
