//! rope vs CPU: the angle formed in f32 as HF does, cos/sin/rotation in f64.
//!
//! Metric: rel+abs with rtol = 2^-20 and atol = attn_factor * 2 * (A * 2^-21 + 2^-16), A the largest angle of the
//! case (inputs lie in [-1, 1), and a rotated output mixes two of them, hence the 2). The GPU's inv_freq comes from
//! exp2 of a rounded exponent (a few ulp from the reference's correctly rounded one), so its f32 angle may differ
//! by up to ~4 ulp of A (2^-22 A; we allow 2^-21 A: 0.014 rad at position 30000, where one ulp of the angle itself
//! is 0.002 rad). After the exact reduction to [-pi, pi], cos and sin are allowed 2^-16 absolute (Vulkan's floor is
//! 2^-11; GPUs and lavapipe are within ~2^-20). Measured on lavapipe: at most 0.15 of the bound. Any wrong pair,
//! sign, frequency or position gives O(1) errors.

use crate::common::{rel_abs, Case, Check, Rng};
use shaderlm::gpu::{DType, Gpu};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::rope::{self, RopeConfig, RopeStyle};

struct Setup {
    shape: [usize; 3],
    cfg: RopeConfig,
    factors: Option<Vec<f32>>,
}

/// Run at each of `positions` on one plan (StepVars.pos is re-read each run); the worst check.
fn run(gpu: &Gpu, s: &Setup, positions: &[u32]) -> shaderlm::Result<Check> {
    let [t, h, d] = s.shape;
    let mut rng = Rng::new((t * 1_000_003 + h * 1009 + d) as u64);
    let x = rng.vec(t * h * d, 1.0);
    let mut g = Graph::new();
    let tx = g.input("x", &s.shape, DType::F32);
    let mut cfg = s.cfg;
    let tf = s.factors.as_ref().map(|f| g.input("factors", &[f.len()], DType::F32));
    cfg.factors = tf;
    let y = g.rope(tx, cfg)?;
    g.output(y);
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, tx, bytemuck::cast_slice(&x))?;
    if let (Some(tf), Some(f)) = (tf, &s.factors) {
        plan.write_input(gpu, tf, bytemuck::cast_slice(f))?;
    }
    let mut worst: Option<(f64, Check)> = None;
    for &pos in positions {
        plan.run(gpu, &StepVars { pos })?;
        let got = plan.read_f32(y)?;
        let want = rope::reference(&x, s.shape, &cfg, s.factors.as_deref(), pos);
        let min_factor = s
            .factors
            .as_ref()
            .map_or(1.0, |f| f.iter().fold(f32::MAX, |m, &v| m.min(v)));
        let max_angle = (pos as f64 + t as f64) * (cfg.freq_scale as f64).abs() / min_factor as f64;
        let atol = cfg.attn_factor.abs() as f64 * 2.0 * (max_angle * 2f64.powi(-21) + 2f64.powi(-16));
        let c = rel_abs(&got, &want, 2f64.powi(-20), atol);
        let w = match c {
            Check::RelAbs { worst, .. } => worst,
            _ => f64::INFINITY,
        };
        if worst.as_ref().is_none_or(|(bw, _)| w.is_nan() || w > *bw) {
            worst = Some((w, c));
        }
    }
    Ok(worst.expect("at least one position").1)
}

fn case(name: String, setup: Setup, positions: &'static [u32]) -> Case {
    Case::new("rope", name, move |gpu| run(gpu, &setup, positions))
}

fn plain(shape: [usize; 3], style: RopeStyle, rot_dim: usize) -> Setup {
    Setup {
        shape,
        cfg: RopeConfig::new(style, 10000.0, rot_dim),
        factors: None,
    }
}

/// Llama 3.1's frequency divisors (factor 8, low/high frequency factors 1 and 4, original context 8192), as f32.
fn llama3_factors(theta: f64, rot_dim: usize) -> Vec<f32> {
    let (factor, low, high, old) = (8.0, 1.0, 4.0, 8192.0);
    (0..rot_dim / 2)
        .map(|j| {
            let wavelen = 2.0 * std::f64::consts::PI * theta.powf(2.0 * j as f64 / rot_dim as f64);
            if wavelen < old / high {
                1.0
            } else if wavelen > old / low {
                factor as f32
            } else {
                let smooth = (old / wavelen - low) / (high - low);
                (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
            }
        })
        .collect()
}

/// `rope_pair` (queries and keys in one dispatch) must equal the single-tensor reference on each, bit for bit
/// against `rope` itself: both rotate with the same angle code.
fn run_pair(
    gpu: &Gpu,
    shape_q: [usize; 3],
    heads_k: usize,
    style: RopeStyle,
    rot: usize,
    with_factors: bool,
) -> shaderlm::Result<Check> {
    let [t, h, d] = shape_q;
    let shape_k = [t, heads_k, d];
    let mut rng = Rng::new((t * 31 + h * 7 + heads_k) as u64);
    let (q, k) = (rng.vec(t * h * d, 1.0), rng.vec(t * heads_k * d, 1.0));
    let factors: Vec<f32> = (0..rot / 2).map(|j| 1.0 + j as f32 * 0.25).collect();
    let mut g = Graph::new();
    let (tq, tk) = (g.input("q", &shape_q, DType::F32), g.input("k", &shape_k, DType::F32));
    let tf = with_factors.then(|| g.input("factors", &[rot / 2], DType::F32));
    let mut cfg = RopeConfig::new(style, 10000.0, rot);
    cfg.factors = tf;
    let (yq, yk) = g.rope_pair(tq, tk, cfg)?;
    let (sq, sk) = (g.rope(tq, cfg)?, g.rope(tk, cfg)?);
    for o in [yq, yk, sq, sk] {
        g.output(o);
    }
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, tq, bytemuck::cast_slice(&q))?;
    plan.write_input(gpu, tk, bytemuck::cast_slice(&k))?;
    if let Some(tf) = tf {
        plan.write_input(gpu, tf, bytemuck::cast_slice(&factors))?;
    }
    plan.run(gpu, &StepVars { pos: 1234 })?;
    let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let mut got = bits(plan.read_f32(yq)?);
    got.extend(bits(plan.read_f32(yk)?));
    let mut want = bits(plan.read_f32(sq)?);
    want.extend(bits(plan.read_f32(sk)?));
    Ok(crate::common::exact(&got, &want))
}

pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for (shape, heads_k, style, rot, factors) in [
        ([1usize, 9, 64], 3usize, RopeStyle::Interleaved, 64usize, false),
        ([5, 4, 32], 1, RopeStyle::RotateHalf, 32, true),
        ([3, 2, 7], 2, RopeStyle::RotateHalf, 4, false),
    ] {
        let name = format!(
            "pair_t{}_h{}_kv{heads_k}_d{}_rot{rot}{}",
            shape[0],
            shape[1],
            shape[2],
            if factors { "_factors" } else { "" }
        );
        v.push(Case::new("rope", name, move |gpu| {
            run_pair(gpu, shape, heads_k, style, rot, factors)
        }));
    }
    for (style, tag) in [(RopeStyle::RotateHalf, "half"), (RopeStyle::Interleaved, "inter")] {
        // [heads, head_dim, rot_dim]: one pair, odd head_dim with pass-through, model heads, partial rotation.
        for [h, d, rot] in [
            [1, 2, 2],
            [3, 7, 4],
            [9, 64, 64],
            [14, 64, 64],
            [32, 128, 128],
            [4, 80, 32],
        ] {
            for tokens in [1usize, 3, 17] {
                v.push(case(
                    format!("{tag}/t{tokens}_h{h}_d{d}_rot{rot}"),
                    plain([tokens, h, d], style, rot),
                    &[0, 7],
                ));
            }
        }
        v.push(case(format!("{tag}/pos0"), plain([3, 4, 64], style, 64), &[0]));
        // Far positions: f32 angles near 3e4 rad need the exact range reduction.
        v.push(case(
            format!("{tag}/pos30000"),
            plain([3, 4, 128], style, 128),
            &[30000],
        ));
        v.push(case(
            format!("{tag}/pos32760_llama3_theta"),
            {
                let mut s = plain([8, 2, 128], style, 128);
                s.cfg.theta = 500000.0;
                s
            },
            &[32760],
        ));
        // Partial rotation (Phi-2 style, 32 of 80 dims), pass-through must be untouched.
        v.push(case(
            format!("{tag}/rot_dim_lt_head_dim"),
            plain([5, 3, 80], style, 32),
            &[0, 1234],
        ));
        // Linear position scaling.
        v.push(case(
            format!("{tag}/freq_scale_0.25"),
            {
                let mut s = plain([5, 3, 64], style, 64);
                s.cfg.freq_scale = 0.25;
                s
            },
            &[0, 20000],
        ));
        // Per-frequency divisors (Llama 3.1) with theta 500000.
        v.push(case(
            format!("{tag}/llama3_factors"),
            {
                let mut s = plain([5, 4, 128], style, 128);
                s.cfg.theta = 500000.0;
                s.factors = Some(llama3_factors(500000.0, 128));
                s
            },
            &[0, 9000, 30000],
        ));
        // Longrope: divisors below and above 1 plus the attention factor on cos and sin.
        v.push(case(
            format!("{tag}/longrope_factors_attn_factor"),
            {
                let mut s = plain([5, 4, 96], style, 96);
                s.cfg.attn_factor = 1.1902;
                s.factors = Some((0..48).map(|j| 0.9 + 0.25 * j as f32).collect());
                s
            },
            &[0, 4096],
        ));
    }
    // One plan, many steps: the position must come from each run's StepVars, not from build time.
    v.push(case(
        "pos_reread_each_run".into(),
        plain([2, 3, 64], RopeStyle::RotateHalf, 64),
        &[0, 1, 513, 0, 30000],
    ));
    // Many tokens: the grid folds into y past 65535 workgroups of 64 (70000 x 64 pairs).
    v.push(case(
        "folded_grid".into(),
        plain([70_000, 1, 128], RopeStyle::RotateHalf, 128),
        &[0],
    ));
    v
}
