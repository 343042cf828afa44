//! moe_up (sparse up projection with fused SiLU and router weight) vs the CPU reference in f64, over f32, f16 and
//! Q4_0 / Q4_1 / Q8_0 weights in both layouts (each run on this adapter), decode and chunks of 3 to 70 tokens, and
//! activation patterns: one token activating one expert, every expert, disjoint and overlapping sets across a chunk,
//! expert counts that are not multiples of anything.
//!
//! r and the active list are inputs (built on the host), so the test measures this kernel alone. Only the listed
//! experts' columns are compared: the others are not written (by design). A token with r = 0 for a listed expert
//! must come out as exactly 0 there, which the metric checks (its reference is 0).
//!
//! Metric: NMSE over the listed columns, bound 1e-9. Why: as for matmul and matmul_q, the kernel's only error is f32
//! rounding of its dot products (NMSE about eps^2 * K / 2 <= 3e-12 for K <= 1280 in one chain, up to 4x more for the
//! Q4_0 offset fold), and SiLU and the product by r add a few ulp relative each (NMSE ~1e-13); the bound leaves a
//! wide margin, while a wrong expert, row or token offset gives 1e-3 or more. f16 and quantized weights are compared
//! with their exact f32 values (f16 rounding, CPU dequantization of the same blocks).

use crate::common::{gpu_fallback, nmse, Case, Check, Rng};
use crate::moe_common::{
    active_columns, active_list, all_forms, gather, kquant_forms, router_weights, Pattern, Weight, Wt,
};
use shaderlm::gpu::{DType, Gpu};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::moe_common::Target;
use shaderlm::ops::moe_up;

const BOUND: f64 = 1e-9;

#[allow(clippy::too_many_arguments)]
fn run(
    gpu: &Gpu,
    wt: Wt,
    m: usize,
    k: usize,
    experts: usize,
    de: usize,
    pattern: Pattern,
    target: Target,
) -> shaderlm::Result<Check> {
    let seed = (m * 1_000_003 + k * 1009 + experts * 31 + de) as u64;
    let x = Rng::new(seed).vec(m * k, 1.0);
    let r = router_weights(pattern, m, experts, seed ^ 1);
    let list = active_list(&r, m, experts);
    let w = Weight::new(gpu, wt, experts * de, k, 0.125, seed ^ 2)?;
    let mut g = Graph::new();
    let tx = g.input("x", &[m, k], DType::F32);
    let tr = g.input("r", &[m, experts], DType::F32);
    let ta = g.input("active", &[1 + experts], DType::U32);
    let tw = w.bind(&mut g);
    let h = g.moe_up_with(tx, tw, tr, ta, de, target)?;
    g.output(h);
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, tx, bytemuck::cast_slice(&x))?;
    plan.write_input(gpu, tr, bytemuck::cast_slice(&r))?;
    plan.write_input(gpu, ta, bytemuck::cast_slice(&list))?;
    plan.run(gpu, &StepVars::default())?;
    let want = moe_up::reference(&x, &w.values, &r, m, k, de);
    let cols = active_columns(&list, de);
    let n = experts * de;
    Ok(nmse(
        &gather(&plan.read_f32(h)?, m, n, &cols),
        &gather(&want, m, n, &cols),
        BOUND,
    ))
}

fn case(wt: Wt, name: String, m: usize, k: usize, experts: usize, de: usize, pattern: Pattern) -> Case {
    let name = format!("{}_{name}_m{m}_k{k}_e{experts}_de{de}", wt.name());
    Case::new("moe_up", name, move |gpu| {
        run(gpu, wt, m, k, experts, de, pattern, Target::Auto)
    })
}

/// The same on the device without subgroups (the variants other adapters get: no x broadcast, tree reductions).
fn fallback_case(wt: Wt, m: usize, k: usize, experts: usize, de: usize) -> Case {
    let name = format!("fallback_{}_m{m}_k{k}_e{experts}_de{de}", wt.name());
    Case::new("moe_up", name, move |_| {
        run(gpu_fallback(), wt, m, k, experts, de, Pattern::Random(30), Target::Auto)
    })
}

pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for wt in all_forms() {
        v.push(case(wt, "one_token_one_expert".into(), 1, 64, 8, 32, Pattern::One(5)));
        v.push(case(wt, Pattern::All.name(), 1, 96, 5, 64, Pattern::All));
        v.push(case(wt, Pattern::All.name(), 8, 64, 3, 32, Pattern::All));
        v.push(case(wt, "chunk8_disjoint".into(), 8, 128, 12, 32, Pattern::Disjoint));
        v.push(case(wt, "chunk32_disjoint".into(), 32, 64, 40, 32, Pattern::Disjoint));
        v.push(case(
            wt,
            "chunk8_overlapping".into(),
            8,
            128,
            40,
            32,
            Pattern::Random(15),
        ));
        v.push(case(
            wt,
            "chunk32_overlapping".into(),
            32,
            96,
            13,
            64,
            Pattern::Random(10),
        ));
        // Odd token counts (partial register blocks), more than 64 workgroups' worth of experts.
        v.push(case(wt, "odd_chunk".into(), 3, 64, 7, 32, Pattern::Random(40)));
        v.push(case(wt, "odd_chunk".into(), 70, 64, 9, 32, Pattern::Random(30)));
        v.push(case(wt, "many_experts".into(), 2, 32, 300, 32, Pattern::Random(5)));
        v.push(fallback_case(wt, 1, 64, 9, 32));
        v.push(fallback_case(wt, 8, 96, 7, 64));
    }
    // k-quants (K = 256: one super-block per row).
    for wt in kquant_forms() {
        v.push(case(wt, "kquant".into(), 1, 256, 8, 32, Pattern::Random(40)));
        v.push(case(wt, "kquant".into(), 8, 256, 5, 64, Pattern::Random(40)));
    }
    // The dense kernel's GPU workgroup sizes (8, 16 and 32 lanes for de = 32, 64, 128), on this adapter.
    for wt in [Wt::F32, Wt::F16] {
        for (m, de) in [(1, 32), (3, 64), (9, 128)] {
            let name = format!("gpu_workgroups_{}_m{m}_de{de}", wt.name());
            v.push(Case::new("moe_up", name, move |gpu| {
                run(gpu, wt, m, 64, 6, de, Pattern::Random(50), Target::Gpu)
            }));
        }
    }
    // Dense rows whose vector count is odd (f16: 72 / 8 = 9, f32: 68 / 4 = 17): the decode loop's tail (two k-steps
    // per iteration) and the chunk loop.
    for m in [1, 2] {
        v.push(case(Wt::F16, "odd_k".into(), m, 72, 3, 32, Pattern::All));
        v.push(case(Wt::F32, "odd_k".into(), m, 68, 3, 32, Pattern::All));
    }
    // BlockFFN-0.5B's shape (hidden 1280, 40 experts of 128), decode at a 20% share.
    for wt in [
        Wt::F16,
        Wt::Q(shaderlm::quant::GgmlType::Q4_0, shaderlm::quant::pack::Layout::Tiled),
    ] {
        v.push(case(wt, "blockffn_0.5b".into(), 1, 1280, 40, 128, Pattern::Random(20)));
    }
    v
}
