//! moe_down (sparse down projection over the listed experts' columns) vs the CPU reference in f64, over f32, f16 and
//! Q4_0 / Q4_1 / Q8_0 weights in both layouts, decode and chunks, hidden sizes that are not multiples of the 4-row
//! or 32-row tiles, and the same activation patterns as moe_up.
//!
//! The columns of h that belong to unlisted experts hold NaN: a kernel that reads any of them turns its output into
//! NaN and fails. With no expert listed, y must be exactly zero (bit for bit).
//!
//! Metric: NMSE, bound 1e-9, for the reasons given in moe_up (dot products of length count * de <= 4096 summed in
//! f32); exact equality of bits for the empty list.

use crate::common::{exact, gpu_fallback, nmse, Case, Check, Rng};
use crate::moe_common::{active_list, all_forms, kquant_forms, router_weights, Pattern, Weight, Wt};
use shaderlm::gpu::{DType, Gpu};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::moe_common::Target;
use shaderlm::ops::moe_down;

const BOUND: f64 = 1e-9;

#[allow(clippy::too_many_arguments)]
fn run(
    gpu: &Gpu,
    wt: Wt,
    m: usize,
    hidden: usize,
    experts: usize,
    de: usize,
    pattern: Pattern,
    target: Target,
) -> shaderlm::Result<Check> {
    let seed = (m * 1_000_003 + hidden * 1009 + experts * 31 + de) as u64;
    let list = active_list(&router_weights(pattern, m, experts, seed ^ 1), m, experts);
    let listed = &list[1..=list[0] as usize];
    let n = experts * de;
    let mut h = Rng::new(seed).vec(m * n, 1.0);
    for (i, v) in h.iter_mut().enumerate() {
        if !listed.contains(&((i % n / de) as u32)) {
            *v = f32::NAN;
        }
    }
    let w = Weight::new(gpu, wt, hidden, n, 0.125, seed ^ 2)?;
    let mut g = Graph::new();
    let th = g.input("h", &[m, n], DType::F32);
    let ta = g.input("active", &[1 + experts], DType::U32);
    let tw = w.bind(&mut g);
    let y = g.moe_down_with(th, tw, ta, de, target)?;
    g.output(y);
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, th, bytemuck::cast_slice(&h))?;
    plan.write_input(gpu, ta, bytemuck::cast_slice(&list))?;
    plan.run(gpu, &StepVars::default())?;
    let got = plan.read_f32(y)?;
    let want = moe_down::reference(&h, &w.values, listed, m, hidden, de);
    if listed.is_empty() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        return Ok(exact(&bits(&got), &bits(&want)));
    }
    Ok(nmse(&got, &want, BOUND))
}

#[allow(clippy::too_many_arguments)]
fn case(wt: Wt, name: String, m: usize, hidden: usize, experts: usize, de: usize, pattern: Pattern) -> Case {
    let name = format!("{}_{name}_m{m}_hidden{hidden}_e{experts}_de{de}", wt.name());
    Case::new("moe_down", name, move |gpu| {
        run(gpu, wt, m, hidden, experts, de, pattern, Target::Auto)
    })
}

/// The same on the device without subgroups (the variants other adapters get: no x broadcast, tree reductions).
fn fallback_case(wt: Wt, m: usize, hidden: usize, experts: usize, de: usize) -> Case {
    let name = format!("fallback_{}_m{m}_hidden{hidden}_e{experts}_de{de}", wt.name());
    Case::new("moe_down", name, move |_| {
        run(
            gpu_fallback(),
            wt,
            m,
            hidden,
            experts,
            de,
            Pattern::Random(30),
            Target::Auto,
        )
    })
}

pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for wt in all_forms() {
        v.push(case(wt, Pattern::None.name(), 1, 64, 8, 32, Pattern::None));
        v.push(case(wt, Pattern::None.name(), 8, 100, 8, 32, Pattern::None));
        v.push(case(wt, "one_token_one_expert".into(), 1, 64, 8, 32, Pattern::One(7)));
        v.push(case(wt, Pattern::All.name(), 1, 96, 5, 64, Pattern::All));
        v.push(case(wt, Pattern::All.name(), 8, 36, 3, 32, Pattern::All));
        v.push(case(wt, "chunk8_disjoint".into(), 8, 128, 12, 32, Pattern::Disjoint));
        v.push(case(wt, "chunk32_disjoint".into(), 32, 64, 40, 32, Pattern::Disjoint));
        v.push(case(
            wt,
            "chunk8_overlapping".into(),
            8,
            100,
            40,
            32,
            Pattern::Random(15),
        ));
        v.push(case(
            wt,
            "chunk32_overlapping".into(),
            32,
            1000,
            13,
            64,
            Pattern::Random(10),
        ));
        v.push(case(wt, "odd_chunk".into(), 3, 33, 7, 32, Pattern::Random(40)));
        v.push(case(wt, "odd_chunk".into(), 70, 64, 9, 32, Pattern::Random(30)));
        v.push(fallback_case(wt, 1, 100, 9, 32));
        v.push(fallback_case(wt, 8, 64, 7, 64));
    }
    // k-quants (K = E * de = 256: one super-block per row).
    for wt in kquant_forms() {
        v.push(case(wt, "kquant".into(), 1, 100, 8, 32, Pattern::Random(40)));
        v.push(case(wt, "kquant".into(), 8, 64, 4, 64, Pattern::Random(40)));
    }
    // The dense kernel's GPU workgroup size (64 lanes: 256 rows per workgroup), on this adapter.
    for wt in [Wt::F32, Wt::F16] {
        for (m, hidden) in [(1, 300), (9, 64)] {
            let name = format!("gpu_workgroups_{}_m{m}_hidden{hidden}", wt.name());
            v.push(Case::new("moe_down", name, move |gpu| {
                run(gpu, wt, m, hidden, 6, 32, Pattern::Random(50), Target::Gpu)
            }));
        }
    }
    for wt in [
        Wt::F16,
        Wt::Q(shaderlm::quant::GgmlType::Q4_0, shaderlm::quant::pack::Layout::Tiled),
    ] {
        v.push(case(wt, "blockffn_0.5b".into(), 1, 1280, 40, 128, Pattern::Random(20)));
    }
    v
}
