//! BlockFFN router (Song et al. 2025, arXiv 2507.08771; `BlockMLP` in thunlp/BlockFFN): `r = norm(ReLU(W_router
//! x))` per token, and the union of the experts the chunk's tokens activate (r != 0) as a list u32 `[1 + E]`: the
//! count, then the expert ids ascending. The projection is the existing matmul (any weight form); `moe_route` is
//! the one-workgroup kernel for ReLU, norm and the union.
//!
//! The list is written on the device and read there: the sparse kernels' grids cover all E experts and the work
//! past the count returns at once (up) or is never looped over (down). No host round trip, no indirect dispatch.

use super::moe_common::{MoeWeight, MAX_EXPERTS};
use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};

/// The epsilon of BlockFFN's `"sum"` router norm (a constant in `BlockMLP`, not a config field).
pub const SUM_EPS: f32 = 1e-5;

/// The model's `norm_after_router`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RouterNorm {
    /// `"none"`: r = ReLU(logits).
    None,
    /// `"sum"`: r = v / (sum(v) * scale + eps); BlockFFN uses its `norm_scale` and eps = 1e-5.
    Sum { scale: f32, eps: f32 },
    /// `"rms"`: RMSNorm over the E values with `router_norm.weight` [E] f32 and the model's `rms_norm_eps`.
    Rms { weight: TensorId, eps: f32 },
}

/// The same norm with host data, for the reference.
#[derive(Clone, Copy, Debug)]
pub enum HostNorm<'a> {
    None,
    Sum { scale: f32, eps: f32 },
    Rms { weight: &'a [f32], eps: f32 },
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct RouteParams {
    m: u32,
    e: u32,
    eps: f32,
    scale: f32,
}

fn key(rms: bool, sum: bool) -> ShaderKey {
    ShaderKey::new("moe_router").flag("RMS", rms).flag("SUM", sum)
}

#[derive(Debug)]
pub struct MoeRoute {
    m: usize,
    experts: usize,
    norm: RouterNorm,
}

impl Kernel for MoeRoute {
    fn name(&self) -> &'static str {
        "moe_router"
    }
    fn dispatches(&self, _: &Caps) -> Vec<Dispatch> {
        let rms = matches!(self.norm, RouterNorm::Rms { .. });
        let sum = matches!(self.norm, RouterNorm::Sum { .. });
        vec![Dispatch {
            shader: key(rms, sum),
            bindings: (0..if rms { 4 } else { 3 }).map(Bind::Tensor).collect(),
            workgroups: [1, 1, 1],
        }]
    }
    fn params(&self, _: usize, _: &StepVars) -> Params {
        let (eps, scale) = match self.norm {
            RouterNorm::None => (0.0, 1.0),
            RouterNorm::Sum { scale, eps } => (eps, scale),
            RouterNorm::Rms { eps, .. } => (eps, 1.0),
        };
        Params::of(&RouteParams {
            m: self.m as u32,
            e: self.experts as u32,
            eps,
            scale,
        })
    }
    fn cost(&self) -> Cost {
        let n = (self.m * self.experts) as u64;
        Cost {
            bytes_read: 8 * n,
            bytes_written: 4 * n + 4 * (1 + self.experts as u64),
            flops: 5 * n,
        }
    }
    /// Node tensors: logits, (the RMSNorm weight), r, the active list (count, then ids ascending).
    fn reference(&self, io: &[HostIo], _: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| {
            let weight;
            let (norm, out) = match self.norm {
                RouterNorm::None => (HostNorm::None, 1),
                RouterNorm::Sum { scale, eps } => (HostNorm::Sum { scale, eps }, 1),
                RouterNorm::Rms { eps, .. } => {
                    weight = io[1].f32()?;
                    (HostNorm::Rms { weight: &weight, eps }, 2)
                }
            };
            let (r, active) = reference(&io[0].f32()?, self.m, self.experts, norm);
            Ok(vec![
                Expected::at(out, r),
                Expected::prefix(out + 1, active.iter().map(|&a| a as f32).collect()),
            ])
        })
    }
}

impl Graph {
    /// ReLU, norm and the union of active experts over router logits [.., E] f32 → (`r` [.., E] f32, `active` u32
    /// `[1 + E]`).
    pub fn moe_route(&mut self, logits: TensorId, norm: RouterNorm) -> Result<(TensorId, TensorId)> {
        let ls = self.shape(logits).to_vec();
        let bad = |why: &str| Error::shape("moe_router", format!("logits {ls:?}, norm {norm:?}: {why}"));
        let Some(&experts) = ls.last() else {
            return Err(bad("logits need a last dim"));
        };
        let m = ls[..ls.len() - 1].iter().product::<usize>();
        if m == 0 || experts == 0 || experts > MAX_EXPERTS || self.dtype(logits) != DType::F32 {
            return Err(bad("must be f32 with 1..=1024 experts and at least one token"));
        }
        if m * experts > u32::MAX as usize {
            return Err(bad("too large for 32-bit indices"));
        }
        let mut inputs = vec![logits];
        if let RouterNorm::Rms { weight, .. } = norm {
            if self.shape(weight) != [experts] || self.dtype(weight) != DType::F32 {
                return Err(bad("the RMS weight must be f32 [E]"));
            }
            inputs.push(weight);
        }
        let kernel = MoeRoute { m, experts, norm };
        let outs = self.add_node(
            kernel,
            &inputs,
            &[("moe_r", &ls, DType::F32), ("moe_active", &[1 + experts], DType::U32)],
        )?;
        Ok((outs[0], outs[1]))
    }

    /// The whole router: `x` [.., hidden] f32 times `w` (`router_proj`, `[E, hidden]`) by the matmul ops, then
    /// [`Graph::moe_route`]. Returns (`r` [.., E] f32, `active` u32 `[1 + E]`).
    pub fn moe_router(&mut self, x: TensorId, w: MoeWeight<'_>, norm: RouterNorm) -> Result<(TensorId, TensorId)> {
        let logits = match w {
            MoeWeight::Dense(t) => self.matmul(x, t, None)?,
            MoeWeight::Quant(pw) => self.matmul_q(x, pw, None)?,
        };
        self.moe_route(logits, norm)
    }
}

/// CPU reference in f64: `logits` [m, e] → (`r` [m, e], the active list `[count, ids ascending..]` of length
/// 1 + count).
pub fn reference(logits: &[f32], m: usize, e: usize, norm: HostNorm<'_>) -> (Vec<f32>, Vec<u32>) {
    let mut r = vec![0f32; m * e];
    let mut any = vec![false; e];
    for t in 0..m {
        let v: Vec<f64> = logits[t * e..(t + 1) * e]
            .iter()
            .map(|&l| (l as f64).max(0.0))
            .collect();
        let f = match norm {
            HostNorm::None => 1.0,
            HostNorm::Sum { scale, eps } => 1.0 / (v.iter().sum::<f64>() * scale as f64 + eps as f64),
            HostNorm::Rms { eps, .. } => 1.0 / (v.iter().map(|a| a * a).sum::<f64>() / e as f64 + eps as f64).sqrt(),
        };
        for (j, a) in v.iter().enumerate() {
            let w = match norm {
                HostNorm::Rms { weight, .. } => weight[j] as f64,
                _ => 1.0,
            };
            let out = a * f * w;
            r[t * e + j] = out as f32;
            any[j] |= out != 0.0;
        }
    }
    let ids: Vec<u32> = (0..e as u32).filter(|&j| any[j as usize]).collect();
    let mut list = vec![ids.len() as u32];
    list.extend(ids);
    (r, list)
}

/// Every shader variant: no norm, sum, RMS.
pub fn variants() -> Vec<ShaderKey> {
    vec![key(false, false), key(false, true), key(true, false)]
}
