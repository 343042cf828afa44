//! add vs CPU: exact up to f32 rounding, which is identical on both sides (one IEEE add), so the bound is 0.

use crate::common::{exact, Case, Rng};
use shaderlm::gpu::DType;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::{add, StepVars};

pub fn cases() -> Vec<Case> {
    [1usize, 7, 256, 1001, 65537]
        .into_iter()
        .map(|n| {
            Case::new("add", format!("n{n}"), move |gpu| {
                let mut rng = Rng::new(n as u64);
                let (a, b) = (rng.vec(n, 2.0), rng.vec(n, 2.0));
                let mut g = Graph::new();
                let ta = g.input("a", &[n], DType::F32);
                let tb = g.input("b", &[n], DType::F32);
                let c = g.add(ta, tb)?;
                g.output(c);
                let mut plan = Plan::new(gpu, g)?;
                plan.write_input(gpu, ta, bytemuck::cast_slice(&a))?;
                plan.write_input(gpu, tb, bytemuck::cast_slice(&b))?;
                plan.run(gpu, &StepVars::default())?;
                let got: Vec<u32> = plan.read_f32(c)?.iter().map(|x| x.to_bits()).collect();
                let want: Vec<u32> = add::reference(&a, &b).iter().map(|x| x.to_bits()).collect();
                Ok(exact(&got, &want))
            })
        })
        .collect()
}
