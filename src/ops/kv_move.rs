//! KV-cache moves within one layer: each (source, destination) position pair of a list, in order, for keys and
//! values. After a draft tree is verified, the accepted path's entries (written side by side, rope_kv's tree form)
//! move to consecutive positions, as plain decoding would have written them.

use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{grid, Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};

/// Most moves per run; the list is `[1 + 2 * MAX_MOVES]` u32: the count, then (source, destination) pairs.
pub const MAX_MOVES: usize = 16;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct KvMoveParams {
    n_kv: u32,
    row_words: u32,
    max_ctx: u32,
}

#[derive(Debug)]
pub struct KvMove {
    n_kv: usize,
    head_dim: usize,
    max_ctx: usize,
    /// The caches hold f16 pairs: a row is head_dim / 2 words.
    kv_f16: bool,
}

impl KvMove {
    /// 32-bit words per cached row (the kernel moves words, whatever the element type).
    fn row_words(&self) -> usize {
        if self.kv_f16 {
            self.head_dim / 2
        } else {
            self.head_dim
        }
    }
}

fn key() -> ShaderKey {
    ShaderKey::new("kv_move").def("MAX_MOVES", format!("{MAX_MOVES}u"))
}

impl Kernel for KvMove {
    fn name(&self) -> &'static str {
        "kv_move"
    }
    /// Node tensors: 0 k_cache, 1 v_cache (written in place), 2 moves.
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        vec![Dispatch {
            shader: key(),
            bindings: (0..3).map(Bind::Tensor).collect(),
            workgroups: grid(self.n_kv * self.row_words(), 64, caps.max_workgroups_per_dim),
        }]
    }
    fn params(&self, _: usize, _: &StepVars) -> Params {
        Params::of(&KvMoveParams {
            n_kv: self.n_kv as u32,
            row_words: self.row_words() as u32,
            max_ctx: self.max_ctx as u32,
        })
    }
    /// At most every move: keys and values of one position each.
    fn cost(&self) -> Cost {
        let bytes = 2 * 4 * (MAX_MOVES * self.n_kv * self.row_words()) as u64;
        Cost {
            bytes_read: bytes,
            bytes_written: bytes,
            flops: 0,
        }
    }
    fn reference(&self, io: &[HostIo], _: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| {
            let (mut k, mut v, moves) = (io[0].f32()?, io[1].f32()?, io[2].u32());
            let (n_kv, ctx, hd) = (self.n_kv, self.max_ctx, self.head_dim);
            reference(&mut k, &mut v, &moves, n_kv, ctx, hd);
            Ok(vec![Expected::at(0, k), Expected::at(1, v)])
        })
    }
    fn check_bound(&self, _: &Caps) -> f64 {
        0.0
    }
}

impl Graph {
    /// Move keys and values of `k_cache` / `v_cache` (`[n_kv, max_ctx, head_dim]`, both f32 or both f16) as `moves` (u32 `[1 + 2 *
    /// MAX_MOVES]`: the count, then (source, destination) position pairs) lists, in order. Moves naming a
    /// position at or past `max_ctx` are skipped.
    pub fn kv_move(&mut self, k_cache: TensorId, v_cache: TensorId, moves: TensorId) -> Result<()> {
        let cs = self.shape(k_cache).to_vec();
        let kv_f16 = super::attention_prefill::kv_f16(self, k_cache);
        let f32s = matches!(self.dtype(k_cache), DType::F32 | DType::F16)
            && self.dtype(v_cache) == self.dtype(k_cache)
            && (!kv_f16 || cs.last().is_some_and(|d| d % 2 == 0));
        let ok = cs.len() == 3
            && self.shape(v_cache) == cs.as_slice()
            && f32s
            && self.shape(moves) == [1 + 2 * MAX_MOVES]
            && self.dtype(moves) == DType::U32;
        if !ok {
            return Err(Error::shape(
                "kv_move",
                format!(
                    "caches {cs:?} / {:?}, moves {:?} {:?}: want two f32 (or f16, even head_dim) [n_kv, max_ctx, head_dim] and u32 [{}]",
                    self.shape(v_cache),
                    self.shape(moves),
                    self.dtype(moves),
                    1 + 2 * MAX_MOVES
                ),
            ));
        }
        let kernel = KvMove {
            n_kv: cs[0],
            head_dim: cs[2],
            max_ctx: cs[1],
            kv_f16,
        };
        self.add_effect(kernel, &[k_cache, v_cache, moves])
    }
}

/// The list of `pairs` (source, destination) in `kv_move`'s form, `[1 + 2 * MAX_MOVES]`; an error past MAX_MOVES.
pub fn moves_list(pairs: &[(u32, u32)]) -> Result<Vec<u32>> {
    if pairs.len() > MAX_MOVES {
        return Err(Error::Invalid(format!("{} KV moves (at most {MAX_MOVES})", pairs.len())));
    }
    let mut list = vec![0u32; 1 + 2 * MAX_MOVES];
    list[0] = pairs.len() as u32;
    for (i, &(s, d)) in pairs.iter().enumerate() {
        (list[1 + 2 * i], list[2 + 2 * i]) = (s, d);
    }
    Ok(list)
}

/// CPU reference: the moves applied in order to host copies of the caches.
pub fn reference(k: &mut [f32], v: &mut [f32], moves: &[u32], n_kv: usize, max_ctx: usize, head_dim: usize) {
    let n = (moves[0] as usize).min(MAX_MOVES);
    for i in 0..n {
        let (src, dst) = (moves[1 + 2 * i] as usize, moves[2 + 2 * i] as usize);
        if src == dst || src >= max_ctx || dst >= max_ctx {
            continue;
        }
        for h in 0..n_kv {
            let (s, t) = ((h * max_ctx + src) * head_dim, (h * max_ctx + dst) * head_dim);
            k.copy_within(s..s + head_dim, t);
            v.copy_within(s..s + head_dim, t);
        }
    }
}

pub fn variants() -> Vec<ShaderKey> {
    vec![key()]
}
