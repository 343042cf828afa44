//! Softmax at each model's shapes: one token's logits (sampling) and a 512-token chunk's attention scores, and the
//! log-sum-exp of a draft tree's frontier of 10 rows of logits; plus the GPU workgroup layout forced at the largest
//! shapes, to compare the two layouts on whatever adapter runs the bench.

use crate::common::{plan_of, Bench, MODELS};
use shaderlm::gpu::DType;
use shaderlm::ops::softmax::WG_GPU;

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    for (model, _, _, heads, _, head_dim, vocab) in MODELS {
        v.push(Bench::new(format!("softmax {model} logits 1x{vocab}"), move |gpu| {
            plan_of(gpu, |g| {
                let x = g.input("x", &[1, vocab], DType::F32);
                g.softmax(x, 1.0)?;
                Ok(vec![(x, vocab, DType::F32)])
            })
        }));
        v.push(Bench::new(format!("softmax lse {model} logits 10x{vocab}"), move |gpu| {
            plan_of(gpu, |g| {
                let x = g.input("x", &[10, vocab], DType::F32);
                g.logsumexp(x)?;
                Ok(vec![(x, 10 * vocab, DType::F32)])
            })
        }));
        let rows = heads * 512;
        v.push(Bench::new(format!("softmax {model} scores {rows}x512"), move |gpu| {
            plan_of(gpu, |g| {
                let x = g.input("x", &[rows, 512], DType::F32);
                g.softmax(x, 1.0 / (head_dim as f32).sqrt())?;
                Ok(vec![(x, rows * 512, DType::F32)])
            })
        }));
    }
    let (model, _, _, heads, _, _, vocab) = MODELS[2];
    v.push(Bench::new(
        format!("softmax {model} logits 1x{vocab} wg{WG_GPU}"),
        move |gpu| {
            plan_of(gpu, |g| {
                let x = g.input("x", &[1, vocab], DType::F32);
                g.softmax_with_workgroup(x, 1.0, WG_GPU)?;
                Ok(vec![(x, vocab, DType::F32)])
            })
        },
    ));
    let rows = heads * 512;
    v.push(Bench::new(
        format!("softmax {model} scores {rows}x512 wg{WG_GPU}"),
        move |gpu| {
            plan_of(gpu, |g| {
                let x = g.input("x", &[rows, 512], DType::F32);
                g.softmax_with_workgroup(x, 0.088, WG_GPU)?;
                Ok(vec![(x, rows * 512, DType::F32)])
            })
        },
    ));
    v
}
