//! Plan: buffer lifetimes and reuse, pipelines warmed, bind groups built once; then each run records one
//! compute pass, writes the parameter block once, submits once and reads back only the requested tensors.

use super::{
    offset_in, root_in, Bind, Cost, Dispatch, Graph, Kernel, Node, Source, StepVars, Tap, TensorDesc, TensorId,
    UNIFORM_ARRAY_BYTES,
};
use crate::error::{Error, Result};
use crate::gpu::pipelines::{Pipeline, PARAMS_BYTES};
use crate::gpu::{tensor::USAGE, Gpu};
use std::sync::Arc;
use std::time::Instant;

pub(super) struct Step {
    pipeline: Arc<Pipeline>,
    bind_group: wgpu::BindGroup,
    workgroups: [u32; 3],
    node: usize,
    index: u32,
    /// Whether the counts change per step ([`Kernel::step_workgroups`]).
    dynamic: bool,
}

pub(super) struct NodeInfo {
    pub(super) label: String,
    pub(super) tap: Option<Tap>,
    pub(super) kernel: Box<dyn Kernel>,
    pub(super) steps: std::ops::Range<usize>,
    /// The node's tensors: inputs, then outputs.
    pub(super) io: Vec<TensorId>,
    pub(super) n_inputs: usize,
    /// The sequence whose vars the node runs with ([`super::Graph::set_seq`]).
    pub(super) seq: usize,
}

struct Readback {
    tensor: TensorId,
    src: Arc<wgpu::Buffer>,
    /// Where the tensor starts in `src` (a row view's offset).
    offset: u64,
    staging: wgpu::Buffer,
    bytes: u64,
    host: Vec<u8>,
}

/// Per-node timing and traffic from [`Plan::profile`].
#[derive(Clone, Debug)]
pub struct NodeProfile {
    pub label: String,
    pub dispatches: usize,
    pub cost: Cost,
    /// GPU time from timestamp queries, or wall time of a submit per node where the adapter has none.
    pub micros: f64,
    pub timed_on_gpu: bool,
}

/// An executable graph.
pub struct Plan {
    pub(super) steps: Vec<Step>,
    pub(super) nodes: Vec<NodeInfo>,
    /// The graph's tensors (shapes, types, where their memory is), for the check mode's readbacks.
    pub(super) tensors: Vec<TensorDesc>,
    params_buf: wgpu::Buffer,
    params_bg: wgpu::BindGroup,
    /// Workgroup counts of every step for the current vars (the dynamic steps' recomputed with the params); a
    /// step with a zero count is not recorded.
    counts: Vec<[u32; 3]>,
    stride: u64,
    staging: Vec<u8>,
    /// The vars of each sequence the params were last written for (empty before the first run).
    last_vars: Vec<StepVars>,
    /// Sequences the graph batches (one [`StepVars`] each per run).
    seqs: usize,
    /// Buffer bound for each graph tensor (None for externals, which keep their own parts).
    pub(super) buffers: Vec<Option<Arc<wgpu::Buffer>>>,
    inputs: Vec<(TensorId, u64)>,
    readbacks: Vec<Readback>,
    /// Distinct buffers the plan allocated, and their total bytes.
    pub allocated: (usize, u64),
}

/// Free-list allocator: best fit among released buffers, else a new one.
#[derive(Default)]
struct Pool {
    free: Vec<Arc<wgpu::Buffer>>,
    count: usize,
    total: u64,
}

impl Pool {
    fn take(&mut self, gpu: &Gpu, bytes: u64, label: &str) -> Arc<wgpu::Buffer> {
        let size = bytes.next_multiple_of(16).max(16);
        let best = (0..self.free.len())
            .filter(|&i| self.free[i].size() >= size && self.free[i].size() <= 2 * size)
            .min_by_key(|&i| self.free[i].size());
        if let Some(i) = best {
            return self.free.swap_remove(i);
        }
        self.count += 1;
        self.total += size;
        Arc::new(gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: USAGE,
            mapped_at_creation: false,
        }))
    }
}

impl Plan {
    /// Assign buffers, compile (and so warm) every pipeline, build bind groups.
    pub fn new(gpu: &Gpu, graph: Graph) -> Result<Plan> {
        let Graph {
            tensors,
            nodes,
            readback,
            ..
        } = graph;
        let root = |t: TensorId| root_in(&tensors, t);
        let last_use = last_uses(&tensors, &nodes, &readback);
        let mut pool = Pool::default();
        let mut buffers: Vec<Option<Arc<wgpu::Buffer>>> = vec![None; tensors.len()];
        let dispatches: Vec<Vec<Dispatch>> = nodes.iter().map(|n| n.kernel.dispatches(&gpu.caps)).collect();
        let alloc = alloc_bytes(&tensors, &nodes, &dispatches)?;
        let mut inputs = Vec::new();
        for (i, t) in tensors.iter().enumerate() {
            if matches!(t.source, Source::Input) {
                check_binding(gpu, &t.name, t.bytes())?;
                buffers[i] = Some(pool.take(gpu, alloc[i], &t.name));
                inputs.push((TensorId(i), t.bytes()));
            }
        }
        let mut node_infos = Vec::new();
        let mut steps = Vec::new();
        let params_layout = gpu.pipelines.params_layout(&gpu.device);
        for (n, (node, dispatches)) in nodes.into_iter().zip(dispatches).enumerate() {
            // A tensor no node produces ([`Graph::uninit`]) takes its buffer at its first use.
            for t in node.inputs.iter().map(|t| root(*t)) {
                if matches!(tensors[t.0].source, Source::Node) && buffers[t.0].is_none() {
                    let desc = &tensors[t.0];
                    check_binding(gpu, &desc.name, desc.bytes())?;
                    buffers[t.0] = Some(pool.take(gpu, alloc[t.0], &desc.name));
                }
            }
            for o in &node.outputs {
                let t = &tensors[o.0];
                check_binding(gpu, &t.name, t.bytes())?;
                buffers[o.0] = Some(pool.take(gpu, alloc[o.0], &t.name));
            }
            let io: Vec<TensorId> = node.inputs.iter().chain(&node.outputs).copied().collect();
            let first = steps.len();
            for (index, d) in dispatches.into_iter().enumerate() {
                let pipeline = gpu.pipeline(&d.shader)?;
                if pipeline.bindings.len() != d.bindings.len() {
                    return Err(Error::Graph(format!(
                        "{}: shader {} declares {} bindings, the kernel binds {}",
                        node.label,
                        d.shader,
                        pipeline.bindings.len(),
                        d.bindings.len()
                    )));
                }
                let bind_group = bind_dispatch(gpu, &tensors, &buffers, &io, &node.label, &d.bindings, &pipeline)?;
                let dynamic = node.kernel.step_workgroups(index, &StepVars::default()).is_some();
                steps.push(Step {
                    pipeline,
                    bind_group,
                    workgroups: d.workgroups,
                    node: n,
                    index: index as u32,
                    dynamic,
                });
            }
            // Release what this node was the last to use (after its outputs took their buffers).
            for t in node.inputs.iter().chain(&node.outputs).map(|t| root(*t)) {
                if last_use[t.0] == n && matches!(tensors[t.0].source, Source::Node) {
                    if let Some(b) = buffers[t.0].clone() {
                        if !pool.free.iter().any(|f| Arc::ptr_eq(f, &b)) {
                            pool.free.push(b);
                        }
                    }
                }
            }
            node_infos.push(NodeInfo {
                label: node.label,
                tap: node.tap,
                kernel: node.kernel,
                steps: first..steps.len(),
                n_inputs: node.inputs.len(),
                io,
                seq: node.seq,
            });
        }
        let stride = PARAMS_BYTES.next_multiple_of(gpu.caps.uniform_align as u64);
        let params_size = stride * steps.len().max(1) as u64;
        let (params_buf, params_bg) = params_block(gpu, &params_layout, params_size);
        let counts = steps.iter().map(|s| s.workgroups).collect();
        let seqs = node_infos.iter().map(|n| n.seq + 1).max().unwrap_or(1);
        let readbacks = readbacks(gpu, &tensors, &buffers, readback)?;
        gpu.check("plan")?;
        Ok(Plan {
            steps,
            nodes: node_infos,
            tensors,
            params_buf,
            params_bg,
            counts,
            stride,
            staging: vec![0; params_size as usize],
            last_vars: Vec::new(),
            seqs,
            buffers,
            inputs,
            readbacks,
            allocated: (pool.count, pool.total),
        })
    }

    /// Sequences the plan's graph batches: a run takes one [`StepVars`] for each.
    pub fn seqs(&self) -> usize {
        self.seqs
    }

    /// One vars per sequence: `vars` for a plan of one sequence, else `vars` for every sequence.
    pub(super) fn every_seq(&self, vars: &StepVars) -> Vec<StepVars> {
        vec![*vars; self.seqs]
    }

    fn check_seqs(&self, vars: &[StepVars]) -> Result<()> {
        if vars.len() != self.seqs {
            return Err(Error::Graph(format!(
                "{} step vars given to a plan of {} sequences",
                vars.len(),
                self.seqs
            )));
        }
        Ok(())
    }

    /// Dispatches a run at `vars` (every sequence's) records (a step whose counts this position sets to zero is
    /// left out).
    pub fn dispatch_count(&self, vars: &StepVars) -> usize {
        let vars = self.every_seq(vars);
        (0..self.steps.len()).filter(|&s| self.recorded(s, &vars)).count()
    }

    /// The vars step `s` runs with (its node's sequence's); `vars` has one per sequence.
    fn vars_of<'v>(&self, s: usize, vars: &'v [StepVars]) -> &'v StepVars {
        &vars[self.nodes[self.steps[s].node].seq]
    }

    /// Workgroup counts of step `s` at `vars` (one per sequence).
    fn counts_at(&self, s: usize, vars: &[StepVars]) -> [u32; 3] {
        let step = &self.steps[s];
        if !step.dynamic {
            return step.workgroups;
        }
        let kernel = &self.nodes[step.node].kernel;
        let want = kernel
            .step_workgroups(step.index as usize, self.vars_of(s, vars))
            .unwrap_or(step.workgroups);
        // Never more than the static grid the kernel was planned (and its bindings sized) for.
        [0, 1, 2].map(|d| want[d].min(step.workgroups[d]))
    }

    fn recorded(&self, s: usize, vars: &[StepVars]) -> bool {
        self.counts_at(s, vars).iter().all(|&c| c > 0)
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Total traffic and flops of one run, from the kernels' cost models.
    pub fn cost(&self) -> Cost {
        self.nodes.iter().fold(Cost::default(), |a, n| {
            let c = n.kernel.cost();
            Cost {
                bytes_read: a.bytes_read + c.bytes_read,
                bytes_written: a.bytes_written + c.bytes_written,
                flops: a.flops + c.flops,
            }
        })
    }

    /// Write an input tensor's bytes for the next run.
    pub fn write_input(&self, gpu: &Gpu, id: TensorId, bytes: &[u8]) -> Result<()> {
        let (_, want) = self.input(id)?;
        if bytes.len() as u64 != want {
            return Err(Error::Graph(format!(
                "input {id:?}: {} bytes given, {want} expected",
                bytes.len()
            )));
        }
        let buf = self.buffers[id.0].as_ref().expect("inputs have buffers");
        if !bytes.is_empty() {
            gpu.queue.write_buffer(buf, 0, bytes);
        }
        Ok(())
    }

    /// Write every dispatch's parameter block for `vars` (one per sequence, as many as the plan has: callers check
    /// with `check_seqs`) unless the last run had the same.
    pub(super) fn write_params(&mut self, gpu: &Gpu, vars: &[StepVars]) {
        if self.last_vars == vars {
            return;
        }
        for (s, step) in self.steps.iter().enumerate() {
            let node = &self.nodes[step.node];
            let p = node.kernel.params(step.index as usize, &vars[node.seq]);
            let at = s * self.stride as usize;
            self.staging[at..at + 128].copy_from_slice(bytemuck::cast_slice(&p.0));
        }
        gpu.queue.write_buffer(&self.params_buf, 0, &self.staging);
        for s in 0..self.steps.len() {
            self.counts[s] = self.counts_at(s, vars);
        }
        self.last_vars.clear();
        self.last_vars.extend_from_slice(vars);
    }

    pub(super) fn record(&self, pass: &mut wgpu::ComputePass<'_>, step: &Step, s: usize) {
        let [x, y, z] = self.counts[s];
        if x == 0 || y == 0 || z == 0 {
            return;
        }
        pass.set_pipeline(&step.pipeline.pipeline);
        pass.set_bind_group(0, &step.bind_group, &[]);
        pass.set_bind_group(1, &self.params_bg, &[(s as u64 * self.stride) as u32]);
        pass.dispatch_workgroups(x, y, z);
    }

    /// Run the whole graph: one pass, one submit, one wait; read-back tensors are then available from `read`.
    /// A plan of several sequences runs every one at `vars`.
    pub fn run(&mut self, gpu: &Gpu, vars: &StepVars) -> Result<()> {
        if self.seqs == 1 {
            self.run_seqs(gpu, std::slice::from_ref(vars))
        } else {
            self.run_seqs(gpu, &self.every_seq(vars))
        }
    }

    /// [`Plan::run`] with one vars per sequence of the graph ([`super::Graph::set_seq`]).
    pub fn run_seqs(&mut self, gpu: &Gpu, vars: &[StepVars]) -> Result<()> {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        self.encode(gpu, vars, &mut enc)?;
        submit_and_read(gpu, enc, &mut [self])
    }

    /// Run this plan at `vars` and then `next` at `next_vars` in one submission and one wait, copying each `(from,
    /// to, at)` between the two passes: tensor `from` of this plan into `next`'s input `to`, `at` bytes in (a draft's
    /// tokens become the verification's input on the device). Both plans' read-backs are then available.
    pub fn run_then(
        &mut self,
        gpu: &Gpu,
        vars: &[StepVars],
        (next, next_vars): (&mut Plan, &[StepVars]),
        copies: impl IntoIterator<Item = (TensorId, TensorId, u64)>,
    ) -> Result<()> {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        self.encode(gpu, vars, &mut enc)?;
        for (from, to, at) in copies {
            let (src, src_at) = self.buffer_of(from)?;
            let (_, want) = next.input(to)?;
            let bytes = self.tensors[from.0].bytes();
            if !at.is_multiple_of(4) || !bytes.is_multiple_of(4) || at + bytes > want {
                return Err(Error::Graph(format!(
                    "cannot copy {bytes} bytes of {} into input {to:?} ({want} bytes) at {at}",
                    self.tensors[from.0].name
                )));
            }
            let dst = next.buffers[to.0].as_ref().expect("inputs have buffers");
            enc.copy_buffer_to_buffer(src, src_at, dst, at, bytes);
        }
        next.encode(gpu, next_vars, &mut enc)?;
        submit_and_read(gpu, enc, &mut [self, next])
    }

    /// Write the params for `vars` and record the whole graph as one compute pass into `enc`.
    fn encode(&mut self, gpu: &Gpu, vars: &[StepVars], enc: &mut wgpu::CommandEncoder) -> Result<()> {
        self.check_seqs(vars)?;
        self.write_params(gpu, vars);
        let mut pass = enc.begin_compute_pass(&Default::default());
        for (s, step) in self.steps.iter().enumerate() {
            self.record(&mut pass, step, s);
        }
        Ok(())
    }

    /// The buffer holding graph tensor `id` (a node's output or an input), and where the tensor starts in it.
    fn buffer_of(&self, id: TensorId) -> Result<(&wgpu::Buffer, u64)> {
        let root = root_in(&self.tensors, id);
        match &self.buffers[root.0] {
            Some(b) => Ok((b.as_ref(), offset_in(&self.tensors, id))),
            None => Err(Error::Graph(format!(
                "tensor {} has no buffer of the plan's own",
                self.tensors[id.0].name
            ))),
        }
    }

    /// Input `id` and its size in bytes.
    fn input(&self, id: TensorId) -> Result<(TensorId, u64)> {
        self.inputs
            .iter()
            .find(|(t, _)| *t == id)
            .copied()
            .ok_or_else(|| Error::Graph(format!("tensor {id:?} is not an input")))
    }

    fn copy_readbacks(&self, enc: &mut wgpu::CommandEncoder) {
        for r in &self.readbacks {
            enc.copy_buffer_to_buffer(&r.src, r.offset, &r.staging, 0, r.staging.size());
        }
    }

    fn map_readbacks(&self) {
        for r in &self.readbacks {
            r.staging.map_async(wgpu::MapMode::Read, .., |_| {});
        }
    }

    /// Copy the mapped read-backs to their host buffers (after the wait).
    fn take_readbacks(&mut self) -> Result<()> {
        for r in &mut self.readbacks {
            let view = r.staging.get_mapped_range(..).map_err(|e| Error::Gpu {
                context: "readback".into(),
                message: e.to_string(),
            })?;
            r.host.copy_from_slice(&view[..r.bytes as usize]);
            drop(view);
            r.staging.unmap();
        }
        Ok(())
    }

    /// Bytes of a read-back tensor from the last run.
    pub fn read(&self, id: TensorId) -> Result<&[u8]> {
        self.readbacks
            .iter()
            .find(|r| r.tensor == id)
            .map(|r| r.host.as_slice())
            .ok_or_else(|| Error::Graph(format!("tensor {id:?} was not marked as an output")))
    }

    /// Copy a read-back tensor into `out` (reusing its allocation: the decode loop allocates nothing).
    pub fn read_into<T: bytemuck::Pod>(&self, id: TensorId, out: &mut Vec<T>) -> Result<()> {
        let bytes = self.read(id)?;
        let size = std::mem::size_of::<T>();
        out.clear();
        out.extend(bytes.chunks_exact(size).map(bytemuck::pod_read_unaligned::<T>));
        Ok(())
    }

    pub fn read_f32(&self, id: TensorId) -> Result<Vec<f32>> {
        Ok(bytemuck::pod_collect_to_vec(self.read(id)?))
    }

    pub fn read_u32(&self, id: TensorId) -> Result<Vec<u32>> {
        Ok(bytemuck::pod_collect_to_vec(self.read(id)?))
    }

    /// Run once, timing every node: timestamps inside the pass where the adapter has them, else one submit per node.
    /// A plan of several sequences profiles every one at `vars`.
    pub fn profile(&mut self, gpu: &Gpu, vars: &StepVars) -> Result<Vec<NodeProfile>> {
        let vars = self.every_seq(vars);
        self.write_params(gpu, &vars);
        let n = self.steps.len();
        let mut micros = vec![0f64; self.nodes.len()];
        let on_gpu = gpu.caps.timestamps_in_passes && n < 4095;
        if on_gpu {
            let count = n as u32 + 1;
            let qs = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("profile"),
                ty: wgpu::QueryType::Timestamp,
                count,
            });
            let resolve = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("timestamps"),
                size: 8 * count as u64,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.write_timestamp(&qs, 0);
                for (s, step) in self.steps.iter().enumerate() {
                    self.record(&mut pass, step, s);
                    pass.write_timestamp(&qs, s as u32 + 1);
                }
            }
            enc.resolve_query_set(&qs, 0..count, &resolve, 0);
            gpu.queue.submit([enc.finish()]);
            gpu.wait("profile")?;
            let ticks: Vec<u64> =
                bytemuck::pod_collect_to_vec(&crate::gpu::tensor::read_buffer(gpu, &resolve, 0, 8 * count as u64)?);
            let period = gpu.queue.get_timestamp_period() as f64;
            for (s, step) in self.steps.iter().enumerate() {
                micros[step.node] += ticks[s + 1].saturating_sub(ticks[s]) as f64 * period / 1000.0;
            }
        } else {
            for (i, node) in self.nodes.iter().enumerate() {
                let mut enc = gpu.device.create_command_encoder(&Default::default());
                {
                    let mut pass = enc.begin_compute_pass(&Default::default());
                    for s in node.steps.clone() {
                        self.record(&mut pass, &self.steps[s], s);
                    }
                }
                let t = Instant::now();
                gpu.queue.submit([enc.finish()]);
                gpu.wait("profile")?;
                micros[i] = t.elapsed().as_secs_f64() * 1e6;
            }
        }
        Ok(self
            .nodes
            .iter()
            .zip(micros)
            .map(|(node, micros)| NodeProfile {
                label: node.label.clone(),
                dispatches: node.steps.clone().filter(|&s| self.recorded(s, &vars)).count(),
                cost: node.kernel.step_cost(&vars[node.seq]),
                micros,
                timed_on_gpu: on_gpu,
            })
            .collect())
    }
}

/// Finish `enc` (the plans' passes recorded) with the plans' read-back copies, submit it, wait once, and take every
/// plan's read-backs.
fn submit_and_read(gpu: &Gpu, mut enc: wgpu::CommandEncoder, plans: &mut [&mut Plan]) -> Result<()> {
    for p in plans.iter() {
        p.copy_readbacks(&mut enc);
    }
    gpu.queue.submit([enc.finish()]);
    for p in plans.iter() {
        p.map_readbacks();
    }
    gpu.wait("run")?;
    for p in plans.iter_mut() {
        p.take_readbacks()?;
    }
    Ok(())
}

fn check_binding(gpu: &Gpu, name: &str, bytes: u64) -> Result<()> {
    if bytes > gpu.caps.max_binding {
        return Err(Error::BindingTooLarge {
            name: name.into(),
            bytes,
            limit: gpu.caps.max_binding,
        });
    }
    Ok(())
}

/// Buffer bytes of each tensor: its own bytes, or for a root tensor of which some dispatch binds a view (or itself)
/// as [`Bind::Uniform`], enough for [`UNIFORM_ARRAY_BYTES`] from the view's offset (padded so the fixed-size array
/// fits; the view must hold at most that many bytes).
fn alloc_bytes(tensors: &[TensorDesc], nodes: &[Node], dispatches: &[Vec<Dispatch>]) -> Result<Vec<u64>> {
    let mut alloc: Vec<u64> = tensors.iter().map(TensorDesc::bytes).collect();
    for (node, ds) in nodes.iter().zip(dispatches) {
        let io: Vec<TensorId> = node.inputs.iter().chain(&node.outputs).copied().collect();
        let uniforms = ds.iter().flat_map(|d| &d.bindings).filter_map(|b| match *b {
            Bind::Uniform(slot) => Some(slot),
            _ => None,
        });
        for slot in uniforms {
            let Some(&id) = io.get(slot) else {
                return Err(Error::Graph(format!("{}: bad binding slot {slot}", node.label)));
            };
            let r = root_in(tensors, id);
            let t = &tensors[r.0];
            if tensors[id.0].bytes() > UNIFORM_ARRAY_BYTES || !matches!(t.source, Source::Input | Source::Node) {
                return Err(Error::Graph(format!(
                    "{}: {} ({} bytes) cannot be bound as a {UNIFORM_ARRAY_BYTES}-byte uniform array",
                    node.label,
                    t.name,
                    t.bytes()
                )));
            }
            // The binding spans the whole array from the view's offset.
            alloc[r.0] = alloc[r.0].max(offset_in(tensors, id) + UNIFORM_ARRAY_BYTES);
        }
    }
    Ok(alloc)
}

/// The bind group of one dispatch: binding i is the node tensor (or row part) `bindings[i]` names, sized to the
/// tensor (a view binds its root's buffer at the view's offset and size).
fn bind_dispatch(
    gpu: &Gpu,
    tensors: &[TensorDesc],
    buffers: &[Option<Arc<wgpu::Buffer>>],
    io: &[TensorId],
    label: &str,
    bindings: &[Bind],
    pipeline: &Pipeline,
) -> Result<wgpu::BindGroup> {
    let root = |t: TensorId| root_in(tensors, t);
    let mut entries = Vec::with_capacity(bindings.len());
    for (b, bind) in bindings.iter().enumerate() {
        let (slot, part) = match *bind {
            Bind::Tensor(s) | Bind::Uniform(s) => (s, 0),
            Bind::Part(s, p) => (s, p),
        };
        let id = *io
            .get(slot)
            .ok_or_else(|| Error::Graph(format!("{}: bad binding slot {slot}", label)))?;
        let bytes = match bind {
            Bind::Uniform(_) => UNIFORM_ARRAY_BYTES,
            _ => tensors[id.0].bytes(),
        };
        let offset = offset_in(tensors, id);
        if !offset.is_multiple_of(gpu.caps.storage_align.max(1) as u64) {
            return Err(Error::Graph(format!(
                "{label}: {} starts {offset} bytes into its buffer, not a multiple of the adapter's {}-byte storage \
                 offset alignment",
                tensors[id.0].name, gpu.caps.storage_align
            )));
        }
        let id = root(id);
        let t = &tensors[id.0];
        let (buffer, size): (&wgpu::Buffer, u64) = match (&t.source, &buffers[id.0]) {
            (Source::External(g), _) => {
                if !matches!(bind, Bind::Part(..)) && g.parts.len() > 1 {
                    return Err(Error::BindingTooLarge {
                        name: t.name.clone(),
                        bytes: t.bytes(),
                        limit: gpu.caps.max_binding,
                    });
                }
                let p = g
                    .parts
                    .get(part)
                    .ok_or_else(|| Error::Graph(format!("{}: no part {part}", t.name)))?;
                (&p.buffer, p.bytes.min(bytes))
            }
            (_, Some(buf)) => (buf, bytes),
            (_, None) => return Err(Error::Graph(format!("{}: tensor {} has no buffer", label, t.name))),
        };
        entries.push(wgpu::BindGroupEntry {
            binding: b as u32,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer,
                offset,
                size: wgpu::BufferSize::new(size.next_multiple_of(4).max(4)),
            }),
        });
    }
    Ok(gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(label),
        layout: &pipeline.layout0,
        entries: &entries,
    }))
}

/// A staging buffer and a host copy for each tensor read back after a run.
fn readbacks(
    gpu: &Gpu,
    tensors: &[TensorDesc],
    buffers: &[Option<Arc<wgpu::Buffer>>],
    readback: Vec<TensorId>,
) -> Result<Vec<Readback>> {
    let root = |t: TensorId| root_in(tensors, t);
    let mut readbacks = Vec::new();
    for id in readback {
        let t = &tensors[root(id).0];
        let src = match (&t.source, &buffers[root(id).0]) {
            (Source::External(g), _) if g.parts.len() == 1 => g.parts[0].buffer.clone(),
            (_, Some(b)) => b.clone(),
            _ => return Err(Error::Graph(format!("cannot read back split tensor {}", t.name))),
        };
        let bytes = tensors[id.0].bytes();
        readbacks.push(Readback {
            tensor: id,
            src,
            offset: offset_in(tensors, id),
            staging: gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size: bytes.next_multiple_of(4).max(4),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            bytes,
            host: vec![0; bytes as usize],
        });
    }
    Ok(readbacks)
}

/// The uniform buffer holding every dispatch's parameter block (`size` bytes, one block per stride) and the bind
/// group that reads one block at a dynamic offset.
fn params_block(gpu: &Gpu, layout: &wgpu::BindGroupLayout, size: u64) -> (wgpu::Buffer, wgpu::BindGroup) {
    let params_buf = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("params"),
        size,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let params_bg = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("params"),
        layout,
        entries: &[wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &params_buf,
                offset: 0,
                size: wgpu::BufferSize::new(PARAMS_BYTES),
            }),
        }],
    });
    (params_buf, params_bg)
}

/// The last node that uses each tensor (read-back tensors live to the end). Views share their root's memory, so a
/// use of a view is a use of the root.
fn last_uses(tensors: &[TensorDesc], nodes: &[super::Node], readback: &[TensorId]) -> Vec<usize> {
    let root = |t: TensorId| root_in(tensors, t);
    let mut last_use = vec![0usize; tensors.len()];
    for (n, node) in nodes.iter().enumerate() {
        for t in node.inputs.iter().chain(&node.outputs) {
            last_use[root(*t).0] = n;
        }
    }
    for t in readback {
        last_use[root(*t).0] = usize::MAX;
    }
    last_use
}
