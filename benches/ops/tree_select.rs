//! The rerank of a (6,10,60) draft tree on the device: 510 candidates (the root's 10 children, then five rounds of
//! 10 x 10), the best 60 made into the tree. One dispatch of one workgroup, once per draft tree.

use crate::common::Bench;
use shaderlm::gpu::DType;
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::tree_select::{CAND_W, ROOT};

pub fn benches() -> Vec<Bench> {
    vec![Bench::new("tree_select 510 candidates -> 60 nodes", |gpu| {
        let (nc, size) = (510usize, 60usize);
        let mut g = Graph::new();
        let list = g.input("cands", &[nc, CAND_W], DType::U32);
        g.tree_select(list, size)?;
        let plan = Plan::new(gpu, g)?;
        // Candidate c under c / 10 - 1 (the first 10 under the root), scores falling with depth.
        let cands: Vec<u32> = (0..nc as u32)
            .flat_map(|c| {
                let parent = if c < 10 { ROOT } else { c / 10 - 1 };
                let score = -((c / 10) as f32) - (c * 7919 % 101) as f32 * 0.001;
                [score.to_bits(), c, parent]
            })
            .collect();
        plan.write_input(gpu, list, bytemuck::cast_slice(&cands))?;
        Ok((plan, StepVars::default()))
    })]
}
