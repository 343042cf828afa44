//! BlockFFN's dense-fallback activation (`relu(u) * r` per expert block) at BlockFFN-0.5B's shape (40 experts of
//! 128), one token and a 32-token chunk.

use crate::common::{plan_of, Bench};
use shaderlm::gpu::DType;

pub fn benches() -> Vec<Bench> {
    let (experts, de) = (40usize, 128usize);
    let mut v = Vec::new();
    for m in [1usize, 32] {
        v.push(Bench::new(format!("moe_act e{experts}x{de} m{m}"), move |gpu| {
            plan_of(gpu, |g| {
                let u = g.input("u", &[m, experts * de], DType::F32);
                let r = g.input("r", &[m, experts], DType::F32);
                g.moe_act(u, r, de)?;
                Ok(vec![(u, m * experts * de, DType::F32), (r, m * experts, DType::F32)])
            })
        }));
    }
    v
}
