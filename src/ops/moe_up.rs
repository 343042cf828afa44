//! BlockFFN sparse up projection (Song et al. 2025, arXiv 2507.08771): for the experts in the active list only,
//! `h[m, e*de + j] = silu(x[m] . Wup[e*de + j]) * r[m, e]`, SiLU and the router weight fused. Columns of experts
//! outside the list are not written ([`super::moe_down`] never reads them). Weights: see [`super::moe_common`].

use super::moe_common::{
    bind_weight, check_active, silu, variants as all_keys, wg_dense_up, ExpertNode, MoeWeight, Target, WeightKind,
    DE_ALIGN, MAX_EXPERTS,
};
use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};
use crate::quant::pack::{Layout, TILE};

/// Rows per workgroup of the rows-layout kernel.
const ROWS_PER_GROUP: usize = 4;

#[derive(Debug)]
pub struct MoeUp {
    node: ExpertNode,
    /// hidden (K).
    k: usize,
}

impl MoeUp {
    /// Workgroups covering all experts (those past the active count return at once).
    fn groups(&self, caps: &Caps) -> usize {
        let n = &self.node;
        match n.kind {
            WeightKind::Dense(_) => n.width() / (4 * wg_dense_up(caps, n.target, n.de)),
            WeightKind::Quant(_, Layout::Tiled) => n.width() / TILE,
            WeightKind::Quant(_, Layout::Rows) => n.width() / ROWS_PER_GROUP,
        }
    }
}

impl Kernel for MoeUp {
    fn name(&self) -> &'static str {
        "moe_up"
    }
    /// Node tensors: x, the weight's bindings, r, active, then h.
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        let n = &self.node;
        let wg = wg_dense_up(caps, n.target, n.de);
        n.dispatch("up", caps, wg, self.groups(caps), n.weight_inputs + 4)
    }
    fn params(&self, _: usize, _: &StepVars) -> Params {
        let n = &self.node;
        let per_expert = match n.kind {
            // The dense shader derives it from its workgroup size.
            WeightKind::Dense(_) => 0,
            WeightKind::Quant(_, Layout::Tiled) => n.de / TILE,
            WeightKind::Quant(_, Layout::Rows) => n.de / ROWS_PER_GROUP,
        };
        n.params(n.width(), self.k, per_expert)
    }
    /// The cost with every expert active (an upper bound: the real share is known only on the device).
    fn cost(&self) -> Cost {
        let (m, k, n) = (self.node.m as u64, self.k as u64, self.node.width() as u64);
        Cost {
            bytes_read: self.node.wbytes + 4 * m * k + 4 * m * self.node.experts as u64,
            bytes_written: 4 * m * n,
            flops: 2 * m * n * k + 6 * m * n,
        }
    }
    /// Only the listed experts' columns are written, so only they are compared.
    fn reference(&self, io: &[HostIo], _: &StepVars) -> Option<Result<Vec<Expected>>> {
        let (n, nw) = (&self.node, self.node.weight_inputs);
        expect(|| {
            let (w, listed) = n.host(io, (n.width(), self.k), nw + 2)?;
            let h = reference(&io[0].f32()?, &w, &io[nw + 1].f32()?, n.m, self.k, n.de);
            let mut written = vec![false; n.width()];
            for &e in &listed {
                written[e as usize * n.de..][..n.de].fill(true);
            }
            Ok(vec![Expected::only(nw + 3, h, written.repeat(n.m))])
        })
    }
    /// The op tests' bound: f32 dot products, SiLU and the router weight (reason in tests/ops/moe_up.rs).
    fn check_bound(&self, _: &Caps) -> f64 {
        1e-9
    }
}

impl Graph {
    /// BlockFFN's sparse up projection: `x` [.., hidden] f32, `w` the up weight `[E*de, hidden]`, `r` [.., E] f32
    /// router weights, `active` u32 `[1 + E]` (from [`Graph::moe_route`]) → `h` [.., E*de] f32, written only in the
    /// active experts' columns.
    pub fn moe_up(
        &mut self,
        x: TensorId,
        w: MoeWeight<'_>,
        r: TensorId,
        active: TensorId,
        de: usize,
    ) -> Result<TensorId> {
        self.moe_up_with(x, w, r, active, de, Target::Auto)
    }

    /// [`Graph::moe_up`] with the dense kernel's workgroup size chosen for `target` (tests and benches).
    pub fn moe_up_with(
        &mut self,
        x: TensorId,
        w: MoeWeight<'_>,
        r: TensorId,
        active: TensorId,
        de: usize,
        target: Target,
    ) -> Result<TensorId> {
        let (xs, rs) = (self.shape(x).to_vec(), self.shape(r).to_vec());
        let bad = |why: String| Error::shape("moe_up", format!("x {xs:?}, r {rs:?}, de {de}: {why}"));
        let (Some(&k), Some(&experts)) = (xs.last(), rs.last()) else {
            return Err(bad("x and r need a last dim".into()));
        };
        let m = xs[..xs.len() - 1].iter().product::<usize>();
        if m == 0 || k == 0 || experts == 0 || rs.iter().product::<usize>() != m * experts {
            return Err(bad("empty, or r is not [tokens, E]".into()));
        }
        if de == 0 || !de.is_multiple_of(DE_ALIGN) || experts > MAX_EXPERTS {
            return Err(bad(format!(
                "de must be a positive multiple of {DE_ALIGN}, E at most {MAX_EXPERTS}"
            )));
        }
        if self.dtype(x) != DType::F32 || self.dtype(r) != DType::F32 {
            return Err(bad("x and r must be f32".into()));
        }
        if m * k > u32::MAX as usize || m * experts * de > u32::MAX as usize {
            return Err(bad("too large for 32-bit indices".into()));
        }
        check_active(self, "moe_up", active, experts)?;
        let bound = bind_weight(self, "moe_up", w, experts * de, k)?;
        let kernel = MoeUp {
            node: ExpertNode::new("moe_up", m, (de, experts), &bound, target)?,
            k,
        };
        let mut inputs = vec![x];
        inputs.extend(&bound.inputs);
        inputs.extend([r, active]);
        let mut out = xs.clone();
        *out.last_mut().expect("x has a last dim") = experts * de;
        Ok(self.add_node(kernel, &inputs, &[("moe_up", &out, DType::F32)])?[0])
    }
}

/// CPU reference in f64 of the dense definition over all experts: `x` [m, k], `w` [E*de, k] (dequantized or rounded
/// to f16 as the device holds it), `r` [m, E] → `h` [m, E*de] = silu(x . w) * r (zero where r is zero).
pub fn reference(x: &[f32], w: &[f32], r: &[f32], m: usize, k: usize, de: usize) -> Vec<f32> {
    let n = w.len() / k;
    let experts = n / de;
    let mut h = vec![0f32; m * n];
    for t in 0..m {
        let xr = &x[t * k..(t + 1) * k];
        for row in 0..n {
            let rv = r[t * experts + row / de] as f64;
            if rv == 0.0 {
                continue;
            }
            let s: f64 = xr
                .iter()
                .zip(&w[row * k..(row + 1) * k])
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum();
            h[t * n + row] = (silu(s) * rv) as f32;
        }
    }
    h
}

/// Every shader variant of the sparse up projection.
pub fn variants() -> Vec<ShaderKey> {
    all_keys("up")
}
