//! GPTQ's calibration pass: the model runs on the CPU (f32) over the calibration tokens, one layer at a time, and
//! each decoder linear layer is quantized from the Hessian of the inputs it sees, in AutoGPTQ's true-sequential
//! order (q/k/v, then o, then gate/up, then down): later layers see the quantized layers' outputs, so they
//! compensate for the error already made. The math is the Llama family's as `model::reference` writes it.

use super::solve::InverseHessian;
use super::source::{ModelTensor, Role, Source};
use crate::error::{Error, Result};
use crate::model::{Arch, Names};
use crate::ops::rope::RopeStyle;

/// Stores one tensor (quantizing it, with GPTQ when an inverse Hessian is given) and returns its stored values.
pub type Store<'a> = dyn FnMut(ModelTensor, Vec<usize>, Vec<f32>, Option<&InverseHessian>) -> Result<Vec<f32>> + 'a;

/// `x [t, k] · wᵀ` for `w [n, k]`: `[t, n]`, output rows split over threads.
fn matmul(x: &[f32], w: &[f32], n: usize, k: usize) -> Vec<f32> {
    let t = x.len() / k;
    let threads = std::thread::available_parallelism()
        .map_or(1, |p| p.get())
        .min(n.max(1));
    let per = n.div_ceil(threads).max(1);
    let mut out_t = vec![0f32; n * t]; // [n, t]
    std::thread::scope(|s| {
        for (c, chunk) in out_t.chunks_mut(per * t).enumerate() {
            s.spawn(move || {
                for (o, out) in chunk.chunks_mut(t).enumerate() {
                    let wr = &w[(c * per + o) * k..(c * per + o + 1) * k];
                    for (r, y) in out.iter_mut().enumerate() {
                        *y = dot(&x[r * k..(r + 1) * k], wr);
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
    out
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut s = [0f32; 4];
    let (ca, cb) = (a.chunks_exact(4), b.chunks_exact(4));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for j in 0..4 {
            s[j] += x[j] * y[j];
        }
    }
    s.iter().sum::<f32>() + tail
}

/// RMSNorm of each `w.len()`-wide row.
fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mut out = x.to_vec();
    for row in out.chunks_mut(w.len()) {
        let ms = row.iter().map(|v| (v * v) as f64).sum::<f64>() / w.len() as f64;
        let r = (1.0 / (ms + eps as f64).sqrt()) as f32;
        row.iter_mut().zip(w).for_each(|(v, g)| *v = *v * r * g);
    }
    out
}

/// `H = 2 X Xᵀ / T` of `x [t, k]` (f64, symmetric) as GPTQ's inverse Hessian factor.
fn inverse_hessian(x: &[f32], k: usize, damp: f64) -> Result<InverseHessian> {
    let t = x.len() / k;
    let mut h = vec![0f64; k * k];
    for row in x.chunks_exact(k) {
        for i in 0..k {
            let xi = row[i] as f64;
            if xi == 0.0 {
                continue;
            }
            for (hij, &xj) in h[i * k + i..(i + 1) * k].iter_mut().zip(&row[i..]) {
                *hij += xi * xj as f64;
            }
        }
    }
    let scale = 2.0 / t.max(1) as f64;
    for i in 0..k {
        for j in i..k {
            let v = h[i * k + j] * scale;
            h[i * k + j] = v;
            h[j * k + i] = v;
        }
    }
    InverseHessian::new(&h, k, damp)
}

/// Run the model over `tokens`, storing every tensor through `store`: decoder linear layers with their inputs'
/// Hessians, everything else by round-to-nearest. Weights come in the `to` convention, so the RoPE pairs follow it.
pub fn run(
    src: &Source,
    to: Names,
    tokens: &[u32],
    damp: f64,
    log: &mut dyn FnMut(&str),
    store: &mut Store<'_>,
) -> Result<()> {
    let c = src.cfg.clone();
    let present = src.tensors();
    let find = |role: Role, layer: Option<usize>| present.iter().copied().find(|t| t.role == role && t.layer == layer);
    let mut put = |t: ModelTensor, h: Option<&InverseHessian>| -> Result<Vec<f32>> {
        let (shape, v) = src.read(&t, to)?;
        store(t, shape, v, h)
    };
    let missing = |role: Role, layer: Option<usize>| {
        Error::Invalid(format!("{}: missing {:?} of layer {layer:?}", src.path.display(), role))
    };
    let t_len = tokens.len();
    if let Some(bad) = tokens.iter().find(|&&t| t as usize >= c.vocab) {
        return Err(Error::Invalid(format!(
            "calibration token {bad} is outside the vocabulary of {}",
            c.vocab
        )));
    }
    let embed = put(find(Role::Embed, None).ok_or_else(|| missing(Role::Embed, None))?, None)?;
    let mut h: Vec<f32> = tokens
        .iter()
        .flat_map(|&t| {
            embed[t as usize * c.hidden..(t as usize + 1) * c.hidden]
                .iter()
                .map(|v| v * c.mup.emb)
        })
        .collect();
    drop(embed);
    let style = if to == Names::Gguf && c.arch == Arch::Llama {
        RopeStyle::Interleaved
    } else {
        RopeStyle::RotateHalf
    };
    let (hd, nh, nkv) = (c.head_dim, c.n_heads, c.n_kv_heads);
    let session = c.rope_scaling.session(c.rope_theta, c.rope_dim, t_len);
    let rope = |v: &mut [f32], pos: usize| {
        let rot = c.rope_dim;
        let attn = session.attn_factor as f64;
        for j in 0..rot / 2 {
            let (s, co) = (pos as f64 * session.inv_freq(j, rot)).sin_cos();
            let (a, b) = match style {
                RopeStyle::RotateHalf => (j, j + rot / 2),
                RopeStyle::Interleaved => (2 * j, 2 * j + 1),
            };
            let (x0, x1) = (v[a] as f64, v[b] as f64);
            v[a] = ((x0 * co - x1 * s) * attn) as f32;
            v[b] = ((x0 * s + x1 * co) * attn) as f32;
        }
    };
    for i in 0..c.n_layers {
        let l = Some(i);
        let need = |role: Role| find(role, l).ok_or_else(|| missing(role, l));
        let an = put(need(Role::AttnNorm)?, None)?;
        let x = rms_norm(&h, &an, c.rms_eps);
        let hx = inverse_hessian(&x, c.hidden, damp)?;
        let mut proj = |role: Role, bias: Role, n: usize| -> Result<Vec<f32>> {
            let w = put(need(role)?, Some(&hx))?;
            let mut y = matmul(&x, &w, n, c.hidden);
            if let Some(b) = find(bias, l) {
                let b = put(b, None)?;
                y.chunks_mut(n)
                    .for_each(|r| r.iter_mut().zip(&b).for_each(|(v, b)| *v += b));
            }
            Ok(y)
        };
        let mut q = proj(Role::Q, Role::QBias, nh * hd)?;
        let mut k = proj(Role::K, Role::KBias, nkv * hd)?;
        let v = proj(Role::V, Role::VBias, nkv * hd)?;
        let qn = find(Role::QNorm, l).map(|t| put(t, None)).transpose()?;
        let kn = find(Role::KNorm, l).map(|t| put(t, None)).transpose()?;
        for (p, (qr, kr)) in q.chunks_mut(nh * hd).zip(k.chunks_mut(nkv * hd)).enumerate() {
            for (heads, norm) in [(qr, &qn), (kr, &kn)] {
                for head in heads.chunks_mut(hd) {
                    if let Some(w) = norm {
                        head.copy_from_slice(&rms_norm(head, w, c.rms_eps));
                    }
                    rope(head, p);
                }
            }
        }
        let scale = 1.0 / (hd as f64).sqrt();
        let mut a = vec![0f32; t_len * nh * hd];
        for p in 0..t_len {
            for hh in 0..nh {
                let kvh = hh / (nh / nkv);
                let qv = &q[p * nh * hd + hh * hd..][..hd];
                let scores: Vec<f64> = (0..=p)
                    .map(|j| dot(qv, &k[j * nkv * hd + kvh * hd..][..hd]) as f64 * scale)
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let sum: f64 = e.iter().sum();
                let out = &mut a[p * nh * hd + hh * hd..][..hd];
                for (j, ej) in e.iter().enumerate() {
                    let vj = &v[j * nkv * hd + kvh * hd..][..hd];
                    for (o, x) in out.iter_mut().zip(vj) {
                        *o += (ej / sum) as f32 * x;
                    }
                }
            }
        }
        let ha = inverse_hessian(&a, nh * hd, damp)?;
        let wo = put(need(Role::O)?, Some(&ha))?;
        let o = matmul(&a, &wo, c.hidden, nh * hd);
        h.iter_mut().zip(&o).for_each(|(x, y)| *x += y * c.mup.residual);
        let fnw = put(need(Role::FfnNorm)?, None)?;
        let x2 = rms_norm(&h, &fnw, c.rms_eps);
        let hx2 = inverse_hessian(&x2, c.hidden, damp)?;
        let wg = put(need(Role::Gate)?, Some(&hx2))?;
        let wu = put(need(Role::Up)?, Some(&hx2))?;
        let g = matmul(&x2, &wg, c.ffn, c.hidden);
        let u = matmul(&x2, &wu, c.ffn, c.hidden);
        let m: Vec<f32> = g.iter().zip(&u).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
        let hm = inverse_hessian(&m, c.ffn, damp)?;
        let wd = put(need(Role::Down)?, Some(&hm))?;
        let d = matmul(&m, &wd, c.hidden, c.ffn);
        h.iter_mut().zip(&d).for_each(|(x, y)| *x += y * c.mup.residual);
        log(&format!("GPTQ: layer {}/{} done", i + 1, c.n_layers));
    }
    for role in [Role::FinalNorm, Role::Head] {
        if let Some(t) = find(role, None) {
            put(t, None)?;
        }
    }
    Ok(())
}
