//! Residual add: `c = a + b`, elementwise over f32 tensors of one shape.

use super::{grid, Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::{Graph, TensorId};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct AddParams {
    n: u32,
}

#[derive(Debug)]
pub struct Add {
    n: usize,
}

impl Kernel for Add {
    fn name(&self) -> &'static str {
        "add"
    }
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        vec![Dispatch {
            shader: ShaderKey::new("add"),
            bindings: vec![Bind::Tensor(0), Bind::Tensor(1), Bind::Tensor(2)],
            workgroups: grid(self.n, 256, caps.max_workgroups_per_dim),
        }]
    }
    fn params(&self, _: usize, _: &StepVars) -> Params {
        Params::of(&AddParams { n: self.n as u32 })
    }
    fn cost(&self) -> Cost {
        Cost {
            bytes_read: 8 * self.n as u64,
            bytes_written: 4 * self.n as u64,
            flops: self.n as u64,
        }
    }
}

impl Graph {
    /// `a + b` (same shape, f32).
    pub fn add(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let shape = self.shape(a).to_vec();
        if shape != self.shape(b) || self.dtype(a) != DType::F32 || self.dtype(b) != DType::F32 {
            return Err(Error::shape("add", format!("{shape:?} + {:?}", self.shape(b))));
        }
        let n = shape.iter().product();
        Ok(self.add_node(Add { n }, &[a, b], &[("add", &shape, DType::F32)])?[0])
    }
}

/// CPU reference.
pub fn reference(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

pub fn variants() -> Vec<ShaderKey> {
    vec![ShaderKey::new("add")]
}
