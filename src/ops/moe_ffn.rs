//! BlockFFN's FFN (`BlockMLP` in thunlp/BlockFFN; Song et al. 2025, arXiv 2507.08771) as one builder call:
//! `y = sum over experts e with r_e != 0 of Wdown[e] (silu(Wup[e] x) * r_e)`, `r = norm(ReLU(W_router x))`.
//! The input is the model's post-attention RMSNorm output; the residual add and its scale stay with the model.
//!
//! Two paths over the same weights ([`super::moe_common`] gives their arrangement):
//! * sparse: router, [`Graph::moe_up`] over the active experts only, [`Graph::moe_down`] over their columns;
//! * dense fallback: the dense matmul ops over all experts, with [`Graph::moe_act`] (SiLU and r) between them,
//!   for chunks whose union of active experts is nearly all of them.

use super::moe_common::{silu, MoeWeight};
use super::moe_router::{HostNorm, RouterNorm};
use crate::error::Result;
use crate::graph::{Graph, TensorId};

/// Which kernels compute the experts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MoePath {
    /// [`auto_path`]: sparse.
    #[default]
    Auto,
    /// Only the active experts' rows and columns are read.
    Sparse,
    /// Every expert, by the dense matmul ops (the result is the same: inactive experts have r = 0).
    Dense,
}

/// Union share (percent of the experts active in a chunk) above which the dense fallback may cost less than the
/// sparse kernels. Measured on lavapipe, process CPU ms per run at the BlockFFN-0.5B shape, dense fallback vs sparse
/// at 100% / 50% / 20% of the experts:
/// * Q4_0 (tiled): 1 token x 27 layers 86 vs 88 / 57 / 29; 8 tokens 14.6 vs 14.6 / 7.2 / 2.6; 32 tokens 52 vs 39 /
///   18 / 8.5;
/// * f16: 1 token x 27 layers 322 vs 354 / 180 / 91; 8 tokens 39 vs 53 / 21 / 9.3; 32 tokens 143 vs 130 / 76 / 27.
///
/// With every expert listed the sparse kernels run at 75% to 110% of the dense matmuls' speed, so the crossover
/// lies between 75% and 100%.
pub const DENSE_ABOVE_SHARE: usize = 85;

/// The path `Auto` takes for `m` tokens: sparse. The union share is known only on the device, after the router; the
/// dense fallback pays only above [`DENSE_ABOVE_SHARE`] percent and then saves at most about 25%, while sparse is
/// about 3x faster at a 20% share and 5x or more at 10%, the shares BlockFFN is trained for (token-level sparsity over
/// 80%, 8-token chunks about 70%). A
/// caller that knows its chunks' unions are nearly full (e.g. from the previous step's `active` count) can ask for
/// [`MoePath::Dense`].
pub fn auto_path(_m: usize) -> MoePath {
    MoePath::Sparse
}

/// The weights of one BlockFFN layer.
#[derive(Clone, Copy, Debug)]
pub struct MoeFfn<'a> {
    /// `router_proj.weight` `[E, hidden]`.
    pub router: MoeWeight<'a>,
    pub norm: RouterNorm,
    /// `up_proj` as `[E*de, hidden]`.
    pub up: MoeWeight<'a>,
    /// `down_proj` as `[hidden, E*de]`.
    pub down: MoeWeight<'a>,
    /// `expert_size`.
    pub de: usize,
}

/// The FFN's output and the router's, for taps and tests.
#[derive(Clone, Copy, Debug)]
pub struct MoeFfnOut {
    /// [.., hidden] f32.
    pub y: TensorId,
    /// Router weights [.., E] f32.
    pub r: TensorId,
    /// u32 `[1 + E]`: count, then the active experts ascending.
    pub active: TensorId,
}

impl Graph {
    /// BlockFFN's FFN over `x` [.., hidden] f32.
    pub fn moe_ffn(&mut self, x: TensorId, f: &MoeFfn<'_>, path: MoePath) -> Result<MoeFfnOut> {
        let m = self.shape(x).iter().rev().skip(1).product::<usize>();
        let (r, active) = self.moe_router(x, f.router, f.norm)?;
        let path = if path == MoePath::Auto { auto_path(m) } else { path };
        let y = match path {
            MoePath::Dense => {
                let u = match f.up {
                    MoeWeight::Dense(t) => self.matmul(x, t, None)?,
                    MoeWeight::Quant(pw) => self.matmul_q(x, pw, None)?,
                };
                let h = self.moe_act(u, r, f.de)?;
                match f.down {
                    MoeWeight::Dense(t) => self.matmul(h, t, None)?,
                    MoeWeight::Quant(pw) => self.matmul_q(h, pw, None)?,
                }
            }
            _ => {
                let h = self.moe_up(x, f.up, r, active, f.de)?;
                self.moe_down(h, f.down, active, f.de)?
            }
        };
        Ok(MoeFfnOut { y, r, active })
    }
}

/// CPU reference in f64 of `BlockMLP.forward` (the dense definition, every expert): `x` [m, hidden], `router`
/// [E, hidden], `up` [E*de, hidden], `down` [hidden, E*de] → y [m, hidden].
pub fn reference(
    x: &[f32],
    router: &[f32],
    norm: HostNorm<'_>,
    up: &[f32],
    down: &[f32],
    hidden: usize,
    de: usize,
) -> Vec<f32> {
    let m = x.len() / hidden;
    let experts = router.len() / hidden;
    let n = experts * de;
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(p, q)| *p as f64 * *q as f64).sum::<f64>();
    let mut logits = vec![0f32; m * experts];
    for t in 0..m {
        for e in 0..experts {
            logits[t * experts + e] =
                dot(&x[t * hidden..(t + 1) * hidden], &router[e * hidden..(e + 1) * hidden]) as f32;
        }
    }
    let (r, _) = super::moe_router::reference(&logits, m, experts, norm);
    let mut y = vec![0f32; m * hidden];
    for t in 0..m {
        let xr = &x[t * hidden..(t + 1) * hidden];
        let h: Vec<f64> = (0..n)
            .map(|j| silu(dot(xr, &up[j * hidden..(j + 1) * hidden])) * r[t * experts + j / de] as f64)
            .collect();
        for o in 0..hidden {
            y[t * hidden + o] = down[o * n..(o + 1) * n]
                .iter()
                .zip(&h)
                .map(|(w, v)| *w as f64 * v)
                .sum::<f64>() as f32;
        }
    }
    y
}
