//! The memory-read ceiling: read_sum over 64 MiB and 128 MiB (the largest storage binding) of f32, with partials of
//! 4096 and 32768 vec4s (64 KiB and 512 KiB: on a CPU adapter's 8-lane workgroups 8 and 64 KiB per invocation).
//! GB/s counts the bytes read (plus the partial sums written).

use crate::common::{plan_of, Bench};
use shaderlm::gpu::DType;

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    for mib in [64usize, 128] {
        let n = mib << 18;
        for span in [4096usize, 32768] {
            v.push(Bench::new(format!("read_sum {mib} MiB span {span}"), move |gpu| {
                plan_of(gpu, |g| {
                    let x = g.input("x", &[n], DType::F32);
                    g.read_sum(x, span)?;
                    Ok(vec![(x, n, DType::F32)])
                })
            }));
        }
    }
    v
}
