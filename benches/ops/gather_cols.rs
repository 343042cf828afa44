//! Column gather of act-order GPTQ inputs at each model's matmul widths (hidden for q/k/v/gate/up, ffn for down),
//! for one token and a 512-token chunk. GB/s counts the gathered x, the indices and y.

use crate::common::{plan_of, Bench, MODELS};
use shaderlm::gpu::{DType, GpuTensor};

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    for (model, hidden, ffn, ..) in MODELS {
        for k in [hidden, ffn] {
            for tokens in [1usize, 512] {
                v.push(Bench::new(format!("gather_cols {model} {tokens}x{k}"), move |gpu| {
                    // A fixed scattered permutation of 0..k (multiplication by an odd number modulo a power of two
                    // is a bijection; k is not one, so take the values in range in order).
                    let perm: Vec<u32> = (0..k.next_power_of_two() as u64)
                        .map(|i| (i * 2654435761 % k.next_power_of_two() as u64) as u32)
                        .filter(|&c| (c as usize) < k)
                        .collect();
                    let p = GpuTensor::upload(gpu, "perm", &[k], DType::U32, bytemuck::cast_slice(&perm))?;
                    plan_of(gpu, |g| {
                        let x = g.input("x", &[tokens, k], DType::F32);
                        let tp = g.external(&p);
                        g.gather_cols(x, tp)?;
                        Ok(vec![(x, tokens * k, DType::F32)])
                    })
                }));
            }
        }
    }
    v
}
