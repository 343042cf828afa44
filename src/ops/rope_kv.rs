//! One step's attention inputs in one dispatch: from its q, k and v projections (one stacked q|k|v tensor, or two, or
//! three),
//! RoPE of q and k (after Qwen3's and Gemma 3's per-head q/k RMSNorm), q written out, k and v appended to the layer's
//! KV cache at positions `StepVars.pos + token` (the tree form: at the depth and in the slot a draft tree's table
//! gives each token, see `attention_decode::TREE_W`). The fused form of `rms_norm` + `rope_pair` + `kv_write_pair`, whose
//! CPU references are its reference.

use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{grid, Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};
use crate::ops::rope::RopeConfig;
use crate::ops::attention_decode::{tree_path_slot, tree_row_depth, with_tree, TREE_W};
use crate::ops::{kv_write, rms_norm, rope};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct RopeKvParams {
    n_tokens: u32,
    rope: RopeFields,
    eps: f32,
    stride: [u32; 3],
    offset: [u32; 3],
}

/// The heads, rotation and cache fields of the params of the shaders that rotate q and k and write the caches
/// (rope_kv, and matmul_q's rope epilogue), in the order both declare them.
#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct RopeFields {
    n_heads: u32,
    n_kv: u32,
    head_dim: u32,
    rot_dim: u32,
    pos: u32,
    style: u32,
    max_ctx: u32,
    log2_theta: f32,
    freq_scale: f32,
    attn_factor: f32,
}

impl RopeFields {
    pub(crate) fn new(d: QkvDims, cfg: &RopeConfig, pos: u32) -> RopeFields {
        RopeFields {
            n_heads: d.n_heads as u32,
            n_kv: d.n_kv as u32,
            head_dim: d.head_dim as u32,
            rot_dim: cfg.rot_dim as u32,
            pos,
            style: cfg.style.code(),
            max_ctx: d.max_ctx as u32,
            log2_theta: cfg.log2_theta(),
            freq_scale: cfg.freq_scale,
            attn_factor: cfg.attn_factor,
        }
    }
}

/// Where a step's projections come from: tensors `[n_tokens, cols]`, each with how many of q, k and v it holds side
/// by side, in that order (q `n_heads * head_dim` columns, k and v `n_kv * head_dim` each): one stacked q|k|v
/// matmul's output, q|k and v, or three.
#[derive(Clone, Debug)]
pub struct QkvSource(pub Vec<(TensorId, usize)>);

impl QkvSource {
    /// One matmul's output `[n_tokens, (n_heads + 2 n_kv) head_dim]`: each row q, then k, then v.
    pub fn stacked(qkv: TensorId) -> QkvSource {
        QkvSource(vec![(qkv, 3)])
    }

    /// Three matmuls' outputs.
    pub fn split(q: TensorId, k: TensorId, v: TensorId) -> QkvSource {
        QkvSource(vec![(q, 1), (k, 1), (v, 1)])
    }
}

/// The sizes of a rope_kv step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QkvDims {
    pub n_tokens: usize,
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub max_ctx: usize,
}

#[derive(Debug)]
pub struct RopeKv {
    dims: QkvDims,
    cfg: RopeConfig,
    /// The q/k norms' epsilon, when the heads are normed first.
    eps: Option<f32>,
    /// Source tensors (1 to 3).
    sources: usize,
    /// The source of q, k and v, and their (row stride, offset of token 0) in it, in elements.
    src_of: [usize; 3],
    layout: [(usize, usize); 3],
    /// The tree form: node tensor caches + 2 is the tree table (q_out then follows it).
    tree: bool,
    /// The caches hold f16 (lib/kv_cache.wgsl): k and v rounded as they are cached.
    kv_f16: bool,
}

fn key(norm: bool, factors: bool, tree: bool, kv_f16: bool) -> ShaderKey {
    let key = ShaderKey::new("rope_kv").flag("NORM", norm).flag("FACTORS", factors);
    with_tree(key, tree).flag("KV_F16", kv_f16)
}

impl RopeKv {
    /// Node tensor indices: sources, (qk_norm), (factors), k_cache, v_cache, (tree), then q_out.
    fn slots(&self) -> (usize, usize) {
        let norm = self.sources;
        let caches = norm + usize::from(self.eps.is_some()) + usize::from(self.cfg.factors.is_some());
        (norm, caches)
    }

    /// q, k and v `[n_tokens, heads * head_dim]` from host copies of the sources.
    fn split_sources(&self, io: &[HostIo]) -> Result<[Vec<f32>; 3]> {
        let d = self.dims;
        let widths = [d.n_heads, d.n_kv, d.n_kv].map(|h| h * d.head_dim);
        let mut out: [Vec<f32>; 3] = Default::default();
        for (i, ((stride, offset), width)) in self.layout.iter().zip(widths).enumerate() {
            let src = io[self.src_of[i]].f32()?;
            out[i] = (0..d.n_tokens)
                .flat_map(|t| src[t * stride + offset..t * stride + offset + width].to_vec())
                .collect();
        }
        Ok(out)
    }
}

impl Kernel for RopeKv {
    fn name(&self) -> &'static str {
        "rope_kv"
    }
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        let (norm, caches) = self.slots();
        let src = |i: usize| Bind::Tensor(self.src_of[i]);
        let q_out = caches + 2 + usize::from(self.tree);
        let mut bindings = vec![
            Bind::Tensor(caches),
            Bind::Tensor(caches + 1),
            Bind::Tensor(q_out),
            src(0),
            src(1),
            src(2),
        ];
        if self.eps.is_some() {
            bindings.push(Bind::Tensor(norm));
        }
        if self.cfg.factors.is_some() {
            bindings.push(Bind::Tensor(caches - 1));
        }
        if self.tree {
            bindings.push(Bind::Tensor(caches + 2));
        }
        let d = self.dims;
        vec![Dispatch {
            shader: key(self.eps.is_some(), self.cfg.factors.is_some(), self.tree, self.kv_f16),
            bindings,
            workgroups: grid(d.n_tokens * (d.n_heads + 2 * d.n_kv), 64, caps.max_workgroups_per_dim),
        }]
    }
    fn params(&self, _: usize, vars: &StepVars) -> Params {
        let d = self.dims;
        Params::of(&RopeKvParams {
            n_tokens: d.n_tokens as u32,
            rope: RopeFields::new(d, &self.cfg, vars.pos),
            eps: self.eps.unwrap_or(0.0),
            stride: self.layout.map(|l| l.0 as u32),
            offset: self.layout.map(|l| l.1 as u32),
        })
    }
    fn cost(&self) -> Cost {
        let d = self.dims;
        let heads = (d.n_tokens * (d.n_heads + d.n_kv)) as u64;
        let n = (d.n_tokens * (d.n_heads + 2 * d.n_kv) * d.head_dim) as u64;
        let norm = if self.eps.is_some() { 8 * d.head_dim as u64 } else { 0 };
        let factors = if self.cfg.factors.is_some() { 2 * self.cfg.rot_dim as u64 } else { 0 };
        let cached = (d.n_tokens * 2 * d.n_kv * d.head_dim) as u64;
        let cache_bytes = super::attention_prefill::kv_elem_bytes(self.kv_f16);
        Cost {
            bytes_read: 4 * n + norm + factors,
            bytes_written: 4 * (n - cached) + cache_bytes * cached,
            // Per q/k head: 4 per dim for the norm, and per pair 6 for the rotation and ~20 for the angle.
            flops: heads * (if self.eps.is_some() { 4 * d.head_dim as u64 } else { 0 } + 13 * self.cfg.rot_dim as u64),
        }
    }
    /// The composition of the ops' CPU references: rms_norm of each head (NORM), rope of q and k, kv_write of k and
    /// v into host copies of the caches.
    fn reference(&self, io: &[HostIo], vars: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| {
            let (norm, caches) = self.slots();
            let [q, k, v] = self.split_sources(io)?;
            let qk_norm = match self.eps {
                Some(eps) => Some((io[norm].f32()?, eps)),
                None => None,
            };
            let factors = match self.cfg.factors {
                Some(_) => Some(io[caches - 1].f32()?),
                None => None,
            };
            let (mut kc, mut vc) = (io[caches].f32()?, io[caches + 1].f32()?);
            let host = HostQkv {
                q: &q,
                k: &k,
                v: &v,
                qk_norm: qk_norm.as_ref().map(|(w, eps)| (w.as_slice(), *eps)),
                factors: factors.as_deref(),
            };
            let q_out = if self.tree {
                let table = io[caches + 2].u32();
                reference_tree(self.dims, &self.cfg, &host, (vars.pos, &table), &mut kc, &mut vc)
            } else {
                reference(self.dims, &self.cfg, &host, vars.pos, &mut kc, &mut vc)
            };
            if self.kv_f16 {
                (kc, vc) = (kv_write::round_f16(&kc), kv_write::round_f16(&vc));
            }
            Ok(vec![
                Expected::at(caches, kc),
                Expected::at(caches + 1, vc),
                Expected::at(caches + 2 + usize::from(self.tree), q_out),
            ])
        })
    }
    /// An f16 cache may round a key the other way where the f32 math differs in its last bit.
    fn check_bound(&self, _: &Caps) -> f64 {
        if self.kv_f16 {
            1e-6
        } else {
            1e-8
        }
    }
}

impl Graph {
    /// RoPE of q and k from `src` (each head RMS-normed first with `qk_norm` `[2, head_dim]` f32, q's weights then
    /// k's, and its epsilon), k and v appended to `k_cache` / `v_cache` (`[n_kv, max_ctx, head_dim]`, both f32 or
    /// both f16) at
    /// positions `vars.pos + t` (tokens at or past `max_ctx` are not cached); returns the rotated q `[n_tokens,
    /// n_heads, head_dim]`. One dispatch.
    pub fn rope_kv(
        &mut self,
        src: QkvSource,
        qk_norm: Option<(TensorId, f32)>,
        cfg: RopeConfig,
        k_cache: TensorId,
        v_cache: TensorId,
    ) -> Result<TensorId> {
        self.rope_kv_tree(src, qk_norm, cfg, (k_cache, v_cache), None)
    }

    /// [`Graph::rope_kv`], or with `tree` (u32 `[n_tokens, TREE_W]`, see `attention_decode::TREE_W`) its tree form:
    /// token t rotated at position `vars.pos + depth(t)` and cached in slot `vars.pos + slot(t)`.
    pub fn rope_kv_tree(
        &mut self,
        src: QkvSource,
        qk_norm: Option<(TensorId, f32)>,
        cfg: RopeConfig,
        (k_cache, v_cache): (TensorId, TensorId),
        tree: Option<TensorId>,
    ) -> Result<TensorId> {
        let cs = self.shape(k_cache).to_vec();
        let bad = |why: String| Error::shape("rope_kv", format!("{src:?} into caches {cs:?}: {why}"));
        let f32s = |g: &Graph, ts: &[TensorId]| ts.iter().all(|&t| g.dtype(t) == DType::F32);
        let Some(([n_kv, max_ctx, head_dim], kv_f16)) = self.kv_cache_pair(k_cache, v_cache) else {
            return Err(bad(KV_CACHE_PAIR.into()));
        };
        let rows = |g: &Graph, t: TensorId| match g.shape(t) {
            &[n, cols] if g.dtype(t) == DType::F32 => Ok((n, cols)),
            s => Err(bad(format!("want f32 [n_tokens, cols] sources, got {s:?} {:?}", g.dtype(t)))),
        };
        let kv_cols = n_kv * head_dim;
        let holds: Vec<usize> = src.0.iter().map(|s| s.1).collect();
        if holds.iter().sum::<usize>() != 3 || holds.contains(&0) {
            return Err(bad("the sources must hold q, k and v, each once".into()));
        }
        let mut inputs = Vec::new();
        let (mut src_of, mut layout, mut n_tokens, mut q_cols) = ([0; 3], [(0, 0); 3], 0, 0);
        let mut p = 0; // the projection: 0 q, 1 k, 2 v
        for (i, &(t, count)) in src.0.iter().enumerate() {
            let (n, cols) = rows(self, t)?;
            // q's columns are the rest of its tensor's.
            let widths: Vec<usize> = (p..p + count)
                .map(|p| if p == 0 { cols.saturating_sub(kv_cols * (count - 1)) } else { kv_cols })
                .collect();
            if (i > 0 && n != n_tokens) || widths.iter().sum::<usize>() != cols || widths.contains(&0) {
                return Err(bad(format!("source {i}: [{n}, {cols}] does not hold {count} of q, k, v")));
            }
            let mut offset = 0;
            for w in widths {
                (src_of[p], layout[p]) = (i, (cols, offset));
                if p == 0 {
                    q_cols = w;
                }
                offset += w;
                p += 1;
            }
            n_tokens = n;
            inputs.push(t);
        }
        if !q_cols.is_multiple_of(head_dim) {
            return Err(bad(format!("q's {q_cols} columns are not n_heads * {head_dim}")));
        }
        let n_heads = q_cols / head_dim;
        let sources = inputs.len();
        if n_tokens == 0 || n_tokens > max_ctx {
            return Err(bad(format!("{n_tokens} tokens (1..={max_ctx})")));
        }
        self.rope_config_check(&cfg, head_dim).map_err(|e| bad(format!("{cfg:?}: {e}")))?;
        if let Some((w, _)) = qk_norm {
            if self.shape(w).iter().product::<usize>() != 2 * head_dim || !f32s(self, &[w]) {
                return Err(bad(format!("qk_norm must be f32 [2, {head_dim}], got {:?}", self.shape(w))));
            }
            inputs.push(w);
        }
        inputs.extend(cfg.factors);
        inputs.extend([k_cache, v_cache]);
        if let Some(t) = tree {
            if self.shape(t) != [n_tokens, TREE_W] || self.dtype(t) != DType::U32 {
                return Err(bad(format!("tree {:?}: want u32 [{n_tokens}, {TREE_W}]", self.shape(t))));
            }
            inputs.push(t);
        }
        let dims = QkvDims {
            n_tokens,
            n_heads,
            n_kv,
            head_dim,
            max_ctx,
        };
        let kernel = RopeKv {
            dims,
            cfg,
            eps: qk_norm.map(|(_, eps)| eps),
            sources,
            src_of,
            layout,
            tree: tree.is_some(),
            kv_f16,
        };
        let out = [n_tokens, n_heads, head_dim];
        Ok(self.add_node(kernel, &inputs, &[("rope_q", &out, DType::F32)])?[0])
    }
}

/// What [`Graph::kv_cache_pair`] accepts, for errors.
pub(crate) const KV_CACHE_PAIR: &str =
    "want two non-empty caches [n_kv, max_ctx, head_dim] of one shape, both f32 or both f16 (even head_dim)";

impl Graph {
    /// `[n_kv, max_ctx, head_dim]` of the caches a step writes, and whether they hold f16: two non-empty tensors of
    /// one shape, both f32 or both f16 (head_dim even); `None` otherwise.
    pub(crate) fn kv_cache_pair(&self, k_cache: TensorId, v_cache: TensorId) -> Option<([usize; 3], bool)> {
        let &[n_kv, max_ctx, head_dim] = self.shape(k_cache) else {
            return None;
        };
        let kv_f16 = super::attention_prefill::kv_f16(self, k_cache);
        let kv_type = (kv_f16 && head_dim.is_multiple_of(2) || self.dtype(k_cache) == DType::F32)
            && self.dtype(v_cache) == self.dtype(k_cache);
        let ok = self.shape(v_cache) == self.shape(k_cache) && kv_type && n_kv * head_dim > 0;
        ok.then_some(([n_kv, max_ctx, head_dim], kv_f16))
    }
}

/// Host copies of a rope_kv's inputs: q `[n_tokens, n_heads * head_dim]`, k and v `[n_tokens, n_kv * head_dim]`,
/// the q/k norm weights `[2 * head_dim]` with their epsilon, the frequency divisors.
pub struct HostQkv<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub qk_norm: Option<(&'a [f32], f32)>,
    pub factors: Option<&'a [f32]>,
}

/// CPU reference: the rotated q `[n_tokens, n_heads, head_dim]`, with k and v written into the caches
/// `[n_kv, max_ctx, head_dim]` ([`rms_norm::reference`], [`rope::reference`], [`kv_write::reference`]).
pub fn reference(
    d: QkvDims,
    cfg: &RopeConfig,
    x: &HostQkv<'_>,
    pos: u32,
    k_cache: &mut [f32],
    v_cache: &mut [f32],
) -> Vec<f32> {
    let (mut q, mut k) = (x.q.to_vec(), x.k.to_vec());
    if let Some((w, eps)) = x.qk_norm {
        q = rms_norm::reference(&q, &w[..d.head_dim], eps);
        k = rms_norm::reference(&k, &w[d.head_dim..], eps);
    }
    let q = rope::reference(&q, [d.n_tokens, d.n_heads, d.head_dim], cfg, x.factors, pos);
    let k = rope::reference(&k, [d.n_tokens, d.n_kv, d.head_dim], cfg, x.factors, pos);
    kv_write::reference(&k, k_cache, d.n_kv, d.max_ctx, d.head_dim, pos as usize);
    kv_write::reference(x.v, v_cache, d.n_kv, d.max_ctx, d.head_dim, pos as usize);
    q
}

/// CPU reference of the tree form: each token as a one-token [`reference`] at position `pos + depth`, its k and v
/// written to slot `pos + slot` (`table` `[n_tokens, TREE_W]`).
pub fn reference_tree(
    d: QkvDims,
    cfg: &RopeConfig,
    x: &HostQkv<'_>,
    (pos, table): (u32, &[u32]),
    k_cache: &mut [f32],
    v_cache: &mut [f32],
) -> Vec<f32> {
    let (qw, kw) = (d.n_heads * d.head_dim, d.n_kv * d.head_dim);
    let mut q_out = Vec::with_capacity(d.n_tokens * qw);
    for t in 0..d.n_tokens {
        let row = &table[t * TREE_W..(t + 1) * TREE_W];
        let depth = tree_row_depth(row);
        let slot = pos as usize + tree_path_slot(row, depth);
        let (mut q, mut k) = (x.q[t * qw..(t + 1) * qw].to_vec(), x.k[t * kw..(t + 1) * kw].to_vec());
        if let Some((w, eps)) = x.qk_norm {
            q = rms_norm::reference(&q, &w[..d.head_dim], eps);
            k = rms_norm::reference(&k, &w[d.head_dim..], eps);
        }
        let at = pos + depth as u32;
        q_out.extend(rope::reference(&q, [1, d.n_heads, d.head_dim], cfg, x.factors, at));
        let k = rope::reference(&k, [1, d.n_kv, d.head_dim], cfg, x.factors, at);
        kv_write::reference(&k, k_cache, d.n_kv, d.max_ctx, d.head_dim, slot);
        kv_write::reference(&x.v[t * kw..(t + 1) * kw], v_cache, d.n_kv, d.max_ctx, d.head_dim, slot);
    }
    q_out
}

pub fn variants() -> Vec<ShaderKey> {
    let mut keys = Vec::new();
    for bits in 0..16u32 {
        let on = |b: u32| bits & (1 << b) != 0;
        keys.push(key(on(0), on(1), on(2), on(3)));
    }
    keys
}
