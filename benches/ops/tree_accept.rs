//! Greedy acceptance of a 61-row draft tree (a spine 6 deep whose rows have 10 children each, the last one the
//! spine's next row; every choice follows the spine to its end): one single-invocation dispatch, the fixed cost a
//! greedy tree step adds to take its moves on the device.

use crate::common::Bench;
use shaderlm::generate::tree::DraftTree;
use shaderlm::gpu::DType;
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::attention_decode::TREE_W;

pub fn benches() -> Vec<Bench> {
    vec![Bench::new("tree_accept 61 rows 6 deep", |gpu| {
        let mut tree = DraftTree::default();
        tree.reset(0);
        let mut spine = 0;
        for _ in 0..6 {
            let parent = spine;
            for t in 0..10u32 {
                spine = tree.push(parent, t);
            }
        }
        let n = tree.len();
        // Every row chooses token 9: the spine's next row.
        let choice = vec![9u32; n];
        let mut g = Graph::new();
        let ids = g.input("ids", &[n], DType::U32);
        let table = g.input("table", &[n, TREE_W], DType::U32);
        let tc = g.input("choice", &[n], DType::U32);
        g.tree_accept(ids, table, tc)?;
        let plan = Plan::new(gpu, g)?;
        plan.write_input(gpu, ids, bytemuck::cast_slice(&tree.tokens))?;
        plan.write_input(gpu, table, bytemuck::cast_slice(&tree.table()?))?;
        plan.write_input(gpu, tc, bytemuck::cast_slice(&choice))?;
        Ok((plan, StepVars { pos: 2000 }))
    })]
}
