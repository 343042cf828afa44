//! SwiGLU (and Gemma's GeGLU) activation at each model's FFN size, for one token and a 512-token chunk.

use crate::common::{plan_of, Bench, MODELS};
use shaderlm::gpu::DType;
use shaderlm::ops::silu_mul::Glu;

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    for (model, _, ffn, ..) in MODELS {
        for (tokens, act) in [
            (1usize, Glu::Silu),
            (512, Glu::Silu),
            (1, Glu::GeluTanh),
            (512, Glu::GeluTanh),
        ] {
            let tag = if act == Glu::Silu { "" } else { " gelu" };
            v.push(Bench::new(
                format!("silu_mul{tag} {model} {tokens}x{ffn}"),
                move |gpu| {
                    plan_of(gpu, |g| {
                        let gate = g.input("gate", &[tokens, ffn], DType::F32);
                        let up = g.input("up", &[tokens, ffn], DType::F32);
                        g.glu(gate, up, act)?;
                        Ok(vec![(gate, tokens * ffn, DType::F32), (up, tokens * ffn, DType::F32)])
                    })
                },
            ));
        }
    }
    v
}
