//! `LlamaConfig` from GGUF metadata: the `{arch}.*` keys llama.cpp's converter writes, muP and RoPE scaling.

use super::{bad, Arch, Glu, LlamaConfig, LongRope, Mup, RopeScaling, SlidingWindow};
use crate::error::Result;
use crate::loader::gguf::GgufFile;
use crate::ops::rope::RopeStyle;

impl LlamaConfig {
    /// From GGUF metadata (`general.architecture` = llama, mistral, qwen2, qwen3 or gemma3).
    pub fn from_gguf(f: &GgufFile) -> Result<LlamaConfig> {
        let arch_name = f.architecture()?.to_string();
        let Some(arch) = Arch::GGUF.iter().find(|a| a.0 == arch_name).map(|a| a.1) else {
            let known: Vec<&str> = Arch::GGUF.iter().map(|a| a.0).collect();
            return Err(bad(
                f.path(),
                format!(
                    "unknown architecture {arch_name:?} (general.architecture): this build runs {}",
                    known.join(", ")
                ),
            ));
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let u = |k: &str| -> Result<usize> { Ok(f.get_u64(&key(k))? as usize) };
        let n_heads = u("attention.head_count")?;
        let hidden = u("embedding_length")?;
        let n_layers = u("block_count")?;
        let head_dim = match f.get_opt::<u64>(&key("attention.key_length"))? {
            Some(d) => d as usize,
            None => hidden / n_heads.max(1),
        };
        let vocab = match f.tensor("token_embd.weight") {
            Some(t) if t.shape().len() == 2 => t.shape()[0],
            Some(t) => return Err(bad(f.path(), format!("token_embd.weight has shape {:?}", t.shape()))),
            None => return Err(bad(f.path(), "missing tensor token_embd.weight")),
        };
        let rope_dim = f
            .get_opt::<u64>(&key("rope.dimension_count"))?
            .map_or(head_dim, |v| v as usize);
        let context = u("context_length")?;
        let mut rope_scaling = gguf_rope_scaling(f, &arch_name, rope_dim)?;
        if let (Arch::MiniCpm, RopeScaling::LongRope(l)) = (arch, &mut rope_scaling) {
            // As from config.json: MiniCPM's own longrope table is built for the trained context.
            l.fixed_ctx = Some(context);
        }
        let gemma = arch == Arch::Gemma3;
        // A window of 0 is none (llama.cpp's converter writes 0 for Phi-3 models without one).
        let window = f.get_opt::<u64>(&key("attention.sliding_window"))?.filter(|&w| w > 0);
        let sliding = match window {
            // llama.cpp's gemma3: every 6th layer global, local layers at base 10000 without scaling.
            Some(w) if gemma => Some(SlidingWindow {
                window: w as usize,
                local: (0..n_layers).map(|i| (i + 1) % 6 != 0).collect(),
                local_theta: 10000.0,
                local_scaling: RopeScaling::None,
            }),
            // Phi-3: every layer, with the model's own rope.
            Some(w) if arch == Arch::Phi3 => Some(SlidingWindow {
                window: w as usize,
                local: vec![true; n_layers],
                local_theta: f.get_opt::<f32>(&key("rope.freq_base"))?.unwrap_or(10000.0),
                local_scaling: rope_scaling.clone(),
            }),
            Some(_) => {
                return Err(bad(
                    f.path(),
                    format!("{} is not supported for {arch_name}", key("attention.sliding_window")),
                ))
            }
            None => None,
        };
        if gemma && sliding.is_none() {
            return Err(bad(f.path(), format!("missing {}", key("attention.sliding_window"))));
        }
        LlamaConfig {
            arch,
            n_layers,
            hidden,
            ffn: u("feed_forward_length")?,
            n_heads,
            n_kv_heads: f
                .get_opt::<u64>(&key("attention.head_count_kv"))?
                .map_or(n_heads, |v| v as usize),
            head_dim,
            vocab,
            rms_eps: f.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            rope_theta: f.get_opt::<f32>(&key("rope.freq_base"))?.unwrap_or(10000.0),
            // llama.cpp's converter permutes Llama (and MiniCPM) q/k rows for ggml's interleaved rope; Qwen, Gemma
            // and Phi-3 keep HF's order.
            rope_style: if matches!(arch, Arch::Llama | Arch::MiniCpm) {
                RopeStyle::Interleaved
            } else {
                RopeStyle::RotateHalf
            },
            rope_dim,
            rope_scaling,
            context,
            tie_embeddings: f.tensor("output.weight").is_none(),
            qkv_bias: f.tensor("blk.0.attn_q.bias").is_some(),
            qk_norm: f.tensor("blk.0.attn_q_norm.weight").is_some(),
            mup: gguf_mup(f, &arch_name, arch, hidden)?,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            ffn_act: if gemma { Glu::GeluTanh } else { Glu::Silu },
            post_norms: gemma,
            sliding,
            sparse: None,
            moe: None,
        }
        .check(f.path())
    }
}

/// The embedding, residual and logit scalings of a GGUF: MiniCPM's muP factors as llama.cpp's converter writes
/// them (`embedding_scale` = scale_emb, `residual_scale` = scale_depth / sqrt(layers), `logit_scale` =
/// hidden / dim_model_base, by which the logits are divided), Gemma's sqrt(hidden) (llama.cpp scales in f32 too).
fn gguf_mup(f: &GgufFile, arch_name: &str, arch: Arch, hidden: usize) -> Result<Mup> {
    let key = |k: &str| format!("{arch_name}.{k}");
    let mut m = Mup::default();
    match arch {
        Arch::Gemma3 => m.emb = (hidden as f32).sqrt(),
        Arch::MiniCpm => {
            m.emb = f.get_opt::<f32>(&key("embedding_scale"))?.unwrap_or(1.0);
            m.residual = f.get_opt::<f32>(&key("residual_scale"))?.unwrap_or(1.0);
            let logit = f.get_opt::<f32>(&key("logit_scale"))?.unwrap_or(1.0);
            if !(logit.is_finite() && logit > 0.0) {
                return Err(bad(f.path(), format!("{} {logit} is not positive", key("logit_scale"))));
            }
            m.logit = 1.0 / logit;
        }
        _ => {}
    }
    for (name, v) in [("embedding_scale", m.emb), ("residual_scale", m.residual)] {
        if !v.is_finite() {
            return Err(bad(f.path(), format!("{} {v} is not finite", key(name))));
        }
    }
    Ok(m)
}

/// RoPE scaling from GGUF keys: `rope_freqs.weight` (llama3-style divisors stored by llama.cpp), or
/// `{arch}.rope.scaling.type` none / linear / yarn with `.factor`, `.original_context_length` and `.attn_factor`.
fn gguf_rope_scaling(f: &GgufFile, arch: &str, rope_dim: usize) -> Result<RopeScaling> {
    let key = |k: &str| format!("{arch}.rope.scaling.{k}");
    if f.tensor("rope_freqs.weight").is_some() {
        let d = f.tensor_f32("rope_freqs.weight")?;
        return RopeScaling::Divisors(d).check(f.path(), rope_dim);
    }
    let factor = f.get_opt::<f32>(&key("factor"))?;
    let original = f.get_opt::<u64>(&key("original_context_length"))?.map(|x| x as usize);
    // Phi-3's longrope as llama.cpp's converter stores it: both factor lists as tensors, the attention factor
    // under rope.scaling.attn_factor.
    if f.tensor("rope_factors_long.weight").is_some() {
        // llama.cpp's default for a file without the key: the trained context.
        let context = f.get_u64(&format!("{arch}.context_length"))? as f64;
        let original_max = original.unwrap_or(context as usize);
        let scale = context / original_max.max(2) as f64;
        let attn_default = if scale <= 1.0 {
            1.0
        } else {
            (1.0 + scale.ln() / (original_max as f64).ln()).sqrt()
        };
        let l = LongRope {
            short: f.tensor_f32("rope_factors_short.weight")?,
            long: f.tensor_f32("rope_factors_long.weight")?,
            original_max,
            attn_factor: f.get_opt::<f32>(&key("attn_factor"))?.unwrap_or(attn_default as f32),
            fixed_ctx: None,
        };
        return RopeScaling::LongRope(l).check(f.path(), rope_dim);
    }
    let scaling = match f.get_opt::<&str>(&key("type"))? {
        None | Some("none") => RopeScaling::None,
        Some("linear") => match factor {
            Some(factor) if factor != 1.0 => RopeScaling::Linear { factor },
            _ => RopeScaling::None,
        },
        Some("yarn") => {
            let factor = factor.ok_or_else(|| bad(f.path(), format!("yarn needs {}", key("factor"))))?;
            let original_max =
                original.ok_or_else(|| bad(f.path(), format!("yarn needs {}", key("original_context_length"))))?;
            // ggml's rope_yarn: cos and sin times attn_factor * (1 + 0.1 ln(factor)).
            let attn = f.get_opt::<f32>(&key("attn_factor"))?.unwrap_or(1.0);
            RopeScaling::Yarn {
                factor,
                original_max,
                beta_fast: f
                    .get_opt::<f32>(&format!("{arch}.rope.scaling.yarn_beta_fast"))?
                    .unwrap_or(32.0),
                beta_slow: f
                    .get_opt::<f32>(&format!("{arch}.rope.scaling.yarn_beta_slow"))?
                    .unwrap_or(1.0),
                attn_factor: attn * if factor > 1.0 { 1.0 + 0.1 * factor.ln() } else { 1.0 },
            }
        }
        Some(other) => {
            return Err(bad(
                f.path(),
                format!("{} {other:?} is not supported (none, linear, yarn)", key("type")),
            ))
        }
    };
    scaling.check(f.path(), rope_dim)
}
