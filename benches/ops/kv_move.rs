//! KV-cache moves for each model's kv heads: an accepted draft path of 6 moved into place, in a 4096 context.

use crate::common::{weight, Bench, MODELS};
use shaderlm::gpu::DType;
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::kv_move::moves_list;

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    for (model, _, _, _, n_kv, head_dim, _) in MODELS {
        v.push(Bench::new(format!("kv_move {model} 6x{n_kv}x{head_dim}"), move |gpu| {
            let max_ctx = 4096;
            let k = weight(gpu, "k_cache", &[n_kv, max_ctx, head_dim], DType::F32)?;
            let c = weight(gpu, "v_cache", &[n_kv, max_ctx, head_dim], DType::F32)?;
            let mut g = Graph::new();
            let moves = g.input("moves", &[1 + 2 * shaderlm::ops::kv_move::MAX_MOVES], DType::U32);
            let (tk, tv) = (g.external(&k), g.external(&c));
            g.kv_move(tk, tv, moves)?;
            let plan = Plan::new(gpu, g)?;
            let pairs: Vec<(u32, u32)> = (1..=6u32).map(|d| (4000 + 3 * d, 4000 + d)).collect();
            plan.write_input(gpu, moves, bytemuck::cast_slice(&moves_list(&pairs)?))?;
            Ok((plan, StepVars::default()))
        }));
    }
    v
}
