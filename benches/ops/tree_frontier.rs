//! One expansion round of a (6,10,60) draft tree on the device: 10 frontier rows with 10 children each, the best
//! 10 kept. One single-invocation dispatch, the fixed cost each round of a draft tree grown on the device adds.

use crate::common::Bench;
use shaderlm::gpu::DType;
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::attention_decode::TREE_W;

pub fn benches() -> Vec<Bench> {
    vec![Bench::new("tree_frontier 10 rows x 10 children keep 10", |gpu| {
        let (f, k, keep) = (10usize, 10usize, 10usize);
        let mut g = Graph::new();
        let scores = g.input("scores", &[f], DType::F32);
        let table = g.input("table", &[f, TREE_W], DType::U32);
        let ids = g.input("ids", &[f, k], DType::U32);
        let vals = g.input("vals", &[f, k], DType::F32);
        let lse = g.input("lse", &[f], DType::F32);
        g.tree_frontier((scores, table), (ids, vals, lse), keep, 11)?;
        let plan = Plan::new(gpu, g)?;
        let row = |r: usize| {
            let mut t = vec![2u32, 0, 1 + r as u32];
            t.resize(TREE_W, 1 + r as u32);
            t
        };
        let tab: Vec<u32> = (0..f).flat_map(row).collect();
        let vals_v: Vec<f32> = (0..f * k).map(|i| -((i * 7919 % 101) as f32) * 0.1).collect();
        plan.write_input(gpu, scores, bytemuck::cast_slice(&vec![-1.0f32; f]))?;
        plan.write_input(gpu, table, bytemuck::cast_slice(&tab))?;
        plan.write_input(gpu, ids, bytemuck::cast_slice(&(0..(f * k) as u32).collect::<Vec<_>>()))?;
        plan.write_input(gpu, vals, bytemuck::cast_slice(&vals_v))?;
        plan.write_input(gpu, lse, bytemuck::cast_slice(&vec![2.0f32; f]))?;
        Ok((plan, StepVars::default()))
    })]
}
