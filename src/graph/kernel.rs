//! The executor's contract with the ops: what a node dispatches (shader, bindings, grid), its parameter block per
//! step, the step variables, and its cost. Ops implement [`Kernel`]; the graph and plan depend on nothing in `ops`.

use super::check::{Expected, HostIo};
use crate::error::Result;
use crate::gpu::{Caps, ShaderKey};

/// Values that change from one run of a plan to the next (decode steps reuse one plan).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepVars {
    /// Absolute position of the step's first token.
    pub pos: u32,
}

/// One dispatch's parameter block: up to 128 bytes, written into the plan's uniform buffer.
#[derive(Clone, Copy, Debug)]
pub struct Params(pub [u32; 32]);

impl Params {
    /// Copy a `#[repr(C)]` Pod params struct (at most 128 bytes) into a block.
    pub fn of<T: bytemuck::Pod>(p: &T) -> Params {
        let mut words = [0u32; 32];
        let bytes = bytemuck::bytes_of(p);
        assert!(bytes.len() <= 128, "params struct over 128 bytes");
        bytemuck::cast_slice_mut::<u32, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        Params(words)
    }
}

/// What a dispatch binds at group 0, binding i: a node tensor by index (inputs first, then outputs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bind {
    /// The whole tensor (it must have a single part).
    Tensor(usize),
    /// One row part of a split tensor.
    Part(usize, usize),
    /// The whole tensor as a fixed-size uniform array of [`UNIFORM_ARRAY_BYTES`] (WGSL sizes uniform arrays at
    /// compile time, so one shader serves every shape that fits); the plan pads the tensor's buffer to that size.
    Uniform(usize),
}

/// Bytes of every fixed-size uniform array a shader declares for [`Bind::Uniform`]: 4096 vec4s, WebGPU's default
/// `maxUniformBufferBindingSize`.
pub const UNIFORM_ARRAY_BYTES: u64 = 65536;

/// Whether `bytes` of a tensor can bind as [`Bind::Uniform`] on this adapter: they fit the fixed-size array, and the
/// adapter binds uniform buffers that large.
pub fn fits_uniform_array(caps: &Caps, bytes: u64) -> bool {
    bytes <= UNIFORM_ARRAY_BYTES && UNIFORM_ARRAY_BYTES <= caps.max_uniform_binding
}

/// One compute dispatch of a node.
#[derive(Clone, Debug)]
pub struct Dispatch {
    pub shader: ShaderKey,
    pub bindings: Vec<Bind>,
    pub workgroups: [u32; 3],
}

/// Work of a node, for profiles and benchmarks.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cost {
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub flops: u64,
}

/// A node's GPU work. Built by a graph-builder method, which checks shapes and fixes everything but `StepVars`.
pub trait Kernel: std::fmt::Debug + Send + Sync {
    /// The op name (stem of its shader and Rust file).
    fn name(&self) -> &'static str;
    /// The dispatches, in order. `caps` picks variants.
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch>;
    /// The parameter block of dispatch `i` for a step.
    fn params(&self, i: usize, vars: &StepVars) -> Params;
    /// Workgroup counts of dispatch `i` that depend on the step (e.g. the key splits a context length needs);
    /// `Some` makes the plan recompute them each run (a direct dispatch; none when a count is 0). At most the static
    /// counts of `dispatches`. Most kernels keep the default: fixed counts.
    fn step_workgroups(&self, _i: usize, _vars: &StepVars) -> Option<[u32; 3]> {
        None
    }
    fn cost(&self) -> Cost;
    /// The traffic of one run at `vars` (a profile's bandwidth): [`Kernel::cost`] unless the step changes it.
    fn step_cost(&self, _vars: &StepVars) -> Cost {
        self.cost()
    }
    /// The node's CPU reference for the check mode: what it writes, computed from host copies of `io` (its inputs
    /// then its outputs, as they were before it ran). `None`: the op has no per-node reference (it is skipped).
    fn reference(&self, _io: &[HostIo], _vars: &StepVars) -> Option<Result<Vec<Expected>>> {
        None
    }
    /// Largest NMSE the check mode accepts of this node against its reference (f32 math in another order).
    fn check_bound(&self, _caps: &Caps) -> f64 {
        1e-8
    }
}

/// Workgroup count covering `n` items with `per` items per workgroup, folded into y when x would exceed the limit.
pub fn grid(n: usize, per: usize, max_per_dim: u32) -> [u32; 3] {
    let groups = n.div_ceil(per.max(1)).max(1) as u32;
    if groups <= max_per_dim {
        [groups, 1, 1]
    } else {
        let y = groups.div_ceil(max_per_dim);
        [groups.div_ceil(y), y, 1]
    }
}
