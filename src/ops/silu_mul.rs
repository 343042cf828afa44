//! Gated FFN activation: `silu(gate) * up` (SwiGLU) or `gelu_tanh(gate) * up` (GeGLU, Gemma), elementwise over f32
//! tensors of one shape.

use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{grid, Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct SiluMulParams {
    units: u32,
    row_units: u32,
}

/// The gate's activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Glu {
    Silu,
    /// GELU with the tanh approximation (`gelu_pytorch_tanh`).
    GeluTanh,
}

fn key(vec4: bool, fused: bool, act: Glu) -> ShaderKey {
    ShaderKey::new("silu_mul")
        .flag("VEC4", vec4)
        .flag("FUSED", fused)
        .flag("GELU", act == Glu::GeluTanh)
}

#[derive(Debug)]
pub struct SiluMul {
    /// Output elements.
    n: usize,
    /// Fused input `[rows, 2F]`: F, the output row length (gate and up side by side).
    fused_f: Option<usize>,
    act: Glu,
}

impl SiluMul {
    /// vec4 units when n (and a fused row) allows: a quarter of the invocations, and 16-byte loads.
    fn vec4(&self) -> bool {
        self.n.is_multiple_of(4) && self.fused_f.is_none_or(|f| f.is_multiple_of(4))
    }
    fn units(&self) -> usize {
        if self.vec4() {
            self.n / 4
        } else {
            self.n
        }
    }
}

impl Kernel for SiluMul {
    fn name(&self) -> &'static str {
        "silu_mul"
    }
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        vec![Dispatch {
            shader: key(self.vec4(), self.fused_f.is_some(), self.act),
            bindings: (0..if self.fused_f.is_some() { 2 } else { 3 })
                .map(Bind::Tensor)
                .collect(),
            workgroups: grid(self.units(), 256, caps.max_workgroups_per_dim),
        }]
    }
    fn params(&self, _: usize, _: &StepVars) -> Params {
        let per_unit = if self.vec4() { 4 } else { 1 };
        Params::of(&SiluMulParams {
            units: self.units() as u32,
            row_units: (self.fused_f.unwrap_or(0) / per_unit) as u32,
        })
    }
    fn cost(&self) -> Cost {
        Cost {
            bytes_read: 8 * self.n as u64,
            bytes_written: 4 * self.n as u64,
            // negate, exp, add, divide, multiply
            flops: 5 * self.n as u64,
        }
    }
    /// Node tensors: gate, up, out; or gu `[.., 2F]`, out.
    fn reference(&self, io: &[HostIo], _: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| {
            let Some(f) = self.fused_f else {
                return Ok(vec![Expected::at(
                    2,
                    reference_act(&io[0].f32()?, &io[1].f32()?, self.act),
                )]);
            };
            let gu = io[0].f32()?;
            let gate: Vec<f32> = gu.chunks(2 * f).flat_map(|r| r[..f].to_vec()).collect();
            let up: Vec<f32> = gu.chunks(2 * f).flat_map(|r| r[f..].to_vec()).collect();
            Ok(vec![Expected::at(1, reference_act(&gate, &up, self.act))])
        })
    }
}

impl Graph {
    /// `silu(gate) * up` (same shape, f32).
    pub fn silu_mul(&mut self, gate: TensorId, up: TensorId) -> Result<TensorId> {
        self.glu(gate, up, Glu::Silu)
    }

    /// `act(gate) * up` (same shape, f32).
    pub fn glu(&mut self, gate: TensorId, up: TensorId, act: Glu) -> Result<TensorId> {
        let shape = self.shape(gate).to_vec();
        let n: usize = shape.iter().product();
        if shape != self.shape(up) || n == 0 || self.dtype(gate) != DType::F32 || self.dtype(up) != DType::F32 {
            return Err(Error::shape(
                "silu_mul",
                format!(
                    "gate {shape:?} {:?}, up {:?} {:?}: want one non-empty shape, f32",
                    self.dtype(gate),
                    self.shape(up),
                    self.dtype(up)
                ),
            ));
        }
        Ok(self.add_node(
            SiluMul { n, fused_f: None, act },
            &[gate, up],
            &[("silu_mul", &shape, DType::F32)],
        )?[0])
    }

    /// `silu(gate) * up` where `gu` `[.., 2F]` holds gate then up in each row (one matmul over the
    /// concatenated weights); returns `[.., F]`.
    pub fn silu_mul_fused(&mut self, gu: TensorId) -> Result<TensorId> {
        self.glu_fused(gu, Glu::Silu)
    }

    /// `act(gate) * up` where `gu` `[.., 2F]` holds gate then up in each row; returns `[.., F]`.
    pub fn glu_fused(&mut self, gu: TensorId, act: Glu) -> Result<TensorId> {
        let shape = self.shape(gu).to_vec();
        let two_f = shape.last().copied().unwrap_or(0);
        if two_f == 0 || !two_f.is_multiple_of(2) || self.dtype(gu) != DType::F32 {
            return Err(Error::shape("silu_mul", format!("gu {shape:?}: want f32 [.., 2F]")));
        }
        let mut out = shape.clone();
        *out.last_mut().expect("non-empty") = two_f / 2;
        let n = out.iter().product();
        let k = SiluMul {
            n,
            fused_f: Some(two_f / 2),
            act,
        };
        Ok(self.add_node(k, &[gu], &[("silu_mul", &out, DType::F32)])?[0])
    }
}

/// The shader flags of a matmul's GLU epilogue (`lib/store_rows.wgsl`): `GLU`, and `GELU` for GeGLU.
pub fn epilogue_flags(key: ShaderKey, glu: Option<Glu>) -> ShaderKey {
    key.flag("GLU", glu.is_some()).flag("GELU", glu == Some(Glu::GeluTanh))
}

/// CPU reference of a GLU epilogue: `y` `[.., 2F]` holds (gate, up) pairs side by side (a matmul over rows of gate
/// and up interleaved); returns `act(gate) * up` `[.., F]`.
pub fn reference_paired(y: &[f32], act: Glu) -> Vec<f32> {
    let gate: Vec<f32> = y.iter().step_by(2).copied().collect();
    let up: Vec<f32> = y.iter().skip(1).step_by(2).copied().collect();
    reference_act(&gate, &up, act)
}

/// CPU reference in f64.
pub fn reference(gate: &[f32], up: &[f32]) -> Vec<f32> {
    reference_act(gate, up, Glu::Silu)
}

/// CPU reference in f64 of `act(gate) * up`; GELU through tanh as its definition writes it.
pub fn reference_act(gate: &[f32], up: &[f32], act: Glu) -> Vec<f32> {
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| {
            let g = g as f64;
            let a = match act {
                Glu::Silu => g / (1.0 + (-g).exp()),
                Glu::GeluTanh => {
                    0.5 * g * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g)).tanh())
                }
            };
            (a * u as f64) as f32
        })
        .collect()
}

pub fn variants() -> Vec<ShaderKey> {
    let mut v = Vec::new();
    for act in [Glu::Silu, Glu::GeluTanh] {
        for (vec4, fused) in [(false, false), (true, false), (false, true), (true, true)] {
            v.push(key(vec4, fused, act));
        }
    }
    v
}
