//! A linear EAGLE-1 head fitted to a model's own hidden states: the head's decoder layer is made an identity (its
//! o and down projections zero, so the residual passes through) and its `fc` is the ridge regression of the next
//! feature on (next token's embedding, feature, 1): `f_{j+1} ~ W_e e(t_{j+1}) + W_f f_j + b`. No trained EAGLE head
//! ships in any package; this one gives real acceptance to test and measure the EAGLE path with. Written in
//! SafeAILab's layout ([`super::eagle`]).

use super::config::LlamaConfig;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::path::Path;

/// The normal equations of the regression, accumulated sample by sample (f64).
pub struct Ridge {
    /// Inputs per sample: embedding, feature, 1.
    dim: usize,
    hidden: usize,
    /// X^T X `[dim, dim]` (upper triangle filled) and X^T Y `[dim, hidden]`.
    xtx: Vec<f64>,
    xty: Vec<f64>,
    pub samples: usize,
}

impl Ridge {
    pub fn new(hidden: usize) -> Ridge {
        let dim = 2 * hidden + 1;
        Ridge {
            dim,
            hidden,
            xtx: vec![0.0; dim * dim],
            xty: vec![0.0; dim * hidden],
            samples: 0,
        }
    }

    /// One sample: next token's embedding `e`, feature `f`, next feature `y` (each `[hidden]`).
    pub fn add(&mut self, e: &[f32], f: &[f32], y: &[f32]) {
        let h = self.hidden;
        let x: Vec<f64> = e.iter().chain(f).map(|&v| v as f64).chain([1.0]).collect();
        debug_assert!(x.len() == self.dim && y.len() == h);
        for (i, &xi) in x.iter().enumerate() {
            if xi == 0.0 {
                continue;
            }
            let row = &mut self.xtx[i * self.dim..(i + 1) * self.dim];
            for (r, &xj) in row[i..].iter_mut().zip(&x[i..]) {
                *r += xi * xj;
            }
            let out = &mut self.xty[i * h..(i + 1) * h];
            for (o, &yk) in out.iter_mut().zip(y) {
                *o += xi * yk as f64;
            }
        }
        self.samples += 1;
    }

    /// Solve `(X^T X + lambda n I) W = X^T Y` (Cholesky); returns `fc` `[hidden, 2 hidden]` (row r: the weights of
    /// output r over embedding then feature) and the bias `[hidden]` (not penalized).
    pub fn solve(&self, lambda: f64) -> Result<(Vec<f32>, Vec<f32>)> {
        let (d, h) = (self.dim, self.hidden);
        let mut a = self.xtx.clone();
        for i in 0..d {
            for j in 0..i {
                a[i * d + j] = a[j * d + i];
            }
            if i + 1 < d {
                a[i * d + i] += lambda * self.samples.max(1) as f64;
            }
        }
        // A = L L^T, in place (lower triangle).
        for j in 0..d {
            let mut s = a[j * d + j];
            for k in 0..j {
                s -= a[j * d + k] * a[j * d + k];
            }
            if s <= 0.0 || !s.is_finite() {
                return Err(Error::Invalid(format!(
                    "the ridge system is not positive definite at {j} (more text or a larger lambda)"
                )));
            }
            let l = s.sqrt();
            a[j * d + j] = l;
            for i in j + 1..d {
                let mut s = a[i * d + j];
                for k in 0..j {
                    s -= a[i * d + k] * a[j * d + k];
                }
                a[i * d + j] = s / l;
            }
        }
        let mut w = self.xty.clone(); // [d, h], solved in place column by column
        for c in 0..h {
            for i in 0..d {
                let mut s = w[i * h + c];
                for k in 0..i {
                    s -= a[i * d + k] * w[k * h + c];
                }
                w[i * h + c] = s / a[i * d + i];
            }
            for i in (0..d).rev() {
                let mut s = w[i * h + c];
                for k in i + 1..d {
                    s -= a[k * d + i] * w[k * h + c];
                }
                w[i * h + c] = s / a[i * d + i];
            }
        }
        let fc = (0..h)
            .flat_map(|r| (0..2 * h).map(move |i| (r, i)))
            .map(|(r, i)| w[i * h + r] as f32)
            .collect();
        let bias = (0..h).map(|r| w[(d - 1) * h + r] as f32).collect();
        Ok((fc, bias))
    }
}

/// Write the fitted head for a target of config `t` into `dir` (created): config.json (a Llama of one layer with a
/// small FFN) and model.safetensors (f32).
pub fn write_head(dir: &Path, t: &LlamaConfig, fc: &[f32], bias: &[f32]) -> Result<()> {
    let (h, hd) = (t.hidden, t.head_dim);
    let (q, kv, ffn) = (t.n_heads * hd, t.n_kv_heads * hd, 32);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": h,
        "intermediate_size": ffn,
        "num_hidden_layers": 1,
        "num_attention_heads": t.n_heads,
        "num_key_value_heads": t.n_kv_heads,
        "head_dim": hd,
        "vocab_size": t.vocab,
        "rms_norm_eps": t.rms_eps,
        "rope_theta": t.rope_theta,
        "max_position_embeddings": t.context,
        "tie_word_embeddings": false,
        "torch_dtype": "float32",
    });
    let path = dir.join("config.json");
    let text = serde_json::to_string_pretty(&config).map_err(|e| Error::Invalid(e.to_string()))?;
    std::fs::write(&path, text).map_err(io(&path))?;
    let zeros = |n: usize| vec![0f32; n];
    let tensors: Vec<(&str, Vec<usize>, Vec<f32>)> = vec![
        ("fc.weight", vec![h, 2 * h], fc.to_vec()),
        ("fc.bias", vec![h], bias.to_vec()),
        ("layers.0.self_attn.q_proj.weight", vec![q, h], zeros(q * h)),
        ("layers.0.self_attn.k_proj.weight", vec![kv, h], zeros(kv * h)),
        ("layers.0.self_attn.v_proj.weight", vec![kv, h], zeros(kv * h)),
        ("layers.0.self_attn.o_proj.weight", vec![h, q], zeros(h * q)),
        ("layers.0.post_attention_layernorm.weight", vec![h], vec![1.0; h]),
        ("layers.0.mlp.gate_proj.weight", vec![ffn, h], zeros(ffn * h)),
        ("layers.0.mlp.up_proj.weight", vec![ffn, h], zeros(ffn * h)),
        ("layers.0.mlp.down_proj.weight", vec![h, ffn], zeros(h * ffn)),
    ];
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|t| bytemuck::cast_slice(&t.2).to_vec()).collect();
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|(t, b)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, t.1.clone(), b)
                .map(|v| (t.0.to_string(), v))
                .map_err(|e| Error::Invalid(format!("{}: {e}", t.0)))
        })
        .collect::<Result<Vec<_>>>()?;
    let path = dir.join("model.safetensors");
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), &path).map_err(|e| Error::File {
        path: path.clone(),
        message: e.to_string(),
    })
}
