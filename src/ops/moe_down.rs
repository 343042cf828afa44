//! BlockFFN sparse down projection (Song et al. 2025, arXiv 2507.08771): `y[m] = sum over the experts e in the
//! active list of Wdown[:, e*de .. (e+1)*de] . h[m, e*de .. (e+1)*de]`, a GEMV / GEMM whose reduction runs over the
//! listed experts' column blocks only. Weights: see [`super::moe_common`].

use super::moe_common::{
    bind_weight, check_active, variants as all_keys, wg_dense_down, ExpertNode, MoeWeight, Target, WeightKind,
    DE_ALIGN, MAX_EXPERTS,
};
use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};
use crate::quant::pack::{Layout, QK, TILE};

/// Output rows per workgroup of the rows-layout kernel.
const ROWS_PER_GROUP: usize = 4;

#[derive(Debug)]
pub struct MoeDown {
    node: ExpertNode,
    hidden: usize,
}

impl Kernel for MoeDown {
    fn name(&self) -> &'static str {
        "moe_down"
    }
    /// Node tensors: h, the weight's bindings, active, then y.
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        let n = &self.node;
        let wg = wg_dense_down(caps, n.target);
        let groups = match n.kind {
            WeightKind::Dense(_) => self.hidden.div_ceil(4 * wg),
            WeightKind::Quant(_, Layout::Tiled) => self.hidden.div_ceil(TILE),
            WeightKind::Quant(_, Layout::Rows) => self.hidden.div_ceil(ROWS_PER_GROUP),
        };
        n.dispatch("down", caps, wg, groups, n.weight_inputs + 3)
    }
    fn params(&self, _: usize, _: &StepVars) -> Params {
        self.node.params(self.hidden, self.node.width(), self.node.de / QK)
    }
    /// The cost with every expert active (an upper bound: the real share is known only on the device).
    fn cost(&self) -> Cost {
        let (m, k, n) = (self.node.m as u64, self.node.width() as u64, self.hidden as u64);
        Cost {
            bytes_read: self.node.wbytes + 4 * m * k + 4 * (1 + self.node.experts as u64),
            bytes_written: 4 * m * n,
            flops: 2 * m * n * k,
        }
    }
    fn reference(&self, io: &[HostIo], _: &StepVars) -> Option<Result<Vec<Expected>>> {
        let (n, nw) = (&self.node, self.node.weight_inputs);
        expect(|| {
            let (w, listed) = n.host(io, (self.hidden, n.width()), nw + 1)?;
            let y = reference(&io[0].f32()?, &w, &listed, n.m, self.hidden, n.de);
            Ok(vec![Expected::at(nw + 2, y)])
        })
    }
    /// The op tests' bound: f32 dot products over the listed experts (reason in tests/ops/moe_down.rs).
    fn check_bound(&self, _: &Caps) -> f64 {
        1e-9
    }
}

impl Graph {
    /// BlockFFN's sparse down projection: `h` [.., E*de] f32 (from [`Graph::moe_up`]), `w` the down weight
    /// `[hidden, E*de]`, `active` u32 `[1 + E]` → `y` [.., hidden] f32, summed over the listed experts only.
    pub fn moe_down(&mut self, h: TensorId, w: MoeWeight<'_>, active: TensorId, de: usize) -> Result<TensorId> {
        self.moe_down_with(h, w, active, de, Target::Auto)
    }

    /// [`Graph::moe_down`] with the dense kernel's workgroup size chosen for `target` (tests and benches).
    pub fn moe_down_with(
        &mut self,
        h: TensorId,
        w: MoeWeight<'_>,
        active: TensorId,
        de: usize,
        target: Target,
    ) -> Result<TensorId> {
        let hs = self.shape(h).to_vec();
        let bad = |why: String| Error::shape("moe_down", format!("h {hs:?}, de {de}: {why}"));
        let Some(&k) = hs.last() else {
            return Err(bad("h needs a last dim".into()));
        };
        if de == 0 || !de.is_multiple_of(DE_ALIGN) || !k.is_multiple_of(de) {
            return Err(bad(format!(
                "de must be a positive multiple of {DE_ALIGN} dividing h's last dim"
            )));
        }
        let (m, experts) = (hs[..hs.len() - 1].iter().product::<usize>(), k / de);
        if m == 0 || experts == 0 || experts > MAX_EXPERTS {
            return Err(bad(format!("empty, or more than {MAX_EXPERTS} experts")));
        }
        if self.dtype(h) != DType::F32 {
            return Err(bad("h must be f32".into()));
        }
        check_active(self, "moe_down", active, experts)?;
        let hidden = match w {
            MoeWeight::Dense(t) => self.shape(t).first().copied().unwrap_or(0),
            MoeWeight::Quant(pw) => pw.n,
        };
        if hidden == 0 || m * k > u32::MAX as usize || m * hidden > u32::MAX as usize {
            return Err(bad(format!("hidden {hidden}: empty or too large for 32-bit indices")));
        }
        let bound = bind_weight(self, "moe_down", w, hidden, k)?;
        let kernel = MoeDown {
            node: ExpertNode::new("moe_down", m, (de, experts), &bound, target)?,
            hidden,
        };
        let mut inputs = vec![h];
        inputs.extend(&bound.inputs);
        inputs.push(active);
        let mut out = hs.clone();
        *out.last_mut().expect("h has a last dim") = hidden;
        Ok(self.add_node(kernel, &inputs, &[("moe_down", &out, DType::F32)])?[0])
    }
}

/// CPU reference in f64: `h` [m, E*de], `w` [hidden, E*de] (dequantized or rounded to f16), `experts` the active
/// list → `y` [m, hidden] summed over the listed experts' column blocks.
pub fn reference(h: &[f32], w: &[f32], experts: &[u32], m: usize, hidden: usize, de: usize) -> Vec<f32> {
    let k = w.len() / hidden;
    let mut y = vec![0f32; m * hidden];
    for t in 0..m {
        for o in 0..hidden {
            let mut s = 0f64;
            for &e in experts {
                let c = e as usize * de;
                for j in c..c + de {
                    s += h[t * k + j] as f64 * w[o * k + j] as f64;
                }
            }
            y[t * hidden + o] = s as f32;
        }
    }
    y
}

/// Every shader variant of the sparse down projection.
pub fn variants() -> Vec<ShaderKey> {
    all_keys("down")
}
