//! rows vs CPU: a pure copy, so the bound is exact equality.

use crate::common::{exact, Case, Rng};
use shaderlm::gpu::DType;
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::rows;

pub fn cases() -> Vec<Case> {
    let grid = [
        (1usize, 1usize, 0usize, 1usize),
        (5, 576, 4, 1),
        (7, 3, 2, 5),
        (300, 129, 0, 300),
    ];
    grid.into_iter()
        .map(|(m, d, start, count)| {
            Case::new("rows", format!("m{m}_d{d}_rows{start}+{count}"), move |gpu| {
                let x = Rng::new(m as u64).vec(m * d, 1.0);
                let mut g = Graph::new();
                let tx = g.input("x", &[m, d], DType::F32);
                let y = g.rows(tx, start, count)?;
                g.output(y);
                let mut plan = Plan::new(gpu, g)?;
                plan.write_input(gpu, tx, bytemuck::cast_slice(&x))?;
                plan.run(gpu, &StepVars::default())?;
                Ok(exact(&plan.read_f32(y)?, &rows::reference(&x, d, start, count)))
            })
        })
        .collect()
}
