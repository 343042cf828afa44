//! The whole BlockFFN FFN (router matmul, moe_router, then moe_up + moe_down, or the dense fallback: matmuls over
//! every expert with moe_act between) vs `BlockMLP.forward` in f64 over every expert (no union, no skipping), for
//! each weight form, the three router norms, both paths, decode and chunks.
//!
//! Activations are steered through x: x[t, e] = +1 or -1 for e < E says whether token t should activate expert e,
//! the router weight is 4 * identity on those dims plus noise of 2^-7, so logits are about +-4 (never near the ReLU
//! edge, where an f32 rounding could flip an expert on or off); the other dims of x are uniform in [-1, 1].
//!
//! Metrics: the active list exactly; y by NMSE, bound 1e-9 (two chained f32 dot products and the router norm, each
//! with NMSE around 1e-12 as argued in moe_up; an expert missed or counted twice gives 1e-3 or more); with no expert
//! active, y exactly zero.

use crate::common::{exact, nmse, Case, Check, Rng};
use crate::moe_common::{all_forms, Pattern, Weight, Wt};
use shaderlm::gpu::{DType, Gpu, GpuTensor};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::moe_common::MoeWeight;
use shaderlm::ops::moe_ffn::{self, MoeFfn, MoePath};
use shaderlm::ops::moe_router::{HostNorm, RouterNorm};

const BOUND: f64 = 1e-9;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Norm {
    None,
    Sum,
    Rms,
}

#[derive(Clone, Copy, Debug)]
struct Shape {
    wt: Wt,
    m: usize,
    hidden: usize,
    experts: usize,
    de: usize,
    pattern: Pattern,
    norm: Norm,
    path: MoePath,
}

fn run(gpu: &Gpu, s: Shape) -> shaderlm::Result<Check> {
    let (m, hidden, experts, de) = (s.m, s.hidden, s.experts, s.de);
    let seed = (m * 1_000_003 + hidden * 1009 + experts * 31 + de) as u64;
    let mut rng = Rng::new(seed);
    let mut x = rng.vec(m * hidden, 1.0);
    let mut prng = Rng::new(seed ^ 3);
    for t in 0..m {
        for e in 0..experts {
            x[t * hidden + e] = if s.pattern.on(t, m, e, experts, &mut prng) {
                1.0
            } else {
                -1.0
            };
        }
    }
    let mut router = rng.vec(experts * hidden, 1.0 / 128.0);
    for e in 0..experts {
        router[e * hidden + e] += 4.0;
    }
    let norm_w: Vec<f32> = (0..experts).map(|_| 1.0 + 0.5 * rng.f32()).collect();
    let up = Weight::new(gpu, s.wt, experts * de, hidden, 0.125, seed ^ 1)?;
    let down = Weight::new(gpu, s.wt, hidden, experts * de, 0.125, seed ^ 2)?;
    let tr = GpuTensor::upload_f32(gpu, "router", &[experts, hidden], &router)?;
    let tn = GpuTensor::upload_f32(gpu, "router_norm", &[experts], &norm_w)?;
    let (eps, scale) = (1e-5f32, 1.0f32);
    let mut g = Graph::new();
    let tx = g.input("x", &[m, hidden], DType::F32);
    let norm = match s.norm {
        Norm::None => RouterNorm::None,
        Norm::Sum => RouterNorm::Sum { scale, eps },
        Norm::Rms => RouterNorm::Rms {
            weight: g.external(&tn),
            eps,
        },
    };
    let f = MoeFfn {
        router: MoeWeight::Dense(g.external(&tr)),
        norm,
        up: up.bind(&mut g),
        down: down.bind(&mut g),
        de,
    };
    let out = g.moe_ffn(tx, &f, s.path)?;
    g.output(out.y);
    g.output(out.active);
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, tx, bytemuck::cast_slice(&x))?;
    plan.run(gpu, &StepVars::default())?;
    let host = match s.norm {
        Norm::None => HostNorm::None,
        Norm::Sum => HostNorm::Sum { scale, eps },
        Norm::Rms => HostNorm::Rms { weight: &norm_w, eps },
    };
    let want = moe_ffn::reference(&x, &router, host, &up.values, &down.values, hidden, de);
    // The union the steering asks for.
    let mut prng = Rng::new(seed ^ 3);
    let mut on = vec![false; experts];
    for t in 0..m {
        for (e, o) in on.iter_mut().enumerate() {
            *o |= s.pattern.on(t, m, e, experts, &mut prng);
        }
    }
    let mut want_list: Vec<u32> = (0..experts as u32).filter(|&e| on[e as usize]).collect();
    want_list.insert(0, want_list.len() as u32);
    let got_list = plan.read_u32(out.active)?;
    let lists = exact(&got_list[..want_list.len()], &want_list);
    if !lists.passed() {
        return Ok(lists);
    }
    let got = plan.read_f32(out.y)?;
    if want_list[0] == 0 {
        return Ok(exact(&got, &want));
    }
    Ok(nmse(&got, &want, BOUND))
}

fn case(name: &str, s: Shape) -> Case {
    let path = match s.path {
        MoePath::Dense => "dense",
        _ => "sparse",
    };
    let name = format!(
        "{}_{name}_{path}_{:?}_m{}_hidden{}_e{}_de{}",
        s.wt.name(),
        s.norm,
        s.m,
        s.hidden,
        s.experts,
        s.de
    )
    .to_lowercase();
    Case::new("moe_ffn", name, move |gpu| run(gpu, s))
}

pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for path in [MoePath::Sparse, MoePath::Dense] {
        for wt in all_forms() {
            let s = |m, hidden, experts, de, pattern, norm| Shape {
                wt,
                m,
                hidden,
                experts,
                de,
                pattern,
                norm,
                path,
            };
            v.push(case(
                "one_token_one_expert",
                s(1, 64, 8, 32, Pattern::One(3), Norm::Rms),
            ));
            v.push(case(&Pattern::None.name(), s(8, 64, 8, 32, Pattern::None, Norm::Rms)));
            v.push(case(&Pattern::All.name(), s(1, 96, 12, 32, Pattern::All, Norm::Rms)));
            v.push(case("chunk8_disjoint", s(8, 96, 12, 32, Pattern::Disjoint, Norm::Rms)));
            v.push(case(
                "chunk32_overlapping",
                s(32, 64, 40, 32, Pattern::Random(10), Norm::Rms),
            ));
        }
        for norm in [Norm::None, Norm::Sum] {
            let s = Shape {
                wt: Wt::F32,
                m: 8,
                hidden: 64,
                experts: 12,
                de: 32,
                pattern: Pattern::Random(25),
                norm,
                path,
            };
            v.push(case("chunk8_overlapping", s));
        }
        // BlockFFN-0.5B's shape (hidden 1280, 40 experts of 128) at a 20% share, decode.
        for wt in [
            Wt::F16,
            Wt::Q(shaderlm::quant::GgmlType::Q4_0, shaderlm::quant::pack::Layout::Tiled),
        ] {
            let s = Shape {
                wt,
                m: 1,
                hidden: 1280,
                experts: 40,
                de: 128,
                pattern: Pattern::Random(20),
                norm: Norm::Rms,
                path,
            };
            v.push(case("blockffn_0.5b", s));
        }
    }
    v
}
