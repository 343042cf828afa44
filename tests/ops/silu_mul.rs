//! silu_mul vs CPU (f64).
//!
//! Metric: rel+abs with rtol = (8 + 2 * max|gate|) ulp (|gate| capped at 88) and atol = 1e-30. Vulkan's bounds: exp
//! is good to 3 + 2|x| ulp, division to 2.5 ulp, add and multiply to 0.5 ulp each; silu's relative error is at most
//! exp's plus those. atol only covers outputs under ~1e-30 (gate below -64), which an adapter may flush to zero.

use crate::common::{rel_abs, Case, Rng};
use shaderlm::gpu::DType;
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::silu_mul;
use shaderlm::ops::silu_mul::Glu;

fn case(name: String, rows: usize, f: usize, gate_scale: f32, fixed: &'static [f32]) -> Case {
    case_act(name, rows, f, gate_scale, fixed, Glu::Silu)
}

/// GELU: the kernel forms 2u = 2 sqrt(2 / pi) (g + 0.044715 g^3) (a few ulp relative) and g / (1 + exp(-2u)), so
/// exp's 3 + 2|2u| ulp takes the place of silu's 3 + 2|g|: rtol = (10 + 2 max|2u|) ulp, |2u| capped at 88.
fn case_act(name: String, rows: usize, f: usize, gate_scale: f32, fixed: &'static [f32], act: Glu) -> Case {
    Case::new("silu_mul", name, move |gpu| {
        let n = rows * f;
        let mut rng = Rng::new((n * 31 + f) as u64);
        let mut gate = rng.vec(n, gate_scale);
        let up = rng.vec(n, 2.0);
        for (g, &v) in gate.iter_mut().zip(fixed) {
            *g = v;
        }
        let mut g = Graph::new();
        let tg = g.input("gate", &[rows, f], DType::F32);
        let tu = g.input("up", &[rows, f], DType::F32);
        let y = g.glu(tg, tu, act)?;
        g.output(y);
        let mut plan = Plan::new(gpu, g)?;
        plan.write_input(gpu, tg, bytemuck::cast_slice(&gate))?;
        plan.write_input(gpu, tu, bytemuck::cast_slice(&up))?;
        plan.run(gpu, &StepVars::default())?;
        let exp_arg = |g: f32| match act {
            Glu::Silu => g.abs(),
            Glu::GeluTanh => (1.6 * (g + 0.044715 * g * g * g)).abs(),
        };
        let max_arg = gate.iter().fold(0f32, |m, &v| m.max(exp_arg(v))).min(88.0) as f64;
        let base = if act == Glu::Silu { 8.0 } else { 10.0 };
        let rtol = (base + 2.0 * max_arg) * f64::from(f32::EPSILON) / 2.0;
        Ok(rel_abs(
            &plan.read_f32(y)?,
            &silu_mul::reference_act(&gate, &up, act),
            rtol,
            1e-30,
        ))
    })
}

pub fn cases() -> Vec<Case> {
    let mut fused = Vec::new();
    // gate|up side by side in one [rows, 2F] tensor (the output of one matmul over concatenated weights) must give
    // bit for bit what the two-tensor kernel gives on the split halves: the same code runs on the same values.
    for (rows, f) in [(1usize, 1536usize), (3, 7), (5, 64), (2, 1)] {
        fused.push(Case::new("silu_mul", format!("fused_rows{rows}_f{f}"), move |gpu| {
            let gu = crate::common::Rng::new((rows * 100 + f) as u64).vec(rows * 2 * f, 4.0);
            let (gate, up): (Vec<f32>, Vec<f32>) = (
                gu.chunks(2 * f).flat_map(|r| r[..f].to_vec()).collect(),
                gu.chunks(2 * f).flat_map(|r| r[f..].to_vec()).collect(),
            );
            let mut g = shaderlm::graph::Graph::new();
            let t = g.input("gu", &[rows, 2 * f], shaderlm::gpu::DType::F32);
            let (tg, tu) = (
                g.input("g", &[rows, f], shaderlm::gpu::DType::F32),
                g.input("u", &[rows, f], shaderlm::gpu::DType::F32),
            );
            let y = g.silu_mul_fused(t)?;
            let want = g.silu_mul(tg, tu)?;
            g.output(y);
            g.output(want);
            let mut plan = shaderlm::graph::Plan::new(gpu, g)?;
            plan.write_input(gpu, t, bytemuck::cast_slice(&gu))?;
            plan.write_input(gpu, tg, bytemuck::cast_slice(&gate))?;
            plan.write_input(gpu, tu, bytemuck::cast_slice(&up))?;
            plan.run(gpu, &shaderlm::graph::StepVars::default())?;
            let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            Ok(crate::common::exact(
                &bits(plan.read_f32(y)?),
                &bits(plan.read_f32(want)?),
            ))
        }));
    }
    let mut v = fused;
    for f in [1usize, 7, 64, 576, 1000, 4096] {
        for rows in [1usize, 3, 17] {
            v.push(case(format!("rows{rows}_f{f}"), rows, f, 8.0, &[]));
        }
    }
    // Gates where exp(-gate) overflows (silu = -0, not NaN), underflows (silu = gate), and zero; in the scalar
    // (n = 11) and the vec4 (n = 12) variants.
    static EXTREME: [f32; 12] = [
        -1e30, -1000.0, -100.0, -88.5, -87.0, -20.0, 0.0, -0.0, 20.0, 100.0, 1e30, -3e38,
    ];
    v.push(case("extreme_gates".into(), 1, 11, 8.0, &EXTREME));
    v.push(case("extreme_gates_vec4".into(), 1, 12, 8.0, &EXTREME));
    // Gates in [-64, 64]: exp's error grows with |x|.
    v.push(case("wide_gates".into(), 3, 1001, 64.0, &[]));
    // GeGLU (Gemma's gelu_tanh gate), scalar and vec4, ordinary and extreme gates.
    for (rows, f) in [(1usize, 7usize), (3, 64), (2, 2048)] {
        v.push(case_act(
            format!("gelu_rows{rows}_f{f}"),
            rows,
            f,
            4.0,
            &[],
            Glu::GeluTanh,
        ));
    }
    v.push(case_act(
        "gelu_extreme_gates".into(),
        1,
        11,
        4.0,
        &EXTREME,
        Glu::GeluTanh,
    ));
    v.push(case_act(
        "gelu_extreme_gates_vec4".into(),
        1,
        12,
        4.0,
        &EXTREME,
        Glu::GeluTanh,
    ));
    // Past 65535 workgroups of 256 (the grid folds into y): odd n, so the scalar variant, one unit per element.
    v.push(case("folded_grid".into(), 1, 65_537 * 256 + 1, 8.0, &[]));
    v
}
