//! Row slice: `y = x[start..start+count]` along the first dimension (f32), a copy.

use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{grid, Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct RowsParams {
    start: u32,
    count: u32,
    d: u32,
}

#[derive(Debug)]
pub struct Rows {
    start: usize,
    count: usize,
    d: usize,
}

impl Kernel for Rows {
    fn name(&self) -> &'static str {
        "rows"
    }
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        vec![Dispatch {
            shader: ShaderKey::new("rows"),
            bindings: vec![Bind::Tensor(0), Bind::Tensor(1)],
            workgroups: grid(self.count * self.d, 256, caps.max_workgroups_per_dim),
        }]
    }
    fn params(&self, _: usize, _: &StepVars) -> Params {
        Params::of(&RowsParams {
            start: self.start as u32,
            count: self.count as u32,
            d: self.d as u32,
        })
    }
    fn cost(&self) -> Cost {
        let bytes = 4 * (self.count * self.d) as u64;
        Cost {
            bytes_read: bytes,
            bytes_written: bytes,
            flops: 0,
        }
    }
    fn reference(&self, io: &[HostIo], _: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| {
            Ok(vec![Expected::at(
                1,
                reference(&io[0].f32()?, self.d, self.start, self.count),
            )])
        })
    }
    fn check_bound(&self, _: &Caps) -> f64 {
        0.0
    }
}

impl Graph {
    /// Rows `start..start+count` of `x` (`[m, ..]` f32); trailing dims are kept.
    pub fn rows(&mut self, x: TensorId, start: usize, count: usize) -> Result<TensorId> {
        let shape = self.shape(x).to_vec();
        let m = shape.first().copied().unwrap_or(0);
        if self.dtype(x) != DType::F32 || count == 0 || start + count > m {
            return Err(Error::shape(
                "rows",
                format!("rows {start}..{} of {shape:?}", start + count),
            ));
        }
        let d = shape[1..].iter().product();
        let mut out = shape.clone();
        out[0] = count;
        Ok(self.add_node(Rows { start, count, d }, &[x], &[("rows", &out, DType::F32)])?[0])
    }
}

/// CPU reference.
pub fn reference(x: &[f32], d: usize, start: usize, count: usize) -> Vec<f32> {
    x[start * d..(start + count) * d].to_vec()
}

pub fn variants() -> Vec<ShaderKey> {
    vec![ShaderKey::new("rows")]
}
