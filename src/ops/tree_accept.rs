//! Greedy acceptance of a verified draft tree on the device: the path from the root that follows, at each row, the
//! child whose token is that row's argmax, and the `kv_move` list that puts the path's K/V at consecutive
//! positions. With it a greedy tree step accepts and moves in its own submission (no second round trip).

use super::attention_decode::{MAX_TREE_DEPTH, MAX_TREE_ROWS, TREE_W};
use super::kv_move::MAX_MOVES;
use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};

/// Entries of the path tensor: the length, then up to `TREE_W` rows (a path holds at most `MAX_TREE_DEPTH + 1`).
pub const PATH_LEN: usize = 1 + TREE_W;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct TreeAcceptParams {
    n: u32,
    pos: u32,
}

#[derive(Debug)]
pub struct TreeAccept {
    n: usize,
}

fn key() -> ShaderKey {
    ShaderKey::new("tree_accept")
        .def("TREE_W", format!("{TREE_W}u"))
        .def("MAX_MOVES", format!("{MAX_MOVES}u"))
}

impl Kernel for TreeAccept {
    fn name(&self) -> &'static str {
        "tree_accept"
    }
    /// Node tensors: 0 ids, 1 table, 2 choice, 3 path, 4 moves.
    fn dispatches(&self, _: &Caps) -> Vec<Dispatch> {
        vec![Dispatch {
            shader: key(),
            bindings: (0..5).map(Bind::Tensor).collect(),
            workgroups: [1, 1, 1],
        }]
    }
    fn params(&self, _: usize, vars: &StepVars) -> Params {
        Params::of(&TreeAcceptParams {
            n: self.n as u32,
            pos: vars.pos,
        })
    }
    /// At most every row's table entry, token and choice, once per step of the walk.
    fn cost(&self) -> Cost {
        Cost {
            bytes_read: (4 * self.n * (TREE_W + 2) * MAX_TREE_DEPTH) as u64,
            bytes_written: (4 * (PATH_LEN + 1 + 2 * MAX_MOVES)) as u64,
            flops: 0,
        }
    }
    fn reference(&self, io: &[HostIo], vars: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| {
            let (path, moves) = reference(&io[0].u32(), &io[1].u32(), &io[2].u32(), vars.pos);
            let f = |v: Vec<u32>| v.iter().map(|&x| x as f32).collect();
            Ok(vec![Expected::at(3, f(path)), Expected::at(4, f(moves))])
        })
    }
    fn check_bound(&self, _: &Caps) -> f64 {
        0.0
    }
}

impl Graph {
    /// The greedy path through a verified draft tree: `ids` `[n]` u32 (each row's token), `table` `[n, TREE_W]`
    /// u32 (`attention_decode`'s tree table), `choice` `[n]` or `[n, 1]` u32 (each row's argmax). Returns `(path
    /// [PATH_LEN] u32, moves [1 + 2 * MAX_MOVES] u32)`: the path's length and rows from the root (row 0), and
    /// `kv_move`'s list that moves each path row's K/V from `pos + slot` to `pos + depth`.
    pub fn tree_accept(&mut self, ids: TensorId, table: TensorId, choice: TensorId) -> Result<(TensorId, TensorId)> {
        let n = self.shape(ids).iter().product::<usize>();
        let u32s = [ids, table, choice].iter().all(|&t| self.dtype(t) == DType::U32);
        let ok = u32s
            && self.shape(ids) == [n]
            && (1..=MAX_TREE_ROWS).contains(&n)
            && self.shape(table) == [n, TREE_W]
            && self.shape(choice).iter().product::<usize>() == n
            && self.shape(choice)[0] == n;
        if !ok {
            return Err(Error::shape(
                "tree_accept",
                format!(
                    "ids {:?} {:?}, table {:?}, choice {:?}: want u32 [n] (1 <= n <= {MAX_TREE_ROWS}), [n, {TREE_W}] and [n]",
                    self.shape(ids),
                    self.dtype(ids),
                    self.shape(table),
                    self.shape(choice)
                ),
            ));
        }
        let o = self.add_node(
            TreeAccept { n },
            &[ids, table, choice],
            &[
                ("tree_accept.path", &[PATH_LEN], DType::U32),
                ("tree_accept.moves", &[1 + 2 * MAX_MOVES], DType::U32),
            ],
        )?;
        Ok((o[0], o[1]))
    }
}

/// CPU reference: (path `[PATH_LEN]`, moves `[1 + 2 * MAX_MOVES]`) as the shader writes them, zeros past the path's
/// length and the move count.
pub fn reference(ids: &[u32], table: &[u32], choice: &[u32], pos: u32) -> (Vec<u32>, Vec<u32>) {
    let n = ids.len();
    let depth = |r: usize| (table[r * TREE_W] as usize).min(MAX_TREE_DEPTH);
    let slot = |r: usize| table[r * TREE_W + 1 + depth(r)];
    let mut path = vec![0u32; PATH_LEN];
    let mut moves = vec![0u32; 1 + 2 * MAX_MOVES];
    let mut pairs = Vec::new();
    if slot(0) != 0 {
        pairs.push((pos + slot(0), pos));
    }
    let (mut node, mut len) = (0usize, 1usize);
    for k in 1..=MAX_TREE_DEPTH {
        let d = depth(node);
        let next = (node + 1..n).find(|&c| {
            depth(c) == d + 1 && table[c * TREE_W + 1 + d] == slot(node) && ids[c] == choice[node]
        });
        let Some(c) = next else { break };
        node = c;
        path[1 + len] = c as u32;
        len += 1;
        if slot(c) != k as u32 && pairs.len() < MAX_MOVES {
            pairs.push((pos + slot(c), pos + k as u32));
        }
    }
    path[0] = len as u32;
    moves[0] = pairs.len() as u32;
    for (i, (s, d)) in pairs.into_iter().enumerate() {
        (moves[1 + 2 * i], moves[2 + 2 * i]) = (s, d);
    }
    (path, moves)
}

pub fn variants() -> Vec<ShaderKey> {
    vec![key()]
}
