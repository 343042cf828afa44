//! Residual add at each model's hidden size, for one token and a 512-token chunk.

use crate::common::{plan_of, Bench, MODELS};
use shaderlm::gpu::DType;

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    for (model, hidden, ..) in MODELS {
        for tokens in [1usize, 512] {
            v.push(Bench::new(format!("add {model} {tokens}x{hidden}"), move |gpu| {
                plan_of(gpu, |g| {
                    let a = g.input("a", &[tokens, hidden], DType::F32);
                    let b = g.input("b", &[tokens, hidden], DType::F32);
                    g.add(a, b)?;
                    Ok(vec![(a, tokens * hidden, DType::F32), (b, tokens * hidden, DType::F32)])
                })
            }));
        }
    }
    v
}
