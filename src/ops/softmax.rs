//! Softmax over the last dim of `scale * x`, numerically stable, one workgroup per row; or the row's log-sum-exp
//! alone (`logsumexp`: a row's log-probabilities are its values minus it).
//!
//! Special values: `-inf` entries (masks) give exactly 0; a row with no entry above `-inf` (fully masked) gives all
//! zeros rather than 0/0; a NaN, or a `+inf` in `scale * x`, makes the whole row NaN (on IEEE adapters: WGSL lets
//! an implementation assume there are no NaNs or infinities, and lavapipe does not). `scale = 0` with a `-inf`
//! entry is `0 * -inf = NaN`. Masks with `-inf` rely on IEEE infinities, which Vulkan, DX12 and GL keep; Metal
//! compiles with fast math by default, where a finite mask (e.g. -1e30) is the safer choice.

use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{grid, Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct SoftmaxParams {
    rows: u32,
    n: u32,
    scale: f32,
}

/// Workgroup size on CPU adapters: one 8-lane SIMD chunk of llvmpipe, so the reductions need no barrier between
/// chunks (coroutine switches there). Measured on lavapipe (contended), 16384 rows of 512: 36 ms at 8 lanes vs 207
/// at 256; one row of 128256: 0.51 vs 0.57 ms.
pub const WG_CPU: u32 = 8;
/// Workgroup size on GPUs.
pub const WG_GPU: u32 = 256;

fn key(wg: u32, subgroups: bool, vec4: bool, lse: bool) -> ShaderKey {
    ShaderKey::new("softmax")
        .def("WG", format!("{wg}u"))
        .flag("VEC4", vec4)
        .flag("SUBGROUPS", subgroups)
        .flag("LSE", lse)
}

#[derive(Debug)]
pub struct Softmax {
    rows: usize,
    n: usize,
    scale: f32,
    /// Forced workgroup size (else from the adapter type).
    wg: Option<u32>,
    /// Write each row's log-sum-exp `[rows]` instead of the softmax.
    lse: bool,
}

impl Kernel for Softmax {
    fn name(&self) -> &'static str {
        "softmax"
    }
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        let wg = self.wg.unwrap_or(if caps.cpu_adapter { WG_CPU } else { WG_GPU });
        vec![Dispatch {
            shader: key(wg, caps.subgroups, self.n.is_multiple_of(4), self.lse),
            bindings: vec![Bind::Tensor(0), Bind::Tensor(1)],
            workgroups: grid(self.rows, 1, caps.max_workgroups_per_dim),
        }]
    }
    fn params(&self, _: usize, _: &StepVars) -> Params {
        Params::of(&SoftmaxParams {
            rows: self.rows as u32,
            n: self.n as u32,
            scale: self.scale,
        })
    }
    fn cost(&self) -> Cost {
        let n = (self.rows * self.n) as u64;
        if self.lse {
            // One pass over x: scale, compare, exp and add per element.
            return Cost {
                bytes_read: 4 * n,
                bytes_written: 4 * self.rows as u64,
                flops: 4 * n,
            };
        }
        Cost {
            // x is read twice (statistics, then output): a vocabulary row (600 KiB) does not stay in cache.
            bytes_read: 8 * n,
            bytes_written: 4 * n,
            // Per element: scale, compare, exp and add in the first pass; scale, subtract, exp, multiply in the second.
            flops: 8 * n,
        }
    }
    fn reference(&self, io: &[HostIo], _: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| {
            let x = io[0].f32()?;
            let y = match self.lse {
                true => reference_lse(&x, self.n, self.scale),
                false => reference(&x, self.n, self.scale),
            };
            Ok(vec![Expected::at(1, y)])
        })
    }
}

impl Graph {
    /// Softmax of `scale * x` over the last dim of `x` [.., n] (f32).
    pub fn softmax(&mut self, x: TensorId, scale: f32) -> Result<TensorId> {
        self.softmax_impl(x, scale, None, false)
    }

    /// The log-sum-exp of each row of `x` [.., n] (f32): `[.., 1]`, `max + ln sum exp(x - max)`, so that a row's
    /// log-probabilities are `x - lse` (-inf for a row of -inf; NaN for a row holding a NaN or +inf).
    pub fn logsumexp(&mut self, x: TensorId) -> Result<TensorId> {
        self.softmax_impl(x, 1.0, None, true)
    }

    /// [`Graph::logsumexp`] with the workgroup size forced as [`Graph::softmax_with_workgroup`] forces it.
    pub fn logsumexp_with_workgroup(&mut self, x: TensorId, wg: u32) -> Result<TensorId> {
        if wg != WG_CPU && wg != WG_GPU {
            return Err(Error::Invalid(format!(
                "logsumexp: workgroup size {wg}, want {WG_CPU} or {WG_GPU}"
            )));
        }
        self.softmax_impl(x, 1.0, Some(wg), true)
    }

    /// [`Graph::softmax`] with the workgroup size forced to [`WG_CPU`] or [`WG_GPU`] whatever the adapter, so
    /// tests and benchmarks can run both layouts.
    pub fn softmax_with_workgroup(&mut self, x: TensorId, scale: f32, wg: u32) -> Result<TensorId> {
        if wg != WG_CPU && wg != WG_GPU {
            return Err(Error::Invalid(format!(
                "softmax: workgroup size {wg}, want {WG_CPU} or {WG_GPU}"
            )));
        }
        self.softmax_impl(x, scale, Some(wg), false)
    }

    fn softmax_impl(&mut self, x: TensorId, scale: f32, wg: Option<u32>, lse: bool) -> Result<TensorId> {
        let shape = self.shape(x).to_vec();
        let n = shape.last().copied().unwrap_or(0);
        let total: usize = shape.iter().product();
        if n == 0 || total == 0 || self.dtype(x) != DType::F32 || !scale.is_finite() {
            return Err(Error::shape(
                "softmax",
                format!(
                    "x {shape:?} {:?}, scale {scale}: want x [.., n] f32, n > 0, finite scale",
                    self.dtype(x)
                ),
            ));
        }
        let k = Softmax {
            rows: total / n,
            n,
            scale,
            wg,
            lse,
        };
        let mut out = shape.clone();
        if lse {
            *out.last_mut().expect("n > 0") = 1;
        }
        Ok(self.add_node(k, &[x], &[("softmax", &out, DType::F32)])?[0])
    }
}

/// CPU reference in f64 from `v = scale * x` rounded to f32 (as the shader forms it), with the special values of
/// the module doc.
pub fn reference(x: &[f32], n: usize, scale: f32) -> Vec<f32> {
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(n) {
        let v: Vec<f64> = row.iter().map(|&a| (scale * a) as f64).collect();
        if v.iter().any(|a| a.is_nan() || *a == f64::INFINITY) {
            y.extend(std::iter::repeat_n(f32::NAN, n));
            continue;
        }
        let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            y.extend(std::iter::repeat_n(0.0, n));
            continue;
        }
        let sum: f64 = v.iter().map(|a| (a - m).exp()).sum();
        y.extend(v.iter().map(|a| ((a - m).exp() / sum) as f32));
    }
    y
}

/// CPU reference of [`Graph::logsumexp`] in f64 from `v = scale * x` rounded to f32, with the module's special
/// values (-inf for a row of -inf, NaN for a row with a NaN or +inf).
pub fn reference_lse(x: &[f32], n: usize, scale: f32) -> Vec<f32> {
    x.chunks(n)
        .map(|row| {
            let v: Vec<f64> = row.iter().map(|&a| (scale * a) as f64).collect();
            if v.iter().any(|a| a.is_nan() || *a == f64::INFINITY) {
                return f32::NAN;
            }
            let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            if m == f64::NEG_INFINITY {
                return f32::NEG_INFINITY;
            }
            (m + v.iter().map(|a| (a - m).exp()).sum::<f64>().ln()) as f32
        })
        .collect()
}

pub fn variants() -> Vec<ShaderKey> {
    let mut v = Vec::new();
    for wg in [WG_CPU, WG_GPU] {
        for subgroups in [false, true] {
            for vec4 in [false, true] {
                for lse in [false, true] {
                    v.push(key(wg, subgroups, vec4, lse));
                }
            }
        }
    }
    v
}
