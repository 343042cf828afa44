//! moe_act (`h = relu-gated u * r` per expert block) vs its CPU reference: rel+abs with rtol (8 + 2 max|u|) ulp
//! (as silu_mul) and atol 1e-30; a zero router weight must give exact zeros.

use crate::common::{rel_abs, Case, Rng};
use shaderlm::gpu::DType;
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::moe_act;

fn act_case(m: usize, experts: usize, de: usize) -> Case {
    Case::new("moe_act", format!("m{m}_e{experts}_de{de}"), move |gpu| {
        let mut rng = Rng::new((m * 31 + experts * 7 + de) as u64);
        let u = rng.vec(m * experts * de, 8.0);
        let mut r = rng.vec(m * experts, 1.0);
        r[0] = 0.0;
        let mut g = Graph::new();
        let tu = g.input("u", &[m, experts * de], DType::F32);
        let tr = g.input("r", &[m, experts], DType::F32);
        let h = g.moe_act(tu, tr, de)?;
        g.output(h);
        let mut plan = Plan::new(gpu, g)?;
        plan.write_input(gpu, tu, bytemuck::cast_slice(&u))?;
        plan.write_input(gpu, tr, bytemuck::cast_slice(&r))?;
        plan.run(gpu, &StepVars::default())?;
        let rtol = (8.0 + 2.0 * 8.0) * f64::from(f32::EPSILON) / 2.0;
        Ok(rel_abs(
            &plan.read_f32(h)?,
            &moe_act::reference(&u, &r, de),
            rtol,
            1e-30,
        ))
    })
}

pub fn cases() -> Vec<Case> {
    [(1, 40, 128), (3, 5, 4), (8, 7, 36)]
        .into_iter()
        .map(|(m, experts, de)| act_case(m, experts, de))
        .collect()
}
