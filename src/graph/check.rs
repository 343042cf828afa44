//! The check mode (`--check`): a plan runs node by node; every node's inputs are read back before it runs and its
//! outputs after, its op's CPU reference recomputes the outputs from those very inputs, and the first node whose
//! error passes its op's bound is the one to blame. Slow (a readback per tensor) and meant to be.

use super::{Source, StepVars, TensorId};
use crate::error::{Error, Result};
use crate::gpu::tensor::{read_buffer, values_f32};
use crate::gpu::{DType, Gpu};

/// Host copy of one tensor a node binds: its shape, type and the bytes of each row part, in row order.
#[derive(Clone, Debug)]
pub struct HostIo {
    pub shape: Vec<usize>,
    pub dtype: DType,
    /// One entry unless the tensor is an external split into row parts (large weights).
    pub parts: Vec<Vec<u8>>,
}

impl HostIo {
    /// All parts' bytes, in row order.
    pub fn bytes(&self) -> Vec<u8> {
        self.parts.concat()
    }

    /// The values as f32 (f16 rows are padded to whole words: the padding is dropped).
    pub fn f32(&self) -> Result<Vec<f32>> {
        values_f32(self.dtype, &self.shape, &self.bytes()).map_err(|e| Error::Graph(format!("check: {e}")))
    }

    pub fn u32(&self) -> Vec<u32> {
        bytemuck::pod_collect_to_vec(&self.bytes())
    }

    /// The words of each part (packed quantized weights are bound part by part).
    pub fn part_words(&self) -> Vec<Vec<u32>> {
        self.parts.iter().map(|p| bytemuck::pod_collect_to_vec(p)).collect()
    }
}

/// What a node's reference expects of one tensor it writes: `slot` indexes the node's inputs then its outputs
/// (an in-place write, such as a KV-cache append, names the input it writes).
#[derive(Clone, Debug)]
pub struct Expected {
    pub slot: usize,
    pub values: Vec<f32>,
    /// Which elements the node defines (the others are compared with nothing).
    pub defined: Defined,
}

/// The elements of a tensor a node writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Defined {
    All,
    /// The first `values.len()` (a list whose length the data decides).
    Prefix,
    /// Those whose flag is set (`values` has the tensor's length; a kernel that skips what it has no work for).
    Where(Vec<bool>),
}

impl Expected {
    pub fn at(slot: usize, values: Vec<f32>) -> Expected {
        Expected {
            slot,
            values,
            defined: Defined::All,
        }
    }

    /// The first `values.len()` elements of the tensor; the rest is not defined.
    pub fn prefix(slot: usize, values: Vec<f32>) -> Expected {
        Expected {
            slot,
            values,
            defined: Defined::Prefix,
        }
    }

    /// Only the elements where `written` is set; the rest is left as it was and not compared.
    pub fn only(slot: usize, values: Vec<f32>, written: Vec<bool>) -> Expected {
        Expected {
            slot,
            values,
            defined: Defined::Where(written),
        }
    }

    /// NMSE of `got` (the whole tensor as the device holds it) over the defined elements.
    fn error(&self, mut got: Vec<f32>) -> f64 {
        match &self.defined {
            Defined::All => nmse(&got, &self.values),
            Defined::Prefix => {
                got.truncate(self.values.len());
                nmse(&got, &self.values)
            }
            Defined::Where(written) if written.len() == got.len() && written.len() == self.values.len() => {
                let pick = |v: &[f32]| -> Vec<f32> { v.iter().zip(written).filter(|w| *w.1).map(|w| *w.0).collect() };
                nmse(&pick(&got), &pick(&self.values))
            }
            Defined::Where(_) => f64::INFINITY,
        }
    }
}

/// `Some(body())`: how a kernel's `reference` wraps its fallible body.
pub fn expect(body: impl FnOnce() -> Result<Vec<Expected>>) -> Option<Result<Vec<Expected>>> {
    Some(body())
}

/// One node's verdict.
#[derive(Clone, Debug)]
pub struct NodeCheck {
    /// The node's index in recording order.
    pub index: usize,
    /// The node's label (`layer3.matmul_q`), and its tap name where the model named it.
    pub label: String,
    pub tap: Option<String>,
    pub op: &'static str,
    /// Worst NMSE over the tensors the node writes; `None` where the op has no per-node reference.
    pub nmse: Option<f64>,
    pub bound: f64,
}

impl NodeCheck {
    pub fn passed(&self) -> bool {
        self.nmse.is_none_or(|e| e <= self.bound)
    }

    /// `label (tap)`: how a report names the node.
    pub fn name(&self) -> String {
        match &self.tap {
            Some(t) => format!("{} ({t})", self.label),
            None => self.label.clone(),
        }
    }
}

/// Normalized squared error of `got` against `want` (0 when both are zero; infinite when the lengths differ or a
/// value is not finite where the reference's is).
pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    let (mut num, mut den) = (0f64, 0f64);
    for (a, b) in got.iter().zip(want) {
        if !b.is_finite() {
            // NaN where the reference has NaN, the same infinity where it has one.
            if a.is_nan() != b.is_nan() || (!b.is_nan() && a != b) {
                return f64::INFINITY;
            }
            continue;
        }
        if !a.is_finite() {
            return f64::INFINITY;
        }
        num += (*a as f64 - *b as f64).powi(2);
        den += (*b as f64).powi(2);
    }
    if num == 0.0 {
        0.0
    } else {
        num / den.max(f64::MIN_POSITIVE)
    }
}

/// A check report: per op, the nodes checked and the worst NMSE against the bound; the ops without a per-node
/// reference; then the first node past its bound, or that all passed. Returns (text, whether all passed).
pub fn report(verdicts: &[NodeCheck]) -> (String, bool) {
    let mut ops: Vec<(&str, usize, f64, f64)> = Vec::new();
    let mut unchecked: Vec<&str> = Vec::new();
    for v in verdicts {
        match v.nmse {
            Some(e) => match ops.iter_mut().find(|o| o.0 == v.op) {
                Some(o) => {
                    o.1 += 1;
                    o.2 = o.2.max(e);
                }
                None => ops.push((v.op, 1, e, v.bound)),
            },
            None if !unchecked.contains(&v.op) => unchecked.push(v.op),
            None => {}
        }
    }
    let mut out = format!(
        "| {:<20} | {:>5} | {:>10} | {:>8} |\n|{:-<22}|{:->7}|{:->12}|{:->10}|\n",
        "op", "nodes", "worst NMSE", "bound", "", "", "", ""
    );
    for (op, n, worst, bound) in &ops {
        out.push_str(&format!("| {op:<20} | {n:>5} | {worst:>10.2e} | {bound:>8.0e} |\n"));
    }
    if !unchecked.is_empty() {
        out.push_str(&format!(
            "no per-node reference (not checked): {}\n",
            unchecked.join(", ")
        ));
    }
    let first = verdicts.iter().find(|v| !v.passed());
    match first {
        Some(v) => out.push_str(&format!(
            "FIRST FAILURE: node {} {} ({}): NMSE {:.3e} over the bound {:.0e}\n",
            v.index,
            v.name(),
            v.op,
            v.nmse.unwrap_or(f64::NAN),
            v.bound
        )),
        None => out.push_str(&format!(
            "all {} checked nodes within their bounds\n",
            ops.iter().map(|o| o.1).sum::<usize>()
        )),
    }
    (out, first.is_none())
}

/// How a check run may corrupt one node's first output after it runs (to prove the check localizes a fault).
#[derive(Clone, Debug, Default)]
pub struct CheckOptions {
    /// Index (in recording order) of the node whose first output is replaced by `1 - x` after it runs.
    pub fault: Option<usize>,
}

impl super::Plan {
    /// Run every node in its own submission and check it against its op's reference; one verdict per node, in
    /// order. The graph's inputs must have been written (as for [`super::Plan::run`]). Reads back every tensor
    /// every node binds: meant for finding a wrong kernel, not for speed.
    pub fn check(&mut self, gpu: &Gpu, vars: &StepVars, opts: &CheckOptions) -> Result<Vec<NodeCheck>> {
        let vars = self.every_seq(vars);
        self.write_params(gpu, &vars);
        let mut verdicts = Vec::with_capacity(self.nodes.len());
        for n in 0..self.nodes.len() {
            let io = self.nodes[n].io.clone();
            let before = io.iter().map(|&t| self.read_host(gpu, t)).collect::<Result<Vec<_>>>()?;
            self.run_node(gpu, n)?;
            if opts.fault == Some(n) {
                self.corrupt(gpu, n)?;
            }
            let node = &self.nodes[n];
            let mut worst = None;
            if let Some(expected) = node.kernel.reference(&before, &vars[node.seq]) {
                let expected = expected.map_err(|e| Error::Graph(format!("check of {}: {e}", node.label)))?;
                let mut err = 0f64;
                for e in &expected {
                    let id = *io
                        .get(e.slot)
                        .ok_or_else(|| Error::Graph(format!("check of {}: no slot {}", node.label, e.slot)))?;
                    let got = self.read_host(gpu, id)?;
                    let got: Vec<f32> = match got.dtype {
                        DType::U32 => got.u32().iter().map(|&v| v as f32).collect(),
                        _ => got.f32()?,
                    };
                    err = err.max(e.error(got));
                }
                worst = Some(err);
            }
            verdicts.push(NodeCheck {
                index: n,
                label: node.label.clone(),
                tap: node.tap.map(|t| t.to_string()),
                op: node.kernel.name(),
                nmse: worst,
                bound: node.kernel.check_bound(&gpu.caps),
            });
        }
        Ok(verdicts)
    }

    fn run_node(&self, gpu: &Gpu, n: usize) -> Result<()> {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for s in self.nodes[n].steps.clone() {
                self.record(&mut pass, &self.steps[s], s);
            }
        }
        gpu.queue.submit([enc.finish()]);
        gpu.wait("check")
    }

    /// The memory of tensor `id` as the device holds it now.
    fn read_host(&self, gpu: &Gpu, id: TensorId) -> Result<HostIo> {
        let desc = &self.tensors[id.0];
        let root = super::root_in(&self.tensors, id);
        let parts = match (&self.tensors[root.0].source, &self.buffers[root.0]) {
            (Source::External(g), _) => g
                .parts
                .iter()
                .map(|p| read_buffer(gpu, &p.buffer, 0, p.bytes))
                .collect::<Result<Vec<_>>>()?,
            (_, Some(buf)) => {
                let offset = super::offset_in(&self.tensors, id);
                vec![read_buffer(gpu, buf, offset, desc.bytes())?]
            }
            (_, None) => return Err(Error::Graph(format!("check: tensor {} has no buffer", desc.name))),
        };
        Ok(HostIo {
            shape: desc.shape.clone(),
            dtype: desc.dtype,
            parts,
        })
    }

    /// The injected fault: node `n`'s first output becomes `1 - x` (f32) or `x ^ 1` (u32).
    fn corrupt(&self, gpu: &Gpu, n: usize) -> Result<()> {
        let node = &self.nodes[n];
        let id = *node
            .io
            .get(node.n_inputs)
            .ok_or_else(|| Error::Graph(format!("check: {} has no output to corrupt", node.label)))?;
        let host = self.read_host(gpu, id)?;
        let words: Vec<u32> = bytemuck::pod_collect_to_vec(&host.bytes());
        let flipped: Vec<u32> = match host.dtype {
            DType::F32 => words.iter().map(|&w| (1.0 - f32::from_bits(w)).to_bits()).collect(),
            _ => words.iter().map(|&w| w ^ 1).collect(),
        };
        let buf = self.buffers[id.0]
            .as_ref()
            .ok_or_else(|| Error::Graph(format!("check: {} writes no plan buffer", node.label)))?;
        gpu.queue.write_buffer(buf, 0, bytemuck::cast_slice(&flipped));
        gpu.wait("check")
    }
}
