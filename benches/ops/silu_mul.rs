//! SwiGLU activation at each model's FFN size, for one token and a 512-token chunk.

use crate::common::{plan_of, Bench, MODELS};
use shaderlm::gpu::DType;

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    for (model, _, ffn, ..) in MODELS {
        for tokens in [1usize, 512] {
            v.push(Bench::new(format!("silu_mul {model} {tokens}x{ffn}"), move |gpu| {
                plan_of(gpu, |g| {
                    let gate = g.input("gate", &[tokens, ffn], DType::F32);
                    let up = g.input("up", &[tokens, ffn], DType::F32);
                    g.silu_mul(gate, up)?;
                    Ok(vec![(gate, tokens * ffn, DType::F32), (up, tokens * ffn, DType::F32)])
                })
            }));
        }
    }
    v
}
