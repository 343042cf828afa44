//! KV-cache append: copy a step's keys (or values) into one layer's cache at positions `pos .. pos + n_tokens`.
//!
//! Cache layout (shared with `attention_prefill` and `attention_decode`): per layer one K cache and one V cache,
//! each an external f32 or f16 tensor `[n_kv_heads, max_ctx, head_dim]` (f16: halves packed two to a word, the
//! `KV_F16` variants, lib/kv_cache.wgsl), each head's positions contiguous. The position
//! comes from `StepVars::pos` at run time, so the same plan serves every decode step.

use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{grid, Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct KvWriteParams {
    n_tokens: u32,
    n_kv: u32,
    head_dim: u32,
    max_ctx: u32,
    pos: u32,
}

#[derive(Debug)]
pub struct KvWrite {
    n_tokens: usize,
    n_kv: usize,
    head_dim: usize,
    max_ctx: usize,
    /// Keys and values in one dispatch (inputs k, v, k_cache, v_cache).
    pair: bool,
    /// The cache holds f16: one invocation per pair of elements, rounded to f16.
    kv_f16: bool,
}

fn key(pair: bool, kv_f16: bool) -> ShaderKey {
    ShaderKey::new("kv_write").flag("PAIR", pair).flag("KV_F16", kv_f16)
}

impl Kernel for KvWrite {
    fn name(&self) -> &'static str {
        "kv_write"
    }
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        vec![Dispatch {
            shader: key(self.pair, self.kv_f16),
            bindings: (0..if self.pair { 4 } else { 2 }).map(Bind::Tensor).collect(),
            workgroups: grid(
                self.n_tokens * self.n_kv * self.head_dim / if self.kv_f16 { 2 } else { 1 },
                256,
                caps.max_workgroups_per_dim,
            ),
        }]
    }
    fn params(&self, _: usize, vars: &StepVars) -> Params {
        Params::of(&KvWriteParams {
            n_tokens: self.n_tokens as u32,
            n_kv: self.n_kv as u32,
            head_dim: self.head_dim as u32,
            max_ctx: self.max_ctx as u32,
            pos: vars.pos,
        })
    }
    fn cost(&self) -> Cost {
        let elems = (self.n_tokens * self.n_kv * self.head_dim) as u64 * if self.pair { 2 } else { 1 };
        Cost {
            bytes_read: 4 * elems,
            bytes_written: super::attention_prefill::kv_elem_bytes(self.kv_f16) * elems,
            flops: 0,
        }
    }
    /// Node tensors: k, cache; or k, v, k_cache, v_cache. The caches are written in place.
    fn reference(&self, io: &[HostIo], vars: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| {
            let pairs: &[(usize, usize)] = if self.pair { &[(0, 2), (1, 3)] } else { &[(0, 1)] };
            let mut out = Vec::new();
            for &(src, dst) in pairs {
                let mut cache = io[dst].f32()?;
                let (n_kv, ctx, hd) = (self.n_kv, self.max_ctx, self.head_dim);
                let mut k = io[src].f32()?;
                if self.kv_f16 {
                    k = round_f16(&k);
                }
                reference(&k, &mut cache, n_kv, ctx, hd, vars.pos as usize);
                out.push(Expected::at(dst, cache));
            }
            Ok(out)
        })
    }
    /// Exact for f32; an f16 cache allows the rounding mode the adapter picks (nearest or toward zero).
    fn check_bound(&self, _: &Caps) -> f64 {
        if self.kv_f16 {
            1e-6
        } else {
            0.0
        }
    }
}

impl Graph {
    /// Write `k` `[n_tokens, n_kv_heads, head_dim]` into `cache` `[n_kv_heads, max_ctx, head_dim]` at positions
    /// `vars.pos + i` (`k` f32, `cache` f32 or f16 with an even head_dim). Tokens that would land at or past
    /// `max_ctx` are dropped by the kernel.
    pub fn kv_write(&mut self, k: TensorId, cache: TensorId) -> Result<()> {
        let kernel = self.kv_write_kernel(k, cache, false)?;
        self.add_effect(kernel, &[k, cache])
    }

    /// [`Graph::kv_write`] of keys and values in one dispatch: `k` into `k_cache`, `v` into `v_cache`.
    pub fn kv_write_pair(&mut self, k: TensorId, v: TensorId, k_cache: TensorId, v_cache: TensorId) -> Result<()> {
        if self.shape(k) != self.shape(v) || self.shape(k_cache) != self.shape(v_cache) {
            return Err(Error::shape(
                "kv_write",
                format!(
                    "k {:?} / v {:?} into caches {:?} / {:?}: the pairs must match",
                    self.shape(k),
                    self.shape(v),
                    self.shape(k_cache),
                    self.shape(v_cache)
                ),
            ));
        }
        self.kv_write_kernel(v, v_cache, true)?;
        let kernel = self.kv_write_kernel(k, k_cache, true)?;
        self.add_effect(kernel, &[k, v, k_cache, v_cache])
    }

    fn kv_write_kernel(&self, k: TensorId, cache: TensorId, pair: bool) -> Result<KvWrite> {
        let (ks, cs) = (self.shape(k).to_vec(), self.shape(cache).to_vec());
        let ok = ks.len() == 3
            && cs.len() == 3
            && ks[1] == cs[0]
            && ks[2] == cs[2]
            && ks[0] >= 1
            && ks[0] <= cs[1]
            && self.dtype(k) == DType::F32
            && (self.dtype(cache) == DType::F32 || self.dtype(cache) == DType::F16 && ks[2].is_multiple_of(2));
        if !ok {
            return Err(Error::shape(
                "kv_write",
                format!(
                    "k {ks:?} {:?} into cache {cs:?} {:?}: expected f32 [n_tokens, n_kv, head_dim] into f32 \
                     or f16 (even head_dim) [n_kv, max_ctx, head_dim] with n_tokens <= max_ctx",
                    self.dtype(k),
                    self.dtype(cache)
                ),
            ));
        }
        Ok(KvWrite {
            n_tokens: ks[0],
            n_kv: ks[1],
            head_dim: ks[2],
            max_ctx: cs[1],
            pair,
            kv_f16: super::attention_prefill::kv_f16(self, cache),
        })
    }
}

/// CPU reference: `cache` `[n_kv, max_ctx, head_dim]` after writing `k` `[n_tokens, n_kv, head_dim]` at `pos`
/// (tokens past `max_ctx` dropped, as the kernel does).
pub fn reference(k: &[f32], cache: &mut [f32], n_kv: usize, max_ctx: usize, head_dim: usize, pos: usize) {
    let n_tokens = k.len() / (n_kv * head_dim).max(1);
    for t in 0..n_tokens {
        if pos + t >= max_ctx {
            break;
        }
        for h in 0..n_kv {
            let src = (t * n_kv + h) * head_dim;
            let dst = (h * max_ctx + pos + t) * head_dim;
            cache[dst..dst + head_dim].copy_from_slice(&k[src..src + head_dim]);
        }
    }
}

/// `x` rounded to f16 and back (round to nearest even): what an f16 cache holds of it.
pub fn round_f16(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect()
}

pub fn variants() -> Vec<ShaderKey> {
    [(false, false), (true, false), (false, true), (true, true)]
        .map(|(pair, f16)| key(pair, f16))
        .to_vec()
}
