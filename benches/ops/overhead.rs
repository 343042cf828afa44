//! Dispatch overhead: one plan of N tiny dispatches in one pass and one submit; ms/run / N is the cost per dispatch.

use crate::common::{plan_of, Bench};
use shaderlm::gpu::DType;

pub fn benches() -> Vec<Bench> {
    [1usize, 100, 400]
        .into_iter()
        .map(|n| {
            Bench::new(format!("overhead: {n} dispatches of add n=64"), move |gpu| {
                plan_of(gpu, |g| {
                    let a = g.input("a", &[64], DType::F32);
                    let mut x = a;
                    for _ in 0..n {
                        x = g.add(x, a)?;
                    }
                    Ok(vec![(a, 64, DType::F32)])
                })
            })
        })
        .collect()
}
