//! read_sum vs CPU partial sums (f64).
//!
//! Metric: exact equality for integer data. x holds nonzero integers in [-8, 8], so every sum the kernel forms
//! (at most 4 span values of magnitude 8, under 2^24 for the spans here) is an integer that f32 holds exactly,
//! whatever the order of additions: any vec4 missed, read twice or taken from another partial's range changes a
//! partial (the values are never 0). One case with real-valued data bounds the rounding instead: each value goes
//! through at most per / 4 + 4 additions in its invocation and WG - 1 in the workgroup sum (whatever order the
//! subgroup sum uses), each adding at most 2^-24 times a partial sum bounded by the sum of |x| over the partial:
//! atol = (per / 4 + WG + 3) 2^-24 max_g sum_g |x|.

use crate::common::{exact, gpu_fallback, rel_abs, Case, Rng};
use shaderlm::gpu::{DType, Gpu};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::read_sum::{self, SPAN_GRANULE, WG_CPU, WG_GPU};

/// Nonzero integers in [-8, 8].
fn integers(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| {
            let v = rng.below(16) as f32 - 8.0;
            if v >= 0.0 {
                v + 1.0
            } else {
                v
            }
        })
        .collect()
}

/// read_sum of `x` with `span` and workgroup size `wg` on `gpu`.
fn run(gpu: &Gpu, x: &[f32], span: usize, wg: usize) -> shaderlm::Result<Vec<f32>> {
    let mut g = Graph::new();
    let tx = g.input("x", &[x.len()], DType::F32);
    let y = g.read_sum_with_workgroup(tx, span, wg)?;
    g.output(y);
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, tx, bytemuck::cast_slice(x))?;
    plan.run(gpu, &StepVars::default())?;
    plan.read_f32(y)
}

fn case(name: String, nv: usize, span: usize, wg: usize, on: fn() -> Option<&'static Gpu>) -> Case {
    Case::new("read_sum", name, move |gpu| {
        let x = integers(4 * nv, (nv * 31 + span + wg) as u64);
        let got = run(on().unwrap_or(gpu), &x, span, wg)?;
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        Ok(exact(&bits(&got), &bits(&read_sum::reference(&x, span))))
    })
}

fn default_gpu() -> Option<&'static Gpu> {
    None
}

fn fallback_gpu() -> Option<&'static Gpu> {
    Some(gpu_fallback())
}

pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    let g = SPAN_GRANULE;
    // nv (vec4s): one whole partial; 3 partials and one vec4 more (a last partial of one vec4); under one partial
    // (most invocations read nothing, one reads a run not a multiple of 4); 5 partials and 999 vec4s; one partial
    // of 2 granules less one vec4.
    for (nv, span) in [
        (g, g),
        (3 * g + 1, g),
        (100, g),
        (10 * g + 999, 2 * g),
        (2 * g - 1, 2 * g),
    ] {
        for wg in [WG_CPU, WG_GPU] {
            v.push(case(format!("nv{nv}_span{span}_wg{wg}"), nv, span, wg, default_gpu));
            v.push(case(
                format!("fallback_nv{nv}_span{span}_wg{wg}"),
                nv,
                span,
                wg,
                fallback_gpu,
            ));
        }
    }
    // 16 MiB in 256 partials (a bench-like size).
    v.push(case("nv1m_span4096_wg8".into(), 1 << 20, 4096, WG_CPU, default_gpu));
    // Real-valued data: rounding bounded as in the module comment.
    for wg in [WG_CPU, WG_GPU] {
        v.push(Case::new("read_sum", format!("real_values_wg{wg}"), move |gpu| {
            let (nv, span) = (5 * g + 17, 2 * g);
            let x = Rng::new(7).vec(4 * nv, 1.0);
            let got = run(gpu, &x, span, wg)?;
            let abs_max = x
                .chunks(4 * span)
                .map(|c| c.iter().map(|v| v.abs() as f64).sum::<f64>())
                .fold(0f64, f64::max);
            let atol = (span / wg / 4 + wg + 3) as f64 * f64::from(f32::EPSILON) / 2.0 * abs_max;
            Ok(rel_abs(&got, &read_sum::reference(&x, span), 0.0, atol))
        }));
    }
    // Bad input is an error value: a length not a multiple of 4, a span not a multiple of the granule, u32 data,
    // another workgroup size.
    v.push(Case::new("read_sum", "bad_input_is_an_error", |_| {
        let mut g = Graph::new();
        let x6 = g.input("x", &[6], DType::F32);
        let x = g.input("x", &[4096], DType::F32);
        let xu = g.input("x", &[4096], DType::U32);
        let errors = [
            g.read_sum(x6, SPAN_GRANULE).is_err(),
            g.read_sum(x, SPAN_GRANULE / 2).is_err(),
            g.read_sum(x, 0).is_err(),
            g.read_sum(xu, SPAN_GRANULE).is_err(),
            g.read_sum_with_workgroup(x, SPAN_GRANULE, 64).is_err(),
            g.node_count() == 0,
        ];
        Ok(exact(&errors, &[true; 6]))
    }));
    v
}
