//! Top-k per row: indices and values of the k largest entries, sorted by value descending with ties to the lower
//! index; NaN ranks below every number (-inf included) and -0 equals +0. `argmax` is k = 1 (greedy decoding).
//!
//! One workgroup per row, or, for long rows with few of them (a vocabulary's logits), the row split into slices:
//! a first dispatch writes each slice's top-k, a second merges them.

use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{grid, Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};
use std::cmp::Ordering;
use std::sync::OnceLock;

/// Largest k the kernel supports (its private lists have a constant capacity).
pub const K_MAX: usize = 64;

/// Private list capacities compiled: a variant per step, so k = 10 does not pay for 64 slots.
const CAPACITIES: [usize; 5] = [1, 8, 16, 32, 64];

/// Workgroup sizes: small on CPU adapters (lavapipe runs a workgroup as 8-lane chunks, and the merge's barriers
/// switch between them), large on GPUs (many loads in flight per row).
const WG_CPU: usize = 8;
const WG_GPU: usize = 256;

/// GPU adapters: slices of 4096 elements (WG_GPU invocations x 4 elements x 4 steps) and up to 64 per row, so one
/// row of logits spreads over dozens of compute units.
const SLICE_GPU: usize = 4096;
const MAX_SLICES_GPU: usize = 64;
/// CPU adapters: a few slices, one per core; more would only add lists to merge (measured on lavapipe: 2 to 4
/// slices best for top-10 over 152K, 32 slices twice as slow).
const SLICE_CPU: usize = 32768;
const MAX_SLICES_CPU: usize = 4;
/// With this many rows or more, one workgroup per row already fills the device.
const ROWS_UNSPLIT: usize = 16;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct TopkParams {
    n: u32,
    k: u32,
    slices: u32,
    slice_len: u32,
    phase: u32,
    groups: u32,
}

#[derive(Debug)]
pub struct Topk {
    rows: usize,
    n: usize,
    k: usize,
    /// The split, chosen per adapter by `dispatches`; `params` and `cost` (given no caps) read it back.
    split: OnceLock<Split>,
}

/// How each row is cut: `slices` workgroups of `len` elements (a multiple of 4) each, merged by a second dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    pub slices: usize,
    pub len: usize,
}

/// The split for `rows` rows of `n` on a CPU adapter or a GPU. One slice when the rows alone fill the device.
pub fn split(rows: usize, n: usize, cpu_adapter: bool) -> Split {
    let (target, max) = if cpu_adapter {
        (SLICE_CPU, MAX_SLICES_CPU)
    } else {
        (SLICE_GPU, MAX_SLICES_GPU)
    };
    if rows >= ROWS_UNSPLIT || n <= target {
        return Split { slices: 1, len: n };
    }
    let slices = n.div_ceil(target).min(max);
    let len = n.div_ceil(slices).next_multiple_of(4);
    Split {
        slices: n.div_ceil(len),
        len,
    }
}

fn capacity(k: usize) -> usize {
    CAPACITIES.into_iter().find(|&c| c >= k).unwrap_or(K_MAX)
}

fn key(capacity: usize, wg: usize, subgroups: bool) -> ShaderKey {
    ShaderKey::new("topk")
        .def("KMAX", format!("{capacity}u"))
        .def("WG", format!("{wg}u"))
        .flag("ARGMAX", capacity == 1)
        .flag("SUBGROUPS", subgroups)
}

impl Topk {
    fn split(&self) -> Split {
        self.split
            .get()
            .copied()
            .unwrap_or_else(|| split(self.rows, self.n, false))
    }
    fn phases(&self) -> Vec<u32> {
        if self.split().slices > 1 {
            vec![0, 2]
        } else {
            vec![1]
        }
    }
    fn groups(&self, phase: u32) -> usize {
        if phase == 0 {
            self.rows * self.split().slices
        } else {
            self.rows
        }
    }
}

impl Kernel for Topk {
    fn name(&self) -> &'static str {
        "topk"
    }
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        let cpu = caps.cpu_adapter;
        self.split.get_or_init(|| split(self.rows, self.n, cpu));
        let wg = if cpu { WG_CPU } else { WG_GPU };
        let shader = key(capacity(self.k), wg, caps.subgroups);
        self.phases()
            .into_iter()
            .map(|phase| Dispatch {
                shader: shader.clone(),
                bindings: vec![Bind::Tensor(0), Bind::Tensor(1), Bind::Tensor(2), Bind::Tensor(3)],
                workgroups: grid(self.groups(phase), 1, caps.max_workgroups_per_dim),
            })
            .collect()
    }
    fn params(&self, i: usize, _: &StepVars) -> Params {
        let phase = self.phases()[i];
        let s = self.split();
        Params::of(&TopkParams {
            n: self.n as u32,
            k: self.k as u32,
            slices: s.slices as u32,
            slice_len: s.len as u32,
            phase,
            groups: self.groups(phase) as u32,
        })
    }
    fn cost(&self) -> Cost {
        let (rows, k) = (self.rows as u64, self.k as u64);
        // Candidates of the slices: written by the first dispatch, read by the second.
        let slices = self.split().slices as u64;
        let part = if slices > 1 { 8 * rows * slices * k } else { 0 };
        Cost {
            // The row once, then the winners' values again.
            bytes_read: 4 * rows * self.n as u64 + 4 * rows * k + part,
            bytes_written: 8 * rows * k + part,
            // No arithmetic: one comparison per element, counted as the op's work.
            flops: rows * self.n as u64,
        }
    }
    /// Node tensors: x, ids, values, scratch. The ids are exact (ties go to the lowest index), as the values.
    fn reference(&self, io: &[HostIo], _: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| {
            let (ids, values) = reference(&io[0].f32()?, self.n, self.k);
            Ok(vec![
                Expected::at(1, ids.iter().map(|&i| i as f32).collect()),
                Expected::at(2, values),
            ])
        })
    }
    fn check_bound(&self, _: &Caps) -> f64 {
        0.0
    }
}

impl Graph {
    /// The `k` largest entries along the last dim of `x` (f32, `[.., n]`): `(ids [.., k] u32, values [.., k] f32)`,
    /// sorted by value descending, ties to the lower index. NaN ranks below every number, so it is picked only
    /// when fewer than `k` numbers are left (then lowest index first); -inf is an ordinary value; -0 equals +0.
    /// `1 <= k <= min(n, 64)`.
    pub fn topk(&mut self, x: TensorId, k: usize) -> Result<(TensorId, TensorId)> {
        let shape = self.shape(x).to_vec();
        let Some(&n) = shape.last() else {
            return Err(Error::shape("topk", "x is a scalar; expected [rows, n]"));
        };
        if self.dtype(x) != DType::F32 {
            return Err(Error::shape("topk", format!("x is {:?}; expected f32", self.dtype(x))));
        }
        if k == 0 || k > K_MAX || k > n {
            return Err(Error::shape(
                "topk",
                format!("k = {k} for rows of {n}; expected 1 <= k <= min(n, {K_MAX})"),
            ));
        }
        if n >= 1 << 31 {
            return Err(Error::shape("topk", format!("rows of {n} elements; at most 2^31 - 1")));
        }
        let rows = shape[..shape.len() - 1].iter().product::<usize>();
        // Room for the candidates of either adapter kind's split (the kernel picks one when it sees the caps).
        let slices = split(rows, n, true).slices.max(split(rows, n, false).slices);
        let mut out = shape.clone();
        *out.last_mut().expect("rank >= 1") = k;
        // Scratch for the slices' candidates (a placeholder word when the rows are not split).
        let part: Vec<usize> = if slices > 1 { vec![rows, slices, k, 2] } else { vec![1] };
        let kernel = Topk {
            rows,
            n,
            k,
            split: OnceLock::new(),
        };
        let o = self.add_node(
            kernel,
            &[x],
            &[
                ("topk.ids", &out, DType::U32),
                ("topk.values", &out, DType::F32),
                ("topk.part", &part, DType::U32),
            ],
        )?;
        Ok((o[0], o[1]))
    }

    /// Index of the largest entry along the last dim of `x` (`[.., n]` f32 -> `[.., 1]` u32), the lowest on ties;
    /// NaN ranks below every number. The greedy-decoding step over a row of logits.
    pub fn argmax(&mut self, x: TensorId) -> Result<TensorId> {
        Ok(self.topk(x, 1)?.0)
    }
}

/// The order the kernel sorts by: value descending, NaN after every number, equal values (and -0, +0) tied. Also
/// `block_topk`'s ranking of candidate blocks.
pub(super) fn descending(a: f32, b: f32) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => b.partial_cmp(&a).unwrap_or(Ordering::Equal),
    }
}

/// CPU reference over rows of `n`: a stable sort by (value desc, index asc), the first `k` of each row.
pub fn reference(x: &[f32], n: usize, k: usize) -> (Vec<u32>, Vec<f32>) {
    let (mut ids, mut values) = (Vec::new(), Vec::new());
    for row in x.chunks(n.max(1)) {
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| descending(row[a], row[b]));
        ids.extend(order.iter().take(k).map(|&i| i as u32));
        values.extend(order.iter().take(k).map(|&i| row[i]));
    }
    (ids, values)
}

pub fn variants() -> Vec<ShaderKey> {
    let mut v = Vec::new();
    for capacity in CAPACITIES {
        for wg in [WG_CPU, WG_GPU] {
            for subgroups in [false, true] {
                v.push(key(capacity, wg, subgroups));
            }
        }
    }
    v
}
