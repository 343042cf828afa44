//! Partial sums of an f32 tensor read as vec4s: a plain streaming read, the memory-read ceiling that the
//! weight-streaming kernels are measured against (benches), with a result a test can check.

use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::{grid, Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};

/// Workgroup size on CPU adapters: one 8-lane llvmpipe SIMD chunk, so the final sum needs no barrier between chunks.
pub const WG_CPU: usize = 8;
/// Workgroup size on GPUs.
pub const WG_GPU: usize = 256;
/// `span` (vec4s per partial) must be a multiple of this: both workgroup sizes divide it, leaving whole groups of 4
/// vec4s (the kernel's unrolled step) per invocation.
pub const SPAN_GRANULE: usize = 4 * WG_GPU;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ReadSumParams {
    nv: u32,
    span: u32,
    groups: u32,
}

fn key(wg: usize, subgroups: bool) -> ShaderKey {
    ShaderKey::new("read_sum")
        .def("WG", format!("{wg}u"))
        .flag("SUBGROUPS", subgroups)
}

#[derive(Debug)]
pub struct ReadSum {
    /// vec4s of x.
    nv: usize,
    /// vec4s per partial sum.
    span: usize,
    /// Forced workgroup size (else from the adapter type).
    wg: Option<usize>,
}

impl ReadSum {
    fn groups(&self) -> usize {
        self.nv.div_ceil(self.span)
    }
    fn wg(&self, caps: &Caps) -> usize {
        self.wg.unwrap_or(if caps.cpu_adapter { WG_CPU } else { WG_GPU })
    }
}

impl Kernel for ReadSum {
    fn name(&self) -> &'static str {
        "read_sum"
    }
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        vec![Dispatch {
            shader: key(self.wg(caps), caps.subgroups),
            bindings: vec![Bind::Tensor(0), Bind::Tensor(1)],
            workgroups: grid(self.groups(), 1, caps.max_workgroups_per_dim),
        }]
    }
    fn params(&self, _: usize, _: &StepVars) -> Params {
        Params::of(&ReadSumParams {
            nv: self.nv as u32,
            span: self.span as u32,
            groups: self.groups() as u32,
        })
    }
    fn cost(&self) -> Cost {
        let n = 4 * self.nv as u64;
        Cost {
            bytes_read: 4 * n,
            bytes_written: 4 * self.groups() as u64,
            flops: n,
        }
    }
}

impl Graph {
    /// Partial sums of `x` (f32, any shape, a multiple of 4 elements), `span` vec4s (4 `span` values) each, in order:
    /// `[ceil(len / (4 span))]` f32. `span` is a positive multiple of [`SPAN_GRANULE`].
    pub fn read_sum(&mut self, x: TensorId, span: usize) -> Result<TensorId> {
        self.read_sum_impl(x, span, None)
    }

    /// [`Graph::read_sum`] with the workgroup size forced to [`WG_CPU`] or [`WG_GPU`] whatever the adapter (tests
    /// and benches run both).
    pub fn read_sum_with_workgroup(&mut self, x: TensorId, span: usize, wg: usize) -> Result<TensorId> {
        if wg != WG_CPU && wg != WG_GPU {
            return Err(Error::Invalid(format!(
                "read_sum: workgroup size {wg}, want {WG_CPU} or {WG_GPU}"
            )));
        }
        self.read_sum_impl(x, span, Some(wg))
    }

    fn read_sum_impl(&mut self, x: TensorId, span: usize, wg: Option<usize>) -> Result<TensorId> {
        let shape = self.shape(x).to_vec();
        let n: usize = shape.iter().product();
        if n == 0 || !n.is_multiple_of(4) || self.dtype(x) != DType::F32 || n / 4 > u32::MAX as usize / 2 {
            return Err(Error::shape(
                "read_sum",
                format!(
                    "x {shape:?} {:?}: want f32 with a multiple of 4 elements",
                    self.dtype(x)
                ),
            ));
        }
        if span == 0 || !span.is_multiple_of(SPAN_GRANULE) || span > u32::MAX as usize / 2 {
            return Err(Error::Invalid(format!(
                "read_sum: span {span}, want a positive multiple of {SPAN_GRANULE} vec4s"
            )));
        }
        let kernel = ReadSum { nv: n / 4, span, wg };
        let groups = kernel.groups();
        Ok(self.add_node(kernel, &[x], &[("read_sum", &[groups], DType::F32)])?[0])
    }
}

/// CPU reference: each partial in f64, over `4 span` consecutive values.
pub fn reference(x: &[f32], span: usize) -> Vec<f32> {
    x.chunks(4 * span)
        .map(|c| c.iter().map(|&v| v as f64).sum::<f64>() as f32)
        .collect()
}

pub fn variants() -> Vec<ShaderKey> {
    let mut v = Vec::new();
    for wg in [WG_CPU, WG_GPU] {
        for sg in [false, true] {
            v.push(key(wg, sg));
        }
    }
    v
}
