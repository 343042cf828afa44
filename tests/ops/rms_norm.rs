//! rms_norm vs CPU (f64 sum of squares), in four layouts: the adapter's workgroup size (8 lanes on lavapipe) and
//! the GPU one (256) forced, each with the subgroup reduction (default device) and the workgroup-memory tree
//! (`gpu_fallback`, subgroups off); d % 4 == 0 takes the vec4 variant, other d the scalar one.
//!
//! Metric: NMSE <= 1e-11. Each lane sums d/256 squares in f32, then a log2(256)-level tree (or subgroup sums):
//! the relative error of the mean is at most about (d/256 + 8) * 2^-24 (2.4e-6 at d = 8192), inverseSqrt and the
//! two products add a few ulp, so the worst case is NMSE ~7e-12 (measured on lavapipe: ~5e-15, the output's own
//! rounding). A mean over d - 1 instead of d would give 4e-9 at d = 8192.

use crate::common::{gpu_fallback, nmse, Case, Rng};
use shaderlm::gpu::{DType, Gpu};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::rms_norm;

/// Workgroup layouts: (name, forced workgroup size, tree fallback).
const LAYOUTS: [(&str, Option<u32>, bool); 4] = [
    ("auto", None, false),
    ("auto_tree", None, true),
    ("wg256", Some(rms_norm::WG_GPU), false),
    ("wg256_tree", Some(rms_norm::WG_GPU), true),
];

fn run(gpu: &Gpu, x: &[f32], w: &[f32], eps: f32, wg: Option<u32>) -> shaderlm::Result<Vec<f32>> {
    let d = w.len();
    let mut g = Graph::new();
    let tx = g.input("x", &[x.len() / d, d], DType::F32);
    let tw = g.input("w", &[d], DType::F32);
    let y = match wg {
        Some(wg) => g.rms_norm_with_workgroup(tx, tw, eps, wg)?,
        None => g.rms_norm(tx, tw, eps)?,
    };
    g.output(y);
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, tx, bytemuck::cast_slice(x))?;
    plan.write_input(gpu, tw, bytemuck::cast_slice(w))?;
    plan.run(gpu, &StepVars::default())?;
    plan.read_f32(y)
}

const MAX: f64 = 1e-11;

fn case(name: String, layout: (&str, Option<u32>, bool), rows: usize, d: usize, scale: f32, eps: f32) -> Case {
    let (tag, wg, fallback) = layout;
    Case::new("rms_norm", format!("{tag}/{name}"), move |gpu| {
        let gpu = if fallback { gpu_fallback() } else { gpu };
        let mut rng = Rng::new((rows * 131 + d) as u64);
        let x = rng.vec(rows * d, scale);
        let w: Vec<f32> = rng.vec(d, 1.0).iter().map(|v| 1.0 + 0.5 * v).collect();
        Ok(nmse(
            &run(gpu, &x, &w, eps, wg)?,
            &rms_norm::reference(&x, &w, eps),
            MAX,
        ))
    })
}

pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for layout in LAYOUTS {
        for d in [1usize, 7, 64, 576, 1000, 4096] {
            for rows in [1usize, 3, 17] {
                v.push(case(format!("rows{rows}_d{d}"), layout, rows, d, 2.0, 1e-6));
            }
        }
        // The largest row (hidden 8192); d just past a multiple of 256 lanes (one lane busy in the tail); odd d
        // (scalar variant) of model size.
        v.push(case("d8192".into(), layout, 2, 8192, 2.0, 1e-5));
        v.push(case("d_wg_plus_1".into(), layout, 3, 257, 2.0, 1e-5));
        v.push(case("d_odd_4095".into(), layout, 3, 4095, 2.0, 1e-5));
        v.push(case("d_vec4_1028".into(), layout, 3, 1028, 2.0, 1e-5));
        // Tiny inputs: eps dominates the mean, so a misplaced eps shows.
        v.push(case("eps_dominates".into(), layout, 3, 64, 1e-4, 1e-5));
        // Large inputs: squares near 1e12 stay finite in f32.
        v.push(case("large_values".into(), layout, 3, 576, 1e6, 1e-6));
    }
    // A row of zeros: the output is exactly zero (0 * rsqrt(eps)), not NaN.
    v.push(Case::new("rms_norm", "zero_row", |gpu| {
        let (x, w) = (vec![0f32; 2 * 64], vec![1f32; 64]);
        Ok(crate::common::exact(
            &run(gpu, &x, &w, 1e-6, None)?,
            &rms_norm::reference(&x, &w, 1e-6),
        ))
    }));
    // The fused residual add: h = x + r (exact: one IEEE add, as on the CPU) and rms_norm(h) within the
    // rms_norm bound, for scalar and vec4 rows, with and without subgroups (the fallback device). With a residual
    // scale alpha (MiniCPM), h = x + alpha r rounds the product too: within 2^-23 (|x| + |alpha r|) <= 3e-7 of the
    // f64 value, bound 1e-6 absolute.
    for (d, rows, alpha) in [
        (576usize, 1usize, 1f32),
        (7, 3, 1.0),
        (1000, 5, 1.0),
        (64, 17, 1.0),
        (576, 3, 0.2475),
    ] {
        for fallback in [false, true] {
            let name = format!(
                "add_rms_norm_rows{rows}_d{d}{}{}",
                if alpha != 1.0 { "_scaled" } else { "" },
                if fallback { "_fallback" } else { "" }
            );
            v.push(Case::new("rms_norm", name, move |gpu| {
                let gpu = if fallback { crate::common::gpu_fallback() } else { gpu };
                let mut rng = crate::common::Rng::new(d as u64 * 31 + rows as u64);
                let (x, r, w) = (rng.vec(rows * d, 2.0), rng.vec(rows * d, 2.0), rng.vec(d, 1.0));
                let mut g = shaderlm::graph::Graph::new();
                let tx = g.input("x", &[rows, d], shaderlm::gpu::DType::F32);
                let tr = g.input("r", &[rows, d], shaderlm::gpu::DType::F32);
                let tw = g.input("w", &[d], shaderlm::gpu::DType::F32);
                let (h, y) = g.add_scaled_rms_norm(tx, tr, alpha, tw, 1e-5)?;
                g.output(h);
                g.output(y);
                let mut plan = shaderlm::graph::Plan::new(gpu, g)?;
                plan.write_input(gpu, tx, bytemuck::cast_slice(&x))?;
                plan.write_input(gpu, tr, bytemuck::cast_slice(&r))?;
                plan.write_input(gpu, tw, bytemuck::cast_slice(&w))?;
                plan.run(gpu, &shaderlm::graph::StepVars::default())?;
                let want_h: Vec<f32> = shaderlm::ops::add::reference(&x, &r, alpha);
                let got_h = plan.read_f32(h)?;
                let h_check = if alpha == 1.0 {
                    let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
                    crate::common::exact(&bits(&got_h), &bits(&want_h))
                } else {
                    crate::common::rel_abs(&got_h, &want_h, 0.0, 1e-6)
                };
                if !h_check.passed() {
                    return Ok(h_check);
                }
                Ok(crate::common::nmse(
                    &plan.read_f32(y)?,
                    &rms_norm::reference(&want_h, &w, 1e-5),
                    1e-11,
                ))
            }));
        }
    }
    // The post-norm form (Gemma): h = x + alpha * rms_norm(r, rw) and rms_norm(h, w) in one dispatch, bit for bit
    // rms_norm then add_scaled_rms_norm (the two-dispatch path it replaces), and y within the rms_norm bound of
    // the CPU reference; scalar and vec4 rows, several workgroup strides, with and without subgroups.
    for (d, rows, alpha) in [(640usize, 1usize, 1f32), (7, 3, 1.0), (1000, 5, 1.0), (64, 17, 0.5), (4096, 2, 1.0)] {
        for fallback in [false, true] {
            let name = format!("add_post_rms_norm_rows{rows}_d{d}{}", if fallback { "_fallback" } else { "" });
            v.push(Case::new("rms_norm", name, move |gpu| post_case(gpu, fallback, rows, d, alpha)));
        }
    }
    // Many rows: the grid folds into y past 65535 workgroups.
    v.push(case("rows_folded_grid".into(), LAYOUTS[0], 70_000, 7, 2.0, 1e-6));
    v
}

fn post_case(gpu: &Gpu, fallback: bool, rows: usize, d: usize, alpha: f32) -> shaderlm::Result<crate::common::Check> {
    let gpu = if fallback { gpu_fallback() } else { gpu };
    let mut rng = Rng::new(d as u64 * 37 + rows as u64);
    let (x, r) = (rng.vec(rows * d, 2.0), rng.vec(rows * d, 3.0));
    let (w, rw) = (rng.vec(d, 1.0), rng.vec(d, 1.0));
    let mut g = Graph::new();
    let tx = g.input("x", &[rows, d], DType::F32);
    let tr = g.input("r", &[rows, d], DType::F32);
    let tw = g.input("w", &[d], DType::F32);
    let trw = g.input("rw", &[d], DType::F32);
    let (h, y) = g.add_post_rms_norm(tx, (tr, trw), alpha, tw, 1e-6)?;
    let rn = g.rms_norm(tr, trw, 1e-6)?;
    let (h2, y2) = g.add_scaled_rms_norm(tx, rn, alpha, tw, 1e-6)?;
    for t in [h, y, h2, y2] {
        g.output(t);
    }
    let mut plan = Plan::new(gpu, g)?;
    for (t, v) in [(tx, &x), (tr, &r), (tw, &w), (trw, &rw)] {
        plan.write_input(gpu, t, bytemuck::cast_slice(v))?;
    }
    plan.run(gpu, &StepVars::default())?;
    let bits = |t| -> shaderlm::Result<Vec<u32>> { Ok(plan.read_f32(t)?.iter().map(|v| v.to_bits()).collect()) };
    for (a, b) in [(h, h2), (y, y2)] {
        let check = crate::common::exact(&bits(a)?, &bits(b)?);
        if !check.passed() {
            return Ok(check);
        }
    }
    let want_h = shaderlm::ops::add::reference(&x, &rms_norm::reference(&r, &rw, 1e-6), alpha);
    Ok(nmse(&plan.read_f32(y)?, &rms_norm::reference(&want_h, &w, 1e-6), MAX))
}
