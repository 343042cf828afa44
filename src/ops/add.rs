//! Residual add `c = a + alpha * b` (alpha = 1 but for MiniCPM's depth scaling) and scaling `c = alpha * a`,
//! elementwise over f32 tensors of one shape.

use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{grid, Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct AddParams {
    n: u32,
    alpha: f32,
}

fn key(scale: bool) -> ShaderKey {
    ShaderKey::new("add").flag("SCALE", scale)
}

#[derive(Debug)]
pub struct Add {
    n: usize,
    alpha: f32,
    /// One input: `c = alpha * a`.
    scale: bool,
}

impl Kernel for Add {
    fn name(&self) -> &'static str {
        "add"
    }
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        vec![Dispatch {
            shader: key(self.scale),
            bindings: (0..if self.scale { 2 } else { 3 }).map(Bind::Tensor).collect(),
            workgroups: grid(self.n, 256, caps.max_workgroups_per_dim),
        }]
    }
    fn params(&self, _: usize, _: &StepVars) -> Params {
        Params::of(&AddParams {
            n: self.n as u32,
            alpha: self.alpha,
        })
    }
    fn cost(&self) -> Cost {
        let inputs = if self.scale { 1 } else { 2 };
        Cost {
            bytes_read: 4 * inputs * self.n as u64,
            bytes_written: 4 * self.n as u64,
            flops: inputs * self.n as u64,
        }
    }
    fn reference(&self, io: &[HostIo], _: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| {
            let a = io[0].f32()?;
            Ok(vec![if self.scale {
                Expected::at(1, a.iter().map(|&x| (self.alpha as f64 * x as f64) as f32).collect())
            } else {
                Expected::at(2, reference(&a, &io[1].f32()?, self.alpha))
            }])
        })
    }
}

impl Graph {
    /// `a + b` (same shape, f32).
    pub fn add(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.add_scaled(a, b, 1.0)
    }

    /// `a + alpha * b` (same shape, f32).
    pub fn add_scaled(&mut self, a: TensorId, b: TensorId, alpha: f32) -> Result<TensorId> {
        let shape = self.shape(a).to_vec();
        if shape != self.shape(b) || self.dtype(a) != DType::F32 || self.dtype(b) != DType::F32 || !alpha.is_finite() {
            return Err(Error::shape(
                "add",
                format!("{shape:?} + {alpha} * {:?}", self.shape(b)),
            ));
        }
        let n = shape.iter().product();
        let k = Add { n, alpha, scale: false };
        Ok(self.add_node(k, &[a, b], &[("add", &shape, DType::F32)])?[0])
    }

    /// `alpha * a` (f32).
    pub fn scale(&mut self, a: TensorId, alpha: f32) -> Result<TensorId> {
        let shape = self.shape(a).to_vec();
        if self.dtype(a) != DType::F32 || !alpha.is_finite() {
            return Err(Error::shape(
                "scale",
                format!("{alpha} * {shape:?} {:?}", self.dtype(a)),
            ));
        }
        let n = shape.iter().product();
        let k = Add { n, alpha, scale: true };
        Ok(self.add_node(k, &[a], &[("scale", &shape, DType::F32)])?[0])
    }
}

/// CPU reference: `a + alpha * b` in f64, rounded once (with alpha = 1 it is the IEEE f32 sum, bit for bit).
pub fn reference(a: &[f32], b: &[f32], alpha: f32) -> Vec<f32> {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 + alpha as f64 * y as f64) as f32)
        .collect()
}

pub fn variants() -> Vec<ShaderKey> {
    vec![key(false), key(true)]
}
