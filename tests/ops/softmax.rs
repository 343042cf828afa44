//! softmax vs CPU (f64 from the same f32 `scale * x`), in four layouts: the adapter's workgroup size (8 lanes on
//! lavapipe) and the GPU one (256) forced, each with the subgroup reduction (default device) and the
//! workgroup-memory tree (`gpu_fallback`, subgroups off); n % 4 == 0 takes the vec4 variant, other n the scalar one.
//!
//! Metric: NMSE <= 1e-11 over the finite outputs. exp is good to a few ulp for the arguments here (v - max in
//! [-16, 0] for ordinary rows; Vulkan allows 3 + 2|x| ulp, ~2e-6), and each lane's f32 sum of n/256 terms
//! (594 for a 152064 vocabulary) plus the tree adds rounding that grows like sqrt(n/256 + 8) * 2^-24 (~1.5e-6),
//! so outputs carry ~2e-6 relative error: NMSE ~4e-12 at most (measured on lavapipe: ~1e-14). A sum that drops
//! one element of a vocabulary row would give ~4e-11. Special positions are checked exactly: masked (-inf)
//! entries and fully masked rows must be 0, and rows the reference makes NaN (a NaN or +inf in scale * x) must be
//! all NaN.
//!
//! The log-sum-exp form (`logsumexp`, one value per row) runs the same inputs at scale 1: NMSE <= 1e-11 over the
//! finite rows (its sum's error is the softmax's; the log adds an ulp), and exactly -inf for a fully masked row and
//! NaN for a row holding a NaN or +inf.

use crate::common::{exact, gpu_fallback, nmse, Case, Check, Rng};
use shaderlm::gpu::{DType, Gpu};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::softmax;

const MAX: f64 = 1e-11;

/// Workgroup layouts: (name, forced workgroup size, tree fallback).
const LAYOUTS: [(&str, Option<u32>, bool); 4] = [
    ("auto", None, false),
    ("auto_tree", None, true),
    ("wg256", Some(softmax::WG_GPU), false),
    ("wg256_tree", Some(softmax::WG_GPU), true),
];

fn run(gpu: &Gpu, x: &[f32], n: usize, scale: f32, wg: Option<u32>) -> shaderlm::Result<Vec<f32>> {
    run_form(gpu, x, n, scale, wg, false)
}

/// The softmax, or (`lse`, at scale 1) the rows' log-sum-exp.
fn run_form(gpu: &Gpu, x: &[f32], n: usize, scale: f32, wg: Option<u32>, lse: bool) -> shaderlm::Result<Vec<f32>> {
    let mut g = Graph::new();
    let tx = g.input("x", &[x.len() / n, n], DType::F32);
    let y = match (wg, lse) {
        (Some(wg), false) => g.softmax_with_workgroup(tx, scale, wg)?,
        (None, false) => g.softmax(tx, scale)?,
        (Some(wg), true) => g.logsumexp_with_workgroup(tx, wg)?,
        (None, true) => g.logsumexp(tx)?,
    };
    g.output(y);
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, tx, bytemuck::cast_slice(x))?;
    plan.run(gpu, &StepVars::default())?;
    plan.read_f32(y)
}

/// Exact agreement on special positions (reference NaN, or an exact 0 from a -inf input), NMSE elsewhere.
fn check(x: &[f32], got: &[f32], want: &[f32]) -> Check {
    check_with(got, want, |i| want[i].is_nan() || (want[i] == 0.0 && x[i] == f32::NEG_INFINITY))
}

/// Log-sum-exp rows: NaN and -inf exactly where the reference has them, NMSE over the rest.
fn check_lse(got: &[f32], want: &[f32]) -> Check {
    check_with(got, want, |i| want[i].is_nan() || want[i] == f32::NEG_INFINITY)
}

/// Exact agreement (NaN matching NaN) where `special`, NMSE over the other positions.
fn check_with(got: &[f32], want: &[f32], special: impl Fn(usize) -> bool) -> Check {
    let same = |i: usize| got[i].is_nan() && want[i].is_nan() || got[i] == want[i];
    let bad: Vec<usize> = (0..want.len().min(got.len())).filter(|&i| special(i) && !same(i)).collect();
    if !bad.is_empty() || got.len() != want.len() {
        return Check::Exact {
            mismatches: bad.len().max(got.len().abs_diff(want.len())),
            first: bad.first().copied(),
        };
    }
    let keep = |v: &[f32]| -> Vec<f32> { (0..v.len()).filter(|&i| !special(i)).map(|i| v[i]).collect() };
    nmse(&keep(got), &keep(want), MAX)
}

type Make = fn(&mut Rng, usize, usize) -> Vec<f32>;

fn case(name: String, layout: (&str, Option<u32>, bool), rows: usize, n: usize, scale: f32, make: Make) -> Case {
    let (tag, wg, fallback) = layout;
    Case::new("softmax", format!("{tag}/{name}"), move |gpu| {
        let gpu = if fallback { gpu_fallback() } else { gpu };
        let mut rng = Rng::new((rows * 7919 + n) as u64);
        let x = make(&mut rng, rows, n);
        let got = run(gpu, &x, n, scale, wg)?;
        Ok(check(&x, &got, &softmax::reference(&x, n, scale)))
    })
}

/// The log-sum-exp form of [`case`]'s input (scale 1).
fn lse_case(name: String, layout: (&str, Option<u32>, bool), rows: usize, n: usize, make: Make) -> Case {
    let (tag, wg, fallback) = layout;
    Case::new("softmax", format!("{tag}/lse_{name}"), move |gpu| {
        let gpu = if fallback { gpu_fallback() } else { gpu };
        let mut rng = Rng::new((rows * 7919 + n) as u64);
        let x = make(&mut rng, rows, n);
        let got = run_form(gpu, &x, n, 1.0, wg, true)?;
        Ok(check_lse(&got, &softmax::reference_lse(&x, n, 1.0)))
    })
}

fn uniform(rng: &mut Rng, rows: usize, n: usize) -> Vec<f32> {
    rng.vec(rows * n, 4.0)
}

/// Causal-mask pattern: row r keeps its first r + 1 entries (as attention scores of row r), the rest -inf.
fn causal(rng: &mut Rng, rows: usize, n: usize) -> Vec<f32> {
    let mut x = rng.vec(rows * n, 4.0);
    for r in 0..rows {
        for c in r + 1..n {
            x[r * n + c] = f32::NEG_INFINITY;
        }
    }
    x
}

/// Row 0 all -inf (fully masked), row 1 one finite entry at the end, row 2 ordinary.
fn fully_masked(rng: &mut Rng, _: usize, n: usize) -> Vec<f32> {
    let mut x = rng.vec(3 * n, 4.0);
    x[..2 * n - 1].fill(f32::NEG_INFINITY);
    x
}

/// Magnitudes up to 1e30 (and the f32 maximum): only max subtraction keeps exp finite.
fn huge(rng: &mut Rng, rows: usize, n: usize) -> Vec<f32> {
    let mut x: Vec<f32> = rng.vec(rows * n, 1.0).iter().map(|v| v * 1e30).collect();
    for r in 0..rows {
        // An exact tie at the top (ulp(1e30) is 7.6e22, so only ties leave more than one output non-zero).
        x[r * n] = 1e30;
        x[r * n + n / 2] = 1e30;
        x[r * n + n - 1] = if r % 2 == 0 { f32::MAX } else { -f32::MAX };
    }
    x
}

/// Row 1 holds a NaN (row 1 all NaN), row 2 a +inf (all NaN), rows 0 and 3 ordinary.
fn nan_inf(rng: &mut Rng, _: usize, n: usize) -> Vec<f32> {
    let mut x = rng.vec(4 * n, 4.0);
    x[n + n / 3] = f32::NAN;
    x[2 * n + n - 1] = f32::INFINITY;
    x
}

pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for layout in LAYOUTS {
        for n in [1usize, 7, 64, 576, 1000, 4096] {
            for rows in [1usize, 3, 17] {
                v.push(case(format!("rows{rows}_n{n}"), layout, rows, n, 1.0, uniform));
            }
        }
        // A vocabulary row (Qwen2.5), and an odd row of vocabulary size (scalar variant): long f32 sums.
        v.push(case("vocab_152064".into(), layout, 2, 152_064, 1.0, uniform));
        v.push(case("odd_49153".into(), layout, 2, 49_153, 1.0, uniform));
        // Attention-style scaling, and a negative scale (the max of scale * x is the min of x).
        v.push(case("scale_0.125".into(), layout, 3, 1000, 0.125, uniform));
        v.push(case("scale_negative".into(), layout, 3, 1001, -2.5, uniform));
        // Masks: a causal pattern (row r keeps r + 1 entries), and fully masked rows.
        v.push(case("causal_mask_-inf".into(), layout, 17, 300, 0.125, causal));
        v.push(case("causal_mask_-inf_odd".into(), layout, 17, 301, 0.125, causal));
        v.push(case(
            "fully_masked_row_is_zero".into(),
            layout,
            3,
            576,
            1.0,
            fully_masked,
        ));
        v.push(case(
            "fully_masked_row_is_zero_odd".into(),
            layout,
            3,
            577,
            1.0,
            fully_masked,
        ));
        v.push(case("huge_values".into(), layout, 4, 1001, 1.0, huge));
        v.push(case("huge_values_vec4".into(), layout, 4, 1000, 1.0, huge));
        v.push(case("nan_or_inf_row_is_nan".into(), layout, 4, 513, 1.0, nan_inf));
        v.push(case("nan_or_inf_row_is_nan_vec4".into(), layout, 4, 512, 1.0, nan_inf));
        // Log-sum-exp: vocabulary rows (a draft tree's log-probabilities), short and odd rows, masks and specials.
        for (rows, n) in [(1, 1), (3, 7), (10, 49_152), (2, 152_064), (17, 1001)] {
            v.push(lse_case(format!("rows{rows}_n{n}"), layout, rows, n, uniform));
        }
        v.push(lse_case("causal_mask".into(), layout, 17, 300, causal));
        v.push(lse_case("fully_masked_row_is_-inf".into(), layout, 3, 577, fully_masked));
        v.push(lse_case("huge_values".into(), layout, 4, 1000, huge));
        v.push(lse_case("nan_or_inf_row_is_nan".into(), layout, 4, 513, nan_inf));
    }
    // n = 1: every output is exactly 1, whatever the input.
    v.push(Case::new("softmax", "n1_is_one", |gpu| {
        let x = [-3.0f32, 0.0, 7.5, 1e30, -1e30];
        Ok(exact(&run(gpu, &x, 1, 1.0, None)?, &[1.0f32; 5]))
    }));
    // Many rows: the grid folds into y past 65535 workgroups.
    v.push(case("rows_folded_grid".into(), LAYOUTS[0], 70_000, 3, 1.0, uniform));
    v
}
