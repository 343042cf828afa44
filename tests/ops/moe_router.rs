//! moe_router (ReLU, norm, union of active experts) vs the CPU reference in f64, for the three norms of BlockFFN's
//! `norm_after_router`, decode (1 token) and chunks of 8 to 128 tokens (past the workgroup's 64 lanes), expert counts
//! that are not multiples of anything (5, 40, 77) up to the 1024 maximum.
//!
//! Metrics: the active list (count, then ids ascending) exactly; r by rel+abs with rtol = (E + 8) * 2^-24 and
//! atol = 1e-30. Why: the f32 sum over E nonnegative terms has relative error at most (E - 1) * 2^-24; the RMS
//! factor takes its square root (halving that) and inverseSqrt adds 2 ulp, the sum norm's division 2.5 ulp, the
//! products 1 ulp. atol 1e-30 makes every zero of the reference an exact zero on the device (an inactive expert
//! must be exactly 0: the sparse kernels skip it).
//!
//! Logits: active experts get values in (0.1, 2.1), inactive ones negative values, exact zeros and -0.0 (ReLU of
//! both is zero: inactive).

use crate::common::{exact, rel_abs, Case, Check, Rng};
use crate::moe_common::Pattern;
use shaderlm::gpu::{DType, GpuTensor};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::moe_router::{self, HostNorm, RouterNorm};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Norm {
    None,
    Sum,
    Rms,
    /// RMS with some weights zero (their experts stay inactive) and some negative (active, r < 0).
    RmsSigned,
}

fn logits(pattern: Pattern, m: usize, experts: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let mut l = vec![0f32; m * experts];
    for t in 0..m {
        for e in 0..experts {
            l[t * experts + e] = if pattern.on(t, m, e, experts, &mut rng) {
                1.1 + rng.f32()
            } else {
                match rng.below(4) {
                    0 => 0.0,
                    1 => -0.0,
                    _ => -0.1 - rng.f32().abs(),
                }
            };
        }
    }
    l
}

fn run(gpu: &shaderlm::gpu::Gpu, m: usize, experts: usize, pattern: Pattern, norm: Norm) -> shaderlm::Result<Check> {
    let seed = (m * 7919 + experts * 31) as u64 + norm as u64;
    let l = logits(pattern, m, experts, seed);
    let mut rng = Rng::new(seed ^ 0xab);
    let mut weight: Vec<f32> = (0..experts).map(|_| 1.0 + 0.5 * rng.f32()).collect();
    if norm == Norm::RmsSigned {
        for (e, w) in weight.iter_mut().enumerate() {
            match e % 3 {
                0 => *w = 0.0,
                1 => *w = -*w,
                _ => {}
            }
        }
    }
    let wt = GpuTensor::upload_f32(gpu, "router_norm", &[experts], &weight)?;
    let (eps, scale) = (1e-5f32, 1.5f32);
    let mut g = Graph::new();
    let tl = g.input("logits", &[m, experts], DType::F32);
    let norm_dev = match norm {
        Norm::None => RouterNorm::None,
        Norm::Sum => RouterNorm::Sum { scale, eps },
        Norm::Rms | Norm::RmsSigned => RouterNorm::Rms {
            weight: g.external(&wt),
            eps,
        },
    };
    let (r, active) = g.moe_route(tl, norm_dev)?;
    g.output(r);
    g.output(active);
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, tl, bytemuck::cast_slice(&l))?;
    plan.run(gpu, &StepVars::default())?;
    let host = match norm {
        Norm::None => HostNorm::None,
        Norm::Sum => HostNorm::Sum { scale, eps },
        Norm::Rms | Norm::RmsSigned => HostNorm::Rms { weight: &weight, eps },
    };
    let (want_r, want_list) = moe_router::reference(&l, m, experts, host);
    let got_list = plan.read_u32(active)?;
    let lists = exact(&got_list[..want_list.len().min(got_list.len())], &want_list);
    if !lists.passed() {
        return Ok(lists);
    }
    let rtol = (experts as f64 + 8.0) * f64::from(f32::EPSILON) / 2.0;
    Ok(rel_abs(&plan.read_f32(r)?, &want_r, rtol, 1e-30))
}

fn case(name: String, m: usize, experts: usize, pattern: Pattern, norm: Norm) -> Case {
    let name = format!("{name}_{:?}_m{m}_e{experts}", norm).to_lowercase();
    Case::new("moe_router", name, move |gpu| run(gpu, m, experts, pattern, norm))
}

pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for norm in [Norm::None, Norm::Sum, Norm::Rms] {
        // Named edge cases (decode and chunks).
        v.push(case(Pattern::None.name(), 1, 40, Pattern::None, norm));
        v.push(case(Pattern::None.name(), 8, 40, Pattern::None, norm));
        v.push(case(Pattern::All.name(), 1, 40, Pattern::All, norm));
        v.push(case(Pattern::All.name(), 32, 77, Pattern::All, norm));
        v.push(case("one_token_one_expert".into(), 1, 40, Pattern::One(17), norm));
        v.push(case("last_expert_only".into(), 3, 77, Pattern::One(76), norm));
        v.push(case("chunk8_disjoint".into(), 8, 40, Pattern::Disjoint, norm));
        v.push(case("chunk32_disjoint".into(), 32, 77, Pattern::Disjoint, norm));
        v.push(case("chunk8_overlapping".into(), 8, 40, Pattern::Random(20), norm));
        v.push(case("chunk32_overlapping".into(), 32, 40, Pattern::Random(10), norm));
        // Expert counts not a multiple of the workgroup or of 32 (the bitmask words), tokens past 64 lanes.
        for (m, experts) in [(1, 5), (5, 33), (70, 77), (128, 40), (2, 1024)] {
            v.push(case("grid".into(), m, experts, Pattern::Random(30), norm));
        }
    }
    v.push(case(
        "signed_norm_weights".into(),
        8,
        40,
        Pattern::Random(50),
        Norm::RmsSigned,
    ));
    v.push(case("signed_norm_weights".into(), 1, 40, Pattern::All, Norm::RmsSigned));
    v
}
