//! The elementwise step of BlockFFN's dense fallback: `h[m, e*de + j] = silu(u[m, e*de + j]) * r[m, e]` over the
//! output `u` of a dense up matmul over all experts (see [`super::moe_ffn`]).

use super::moe_common::silu;
use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{grid, Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct MoeActParams {
    units: u32,
    de4: u32,
}

#[derive(Debug)]
pub struct MoeAct {
    /// Elements of u (and h).
    n: usize,
    de: usize,
}

impl Kernel for MoeAct {
    fn name(&self) -> &'static str {
        "moe_act"
    }
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        vec![Dispatch {
            shader: ShaderKey::new("moe_act"),
            bindings: (0..3).map(Bind::Tensor).collect(),
            workgroups: grid(self.n / 4, 256, caps.max_workgroups_per_dim),
        }]
    }
    fn params(&self, _: usize, _: &StepVars) -> Params {
        Params::of(&MoeActParams {
            units: (self.n / 4) as u32,
            de4: (self.de / 4) as u32,
        })
    }
    fn cost(&self) -> Cost {
        let n = self.n as u64;
        Cost {
            bytes_read: 4 * n + 4 * n / self.de as u64,
            bytes_written: 4 * n,
            flops: 5 * n,
        }
    }
    fn reference(&self, io: &[HostIo], _: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| Ok(vec![Expected::at(2, reference(&io[0].f32()?, &io[1].f32()?, self.de))]))
    }
}

impl Graph {
    /// `silu(u) * r` per expert block: `u` [.., E*de] f32, `r` [.., E] f32 → `h` [.., E*de] f32 (de % 4 == 0).
    pub fn moe_act(&mut self, u: TensorId, r: TensorId, de: usize) -> Result<TensorId> {
        let (us, rs) = (self.shape(u).to_vec(), self.shape(r).to_vec());
        let n = us.iter().product::<usize>();
        let bad = || Error::shape("moe_act", format!("u {us:?}, r {rs:?}, de {de}"));
        let Some(&cols) = us.last() else {
            return Err(bad());
        };
        if de == 0 || !de.is_multiple_of(4) || !cols.is_multiple_of(de) || n == 0 || n > u32::MAX as usize {
            return Err(bad());
        }
        if rs.iter().product::<usize>() != n / de || self.dtype(u) != DType::F32 || self.dtype(r) != DType::F32 {
            return Err(bad());
        }
        Ok(self.add_node(MoeAct { n, de }, &[u, r], &[("moe_act", &us, DType::F32)])?[0])
    }
}

/// CPU reference in f64: `u` [m, E*de], `r` [m, E] → `h`.
pub fn reference(u: &[f32], r: &[f32], de: usize) -> Vec<f32> {
    u.iter()
        .enumerate()
        .map(|(i, &v)| (silu(v as f64) * r[i / de] as f64) as f32)
        .collect()
}

pub fn variants() -> Vec<ShaderKey> {
    vec![ShaderKey::new("moe_act")]
}
