//! A plain CPU forward of every architecture the engine runs, in f32 with f64 sums, written straight from the
//! architectures' definitions. It steps a layer at a time ([`Forward`]) and reads its tensors through [`Tensors`]:
//! the model's weights as they are to check the GPU graph on small models (`cargo test`, [`logits`]), or a hook
//! that sees each linear layer's inputs before it runs (`quantize`'s GPTQ calibration quantizes the layer there).

use super::config::{Arch, LlamaConfig, MoeConfig};
use super::fused::Unfused;
use super::llama::Names;
use super::names::Role;
use super::rope_scaling::RopeSession;
use super::weights::WeightSource;
use crate::error::{Error, Result};
use crate::ops::attention_prefill::AttnShape;
use crate::ops::rope::RopeStyle;
use crate::ops::silu_mul::reference_act;

/// A per-token function of the forward (one layer's FFN): `[hidden]` to `[hidden]`.
pub type TokenFn = Box<dyn Fn(&[f32]) -> Vec<f32>>;

/// Where the forward reads its tensors, and who sees each linear layer's inputs.
pub trait Tensors {
    /// Tensor `role` of layer `layer` (`None` for the model-wide ones) as f32 row-major values, as the math uses
    /// them; `None` where the model has none.
    fn get(&mut self, role: Role, layer: Option<usize>) -> Result<Option<Vec<f32>>>;

    /// The weight `[n, k]` of linear layer `role` in `layer`, whose input rows `x` `[tokens, k]` it is about to
    /// multiply (GPTQ quantizes the layer from them here and returns the values it stored).
    fn linear(&mut self, layer: usize, role: Role, _x: &[f32], _k: usize) -> Result<Vec<f32>> {
        self.require(role, Some(layer))
    }

    /// BlockFFN's FFN of one normed token in `layer`.
    fn experts(&mut self, cfg: &LlamaConfig, moe: &MoeConfig, layer: usize) -> Result<TokenFn>;

    /// [`Tensors::get`] for a tensor the model must have.
    fn require(&mut self, role: Role, layer: Option<usize>) -> Result<Vec<f32>> {
        self.get(role, layer)?.ok_or_else(|| {
            let at = layer.map_or(String::new(), |i| format!(" of layer {i}"));
            Error::Invalid(format!("reference forward: the model has no {role:?} tensor{at}"))
        })
    }
}

/// A model's weights as they are: fused matrices split (Phi-3), Gemma's Hugging Face norms as `1 + w`.
pub struct Weights<'s> {
    src: Unfused<'s>,
    arch: Arch,
    names: Names,
}

impl<'s> Weights<'s> {
    pub fn new(src: &'s dyn WeightSource, cfg: &LlamaConfig, names: Names) -> Weights<'s> {
        Weights {
            src: Unfused::of(src, cfg, names),
            arch: cfg.arch,
            names,
        }
    }
}

impl Tensors for Weights<'_> {
    fn get(&mut self, role: Role, layer: Option<usize>) -> Result<Option<Vec<f32>>> {
        let name = self.names.of(self.arch, role, layer);
        let Some(t) = self.src.tensor(&name)? else {
            return Ok(None);
        };
        let v = t.to_f32()?;
        // Gemma's HF norms are x * (1 + w); GGUF stores 1 + w.
        Ok(Some(
            if self.arch == Arch::Gemma3 && self.names == Names::Hf && name.contains("norm") {
                v.iter().map(|w| w + 1.0).collect()
            } else {
                v
            },
        ))
    }

    fn experts(&mut self, cfg: &LlamaConfig, moe: &MoeConfig, layer: usize) -> Result<TokenFn> {
        Ok(Box::new(super::blockffn::reference(&self.src, cfg, moe, layer)?))
    }
}

/// Logits `[vocab]` at every position of `ids` (one causal pass), for a session of `cfg.context` positions.
pub fn logits(src: &dyn WeightSource, cfg: &LlamaConfig, names: Names, ids: &[u32]) -> Result<Vec<Vec<f32>>> {
    logits_with(src, cfg, names, ids, cfg.context)
}

/// [`logits`] for a session whose KV cache holds `max_ctx` positions (longrope picks its factors by it).
pub fn logits_with(
    src: &dyn WeightSource,
    cfg: &LlamaConfig,
    names: Names,
    ids: &[u32],
    max_ctx: usize,
) -> Result<Vec<Vec<f32>>> {
    logits_steps(src, cfg, names, ids, max_ctx, &[ids.len()])
}

/// [`logits_with`] for `ids` fed in steps of `steps` tokens (summing to `ids.len()`): with sparse attention a step
/// whose KV length reaches `dense_len` attends sparsely, every token of it (see `model::sparse`).
pub fn logits_steps(
    src: &dyn WeightSource,
    cfg: &LlamaConfig,
    names: Names,
    ids: &[u32],
    max_ctx: usize,
    steps: &[usize],
) -> Result<Vec<Vec<f32>>> {
    let mut w = Weights::new(src, cfg, names);
    let mut f = Forward::new(&mut w, cfg, ids, max_ctx, steps)?;
    for i in 0..cfg.n_layers {
        f.layer(&mut w, i)?;
    }
    f.logits(&mut w)
}

/// The forward between layers: the residual stream of every token.
pub struct Forward<'c> {
    cfg: &'c LlamaConfig,
    max_ctx: usize,
    /// Steps that attend sparsely: (first position, tokens).
    sparse_steps: Vec<(usize, usize)>,
    tokens: usize,
    /// `[tokens, hidden]`.
    h: Vec<f32>,
}

impl<'c> Forward<'c> {
    /// The scaled embeddings of `ids` at positions `0..`, fed in `steps` (summing to `ids.len()`) in a session of
    /// `max_ctx` positions.
    pub fn new(
        t: &mut dyn Tensors,
        cfg: &'c LlamaConfig,
        ids: &[u32],
        max_ctx: usize,
        steps: &[usize],
    ) -> Result<Forward<'c>> {
        let c = cfg;
        if steps.iter().sum::<usize>() != ids.len() || ids.len() > max_ctx {
            return Err(Error::Invalid(format!(
                "reference: steps {steps:?} do not cover {} tokens within {max_ctx} positions",
                ids.len()
            )));
        }
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= c.vocab) {
            return Err(Error::Invalid(format!(
                "reference: token {bad} is outside the vocabulary of {}",
                c.vocab
            )));
        }
        // The session has compressed keys only when its context holds a C2 window and reaches dense_len
        // (`sparse::new_caches`).
        let sparse_steps = match &c.sparse {
            Some(s) if s.windows().1.count(max_ctx) > 0 && s.dense_len <= max_ctx => steps
                .iter()
                .scan(0, |pos, &n| {
                    *pos += n;
                    Some((*pos - n, n))
                })
                .filter(|&(pos, n)| s.is_sparse(pos + n))
                .collect(),
            _ => Vec::new(),
        };
        let embed = t.require(Role::Embed, None)?;
        check_len("embedding", &embed, c.vocab * c.hidden)?;
        let h = ids
            .iter()
            .flat_map(|&id| {
                embed[id as usize * c.hidden..][..c.hidden]
                    .iter()
                    .map(|v| v * c.mup.emb)
            })
            .collect();
        Ok(Forward {
            cfg,
            max_ctx,
            sparse_steps,
            tokens: ids.len(),
            h,
        })
    }

    /// Decoder layer `i` (layers run in order): attention, then the FFN, each added to the residual stream.
    pub fn layer(&mut self, t: &mut dyn Tensors, i: usize) -> Result<()> {
        let c = self.cfg;
        let (hd, nh, nkv, hidden) = (c.head_dim, c.n_heads, c.n_kv_heads, c.hidden);
        let x = rms_rows(&self.h, &t.require(Role::AttnNorm, Some(i))?, c.rms_eps)?;
        let mut proj = |role: Role, bias: Role, n: usize| -> Result<Vec<f32>> {
            let mut y = matmul(&x, &t.linear(i, role, &x, hidden)?, n, hidden)?;
            if let Some(b) = t.get(bias, Some(i))? {
                check_len("bias", &b, n)?;
                y.chunks_mut(n)
                    .for_each(|r| r.iter_mut().zip(&b).for_each(|(v, b)| *v += b));
            }
            Ok(y)
        };
        let mut q = proj(Role::Q, Role::QBias, nh * hd)?;
        let mut k = proj(Role::K, Role::KBias, nkv * hd)?;
        let v = proj(Role::V, Role::VBias, nkv * hd)?;
        let (theta, scaling) = c.layer_rope(i);
        let rs = scaling.session(theta, c.rope_dim, self.max_ctx);
        let (qn, kn) = (t.get(Role::QNorm, Some(i))?, t.get(Role::KNorm, Some(i))?);
        for (rows, width, norm) in [(&mut q, nh * hd, qn), (&mut k, nkv * hd, kn)] {
            for (p, row) in rows.chunks_mut(width).enumerate() {
                for head in row.chunks_mut(hd) {
                    if let Some(w) = &norm {
                        head.copy_from_slice(&rms_rows(head, w, c.rms_eps)?);
                    }
                    rope(head, p, c, &rs);
                }
            }
        }
        let att = self.attention(i, &q, &k, &v);
        let mut o = matmul(&att, &t.linear(i, Role::O, &att, nh * hd)?, hidden, nh * hd)?;
        if c.post_norms {
            o = rms_rows(&o, &t.require(Role::PostAttnNorm, Some(i))?, c.rms_eps)?;
        }
        self.residual(&o);
        let x = rms_rows(&self.h, &t.require(Role::FfnNorm, Some(i))?, c.rms_eps)?;
        let mut d = match &c.moe {
            Some(m) => {
                let ffn = t.experts(c, m, i)?;
                x.chunks(hidden).flat_map(ffn).collect()
            }
            None => {
                let g = matmul(&x, &t.linear(i, Role::Gate, &x, hidden)?, c.ffn, hidden)?;
                let u = matmul(&x, &t.linear(i, Role::Up, &x, hidden)?, c.ffn, hidden)?;
                let a = reference_act(&g, &u, c.ffn_act);
                matmul(&a, &t.linear(i, Role::Down, &a, c.ffn)?, hidden, c.ffn)?
            }
        };
        if c.post_norms {
            d = rms_rows(&d, &t.require(Role::PostFfnNorm, Some(i))?, c.rms_eps)?;
        }
        self.residual(&d);
        Ok(())
    }

    /// Logits `[vocab]` at every position: the final norm, then the head (the embedding where tied or absent).
    pub fn logits(&self, t: &mut dyn Tensors) -> Result<Vec<Vec<f32>>> {
        let c = self.cfg;
        let x = rms_rows(&self.h, &t.require(Role::FinalNorm, None)?, c.rms_eps)?;
        let x: Vec<f32> = x.iter().map(|v| v * c.mup.logit).collect();
        let head = match t.get(Role::Head, None)? {
            Some(w) if !c.tie_embeddings => w,
            _ => t.require(Role::Embed, None)?,
        };
        let head = head.get(..c.vocab * c.hidden).unwrap_or(&head);
        Ok(matmul(&x, head, c.vocab, c.hidden)?
            .chunks(c.vocab)
            .map(<[f32]>::to_vec)
            .collect())
    }

    /// `h += residual scale * d` for `d` `[tokens, hidden]`.
    fn residual(&mut self, d: &[f32]) {
        let s = self.cfg.mup.residual;
        self.h.iter_mut().zip(d).for_each(|(a, b)| *a += b * s);
    }

    /// Attention of layer `i` over q `[tokens, n_heads * head_dim]`, k and v `[tokens, n_kv * head_dim]`: causal,
    /// within the layer's sliding window, or sparse in the steps that attend sparsely. `[tokens, n_heads * hd]`.
    fn attention(&self, i: usize, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
        let c = self.cfg;
        let (hd, nh, nkv, n) = (c.head_dim, c.n_heads, c.n_kv_heads, self.tokens);
        let mut att = vec![0f32; n * nh * hd];
        let mut sparse = vec![false; n];
        if let (Some(s), false) = (&c.sparse, self.sparse_steps.is_empty()) {
            let cache = |rows: &[f32]| {
                let mut t = vec![0f32; nkv * self.max_ctx * hd];
                for (p, r) in rows.chunks(nkv * hd).enumerate() {
                    for h in 0..nkv {
                        t[(h * self.max_ctx + p) * hd..][..hd].copy_from_slice(&r[h * hd..][..hd]);
                    }
                }
                t
            };
            let (kc, vc) = (cache(k), cache(v));
            for &(pos, len) in &self.sparse_steps {
                let shape = AttnShape {
                    n_tokens: len,
                    n_heads: nh,
                    n_kv: nkv,
                    head_dim: hd,
                    max_ctx: self.max_ctx,
                };
                let rows = pos * nh * hd..(pos + len) * nh * hd;
                att[rows.clone()].copy_from_slice(&super::sparse::reference(s, &q[rows], &kc, &vc, shape, pos));
                sparse[pos..pos + len].fill(true);
            }
        }
        let scale = c.attn_scale as f64;
        // A sliding-window layer sees keys p + 1 - window ..= p.
        let window = c.layer_window(i);
        let k64 = widen(k);
        for p in (0..n).filter(|&p| !sparse[p]) {
            let first = window.map_or(0, |w| (p + 1).saturating_sub(w));
            for hh in 0..nh {
                let kvh = hh / (nh / nkv);
                let qv = widen(&q[(p * nh + hh) * hd..][..hd]);
                let scores: Vec<f64> = (first..=p)
                    .map(|j| dot(&qv, &k64[(j * nkv + kvh) * hd..][..hd]) * scale)
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let sum: f64 = e.iter().sum();
                for d in 0..hd {
                    let o: f64 = (first..=p)
                        .map(|j| e[j - first] * v[(j * nkv + kvh) * hd + d] as f64)
                        .sum();
                    att[(p * nh + hh) * hd + d] = (o / sum) as f32;
                }
            }
        }
        att
    }
}

fn check_len(what: &str, v: &[f32], want: usize) -> Result<()> {
    if v.len() < want {
        return Err(Error::Invalid(format!(
            "reference forward: the {what} has {} values, fewer than the config's {want}",
            v.len()
        )));
    }
    Ok(())
}

/// RMSNorm of each `w.len()`-wide row of `x`.
fn rms_rows(x: &[f32], w: &[f32], eps: f32) -> Result<Vec<f32>> {
    if w.is_empty() || !x.len().is_multiple_of(w.len()) {
        return Err(Error::Invalid(format!(
            "reference forward: a norm of {} values over rows of {} values",
            w.len(),
            x.len()
        )));
    }
    Ok(x.chunks(w.len())
        .flat_map(|row| {
            let ms = row.iter().map(|v| (v * v) as f64).sum::<f64>() / row.len() as f64;
            let r = 1.0 / (ms + eps as f64).sqrt();
            row.iter().zip(w).map(move |(v, g)| (*v as f64 * r) as f32 * g)
        })
        .collect())
}

/// `a · b` in f64, four lanes.
#[inline]
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let mut s = [0f64; 4];
    let (ca, cb) = (a.chunks_exact(4), b.chunks_exact(4));
    let tail: f64 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for j in 0..4 {
            s[j] += x[j] * y[j];
        }
    }
    s[0] + s[1] + s[2] + s[3] + tail
}

fn widen(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// `x [t, k] · wᵀ` for `w [n, k]`: `[t, n]`, products and sums in f64, the rows of `w` split over threads.
fn matmul(x: &[f32], w: &[f32], n: usize, k: usize) -> Result<Vec<f32>> {
    if w.len() != n * k || k == 0 || !x.len().is_multiple_of(k) {
        return Err(Error::Invalid(format!(
            "reference forward: a weight of {} values for [{n}, {k}], or inputs of {} values",
            w.len(),
            x.len()
        )));
    }
    let t = x.len() / k;
    let x = widen(x);
    let threads = std::thread::available_parallelism().map_or(1, |p| p.get()).min(n);
    let per = n.div_ceil(threads);
    let mut out_t = vec![0f32; n * t]; // [n, t]
    std::thread::scope(|s| {
        for (c, chunk) in out_t.chunks_mut(per * t.max(1)).enumerate() {
            let x = &x;
            s.spawn(move || {
                for (o, out) in chunk.chunks_mut(t.max(1)).enumerate() {
                    let wr = widen(&w[(c * per + o) * k..][..k]);
                    for (r, y) in out.iter_mut().enumerate() {
                        *y = dot(&x[r * k..][..k], &wr) as f32;
                    }
                }
            });
        }
    });
    let mut out = vec![0f32; t * n];
    for o in 0..n {
        for r in 0..t {
            out[r * n + o] = out_t[o * t + r];
        }
    }
    Ok(out)
}

/// RoPE at `pos` with the session's rotation (`rope_scaling`: divisors per frequency, cos and sin times the
/// attention factor).
fn rope(v: &mut [f32], pos: usize, cfg: &LlamaConfig, r: &RopeSession) {
    let rot = cfg.rope_dim;
    let attn = r.attn_factor as f64;
    for j in 0..rot / 2 {
        let angle = pos as f64 * r.inv_freq(j, rot);
        let (s, c) = angle.sin_cos();
        let (s, c) = (s * attn, c * attn);
        let (a, b) = match cfg.rope_style {
            RopeStyle::RotateHalf => (j, j + rot / 2),
            RopeStyle::Interleaved => (2 * j, 2 * j + 1),
        };
        let (x0, x1) = (v[a] as f64, v[b] as f64);
        v[a] = (x0 * c - x1 * s) as f32;
        v[b] = (x0 * s + x1 * c) as f32;
    }
}
