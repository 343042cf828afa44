//! `LlamaConfig` from a Hugging Face `config.json` (transformers 4 and 5 layouts): RoPE parameters, sliding
//! windows, MiniCPM's muP and `sparse_config`, BlockFFN's experts.

use super::{bad, Arch, Glu, LlamaConfig, MoeConfig, Mup, RopeScaling, RouterNormKind, SlidingWindow, SparseConfig};
use crate::error::Result;
use crate::ops::rope::RopeStyle;
use std::path::Path;

impl LlamaConfig {
    /// From a Hugging Face `config.json`, as transformers 4.x and 5.x write it.
    pub fn from_hf(path: &Path) -> Result<LlamaConfig> {
        Self::from_hf_value(&crate::loader::read_json(path)?, path)
    }

    /// [`LlamaConfig::from_hf`] of the parsed `config.json` at `path` (named in errors).
    pub fn from_hf_value(v: &serde_json::Value, path: &Path) -> Result<LlamaConfig> {
        let archs: Vec<&str> = v
            .get("architectures")
            .and_then(|a| a.as_array())
            .map(|a| a.iter().filter_map(|x| x.as_str()).collect())
            .unwrap_or_default();
        let model_type = v.get("model_type").and_then(|t| t.as_str());
        let found = match archs.first() {
            Some(a) => Arch::HF.iter().find(|e| e.0 == *a),
            None => Arch::HF.iter().find(|e| Some(e.1) == model_type),
        };
        let Some(&(_, _, arch)) = found else {
            let known: Vec<&str> = Arch::HF.iter().map(|e| e.0).collect();
            let named = archs
                .first()
                .map_or(format!("model_type {model_type:?}"), |a| format!("{a:?}"));
            return Err(bad(
                path,
                format!("unknown architecture {named}: this build runs {}", known.join(", ")),
            ));
        };
        let num = |k: &str| v.get(k).and_then(|x| x.as_f64());
        let need = |k: &str| {
            num(k)
                .map(|x| x as usize)
                .ok_or_else(|| bad(path, format!("missing {k}")))
        };
        let set = |k: &str| v.get(k).is_some_and(|x| !x.is_null());
        let gemma = arch == Arch::Gemma3;
        for k in ["attn_logit_softcapping", "final_logit_softcapping"] {
            if set(k) {
                return Err(bad(path, format!("{k} is not supported")));
            }
        }
        if v.get("mlp_bias").and_then(|b| b.as_bool()) == Some(true) {
            return Err(bad(path, "mlp_bias = true is not supported"));
        }
        let act = v
            .get("hidden_activation")
            .filter(|a| !a.is_null())
            .or(v.get("hidden_act"))
            .and_then(|a| a.as_str());
        let ffn_act = match act {
            None if gemma => Glu::GeluTanh,
            None | Some("silu" | "swish") => Glu::Silu,
            Some("gelu_pytorch_tanh" | "gelu_tanh") => Glu::GeluTanh,
            Some(other) => {
                return Err(bad(
                    path,
                    format!("hidden_act {other:?} is not supported (silu, gelu_pytorch_tanh)"),
                ))
            }
        };
        let hidden = need("hidden_size")?;
        let n_heads = need("num_attention_heads")?;
        let head_dim = num("head_dim").map_or(hidden / n_heads.max(1), |x| x as usize);
        let rope_dim = match num("partial_rotary_factor") {
            Some(f) if f > 0.0 && f <= 1.0 => ((head_dim as f64 * f) as usize) & !1,
            Some(f) => return Err(bad(path, format!("partial_rotary_factor {f} is not in (0, 1]"))),
            None => head_dim,
        };
        let context = num("max_position_embeddings").map_or(4096, |x| x as usize);
        let n_layers = need("num_hidden_layers")?;
        let mut rope = HfRope::read(path, v, rope_dim, context)?;
        if let (Arch::MiniCpm, RopeScaling::LongRope(l)) = (arch, &mut rope.scaling) {
            l.fixed_ctx = Some(context);
        }
        let sliding = hf_sliding(path, v, arch, n_layers, &rope)?;
        let mup = if arch == Arch::MiniCpm {
            let dim_base = num("dim_model_base").unwrap_or(hidden as f64);
            Mup {
                emb: num("scale_emb").unwrap_or(1.0) as f32,
                residual: (num("scale_depth").unwrap_or(1.0) / (n_layers as f64).sqrt()) as f32,
                logit: (dim_base / hidden as f64) as f32,
            }
        } else if gemma {
            Mup {
                emb: (hidden as f32).sqrt(),
                ..Mup::default()
            }
        } else {
            Mup::default()
        };
        let moe = match v.get("ffn_type").and_then(|t| t.as_str()) {
            Some("block" | "block_linear") if arch == Arch::MiniCpm => Some(moe_config(path, v)?),
            None | Some("dense" | "mlp") => None,
            Some(other) => return Err(bad(path, format!("ffn_type {other:?} is not supported"))),
        };
        let sparse = match v.get("sparse_config").filter(|s| !s.is_null()) {
            Some(s) if arch == Arch::MiniCpm => Some(sparse_config(path, s)?),
            _ => None,
        };
        let attn_scale = match num("query_pre_attn_scalar") {
            Some(q) if gemma && q > 0.0 => (1.0 / q.sqrt()) as f32,
            Some(q) if gemma => return Err(bad(path, format!("query_pre_attn_scalar {q} is not positive"))),
            _ => 1.0 / (head_dim as f32).sqrt(),
        };
        LlamaConfig {
            arch,
            n_layers,
            hidden,
            ffn: if moe.is_some() {
                num("intermediate_size").map_or(1, |x| x as usize)
            } else {
                need("intermediate_size")?
            },
            n_heads,
            n_kv_heads: num("num_key_value_heads").map_or(n_heads, |x| x as usize),
            head_dim,
            vocab: need("vocab_size")?,
            rms_eps: num("rms_norm_eps").unwrap_or(1e-6) as f32,
            rope_theta: rope.theta,
            rope_style: RopeStyle::RotateHalf,
            rope_dim,
            rope_scaling: rope.scaling,
            context,
            tie_embeddings: v.get("tie_word_embeddings").and_then(|t| t.as_bool()).unwrap_or(gemma),
            qkv_bias: arch == Arch::Qwen2 || v.get("attention_bias").and_then(|b| b.as_bool()).unwrap_or(false),
            qk_norm: arch == Arch::Qwen3 || gemma,
            mup,
            attn_scale,
            ffn_act,
            post_norms: gemma,
            sliding,
            sparse,
            moe,
        }
        .check(path)
    }
}

/// `sparse_config` of a MiniCPM4 config.json; missing fields take MiniCPM4's published values.
fn sparse_config(path: &Path, s: &serde_json::Value) -> Result<SparseConfig> {
    let d = SparseConfig::MINICPM4;
    let get = |k: &str, default: usize| s.get(k).and_then(|x| x.as_u64()).map_or(default, |x| x as usize);
    if s.get("use_nope").and_then(|x| x.as_bool()) == Some(true) {
        return Err(bad(path, "sparse_config.use_nope = true is not supported"));
    }
    SparseConfig {
        kernel_size: get("kernel_size", d.kernel_size),
        kernel_stride: get("kernel_stride", d.kernel_stride),
        block_size: get("block_size", d.block_size),
        init_blocks: get("init_blocks", d.init_blocks),
        window_size: get("window_size", d.window_size),
        topk: get("topk", d.topk),
        dense_len: get("dense_len", d.dense_len),
    }
    .check(path)
}

/// BlockFFN's fields of config.json (`ffn_type` block / block_linear). The `BlockMLP` class defaults
/// (`norm_after_router` "sum", `norm_scale` 1) apply where the file says nothing.
fn moe_config(path: &Path, v: &serde_json::Value) -> Result<MoeConfig> {
    let num = |k: &str| v.get(k).and_then(|x| x.as_u64()).map(|x| x as usize);
    let text = |k: &str| v.get(k).and_then(|x| x.as_str());
    let (Some(experts), Some(expert_size)) = (num("num_experts"), num("expert_size")) else {
        return Err(bad(path, "a BlockFFN config needs num_experts and expert_size"));
    };
    if experts == 0 || experts > crate::ops::moe_common::MAX_EXPERTS || expert_size == 0 {
        return Err(bad(
            path,
            format!("{experts} experts of size {expert_size}: unsupported"),
        ));
    }
    if !expert_size.is_multiple_of(crate::ops::moe_common::DE_ALIGN) {
        return Err(bad(path, format!("expert_size {expert_size} is not a multiple of 32")));
    }
    if num("num_shared_experts").unwrap_or(0) > 0 {
        return Err(bad(path, "BlockFFN shared experts are not supported"));
    }
    if let Some(act) = text("router_act").filter(|a| *a != "relu") {
        return Err(bad(path, format!("router_act {act:?} is not supported (relu only)")));
    }
    if let Some(act) = text("hidden_act").filter(|a| *a != "silu") {
        return Err(bad(
            path,
            format!("hidden_act {act:?} is not supported for experts (silu only)"),
        ));
    }
    let norm = match text("norm_after_router").unwrap_or("sum") {
        "none" => RouterNormKind::None,
        "sum" => RouterNormKind::Sum {
            scale: v.get("norm_scale").and_then(|x| x.as_f64()).unwrap_or(1.0) as f32,
        },
        "rms" => RouterNormKind::Rms,
        other => return Err(bad(path, format!("norm_after_router {other:?} is not supported"))),
    };
    Ok(MoeConfig {
        experts,
        expert_size,
        per_expert_tensors: text("ffn_type") == Some("block"),
        norm,
    })
}

/// RoPE settings of a Hugging Face config: transformers 5's `rope_parameters` (one object, or one per layer type
/// for Gemma 3) or the older `rope_theta` + `rope_scaling` (+ Gemma 3's `rope_local_base_freq`).
struct HfRope {
    theta: f32,
    scaling: RopeScaling,
    /// Sliding-window layers' base and scaling, where the config gives them apart.
    local: Option<(f32, RopeScaling)>,
}

impl HfRope {
    fn read(path: &Path, v: &serde_json::Value, rope_dim: usize, context: usize) -> Result<HfRope> {
        let base = |t: f64| -> Result<f32> {
            if t.is_finite() && t > 1.0 {
                Ok(t as f32)
            } else {
                Err(bad(path, format!("rope_theta {t} is not a base above 1")))
            }
        };
        let theta_of =
            |o: &serde_json::Value, default: f64| base(o.get("rope_theta").and_then(|x| x.as_f64()).unwrap_or(default));
        let default_theta = v.get("rope_theta").and_then(|x| x.as_f64()).unwrap_or(10000.0);
        if let Some(p) = v.get("rope_parameters").filter(|p| !p.is_null()) {
            // Per layer type (Gemma 3 under transformers 5): {"full_attention": {..}, "sliding_attention": {..}}.
            if let Some(full) = p.get("full_attention") {
                let local = match p.get("sliding_attention") {
                    Some(l) => Some((theta_of(l, 10000.0)?, RopeScaling::from_hf(path, l, rope_dim, context)?)),
                    None => None,
                };
                return Ok(HfRope {
                    theta: theta_of(full, default_theta)?,
                    scaling: RopeScaling::from_hf(path, full, rope_dim, context)?,
                    local,
                });
            }
            return Ok(HfRope {
                theta: theta_of(p, default_theta)?,
                scaling: RopeScaling::from_hf(path, p, rope_dim, context)?,
                local: None,
            });
        }
        let scaling = match v.get("rope_scaling").filter(|s| !s.is_null()) {
            Some(s) => {
                // Phi-3 writes original_max_position_embeddings beside rope_scaling, not in it.
                let mut s = s.clone();
                if let (Some(o), Some(top)) = (s.as_object_mut(), v.get("original_max_position_embeddings")) {
                    o.entry("original_max_position_embeddings")
                        .or_insert_with(|| top.clone());
                }
                RopeScaling::from_hf(path, &s, rope_dim, context)?
            }
            None => RopeScaling::None,
        };
        let local = match v.get("rope_local_base_freq").and_then(|x| x.as_f64()) {
            Some(b) => Some((base(b)?, RopeScaling::None)),
            None => None,
        };
        Ok(HfRope {
            theta: theta_of(v, default_theta)?,
            scaling,
            local,
        })
    }
}

/// Sliding-window layers of a Hugging Face config: `layer_types` where transformers writes it, else Gemma 3's
/// `sliding_window_pattern` (every n-th layer global, default 6), Mistral's window on every layer, or Qwen2's
/// `use_sliding_window` on layers from `max_window_layers` on.
fn hf_sliding(
    path: &Path,
    v: &serde_json::Value,
    arch: Arch,
    n_layers: usize,
    rope: &HfRope,
) -> Result<Option<SlidingWindow>> {
    // null, absent or 0: no window (transformers tests the value's truth).
    let window = match v
        .get("sliding_window")
        .filter(|w| !w.is_null() && w.as_u64() != Some(0))
    {
        None => {
            if arch == Arch::Gemma3 {
                return Err(bad(path, "a Gemma 3 config needs sliding_window"));
            }
            return Ok(None);
        }
        Some(w) => w
            .as_u64()
            .filter(|w| *w > 0)
            .ok_or_else(|| bad(path, "sliding_window must be a positive number"))? as usize,
    };
    let uses = v.get("use_sliding_window").and_then(|u| u.as_bool());
    let local: Vec<bool> = if let Some(types) = v.get("layer_types").filter(|t| !t.is_null()) {
        let list = types
            .as_array()
            .filter(|l| l.len() == n_layers)
            .ok_or_else(|| bad(path, format!("layer_types must list {n_layers} layer types")))?;
        list.iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                other => Err(bad(
                    path,
                    format!("layer type {other:?} is not supported (sliding_attention, full_attention)"),
                )),
            })
            .collect::<Result<_>>()?
    } else {
        match arch {
            Arch::Gemma3 => {
                let n = v.get("sliding_window_pattern").and_then(|x| x.as_u64()).unwrap_or(6) as usize;
                if n == 0 {
                    return Err(bad(path, "sliding_window_pattern must be positive"));
                }
                (0..n_layers).map(|i| (i + 1) % n != 0).collect()
            }
            Arch::Qwen2 | Arch::Qwen3 if uses != Some(true) => return Ok(None),
            Arch::Qwen2 | Arch::Qwen3 => {
                let from = v.get("max_window_layers").and_then(|x| x.as_u64()).unwrap_or(0) as usize;
                (0..n_layers).map(|i| i >= from).collect()
            }
            _ if uses == Some(false) => return Ok(None),
            _ => vec![true; n_layers],
        }
    };
    if !local.contains(&true) {
        return Ok(None);
    }
    let (local_theta, local_scaling) = match (&rope.local, arch) {
        (Some(l), _) => l.clone(),
        // transformers' Gemma 3 default rope_local_base_freq.
        (None, Arch::Gemma3) => (10000.0, RopeScaling::None),
        (None, _) => (rope.theta, rope.scaling.clone()),
    };
    Ok(Some(SlidingWindow {
        window,
        local,
        local_theta,
        local_scaling,
    }))
}
