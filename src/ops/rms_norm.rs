//! RMSNorm: `y = x / sqrt(mean(x^2) + eps) * weight` over the last dim, one workgroup per row (optionally after a
//! residual add, whose branch may be RMSNorm'ed first).

use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{grid, Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct RmsNormParams {
    rows: u32,
    d: u32,
    eps: f32,
    /// Residual scale: `h = x + alpha * r`.
    alpha: f32,
}

/// Workgroup size on CPU adapters: one 8-lane SIMD chunk of llvmpipe, so the reduction needs no barrier between
/// chunks (coroutine switches there). Measured on lavapipe (contended): 512 rows of 576, 2.3 ms at 8 lanes vs 5.4
/// at 256 (scalar loads); 512 rows of 4096 with vec4 loads, within noise (10.9 vs 10.3 ms).
pub const WG_CPU: u32 = 8;
/// Workgroup size on GPUs.
pub const WG_GPU: u32 = 256;

fn key(wg: u32, subgroups: bool, vec4: bool, residual: bool, post: bool) -> ShaderKey {
    ShaderKey::new("rms_norm")
        .def("WG", format!("{wg}u"))
        .flag("VEC4", vec4)
        .flag("SUBGROUPS", subgroups)
        .flag("RESIDUAL", residual)
        .flag("POST", post)
}

#[derive(Debug)]
pub struct RmsNorm {
    rows: usize,
    d: usize,
    eps: f32,
    /// Forced workgroup size (else from the adapter type).
    wg: Option<u32>,
    /// Fused residual add: inputs x, r, weight; outputs y, h = x + alpha * r.
    residual: bool,
    alpha: f32,
    /// With `residual`, r is RMSNorm'ed first with its own weight (a fourth input): h = x + alpha * rms_norm(r).
    post: bool,
}

impl Kernel for RmsNorm {
    fn name(&self) -> &'static str {
        "rms_norm"
    }
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        let wg = self.wg.unwrap_or(if caps.cpu_adapter { WG_CPU } else { WG_GPU });
        vec![Dispatch {
            shader: key(wg, caps.subgroups, self.d.is_multiple_of(4), self.residual, self.post),
            bindings: (0..3 + 2 * usize::from(self.residual) + usize::from(self.post)).map(Bind::Tensor).collect(),
            workgroups: grid(self.rows, 1, caps.max_workgroups_per_dim),
        }]
    }
    fn params(&self, _: usize, _: &StepVars) -> Params {
        Params::of(&RmsNormParams {
            rows: self.rows as u32,
            d: self.d as u32,
            eps: self.eps,
            alpha: self.alpha,
        })
    }
    fn cost(&self) -> Cost {
        let n = (self.rows * self.d) as u64;
        let streams = if self.residual { 2 } else { 1 };
        let post = u64::from(self.post);
        Cost {
            // Unique bytes: the second pass over a row (at most 32 KiB) reads it again from cache.
            bytes_read: 4 * (streams * n + (1 + post) * self.d as u64),
            bytes_written: 4 * streams * n,
            flops: (3 + streams + 4 * post) * n,
        }
    }
    /// Node tensors: x, weight, y; or x, r, weight, y, h = x + alpha r; or (post) x, r, weight, rw, y, h = x +
    /// alpha rms_norm(r, rw).
    fn reference(&self, io: &[HostIo], _: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| {
            let x = io[0].f32()?;
            if !self.residual {
                return Ok(vec![Expected::at(2, reference(&x, &io[1].f32()?, self.eps))]);
            }
            let r = match self.post {
                true => reference(&io[1].f32()?, &io[3].f32()?, self.eps),
                false => io[1].f32()?,
            };
            let h = super::add::reference(&x, &r, self.alpha);
            let y = reference(&h, &io[2].f32()?, self.eps);
            let at = 3 + usize::from(self.post);
            Ok(vec![Expected::at(at, y), Expected::at(at + 1, h)])
        })
    }
}

impl Graph {
    /// RMSNorm of `x` [.., d] (f32) with `weight` [d] (f32): `x / sqrt(mean(x^2) + eps) * weight`.
    pub fn rms_norm(&mut self, x: TensorId, weight: TensorId, eps: f32) -> Result<TensorId> {
        self.rms_norm_impl(x, None, weight, eps, None, None).map(|o| o[0])
    }

    /// `h = x + r` (the residual add) and `rms_norm(h)` in one dispatch; returns `(h, normed)`.
    pub fn add_rms_norm(
        &mut self,
        x: TensorId,
        r: TensorId,
        weight: TensorId,
        eps: f32,
    ) -> Result<(TensorId, TensorId)> {
        self.add_scaled_rms_norm(x, r, 1.0, weight, eps)
    }

    /// [`Graph::add_rms_norm`] with a scaled residual branch: `h = x + alpha * r` (MiniCPM's depth scaling).
    pub fn add_scaled_rms_norm(
        &mut self,
        x: TensorId,
        r: TensorId,
        alpha: f32,
        weight: TensorId,
        eps: f32,
    ) -> Result<(TensorId, TensorId)> {
        self.check_branch("add_rms_norm", x, r, alpha)?;
        let o = self.rms_norm_impl(x, Some((r, alpha)), weight, eps, None, None)?;
        Ok((o[1], o[0]))
    }

    /// [`Graph::add_scaled_rms_norm`] whose branch `r` is RMSNorm'ed first with its own weight `r_weight` (Gemma's
    /// post-norms): `h = x + alpha * rms_norm(r, r_weight)`, returns `(h, rms_norm(h, weight))`, in one dispatch,
    /// bit for bit `rms_norm` then `add_scaled_rms_norm`.
    pub fn add_post_rms_norm(
        &mut self,
        x: TensorId,
        (r, r_weight): (TensorId, TensorId),
        alpha: f32,
        weight: TensorId,
        eps: f32,
    ) -> Result<(TensorId, TensorId)> {
        self.check_branch("add_post_rms_norm", x, r, alpha)?;
        if self.shape(r_weight) != self.shape(weight) || self.dtype(r_weight) != DType::F32 {
            return Err(Error::shape(
                "add_post_rms_norm",
                format!("r's norm weight {:?}, want f32 {:?}", self.shape(r_weight), self.shape(weight)),
            ));
        }
        let o = self.rms_norm_impl(x, Some((r, alpha)), weight, eps, None, Some(r_weight))?;
        Ok((o[1], o[0]))
    }

    /// A residual branch `r` must be f32 of `x`'s shape, its scale finite.
    fn check_branch(&self, op: &'static str, x: TensorId, r: TensorId, alpha: f32) -> Result<()> {
        if self.shape(r) != self.shape(x) || self.dtype(r) != DType::F32 || !alpha.is_finite() {
            return Err(Error::shape(
                op,
                format!("x {:?} + r {:?} {:?}, alpha {alpha}", self.shape(x), self.shape(r), self.dtype(r)),
            ));
        }
        Ok(())
    }

    /// [`Graph::rms_norm`] with the workgroup size forced to [`WG_CPU`] or [`WG_GPU`] whatever the adapter, so
    /// tests and benchmarks can run both layouts.
    pub fn rms_norm_with_workgroup(&mut self, x: TensorId, weight: TensorId, eps: f32, wg: u32) -> Result<TensorId> {
        if wg != WG_CPU && wg != WG_GPU {
            return Err(Error::Invalid(format!(
                "rms_norm: workgroup size {wg}, want {WG_CPU} or {WG_GPU}"
            )));
        }
        self.rms_norm_impl(x, None, weight, eps, Some(wg), None).map(|o| o[0])
    }

    fn rms_norm_impl(
        &mut self,
        x: TensorId,
        r: Option<(TensorId, f32)>,
        weight: TensorId,
        eps: f32,
        wg: Option<u32>,
        r_weight: Option<TensorId>,
    ) -> Result<Vec<TensorId>> {
        let shape = self.shape(x).to_vec();
        let d = shape.last().copied().unwrap_or(0);
        let n: usize = shape.iter().product();
        if d == 0
            || n == 0
            || self.shape(weight) != [d]
            || self.dtype(x) != DType::F32
            || self.dtype(weight) != DType::F32
            || !eps.is_finite()
            || eps < 0.0
        {
            return Err(Error::shape(
                "rms_norm",
                format!(
                    "x {shape:?} {:?}, weight {:?} {:?}, eps {eps}: want x [.., d] f32, weight [d] f32, eps >= 0",
                    self.dtype(x),
                    self.shape(weight),
                    self.dtype(weight)
                ),
            ));
        }
        let k = RmsNorm {
            rows: n / d,
            d,
            eps,
            wg,
            residual: r.is_some(),
            alpha: r.map_or(1.0, |r| r.1),
            post: r_weight.is_some(),
        };
        match r {
            None => self.add_node(k, &[x, weight], &[("rms_norm", &shape, DType::F32)]),
            Some((r, _)) => {
                let mut inputs = vec![x, r, weight];
                inputs.extend(r_weight);
                self.add_node(
                    k,
                    &inputs,
                    &[("rms_norm", &shape, DType::F32), ("residual", &shape, DType::F32)],
                )
            }
        }
    }
}

/// CPU reference: the sum of squares in f64, then the HF order `(x * r) * weight`.
pub fn reference(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let d = weight.len();
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(d) {
        let ss: f64 = row.iter().map(|&v| v as f64 * v as f64).sum();
        let r = 1.0 / (ss / d as f64 + eps as f64).sqrt();
        y.extend(row.iter().zip(weight).map(|(&v, &w)| (v as f64 * r * w as f64) as f32));
    }
    y
}

pub fn variants() -> Vec<ShaderKey> {
    let mut v = Vec::new();
    for wg in [WG_CPU, WG_GPU] {
        for subgroups in [false, true] {
            for vec4 in [false, true] {
                for (residual, post) in [(false, false), (true, false), (true, true)] {
                    v.push(key(wg, subgroups, vec4, residual, post));
                }
            }
        }
    }
    v
}
