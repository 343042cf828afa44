//! BlockFFN FFN time (router + up + down, one plan) against the share of active experts, next to the dense SwiGLU
//! FFN with the same parameter count (gate|up matmul, fused silu_mul, down matmul), and BlockFFN's dense fallback.
//!
//! Shapes: BlockFFN-0.5B (hidden 1280, 40 experts of 128, 27 layers; its dense twin in the paper's configs has
//! dim_ff 3440, here 3456 for whole Q4 blocks) and a 3B-like shape (hidden 2560, 64 experts of 128, dense dim_ff
//! 5472: 2 * E * de = 3 * dim_ff; the 3B checkpoint's config was not available). Weights f16 and Q4_0 in the
//! adapter's layout; 1 token (decode), 8 (a speculative verification chunk) and 32 (a prefill chunk).
//!
//! Decode runs a stack of layers with distinct weight buffers (27 for 0.5B, as in the model; 8 for the 3B-like
//! shape), each reading the same x, so that the weights a run reads are not all in the CPU's last-level cache from
//! the previous run (on lavapipe a single layer's active experts would be, which flatters small shares): the name
//! says "xL layers" and ms/run is for all of them; divide by L for one layer. Chunks run one layer (they are
//! compute-bound). The same experts are active in every run and layer; real decoding changes the set token to token.
//!
//! The share is set through the router: every token's x is the same row v, and router row e is +-0.01 * sign(v), so
//! its logit is positive exactly for the first share * E experts. The GFLOP/s and GB/s columns count every expert
//! (the kernels' cost is an upper bound), so compare ms.

use crate::common::{weight, Bench};
use crate::embedding_q::blocks;
use shaderlm::gpu::packed::PackedWeight;
use shaderlm::gpu::{DType, Gpu, GpuTensor};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::moe_common::MoeWeight;
use shaderlm::ops::moe_ffn::{MoeFfn, MoePath};
use shaderlm::ops::moe_router::RouterNorm;
use shaderlm::quant::GgmlType;

/// (name, hidden, experts, de, dense dim_ff, layers stacked for decode).
pub const SHAPES: [(&str, usize, usize, usize, usize, usize); 2] = [
    ("blockffn-0.5b", 1280, 40, 128, 3456, 27),
    ("3b-like", 2560, 64, 128, 5472, 8),
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    F16,
    Q4,
}

/// A `[n, k]` weight in `form`, held by the closure that builds the graph.
enum Held {
    Dense(GpuTensor),
    Packed(Box<PackedWeight>),
}

impl Held {
    fn new(gpu: &Gpu, form: Form, name: &str, n: usize, k: usize) -> shaderlm::Result<Held> {
        Ok(Self::layers(gpu, form, name, n, k, 1)?.remove(0))
    }

    /// `layers` weights with the same contents in distinct buffers (the host data is made once).
    fn layers(gpu: &Gpu, form: Form, name: &str, n: usize, k: usize, layers: usize) -> shaderlm::Result<Vec<Held>> {
        match form {
            Form::F16 => {
                let first = weight(gpu, name, &[n, k], DType::F16)?;
                let bytes = first.download(gpu)?;
                let mut v = vec![Held::Dense(first)];
                for _ in 1..layers {
                    v.push(Held::Dense(GpuTensor::upload(gpu, name, &[n, k], DType::F16, &bytes)?));
                }
                Ok(v)
            }
            Form::Q4 => {
                let raw = blocks(GgmlType::Q4_0, n, k);
                (0..layers)
                    .map(|_| {
                        let w = PackedWeight::upload(gpu, name, GgmlType::Q4_0, n, k, &raw)?;
                        Ok(Held::Packed(Box::new(w)))
                    })
                    .collect()
            }
        }
    }
    fn bind<'a>(&'a self, g: &mut Graph) -> MoeWeight<'a> {
        match self {
            Held::Dense(t) => MoeWeight::Dense(g.external(t)),
            Held::Packed(p) => MoeWeight::Quant(p),
        }
    }
    fn matmul(&self, g: &mut Graph, x: shaderlm::graph::TensorId) -> shaderlm::Result<shaderlm::graph::TensorId> {
        match self {
            Held::Dense(t) => {
                let w = g.external(t);
                g.matmul(x, w, None)
            }
            Held::Packed(p) => g.matmul_q(x, p, None),
        }
    }
}

/// The x row every token gets (no zeros, so every sign is defined).
fn x_row(hidden: usize) -> Vec<f32> {
    (0..hidden).map(|i| ((i % 13) as f32 - 6.0) * 0.01 + 0.001).collect()
}

/// Plan of `layers` BlockFFN layers (distinct weights, the same x) with `share` percent of the experts active for
/// every token.
fn blockffn(
    gpu: &Gpu,
    shape: usize,
    form: Form,
    (m, layers): (usize, usize),
    share: usize,
    path: MoePath,
) -> shaderlm::Result<Plan> {
    let (_, hidden, experts, de, ..) = SHAPES[shape];
    let v = x_row(hidden);
    let on = experts * share / 100;
    let router: Vec<f32> = (0..experts)
        .flat_map(|e| {
            let s = if e < on { 0.01 } else { -0.01 };
            v.iter().map(move |x| s * x.signum())
        })
        .collect();
    let tr = GpuTensor::upload_f32(gpu, "router", &[experts, hidden], &router)?;
    let tn = GpuTensor::upload_f32(gpu, "router_norm", &[experts], &vec![1.0; experts])?;
    let ups = Held::layers(gpu, form, "up", experts * de, hidden, layers)?;
    let downs = Held::layers(gpu, form, "down", hidden, experts * de, layers)?;
    let mut g = Graph::new();
    let x = g.input("x", &[m, hidden], DType::F32);
    for (up, down) in ups.iter().zip(&downs) {
        let f = MoeFfn {
            router: MoeWeight::Dense(g.external(&tr)),
            norm: RouterNorm::Rms {
                weight: g.external(&tn),
                eps: 1e-5,
            },
            up: up.bind(&mut g),
            down: down.bind(&mut g),
            de,
        };
        g.moe_ffn(x, &f, path)?;
    }
    let plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, x, bytemuck::cast_slice(&v.repeat(m)))?;
    Ok(plan)
}

/// Plan of `layers` dense SwiGLU FFNs with the same parameters: gate|up stacked in one matmul, fused silu_mul, down.
fn swiglu(gpu: &Gpu, shape: usize, form: Form, (m, layers): (usize, usize)) -> shaderlm::Result<Plan> {
    let (_, hidden, _, _, ff, _) = SHAPES[shape];
    let gate_ups = Held::layers(gpu, form, "gate_up", 2 * ff, hidden, layers)?;
    let downs = Held::layers(gpu, form, "down", hidden, ff, layers)?;
    let mut g = Graph::new();
    let x = g.input("x", &[m, hidden], DType::F32);
    for (gate_up, down) in gate_ups.iter().zip(&downs) {
        let gu = gate_up.matmul(&mut g, x)?;
        let h = g.silu_mul_fused(gu)?;
        down.matmul(&mut g, h)?;
    }
    let plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, x, bytemuck::cast_slice(&x_row(hidden).repeat(m)))?;
    Ok(plan)
}

/// Plan of the up or down kernel alone over all experts (r and the list as inputs), or with `dense` of the matmul
/// op on the same matrix: the kernels' cost per weight against the dense ops'.
fn kernel(gpu: &Gpu, shape: usize, form: Form, m: usize, down: bool, dense: bool) -> shaderlm::Result<Plan> {
    let (_, hidden, experts, de, ..) = SHAPES[shape];
    let (n, k) = if down {
        (hidden, experts * de)
    } else {
        (experts * de, hidden)
    };
    let w = Held::new(gpu, form, "w", n, k)?;
    let mut g = Graph::new();
    let x = g.input("x", &[m, k], DType::F32);
    let r = g.input("r", &[m, experts], DType::F32);
    let active = g.input("active", &[1 + experts], DType::U32);
    if dense {
        w.matmul(&mut g, x)?;
    } else if down {
        let tw = w.bind(&mut g);
        g.moe_down(x, tw, active, de)?;
    } else {
        let tw = w.bind(&mut g);
        g.moe_up(x, tw, r, active, de)?;
    }
    let plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, x, bytemuck::cast_slice(&vec![0.01f32; m * k]))?;
    if !dense {
        plan.write_input(gpu, r, bytemuck::cast_slice(&vec![1.0f32; m * experts]))?;
        let list: Vec<u32> = std::iter::once(experts as u32).chain(0..experts as u32).collect();
        plan.write_input(gpu, active, bytemuck::cast_slice(&list))?;
    }
    Ok(plan)
}

/// The up (`down` false) or down kernel alone at BlockFFN-0.5B's shape over all experts, beside the matmul op on
/// the same matrix: the rows of benches/ops/moe_up.rs and moe_down.rs.
pub fn kernel_benches(down: bool) -> Vec<Bench> {
    let op = if down { "down" } else { "up" };
    let mut v = Vec::new();
    for (form, fname) in [(Form::F16, "f16"), (Form::Q4, "q4_0")] {
        for m in [1usize, 8, 32] {
            for (dense, how) in [(false, "moe kernel, all experts"), (true, "matmul op")] {
                let name = format!("moe_{op} {} {fname} m{m} {how}", SHAPES[0].0);
                v.push(Bench::new(name, move |gpu| {
                    Ok((kernel(gpu, 0, form, m, down, dense)?, StepVars::default()))
                }));
            }
        }
    }
    v
}

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    for (shape, &(model, .., stack)) in SHAPES.iter().enumerate() {
        for (form, fname) in [(Form::F16, "f16"), (Form::Q4, "q4_0")] {
            for m in [1usize, 8, 32] {
                let ml = (m, if m == 1 { stack } else { 1 });
                let tag = format!("{model} {fname} m{m} x{} layers", ml.1);
                v.push(Bench::new(format!("moe_ffn {tag} swiglu-dense"), move |gpu| {
                    Ok((swiglu(gpu, shape, form, ml)?, StepVars::default()))
                }));
                v.push(Bench::new(format!("moe_ffn {tag} dense-fallback"), move |gpu| {
                    Ok((
                        blockffn(gpu, shape, form, ml, 100, MoePath::Dense)?,
                        StepVars::default(),
                    ))
                }));
                for share in [10usize, 20, 50, 100] {
                    v.push(Bench::new(format!("moe_ffn {tag} sparse {share}%"), move |gpu| {
                        Ok((
                            blockffn(gpu, shape, form, ml, share, MoePath::Sparse)?,
                            StepVars::default(),
                        ))
                    }));
                }
            }
        }
    }
    v
}
