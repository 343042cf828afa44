//! kv_move vs CPU: moves are copies, so both whole caches (moved rows and every untouched row) must match bit for
//! bit. The caches start random, so a stray, missing or out-of-order move shows up as a mismatch.

use crate::common::{exact, Case, Rng};
use shaderlm::gpu::{DType, Gpu, GpuTensor};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::kv_move::{self, moves_list, MAX_MOVES};

fn run(gpu: &Gpu, n_kv: usize, head_dim: usize, max_ctx: usize, runs: &[Vec<(u32, u32)>]) -> shaderlm::Result<crate::common::Check> {
    let mut rng = Rng::new(7);
    let n = n_kv * max_ctx * head_dim;
    let (k0, v0) = (rng.vec(n, 1.0), rng.vec(n, 1.0));
    let shape = [n_kv, max_ctx, head_dim];
    let (kt, vt) = (GpuTensor::upload_f32(gpu, "k", &shape, &k0)?, GpuTensor::upload_f32(gpu, "v", &shape, &v0)?);
    let mut g = Graph::new();
    let moves = g.input("moves", &[1 + 2 * MAX_MOVES], DType::U32);
    let (k, v) = (g.external(&kt), g.external(&vt));
    g.kv_move(k, v, moves)?;
    let mut plan = Plan::new(gpu, g)?;
    let (mut wk, mut wv) = (k0, v0);
    for pairs in runs {
        let list = moves_list(pairs)?;
        plan.write_input(gpu, moves, bytemuck::cast_slice(&list))?;
        plan.run(gpu, &StepVars::default())?;
        kv_move::reference(&mut wk, &mut wv, &list, n_kv, max_ctx, head_dim);
    }
    let bits = |x: Vec<f32>| x.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
    let mut got = bits(kt.download_f32(gpu)?);
    got.extend(bits(vt.download_f32(gpu)?));
    let mut want = bits(wk);
    want.extend(bits(wv));
    Ok(exact(&got, &want))
}

/// (name, n_kv, head_dim, max_ctx, the moves of successive runs of one plan)
type Grid = (&'static str, usize, usize, usize, Vec<Vec<(u32, u32)>>);

pub fn cases() -> Vec<Case> {
    let grid: Vec<Grid> = vec![
        ("nothing", 2, 64, 16, vec![vec![]]),
        // A tree path: depth d moves from slot 10 + node to 10 + d; node 2's slot is read by depth 1 before depth 2
        // overwrites it (order matters).
        ("tree_path_in_order", 3, 64, 40, vec![vec![(12, 11), (13, 12), (17, 13)]]),
        ("same_slot_skipped", 1, 32, 20, vec![vec![(5, 5), (9, 6)]]),
        ("past_end_skipped", 2, 16, 20, vec![vec![(25, 3), (4, 30), (7, 2)]]),
        ("most_moves_two_runs", 4, 128, 64, vec![
            (0..MAX_MOVES as u32).map(|i| (40 + 2 * i, 1 + i)).collect(),
            vec![(3, 60)],
        ]),
        ("odd_head_dim", 3, 7, 11, vec![vec![(9, 2), (10, 3)]]),
    ];
    let mut v: Vec<Case> = grid
        .into_iter()
        .map(|(name, kv, d, ctx, runs)| {
            Case::new("kv_move", format!("{name}_kv{kv}_d{d}_ctx{ctx}"), move |gpu| run(gpu, kv, d, ctx, &runs))
        })
        .collect();
    v.push(Case::new("kv_move", "bad_shapes_refused".to_string(), |gpu| {
        let cache = GpuTensor::upload_f32(gpu, "c", &[1, 4, 4], &[0.0; 16])?;
        let mut g = Graph::new();
        let (k, c) = (g.external(&cache), g.external(&cache));
        let short = g.input("moves", &[3], DType::U32);
        let f = g.input("movesf", &[1 + 2 * MAX_MOVES], DType::F32);
        let errors = [
            g.kv_move(k, c, short).is_err(),
            g.kv_move(k, c, f).is_err(),
            moves_list(&[(0, 1); MAX_MOVES + 1]).is_err(),
        ];
        Ok(exact(&errors, &[true; 3]))
    }));
    v
}
