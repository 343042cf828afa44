//! Shared pieces of BlockFFN's sparse-expert kernels ([`super::moe_up`], [`super::moe_down`]): the weight forms they
//! read, their parameter block (`shaders/lib/moe_common.wgsl`), shader keys and tokens per invocation.
//!
//! Weight arrangement (the loader's contract): both matrices are ordinary `[N, K]` row-major weights, so the same
//! tensors also feed the dense matmul ops (the dense fallback) unchanged.
//! * up: `[E * de, hidden]`, expert `e` owning rows `e*de .. (e+1)*de`: PyTorch `block_linear` `up_proj` as stored,
//!   and `block` `up_proj` `[E, de, hidden]` is the same memory.
//! * down: `[hidden, E * de]`, expert `e` owning columns `e*de .. (e+1)*de` of every row: PyTorch `block_linear`
//!   `down_proj` as stored; `block` `down_proj` `[E, hidden, de]` must be permuted to `[hidden, E, de]` at load.
//!
//! Each is a dense f32 / f16 [`GpuTensor`](crate::gpu::GpuTensor) or a [`PackedWeight`] (any packable format, either
//! layout), in one binding (one part). `de` must be a multiple of 32: an expert is whole 32-row tiles (tiled up),
//! whole 32-weight blocks of every row (quantized down), and whole workgroups of rows.

use super::matmul_q::dequantize_io;
use crate::error::{Error, Result};
use crate::gpu::packed::PackedWeight;
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::HostIo;
use crate::graph::{grid, Bind, Dispatch, Params};
use crate::graph::{Graph, TensorId};
use crate::quant::pack::{kernel_formats, Format, Layout, QK, TILE};

/// An expert weight matrix as the sparse kernels take it.
#[derive(Clone, Copy, Debug)]
pub enum MoeWeight<'a> {
    /// A graph tensor of f32 or f16 (`DType::F16`: packed pairs), `[N, K]`.
    Dense(TensorId),
    /// Block-quantized and packed by [`crate::quant::pack`]; its buffers become graph externals.
    Quant(&'a PackedWeight),
}

/// What the kernels need to know about a weight to choose a shader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightKind {
    Dense(DType),
    Quant(Format, Layout),
}

/// Largest expert count: the router's workgroup bitmask holds 1024 bits.
pub const MAX_EXPERTS: usize = 1024;
/// Expert sizes are multiples of this.
pub const DE_ALIGN: usize = 32;
/// Workgroup size of the dense kernels on CPU adapters (one llvmpipe SIMD chunk).
pub const WG_DENSE_CPU: usize = 8;
/// WebGPU's guaranteed minimum of `max_compute_workgroups_per_dimension` (the grid's z: blocks of tokens).
const MAX_GROUPS: usize = 65535;

/// The parameter block of every moe_up / moe_down shader (`Params` in `shaders/lib/moe_common.wgsl`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct MoeParams {
    pub m: u32,
    pub experts: u32,
    pub de: u32,
    /// Rows of W, also the output row length: `E * de` (up), hidden (down).
    pub rows: u32,
    /// Dense W: row stride in elements of the shader's `w` (vec4 of f32, or vec4<u32> of 8 halves).
    pub kv: u32,
    /// x row stride in vec4s.
    pub xv: u32,
    /// Quantized W: 32-blocks per row.
    pub groups: u32,
    /// Quantized W, tiled layout: 32-row tiles.
    pub tiles: u32,
    /// up (quantized): workgroups per expert; down (quantized): 32-blocks per expert.
    pub per_expert: u32,
}

impl MoeParams {
    pub fn block(&self) -> Params {
        Params::of(self)
    }
}

/// Tokens per invocation (or per workgroup, rows layout) for `m` tokens: one for decode, else register blocks of
/// 4 or 8 tokens that share each weight load (tokens past `m` in a block are recomputed and not written).
fn tokens_per_invocation(kind: WeightKind, m: usize) -> usize {
    match (kind, m) {
        (_, 1) => 1,
        (WeightKind::Quant(_, Layout::Rows), _) => 4,
        (_, m) if m <= 4 => 4,
        _ => 8,
    }
}

/// Grid z for `m` tokens in blocks of `tm`, checked against the per-dimension limit.
fn token_blocks(op: &'static str, m: usize, tm: usize) -> Result<u32> {
    let z = m.div_ceil(tm);
    if z > MAX_GROUPS {
        return Err(Error::shape(op, format!("{m} tokens are too many for one dispatch")));
    }
    Ok(z as u32)
}

/// Whether the kernel for `kind` uses subgroups on this adapter: the tiled kernels broadcast x across 8 lanes
/// (subgroup size >= 8), the rows kernels reduce with subgroupAdd.
fn subgroups_for(kind: WeightKind, caps: &Caps) -> bool {
    match kind {
        WeightKind::Dense(_) => false,
        WeightKind::Quant(_, Layout::Tiled) => caps.subgroups && caps.subgroup_size >= 8,
        WeightKind::Quant(_, Layout::Rows) => caps.subgroups,
    }
}

/// Which adapter type the dense kernels' workgroup sizes are chosen for. `Auto` follows the adapter; the others
/// force one (tests and benches run the GPU sizes on a CPU adapter this way).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Target {
    #[default]
    Auto,
    CpuAdapter,
    Gpu,
}

impl Target {
    fn cpu(self, caps: &Caps) -> bool {
        match self {
            Target::Auto => caps.cpu_adapter,
            Target::CpuAdapter => true,
            Target::Gpu => false,
        }
    }
}

/// Workgroup size of the dense up kernel: 8 on CPU adapters; on GPUs the largest of 32, 16, 8 whose 4 rows per
/// invocation tile an expert (`de % (4 * WG) == 0`).
pub fn wg_dense_up(caps: &Caps, target: Target, de: usize) -> usize {
    if target.cpu(caps) {
        return WG_DENSE_CPU;
    }
    [32, 16, 8].into_iter().find(|w| de.is_multiple_of(4 * w)).unwrap_or(8)
}

/// Workgroup size of the dense down kernel: 8 on CPU adapters, 64 on GPUs.
pub fn wg_dense_down(caps: &Caps, target: Target) -> usize {
    if target.cpu(caps) {
        WG_DENSE_CPU
    } else {
        64
    }
}

/// The shader variant of `op` ("up" or "down") for a weight kind, `tm` tokens per invocation, workgroup size `wg`
/// (dense kernels only) and subgroups (quantized kernels only; see [`subgroups_for`]).
fn key(op: &str, kind: WeightKind, tm: usize, wg: usize, subgroups: bool) -> ShaderKey {
    match kind {
        WeightKind::Dense(dtype) => ShaderKey::new(if op == "up" { "moe_up_dense" } else { "moe_down_dense" })
            .flag("WH", dtype == DType::F16)
            .flag("VEC", true)
            .def("TM", format!("{tm}u"))
            .def("WG", format!("{wg}u"))
            .flag("K2", tm == 1),
        WeightKind::Quant(format, layout) => {
            let name = match (op, layout) {
                ("up", Layout::Tiled) => "moe_up_q_tiled",
                ("up", Layout::Rows) => "moe_up_q_rows",
                (_, Layout::Tiled) => "moe_down_q_tiled",
                (_, Layout::Rows) => "moe_down_q_rows",
            };
            let key = format
                .shader_flags(ShaderKey::new(name))
                .flag("SUBGROUPS", subgroups)
                .def("TM", format!("{tm}u"));
            // The tiled kernels write their token blocks out (T4: 4 tokens, T8: 8).
            match layout {
                Layout::Tiled => key
                    .def("W_AT", "1u")
                    .flag("T2", tm >= 2)
                    .flag("T4", tm >= 4)
                    .flag("T8", tm >= 8),
                Layout::Rows => key,
            }
        }
    }
}

/// Every variant of `op` ("up" or "down") the kernels can ask for.
pub fn variants(op: &str) -> Vec<ShaderKey> {
    let mut v = Vec::new();
    let wgs: &[usize] = if op == "up" { &[8, 16, 32] } else { &[8, 64] };
    for dtype in [DType::F32, DType::F16] {
        for tm in [1, 4, 8] {
            for &wg in wgs {
                v.push(key(op, WeightKind::Dense(dtype), tm, wg, false));
            }
        }
    }
    // Formats with the same kernel blocks share variants; the super formats (Q2_K, Q3_K) have no MoE kernels yet.
    for format in kernel_formats().filter(|f| !f.super_block()) {
        for sg in [false, true] {
            let tiled = WeightKind::Quant(format, Layout::Tiled);
            for tm in [1, 4, 8] {
                v.push(key(op, tiled, tm, 8, sg));
            }
            for tm in [1, 4] {
                v.push(key(op, WeightKind::Quant(format, Layout::Rows), tm, 64, sg));
            }
        }
    }
    v
}

/// A weight checked to be `[n, k]` in one binding: its kind, the graph tensors the kernel binds (in binding order)
/// and its device bytes.
pub struct BoundWeight {
    pub kind: WeightKind,
    pub inputs: Vec<TensorId>,
    pub bytes: u64,
}

/// Check `w` is an `[n, k]` weight the sparse kernels can read, and add its tensors to the graph.
pub fn bind_weight(g: &mut Graph, op: &'static str, w: MoeWeight<'_>, n: usize, k: usize) -> Result<BoundWeight> {
    match w {
        MoeWeight::Dense(t) => {
            let (shape, dtype) = (g.shape(t).to_vec(), g.dtype(t));
            if shape != [n, k] {
                return Err(Error::shape(op, format!("weight {shape:?}, expected [{n}, {k}]")));
            }
            let align = if dtype == DType::F16 { 8 } else { 4 };
            if !matches!(dtype, DType::F32 | DType::F16) || !k.is_multiple_of(align) {
                return Err(Error::shape(
                    op,
                    format!("dense weight must be f32 (K % 4 == 0) or f16 (K % 8 == 0), got {dtype:?} K = {k}"),
                ));
            }
            if g.desc(t).parts().len() != 1 {
                return Err(Error::shape(op, "the weight is split into several bindings"));
            }
            Ok(BoundWeight {
                kind: WeightKind::Dense(dtype),
                inputs: vec![t],
                bytes: dtype.bytes(k) * n as u64,
            })
        }
        MoeWeight::Quant(pw) => {
            if pw.format.super_block() {
                return Err(Error::Invalid(format!(
                    "{op}: {} experts have no sparse kernel yet (Q2_K and Q3_K run through matmul_q only)",
                    pw.format.ty
                )));
            }
            if pw.n != n || pw.k != k || !k.is_multiple_of(QK) {
                return Err(Error::shape(
                    op,
                    format!("{} weight [{}, {}], expected [{n}, {k}]", pw.format.ty, pw.n, pw.k),
                ));
            }
            if pw.parts().len() != 1 {
                return Err(Error::shape(op, "the packed weight is split into several bindings"));
            }
            let mut inputs = vec![g.external(&pw.quants), g.external(&pw.scales)];
            if let Some(m) = &pw.mins {
                inputs.push(g.external(m));
            }
            Ok(BoundWeight {
                kind: WeightKind::Quant(pw.format, pw.layout),
                inputs,
                bytes: pw.bytes(),
            })
        }
    }
}

/// Check the active-expert list: u32 `[1 + E]`.
pub fn check_active(g: &Graph, op: &'static str, active: TensorId, experts: usize) -> Result<()> {
    if g.shape(active) != [1 + experts] || g.dtype(active) != DType::U32 {
        return Err(Error::shape(
            op,
            format!(
                "active list {:?} {:?}, expected u32 [{}]",
                g.shape(active),
                g.dtype(active),
                1 + experts
            ),
        ));
    }
    Ok(())
}

/// What the sparse expert kernels' nodes share: tokens, experts and the weight they read.
#[derive(Debug)]
pub struct ExpertNode {
    pub m: usize,
    pub de: usize,
    pub experts: usize,
    pub kind: WeightKind,
    /// Graph inputs of the weight (node tensors `1..=weight_inputs`).
    pub weight_inputs: usize,
    /// Device bytes of the weight.
    pub wbytes: u64,
    pub target: Target,
}

impl ExpertNode {
    /// The node of `op` for `m` tokens over a weight bound by [`bind_weight`] (its token blocks must fit a grid).
    pub fn new(
        op: &'static str,
        m: usize,
        (de, experts): (usize, usize),
        w: &BoundWeight,
        target: Target,
    ) -> Result<Self> {
        let node = ExpertNode {
            m,
            de,
            experts,
            kind: w.kind,
            weight_inputs: w.inputs.len(),
            wbytes: w.bytes,
            target,
        };
        token_blocks(op, m, node.tm())?;
        Ok(node)
    }

    /// `E * de`: the up weight's rows, the down weight's columns.
    pub fn width(&self) -> usize {
        self.experts * self.de
    }

    /// Tokens per invocation (or workgroup): [`tokens_per_invocation`].
    pub fn tm(&self) -> usize {
        tokens_per_invocation(self.kind, self.m)
    }

    /// The one dispatch of `op` ("up" or "down"): token blocks along x, `groups` workgroups of weight rows along y
    /// (and z past the limit), node tensors `0..bindings` bound in order; `wg` the dense kernels' workgroup size.
    pub fn dispatch(&self, op: &str, caps: &Caps, wg: usize, groups: usize, bindings: usize) -> Vec<Dispatch> {
        let [y, z, _] = grid(groups, 1, caps.max_workgroups_per_dim);
        vec![Dispatch {
            shader: key(op, self.kind, self.tm(), wg, subgroups_for(self.kind, caps)),
            bindings: (0..bindings).map(Bind::Tensor).collect(),
            workgroups: [self.m.div_ceil(self.tm()) as u32, y, z],
        }]
    }

    /// The parameter block for a weight of `rows` rows of `k` (the input rows' length too) and the kernel's
    /// `per_expert` count.
    pub fn params(&self, rows: usize, k: usize, per_expert: usize) -> Params {
        let kv = match self.kind {
            WeightKind::Dense(DType::F16) => k / 8,
            _ => k / 4,
        };
        MoeParams {
            m: self.m as u32,
            experts: self.experts as u32,
            de: self.de as u32,
            rows: rows as u32,
            kv: kv as u32,
            xv: (k / 4) as u32,
            groups: (k / QK) as u32,
            tiles: rows.div_ceil(TILE) as u32,
            per_expert: per_expert as u32,
        }
        .block()
    }

    /// For the check mode, from host copies of the node's tensors: the weight `[n, k]` as the kernel reads it
    /// (dense values, f16 widened, or the CPU dequantization of the packed words) and the listed experts (node
    /// tensor `list`, u32 `[1 + E]`: the count, then the ids).
    pub fn host(&self, io: &[HostIo], (n, k): (usize, usize), list: usize) -> Result<(Vec<f32>, Vec<u32>)> {
        let bufs = &io[1..=self.weight_inputs];
        let w = match self.kind {
            WeightKind::Dense(_) => bufs[0].f32()?,
            WeightKind::Quant(format, layout) => dequantize_io(format, layout, n, k, &[(0, n)], bufs)?,
        };
        let ids = io[list].u32();
        let count = ids.first().map_or(0, |&c| c as usize);
        match ids.get(1..1 + count) {
            Some(l) if count <= self.experts && l.iter().all(|&e| (e as usize) < self.experts) => Ok((w, l.to_vec())),
            _ => Err(Error::Graph(format!(
                "active list {:?} is not a count and that many experts below {}",
                &ids[..ids.len().min(8)],
                self.experts
            ))),
        }
    }
}

/// SiLU in f64, for the references.
pub fn silu(v: f64) -> f64 {
    v / (1.0 + (-v).exp())
}
