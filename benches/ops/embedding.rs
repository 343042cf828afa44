//! Embedding gather from each model's f16 vocab x hidden table (split by rows where it exceeds the binding limit),
//! for one token and a 512-token chunk. GB/s counts the gathered rows, the ids and the f32 output.

use crate::common::{plan_of, Bench, MODELS};
use shaderlm::gpu::{DType, GpuTensor};

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    for (model, hidden, .., vocab) in MODELS {
        for tokens in [1usize, 512] {
            v.push(Bench::new(
                format!("embedding {model} {tokens}x{hidden} f16"),
                move |gpu| {
                    // Pseudo-random halves in [-0.06, 0.06], made directly as bits: the 8B table is 1 GiB.
                    let words = vocab * hidden.div_ceil(2);
                    let bits: Vec<u32> = (0..words as u32)
                        .map(|i| {
                            let h = |k: u32| 0x2800 | (k.wrapping_mul(2654435761) >> 22) | ((k & 1) << 15);
                            h(2 * i) | (h(2 * i + 1) << 16)
                        })
                        .collect();
                    let table =
                        GpuTensor::upload(gpu, "table", &[vocab, hidden], DType::F16, bytemuck::cast_slice(&bits))?;
                    drop(bits);
                    plan_of(gpu, |g| {
                        let ids = g.input("ids", &[tokens], DType::U32);
                        let t = g.external(&table);
                        g.embedding(ids, t)?;
                        Ok(vec![(ids, tokens, DType::U32)])
                    })
                },
            ));
        }
    }
    v
}
