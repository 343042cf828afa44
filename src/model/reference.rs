//! A plain CPU forward of the Llama family in f32, written straight from the architecture's definition, to check
//! the GPU graph on small models (`cargo test`) and to debug a layer at a time.

use super::config::{Arch, LlamaConfig};
use super::llama::Names;
use super::names::Role;
use super::rope_scaling::RopeSession;
use super::weights::WeightSource;
use crate::error::Result;
use crate::ops::attention_prefill::AttnShape;
use crate::ops::rope::RopeStyle;
use crate::ops::silu_mul::reference_act;

fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| (v * v) as f64).sum::<f64>() / x.len() as f64;
    let r = 1.0 / (ms + eps as f64).sqrt();
    x.iter().zip(w).map(|(v, g)| (*v as f64 * r) as f32 * g).collect()
}

/// `w [n, k] · x [k]`.
fn matvec(w: &[f32], x: &[f32], n: usize) -> Vec<f32> {
    let k = x.len();
    (0..n)
        .map(|r| {
            w[r * k..(r + 1) * k]
                .iter()
                .zip(x)
                .map(|(a, b)| (*a as f64) * (*b as f64))
                .sum::<f64>() as f32
        })
        .collect()
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

/// A per-token function of the forward (one layer's FFN).
type TokenFn = Box<dyn Fn(&[f32]) -> Vec<f32>>;

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
    let c = cfg;
    if steps.iter().sum::<usize>() != ids.len() || ids.len() > max_ctx {
        return Err(crate::error::Error::Invalid(format!(
            "reference: steps {steps:?} do not cover {} tokens within {max_ctx} positions",
            ids.len()
        )));
    }
    // Steps that attend sparsely: (first position, tokens). The session has compressed keys only when its
    // context holds a C2 window and reaches dense_len (`sparse::new_caches`).
    let sparse_steps: Vec<(usize, usize)> = match &c.sparse {
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
    let unfused = super::fused::Unfused::of(src, c, names);
    let src: &dyn WeightSource = &unfused;
    let get = |name: &str| -> Result<Vec<f32>> { src.require(name)?.to_f32() };
    let l = |i: usize, role: Role| names.layer(c.arch, i, role);
    let pick = |role: Role| names.of(c.arch, role, None);
    let embed = get(&pick(Role::Embed))?;
    let n = ids.len();
    let mut h: Vec<Vec<f32>> = ids
        .iter()
        .map(|&t| {
            embed[t as usize * c.hidden..(t as usize + 1) * c.hidden]
                .iter()
                .map(|v| v * c.mup.emb)
                .collect()
        })
        .collect();
    let (hd, nh, nkv) = (c.head_dim, c.n_heads, c.n_kv_heads);
    // Gemma's HF norms are x * (1 + w); GGUF stores 1 + w.
    let shift = if c.arch == Arch::Gemma3 && names == Names::Hf {
        1.0
    } else {
        0.0
    };
    let opt = |name: String| -> Result<Option<Vec<f32>>> {
        let v = src.tensor(&name)?.map(|t| t.to_f32()).transpose()?;
        Ok(v.map(|v| {
            if name.contains("norm") {
                v.iter().map(|w| w + shift).collect()
            } else {
                v
            }
        }))
    };
    let get_norm = |name: &str| -> Result<Vec<f32>> { Ok(get(name)?.iter().map(|w| w + shift).collect()) };
    let glu = c.ffn_act;
    for i in 0..c.n_layers {
        let (theta, scaling) = c.layer_rope(i);
        let rs = scaling.session(theta, c.rope_dim, max_ctx);
        let window = c.layer_window(i);
        let wq = get(&l(i, Role::Q))?;
        let wk = get(&l(i, Role::K))?;
        let wv = get(&l(i, Role::V))?;
        let wo = get(&l(i, Role::O))?;
        let bq = opt(l(i, Role::QBias))?;
        let bk = opt(l(i, Role::KBias))?;
        let bv = opt(l(i, Role::VBias))?;
        let qn = opt(l(i, Role::QNorm))?;
        let kn = opt(l(i, Role::KNorm))?;
        let an = get_norm(&l(i, Role::AttnNorm))?;
        let fnw = get_norm(&l(i, Role::FfnNorm))?;
        let post = if c.post_norms {
            Some((
                get_norm(&l(i, Role::PostAttnNorm))?,
                get_norm(&l(i, Role::PostFfnNorm))?,
            ))
        } else {
            None
        };
        // The FFN of one normed token: SwiGLU, or BlockFFN's experts.
        let ffn: TokenFn = match &c.moe {
            Some(m) => Box::new(super::blockffn::reference(src, c, m, i)?),
            None => {
                let wg = get(&l(i, Role::Gate))?;
                let wu = get(&l(i, Role::Up))?;
                let wd = get(&l(i, Role::Down))?;
                let (ffn, hidden) = (c.ffn, c.hidden);
                Box::new(move |x: &[f32]| {
                    let (g, u) = (matvec(&wg, x, ffn), matvec(&wu, x, ffn));
                    matvec(&wd, &reference_act(&g, &u, glu), hidden)
                })
            }
        };
        let add = |v: &mut Vec<f32>, b: &Option<Vec<f32>>| {
            if let Some(b) = b {
                v.iter_mut().zip(b).for_each(|(x, y)| *x += y);
            }
        };
        let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
        for (p, hp) in h.iter().enumerate() {
            let x = rms_norm(hp, &an, c.rms_eps);
            let (mut q, mut k, mut v) = (
                matvec(&wq, &x, nh * hd),
                matvec(&wk, &x, nkv * hd),
                matvec(&wv, &x, nkv * hd),
            );
            add(&mut q, &bq);
            add(&mut k, &bk);
            add(&mut v, &bv);
            for hh in 0..nh {
                let head = &mut q[hh * hd..(hh + 1) * hd];
                if let Some(w) = &qn {
                    head.copy_from_slice(&rms_norm(head, w, c.rms_eps));
                }
                rope(head, p, c, &rs);
            }
            for hh in 0..nkv {
                let head = &mut k[hh * hd..(hh + 1) * hd];
                if let Some(w) = &kn {
                    head.copy_from_slice(&rms_norm(head, w, c.rms_eps));
                }
                rope(head, p, c, &rs);
            }
            qs.push(q);
            ks.push(k);
            vs.push(v);
        }
        let scale = c.attn_scale as f64;
        let mut sparse_att: Vec<Option<Vec<f32>>> = vec![None; n];
        if let (Some(s), false) = (&c.sparse, sparse_steps.is_empty()) {
            let cache = |rows: &[Vec<f32>]| {
                let mut t = vec![0f32; nkv * max_ctx * hd];
                for (p, r) in rows.iter().enumerate() {
                    for h in 0..nkv {
                        t[(h * max_ctx + p) * hd..][..hd].copy_from_slice(&r[h * hd..][..hd]);
                    }
                }
                t
            };
            let (kc, vc) = (cache(&ks), cache(&vs));
            for &(pos, len) in &sparse_steps {
                let q: Vec<f32> = qs[pos..pos + len].concat();
                let shape = AttnShape {
                    n_tokens: len,
                    n_heads: nh,
                    n_kv: nkv,
                    head_dim: hd,
                    max_ctx,
                };
                let att = super::sparse::reference(s, &q, &kc, &vc, shape, pos);
                for t in 0..len {
                    sparse_att[pos + t] = Some(att[t * nh * hd..][..nh * hd].to_vec());
                }
            }
        }
        for p in 0..n {
            let mut att = vec![0f32; nh * hd];
            for hh in (0..nh).filter(|_| sparse_att[p].is_none()) {
                let kvh = hh / (nh / nkv);
                let q = &qs[p][hh * hd..(hh + 1) * hd];
                // A sliding-window layer sees keys p + 1 - window ..= p.
                let first = window.map_or(0, |w| (p + 1).saturating_sub(w));
                let scores: Vec<f64> = (first..=p)
                    .map(|j| {
                        let k = &ks[j][kvh * hd..(kvh + 1) * hd];
                        q.iter().zip(k).map(|(a, b)| (*a as f64) * (*b as f64)).sum::<f64>() * scale
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let sum: f64 = e.iter().sum();
                for d in 0..hd {
                    let v: f64 = (first..=p).map(|j| e[j - first] * vs[j][kvh * hd + d] as f64).sum();
                    att[hh * hd + d] = (v / sum) as f32;
                }
            }
            if let Some(a) = sparse_att[p].take() {
                att = a;
            }
            let mut o = matvec(&wo, &att, c.hidden);
            if let Some((post_attn, _)) = &post {
                o = rms_norm(&o, post_attn, c.rms_eps);
            }
            h[p].iter_mut().zip(&o).for_each(|(a, b)| *a += b * c.mup.residual);
            let x = rms_norm(&h[p], &fnw, c.rms_eps);
            let mut d = ffn(&x);
            if let Some((_, post_ffn)) = &post {
                d = rms_norm(&d, post_ffn, c.rms_eps);
            }
            h[p].iter_mut().zip(&d).for_each(|(a, b)| *a += b * c.mup.residual);
        }
    }
    let norm = get_norm(&pick(Role::FinalNorm))?;
    let head = match opt(pick(Role::Head))? {
        Some(w) if !c.tie_embeddings => w,
        _ => embed,
    };
    Ok(h.iter()
        .map(|hp| {
            let x: Vec<f32> = rms_norm(hp, &norm, c.rms_eps).iter().map(|v| v * c.mup.logit).collect();
            matvec(&head, &x, c.vocab)
        })
        .collect())
}
