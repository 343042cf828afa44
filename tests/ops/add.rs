//! add vs CPU: exact up to f32 rounding, which is identical on both sides (one IEEE add), so the bound is 0.
//! add_scaled and scale (alpha != 1): the GPU rounds the product and the sum (or fuses them), the reference rounds
//! once from f64, so each element may differ by 2^-23 (|a| + |alpha b|) <= 3e-7 for |a|, |b| <= 2: bound 1e-6
//! absolute.

use crate::common::{exact, rel_abs, Case, Rng};
use shaderlm::gpu::DType;
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::add;

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
                let want: Vec<u32> = add::reference(&a, &b, 1.0).iter().map(|x| x.to_bits()).collect();
                Ok(exact(&got, &want))
            })
        })
        .chain([1usize, 7, 1001].into_iter().flat_map(|n| {
            [(0.24748737f32, false), (-3.0, false), (12.0, true), (0.0, true)].map(|(alpha, unary)| {
                Case::new(
                    "add",
                    format!("{}_n{n}_alpha{alpha}", if unary { "scale" } else { "scaled" }),
                    move |gpu| {
                        let mut rng = Rng::new(n as u64 + 5);
                        let (a, b) = (rng.vec(n, 2.0), rng.vec(n, 2.0));
                        let mut g = Graph::new();
                        let ta = g.input("a", &[n], DType::F32);
                        let tb = g.input("b", &[n], DType::F32);
                        let c = if unary {
                            g.scale(tb, alpha)?
                        } else {
                            g.add_scaled(ta, tb, alpha)?
                        };
                        g.output(c);
                        let mut plan = Plan::new(gpu, g)?;
                        plan.write_input(gpu, ta, bytemuck::cast_slice(&a))?;
                        plan.write_input(gpu, tb, bytemuck::cast_slice(&b))?;
                        plan.run(gpu, &StepVars::default())?;
                        let zeros = vec![0f32; n];
                        let want = add::reference(if unary { &zeros } else { &a }, &b, alpha);
                        Ok(rel_abs(&plan.read_f32(c)?, &want, 0.0, 1e-6))
                    },
                )
            })
        }))
        .collect()
}
