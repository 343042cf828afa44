//! The graph models record: tensors (inputs, external weights/caches, intermediates) and nodes (kernel + io).
//! A [`Plan`] turns a graph into buffers, bind groups and one command buffer per step.

pub mod check;
mod kernel;
mod plan;

pub use check::{CheckOptions, NodeCheck};
pub use kernel::{fits_uniform_array, grid, Bind, Cost, Dispatch, Kernel, Params, StepVars, UNIFORM_ARRAY_BYTES};
pub use plan::{NodeProfile, Plan};

use crate::error::{Error, Result};
use crate::gpu::{DType, GpuTensor};

/// Handle of a tensor in one graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub(crate) usize);

/// Where a tensor's memory comes from.
#[derive(Debug)]
pub enum Source {
    /// Written by the host before each run.
    Input,
    /// Owned outside the graph (weights, KV cache); may be split into row parts.
    External(GpuTensor),
    /// Produced by a node; its buffer is assigned by the plan and reused after its last use.
    Node,
    /// Another tensor's memory from a byte offset on: under a new shape of the same size (a free reshape), or some
    /// of its rows ([`Graph::row_view`]).
    View { base: TensorId, offset: u64 },
}

#[derive(Debug)]
pub struct TensorDesc {
    pub name: String,
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub source: Source,
}

impl TensorDesc {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn bytes(&self) -> u64 {
        let cols = self.shape.last().copied().unwrap_or(1);
        let rows = self.numel() / cols.max(1);
        self.dtype.bytes(cols) * rows as u64
    }
    /// (first row, row count) of each part: one part unless this is a split external tensor.
    pub fn parts(&self) -> Vec<(usize, usize)> {
        match &self.source {
            Source::External(t) => t.parts.iter().map(|p| (p.row0, p.rows)).collect(),
            _ => vec![(0, self.shape.first().copied().unwrap_or(1))],
        }
    }
}

/// A model's name for an intermediate, so a check report or a debugging readback can say which one it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tap {
    /// The scaled token embeddings `[t, hidden]`.
    Embed,
    /// Layer `l`'s normed input to attention `[t, hidden]`.
    AttnNorm(usize),
    /// Layer `l`'s first projection group: q|k|v `[t, (nq + 2 nkv) hd]`, q|k, or q alone (as they are stored).
    Qkv(usize),
    /// Layer `l`'s q and k after RoPE.
    Rope(usize),
    /// Layer `l`'s attention output before the o projection `[t, nq hd]`.
    AttnOut(usize),
    /// Layer `l`'s o projection `[t, hidden]`.
    AttnProj(usize),
    /// Layer `l`'s normed input to the FFN `[t, hidden]` (with the residual stream beside it).
    FfnNorm(usize),
    /// Layer `l`'s gated activation `[t, ffn]`.
    FfnAct(usize),
    /// Layer `l`'s FFN output `[t, hidden]`.
    FfnOut(usize),
    /// The final norm `[t, hidden]`.
    OutputNorm,
    /// The logits `[t, vocab]`.
    Logits,
}

impl std::fmt::Display for Tap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tap::Embed => write!(f, "embed"),
            Tap::AttnNorm(l) => write!(f, "attn_norm[{l}]"),
            Tap::Qkv(l) => write!(f, "qkv[{l}]"),
            Tap::Rope(l) => write!(f, "rope[{l}]"),
            Tap::AttnOut(l) => write!(f, "attn_out[{l}]"),
            Tap::AttnProj(l) => write!(f, "attn_proj[{l}]"),
            Tap::FfnNorm(l) => write!(f, "ffn_norm[{l}]"),
            Tap::FfnAct(l) => write!(f, "ffn_act[{l}]"),
            Tap::FfnOut(l) => write!(f, "ffn_out[{l}]"),
            Tap::OutputNorm => write!(f, "output_norm"),
            Tap::Logits => write!(f, "logits"),
        }
    }
}

#[derive(Debug)]
pub struct Node {
    pub label: String,
    /// The model's name for what this node computes, if it named it.
    pub tap: Option<Tap>,
    pub kernel: Box<dyn Kernel>,
    pub inputs: Vec<TensorId>,
    pub outputs: Vec<TensorId>,
    /// The sequence whose [`StepVars`] the node runs with (0 unless the graph batches several sequences).
    pub seq: usize,
}

/// A recorded forward step.
#[derive(Debug, Default)]
pub struct Graph {
    pub(crate) tensors: Vec<TensorDesc>,
    pub(crate) nodes: Vec<Node>,
    pub(crate) readback: Vec<TensorId>,
    prefix: String,
    /// The sequence of the nodes recorded from now on (see [`Graph::set_seq`]).
    seq: usize,
    /// Up to this many rows, ops whose kernel choice depends on the row count pick the one whose rows equal the
    /// one-row result (see [`Graph::set_invariant_rows`]).
    invariant_rows: usize,
}

impl Graph {
    pub fn new() -> Self {
        Self::default()
    }

    fn push_tensor(&mut self, name: &str, shape: &[usize], dtype: DType, source: Source) -> TensorId {
        self.tensors.push(TensorDesc {
            name: name.into(),
            shape: shape.to_vec(),
            dtype,
            source,
        });
        TensorId(self.tensors.len() - 1)
    }

    /// From now on, ops of up to `rows` rows choose kernels whose every row equals the one-row result bit for bit
    /// (a draft tree's step: the dense matmul keeps its GEMV past `matmul::GEMV_MAX_M` rows).
    pub fn set_invariant_rows(&mut self, rows: usize) {
        self.invariant_rows = rows;
    }

    /// See [`Graph::set_invariant_rows`].
    pub fn invariant_rows(&self) -> usize {
        self.invariant_rows
    }

    /// A tensor the host writes before each run.
    pub fn input(&mut self, name: &str, shape: &[usize], dtype: DType) -> TensorId {
        self.push_tensor(name, shape, dtype, Source::Input)
    }

    /// A tensor that no node produces: nodes write it as effects, row by row through [`Graph::row_view`]s (each
    /// sequence of a batched step its own rows), before any node reads it. The plan gives it a buffer at its first
    /// use; what it holds before the first write is undefined.
    pub fn uninit(&mut self, name: &str, shape: &[usize], dtype: DType) -> TensorId {
        let name = format!("{}{name}", self.prefix);
        self.push_tensor(&name, shape, dtype, Source::Node)
    }

    /// A device tensor owned outside the graph (weights, KV cache). Kernels may write to it.
    pub fn external(&mut self, t: &GpuTensor) -> TensorId {
        self.push_tensor(&t.name.clone(), &t.shape.clone(), t.dtype, Source::External(t.clone()))
    }

    /// The same memory under another shape with the same number of bytes (no copy, no dispatch).
    pub fn reshape(&mut self, id: TensorId, shape: &[usize]) -> Result<TensorId> {
        let (dtype, name, bytes) = {
            let t = self.desc(id);
            (t.dtype, t.name.clone(), t.bytes())
        };
        if let Source::External(t) = &self.desc(id).source {
            if t.parts.len() > 1 {
                return Err(Error::shape("reshape", format!("{name} is split into parts")));
            }
        }
        let view = TensorDesc {
            name: name.clone(),
            shape: shape.to_vec(),
            dtype,
            source: Source::View {
                base: self.root(id),
                offset: self.view_offset(id),
            },
        };
        if view.bytes() != bytes {
            return Err(Error::shape(
                "reshape",
                format!("{name}: {:?} to {shape:?} changes the size", self.shape(id)),
            ));
        }
        self.tensors.push(view);
        Ok(TensorId(self.tensors.len() - 1))
    }

    /// The tensor whose memory `id` uses (itself unless it is a view).
    pub fn root(&self, id: TensorId) -> TensorId {
        root_in(&self.tensors, id)
    }

    fn view_offset(&self, id: TensorId) -> u64 {
        offset_in(&self.tensors, id)
    }

    /// Rows `row0 .. row0 + rows` of `id` (first dimension) as a tensor of their own: the same memory, no copy. A
    /// node may read it, or write it as an effect ([`Graph::add_effect`]; e.g. each sequence of a batched step
    /// writing its rows of one tensor). The plan binds it at its byte offset, which must be a multiple of the
    /// adapter's storage-offset alignment (256 bytes on most).
    pub fn row_view(&mut self, id: TensorId, row0: usize, rows: usize) -> Result<TensorId> {
        let (shape, dtype, name) = {
            let t = self.desc(id);
            (t.shape.clone(), t.dtype, t.name.clone())
        };
        let total = shape.first().copied().unwrap_or(1);
        if shape.is_empty() || rows == 0 || row0 + rows > total {
            return Err(Error::shape(
                "row_view",
                format!("{name}: rows {row0}..{} of {shape:?}", row0 + rows),
            ));
        }
        if matches!(&self.desc(self.root(id)).source, Source::External(t) if t.parts.len() > 1) {
            return Err(Error::shape("row_view", format!("{name} is split into parts")));
        }
        let row_bytes = self.desc(id).bytes() / total as u64;
        let mut view_shape = shape;
        view_shape[0] = rows;
        self.tensors.push(TensorDesc {
            name: format!("{name}[{row0}..{}]", row0 + rows),
            shape: view_shape,
            dtype,
            source: Source::View {
                base: self.root(id),
                offset: self.view_offset(id) + row0 as u64 * row_bytes,
            },
        });
        Ok(TensorId(self.tensors.len() - 1))
    }

    /// Ask for this tensor to be read back after each run.
    pub fn output(&mut self, id: TensorId) {
        if !self.readback.contains(&id) {
            self.readback.push(id);
        }
    }

    /// Name prefix for the labels of nodes recorded from now on (e.g. `layer3.`).
    pub fn set_prefix(&mut self, prefix: &str) {
        self.prefix = prefix.into();
    }

    /// The sequence whose position the nodes recorded from now on use: a graph that batches the tokens of several
    /// sequences (sessions, each at its own position) records each sequence's position-dependent nodes (RoPE, the
    /// K/V write, attention) under its index, and a run passes one [`StepVars`] per sequence
    /// ([`Plan::run_seqs`]). Nodes that only see rows (matmuls, norms) stay in sequence 0.
    pub fn set_seq(&mut self, seq: usize) {
        self.seq = seq;
    }

    pub fn desc(&self, id: TensorId) -> &TensorDesc {
        &self.tensors[id.0]
    }

    pub fn shape(&self, id: TensorId) -> &[usize] {
        &self.tensors[id.0].shape
    }

    pub fn dtype(&self, id: TensorId) -> DType {
        self.tensors[id.0].dtype
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Record a node; returns its new output tensors. Builder methods in `ops/` call this after checking shapes.
    pub fn add_node(
        &mut self,
        kernel: impl Kernel + 'static,
        inputs: &[TensorId],
        outputs: &[(&str, &[usize], DType)],
    ) -> Result<Vec<TensorId>> {
        if let Some(bad) = inputs.iter().find(|i| i.0 >= self.tensors.len()) {
            return Err(Error::Graph(format!("{}: unknown input tensor {bad:?}", kernel.name())));
        }
        let label = format!("{}{}", self.prefix, kernel.name());
        let outs: Vec<TensorId> = outputs
            .iter()
            .map(|(name, shape, dtype)| {
                self.push_tensor(&format!("{}{name}", self.prefix), shape, *dtype, Source::Node)
            })
            .collect();
        self.nodes.push(Node {
            label,
            tap: None,
            kernel: Box::new(kernel),
            inputs: inputs.to_vec(),
            outputs: outs.clone(),
            seq: self.seq,
        });
        Ok(outs)
    }

    /// Name the node that produced `id` (a no-op for graph inputs and externals).
    pub fn tap(&mut self, id: TensorId, tap: Tap) {
        let id = self.root(id);
        if let Some(node) = self.nodes.iter_mut().rev().find(|n| n.outputs.contains(&id)) {
            node.tap = Some(tap);
        }
    }

    /// Record a node that only writes into existing tensors (e.g. a KV-cache append), listed in `inputs`.
    pub fn add_effect(&mut self, kernel: impl Kernel + 'static, inputs: &[TensorId]) -> Result<()> {
        self.add_node(kernel, inputs, &[]).map(|_| ())
    }
}

/// The tensor of `tensors` whose memory `id` uses (itself unless it is a view).
pub(crate) fn root_in(tensors: &[TensorDesc], id: TensorId) -> TensorId {
    match tensors[id.0].source {
        Source::View { base, .. } => base,
        _ => id,
    }
}

/// Bytes from its root's start to tensor `id`'s first byte (0 unless it is a row view).
pub(crate) fn offset_in(tensors: &[TensorDesc], id: TensorId) -> u64 {
    match tensors[id.0].source {
        Source::View { offset, .. } => offset,
        _ => 0,
    }
}
