//! BlockFFN layers (thunlp/BlockFFN, `BlockMLP`): loading the router and the expert matrices from a Hugging Face
//! checkpoint into the arrangement the expert kernels read (`ops::moe_common`), the graph of one FFN, and the
//! same FFN on the CPU for the reference forward.
//!
//! Tensor names (per layer, prefix `model.layers.{i}.mlp.`): `router_proj.weight` `[E, hidden]`,
//! `router_norm.weight` `[E]` (norm "rms" only), and the expert matrices as bare parameters (no `.weight`):
//! `up_proj` `[E, de, hidden]` (`ffn_type` block) or `[E*de, hidden]` (block_linear), `down_proj` `[E, hidden, de]`
//! or `[hidden, E*de]`. The kernels take up as `[E*de, hidden]` (the same memory) and down as `[hidden, E*de]`, so
//! a per-expert `down_proj` is transposed once at load.

use super::config::{LlamaConfig, MoeConfig, RouterNormKind};
use super::weights::{load_vector, HostData, Linear, WeightSource};
use crate::error::{Error, Result};
use crate::gpu::{Gpu, GpuTensor};
use crate::graph::{Graph, TensorId};
use crate::ops::moe_common::MoeWeight;
use crate::ops::moe_ffn::{MoeFfn, MoePath};
use crate::ops::moe_router::{HostNorm, RouterNorm, SUM_EPS};

/// One layer's experts on the device.
pub struct BlockFfn {
    router: Linear,          // [E, hidden]
    norm: Option<GpuTensor>, // [E], norm "rms"
    up: Linear,              // [E * de, hidden]
    down: Linear,            // [hidden, E * de]
}

fn name(i: usize, t: &str) -> String {
    format!("model.layers.{i}.mlp.{t}")
}

/// The expert matrices in the kernels' arrangement, f32 on the host: (up `[E*de, hidden]`, down `[hidden, E*de]`).
pub fn host_experts(
    src: &dyn WeightSource,
    cfg: &LlamaConfig,
    m: &MoeConfig,
    i: usize,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let (e, de, h) = (m.experts, m.expert_size, cfg.hidden);
    let up = src.require(&name(i, "up_proj"))?;
    let down = src.require(&name(i, "down_proj"))?;
    let (up_shape, down_shape): (Vec<usize>, Vec<usize>) = if m.per_expert_tensors {
        (vec![e, de, h], vec![e, h, de])
    } else {
        (vec![e * de, h], vec![h, e * de])
    };
    for (t, want) in [(&up, &up_shape), (&down, &down_shape)] {
        if &t.shape != want {
            return Err(Error::shape(
                "load",
                format!("{}: {:?}, expected {want:?}", t.name, t.shape),
            ));
        }
    }
    let up = up.to_f32()?;
    let mut down = down.to_f32()?;
    if m.per_expert_tensors {
        // [E, hidden, de] -> [hidden, E, de]
        let src = std::mem::take(&mut down);
        down = vec![0f32; src.len()];
        for x in 0..e {
            for r in 0..h {
                down[(r * e + x) * de..][..de].copy_from_slice(&src[(x * h + r) * de..][..de]);
            }
        }
    }
    Ok((up, down))
}

impl BlockFfn {
    pub fn load(gpu: &Gpu, src: &dyn WeightSource, cfg: &LlamaConfig, m: &MoeConfig, i: usize) -> Result<BlockFfn> {
        let (e, de, h) = (m.experts, m.expert_size, cfg.hidden);
        let router = src.require(&name(i, "router_proj.weight"))?;
        if router.shape != [e, h] {
            return Err(Error::shape(
                "load",
                format!("{}: {:?}, expected [{e}, {h}]", router.name, router.shape),
            ));
        }
        let norm = match m.norm {
            RouterNormKind::Rms => Some(load_vector(gpu, &src.require(&name(i, "router_norm.weight"))?, e)?),
            _ => None,
        };
        // Half-precision checkpoints stay f16 on the device; others are f32.
        let half = matches!(router.data, HostData::F16(_));
        let (up, down) = host_experts(src, cfg, m, i)?;
        let matrix = |n: &str, shape: [usize; 2], v: Vec<f32>| {
            let upload = if half {
                GpuTensor::upload_f16
            } else {
                GpuTensor::upload_f32
            };
            upload(gpu, &name(i, n), &shape, &v).map(Linear::Dense)
        };
        Ok(BlockFfn {
            router: Linear::load(gpu, &router)?,
            norm,
            up: matrix("up_proj", [e * de, h], up)?,
            down: matrix("down_proj", [h, e * de], down)?,
        })
    }

    /// Bytes of all expert weights and the router (a dense FFN's read; a sparse step reads the active share).
    pub fn bytes(&self) -> u64 {
        self.router.bytes() + self.up.bytes() + self.down.bytes()
    }

    /// The FFN of `x` `[n, hidden]`: (y `[n, hidden]`, router weights `[n, E]`).
    pub fn forward(&self, g: &mut Graph, x: TensorId, m: &MoeConfig, eps: f32) -> Result<(TensorId, TensorId)> {
        fn weight<'a>(g: &mut Graph, l: &'a Linear) -> Result<MoeWeight<'a>> {
            Ok(match l {
                Linear::Dense(t) => MoeWeight::Dense(g.external(t)),
                Linear::Quant { w, perm: None } => MoeWeight::Quant(w),
                Linear::Quant { .. } => {
                    return Err(Error::Invalid(
                        "BlockFFN expert weights with an input permutation (GPTQ act-order) are not supported".into(),
                    ))
                }
            })
        }
        let norm = match (m.norm, &self.norm) {
            (RouterNormKind::None, _) => RouterNorm::None,
            (RouterNormKind::Sum { scale }, _) => RouterNorm::Sum { scale, eps: SUM_EPS },
            (RouterNormKind::Rms, Some(w)) => RouterNorm::Rms {
                weight: g.external(w),
                eps,
            },
            (RouterNormKind::Rms, None) => return Err(Error::Invalid("router_norm.weight was not loaded".into())),
        };
        let f = MoeFfn {
            router: weight(g, &self.router)?,
            norm,
            up: weight(g, &self.up)?,
            down: weight(g, &self.down)?,
            de: m.expert_size,
        };
        let out = g.moe_ffn(x, &f, MoePath::Auto)?;
        Ok((out.y, out.r))
    }
}

/// The CPU FFN of one token `x` `[hidden]` for the reference forward.
pub fn reference(
    src: &dyn WeightSource,
    cfg: &LlamaConfig,
    m: &MoeConfig,
    i: usize,
) -> Result<impl Fn(&[f32]) -> Vec<f32>> {
    let router = src.require(&name(i, "router_proj.weight"))?.to_f32()?;
    let norm_w = match m.norm {
        RouterNormKind::Rms => Some(src.require(&name(i, "router_norm.weight"))?.to_f32()?),
        _ => None,
    };
    let (up, down) = host_experts(src, cfg, m, i)?;
    let (norm, hidden, de, eps) = (m.norm, cfg.hidden, m.expert_size, cfg.rms_eps);
    Ok(move |x: &[f32]| {
        let host = match (norm, &norm_w) {
            (RouterNormKind::None, _) => HostNorm::None,
            (RouterNormKind::Sum { scale }, _) => HostNorm::Sum { scale, eps: SUM_EPS },
            (RouterNormKind::Rms, w) => HostNorm::Rms {
                weight: w.as_deref().unwrap_or(&[]),
                eps,
            },
        };
        crate::ops::moe_ffn::reference(x, &router, host, &up, &down, hidden, de)
    })
}
