//! The last row of a 128-token prefill chunk (the row the logits are computed from) at each model's hidden size.

use crate::common::{plan_of, Bench, MODELS};
use shaderlm::gpu::DType;

pub fn benches() -> Vec<Bench> {
    MODELS
        .iter()
        .map(|&(model, hidden, ..)| {
            Bench::new(format!("rows {model} last of 128x{hidden}"), move |gpu| {
                plan_of(gpu, |g| {
                    let x = g.input("x", &[128, hidden], DType::F32);
                    g.rows(x, 127, 1)?;
                    Ok(vec![(x, 128 * hidden, DType::F32)])
                })
            })
        })
        .collect()
}
