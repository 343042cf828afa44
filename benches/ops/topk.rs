//! argmax (greedy decoding) and top-10 (top-k sampling) over one row of logits at each model's vocabulary size (and
//! Gemma 3's 262144).

use crate::common::{plan_of, Bench, MODELS};
use shaderlm::gpu::DType;

/// Logit-like values: pseudo-random in [-8, 8) (no long runs of ties, unlike the default fill).
fn logits(n: usize) -> Vec<f32> {
    let mut s = 0x2545F4914F6CDD1Du64;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 16.0 - 8.0
        })
        .collect()
}

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    let vocabs = MODELS.map(|(model, .., vocab)| (model, vocab));
    // Gemma 3's vocabulary (262144), the largest of the supported families.
    for (model, vocab) in vocabs.into_iter().chain([("gemma3-270m", 262144)]) {
        for k in [1usize, 10] {
            let name = if k == 1 {
                "argmax".to_string()
            } else {
                format!("top{k}")
            };
            v.push(Bench::new(format!("topk {name} {model} 1x{vocab}"), move |gpu| {
                let mut x = None;
                let (plan, vars) = plan_of(gpu, |g| {
                    let t = g.input("logits", &[1, vocab], DType::F32);
                    if k == 1 {
                        g.argmax(t)?;
                    } else {
                        g.topk(t, k)?;
                    }
                    x = Some(t);
                    Ok(vec![(t, vocab, DType::F32)])
                })?;
                if let Some(t) = x {
                    plan.write_input(gpu, t, bytemuck::cast_slice(&logits(vocab)))?;
                }
                Ok((plan, vars))
            }));
        }
    }
    v
}
