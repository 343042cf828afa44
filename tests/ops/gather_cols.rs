//! gather_cols vs CPU: a pure copy of selected columns, so the bound is exact equality (bit for bit, NaN-free
//! inputs), including the zero columns of out-of-range indices.

use crate::common::{exact, Case, Rng};
use shaderlm::gpu::{DType, GpuTensor};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::gather_cols;

/// A seeded permutation of 0..k (Fisher-Yates).
fn permutation(k: usize, seed: u64) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    let mut p: Vec<u32> = (0..k as u32).collect();
    for i in (1..k).rev() {
        p.swap(i, rng.below(i as u32 + 1) as usize);
    }
    p
}

/// Run `x [rows, k]` gathered by `perm` (an external device tensor, as the model binds it) against the reference.
fn case(name: String, rows: usize, k: usize, perm: Vec<u32>) -> Case {
    Case::new("gather_cols", name, move |gpu| {
        let x = Rng::new((rows * 7919 + k) as u64).vec(rows * k, 3.0);
        let p = GpuTensor::upload(gpu, "perm", &[perm.len()], DType::U32, bytemuck::cast_slice(&perm))?;
        let mut g = Graph::new();
        let tx = g.input("x", &[rows, k], DType::F32);
        let tp = g.external(&p);
        let y = g.gather_cols(tx, tp)?;
        g.output(y);
        let mut plan = Plan::new(gpu, g)?;
        plan.write_input(gpu, tx, bytemuck::cast_slice(&x))?;
        plan.run(gpu, &StepVars::default())?;
        let bits = |v: &[f32]| v.iter().map(|a| a.to_bits()).collect::<Vec<u32>>();
        Ok(exact(
            &bits(&plan.read_f32(y)?),
            &bits(&gather_cols::reference(&x, k, &perm)),
        ))
    })
}

pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    // Permutations of K (the act-order use): model widths and odd ones (the scalar variant).
    for k in [32usize, 96, 576, 4096, 7, 1001] {
        for rows in [1usize, 3, 17] {
            v.push(case(format!("perm_rows{rows}_k{k}"), rows, k, permutation(k, k as u64)));
        }
    }
    // Any column selection, with repeats, longer or shorter than x's rows, in both variants.
    for (k, n) in [(64usize, 12usize), (64, 13), (10, 40), (5, 1)] {
        let sel: Vec<u32> = (0..n as u32).map(|j| (j * 7 + 3) % k as u32).collect();
        v.push(case(format!("select_k{k}_n{n}"), 5, k, sel));
    }
    // Indices past k give zeros (no out-of-bounds read), in the vec4 and scalar variants.
    v.push(case("out_of_range_vec4".into(), 3, 8, vec![7, 8, 0, u32::MAX]));
    v.push(case("out_of_range_scalar".into(), 3, 8, vec![9, 1, 100]));
    // The identity (a permutation that changes nothing) and a reversal.
    v.push(case("identity".into(), 2, 128, (0..128).collect()));
    v.push(case("reversed".into(), 4, 96, (0..96).rev().collect()));
    // Past 65535 workgroups of 256 (the grid folds into y): odd n, one column per invocation.
    v.push(case("folded_grid".into(), 4097, 4097, permutation(4097, 1)));
    // u32 tables (an FR-Spec head's token ids, indexed by its argmax): one index, as a chain link maps it, ids past
    // 2^24 and 2^31 (not f32-exact, f32 NaN bits), indices past the table, and the vec4 variant.
    let ids: Vec<u32> = (0..2048u32).map(|i| i * 73 + (i % 5) * (1 << 24)).chain([0x8000_0001, 0xffff_ffff]).collect();
    for (name, perm) in [
        ("u32_one", vec![1500u32]),
        ("u32_last_two", vec![2048, 2049]),
        ("u32_out_of_range", vec![2050, 7, u32::MAX]),
        ("u32_vec4", vec![0, 2049, 1024, 2048, 5, 6, 7, 8]),
    ] {
        v.push(case_u32(name.into(), ids.clone(), perm));
    }
    v
}

/// The u32 form: `table [k]` (one row) gathered by `perm` against the reference, bit for bit.
fn case_u32(name: String, table: Vec<u32>, perm: Vec<u32>) -> Case {
    Case::new("gather_cols", name, move |gpu| {
        let p = GpuTensor::upload(gpu, "perm", &[perm.len()], DType::U32, bytemuck::cast_slice(&perm))?;
        let mut g = Graph::new();
        let tx = g.input("table", &[table.len()], DType::U32);
        let tp = g.external(&p);
        let y = g.gather_cols(tx, tp)?;
        g.output(y);
        let mut plan = Plan::new(gpu, g)?;
        plan.write_input(gpu, tx, bytemuck::cast_slice(&table))?;
        plan.run(gpu, &StepVars::default())?;
        Ok(exact(&plan.read_u32(y)?, &gather_cols::reference(&table, table.len(), &perm)))
    })
}
