//! MiniCPM's EAGLE heads, in the two published layouts. Both compute `fc(cat(input_norm1(embed(t) * scale_emb),
//! input_norm2(f)))` with `fc.weight` `[hidden, 2 hidden]`, then MiniCPM decoder layers (with their input norms and a
//! residual scale), and the output divided by `hidden_size / dim_model_base` into the target's LM head; the
//! embedding is the target's.
//!
//! - vLLM's `EagleMiniCPMForCausalLM` (MiniCPM4-8B-Eagle-vLLM): layers `eagle_layers.N.*`, names with or without the
//!   `model.` prefix, the layers keeping whatever indices the file gives them (vLLM numbers them after the target's),
//!   the residual scale `scale_depth / sqrt(mup_denominator)`, no fc bias, its own RoPE settings; the scaled output
//!   is the next draft step's feature; an `lm_head.weight` of the full vocabulary in the file is the head's own.
//! - CPM.cu's (MiniCPM4-8B-Eagle-FRSpec, `MiniCPM4EagleImpl` with its input and attention norms and RoPE, as CPM.cu
//!   runs MiniCPM4): layers `layers.N.*` with no prefix, `fc.weight` split into `fc1` (embedding half, with
//!   `fc.bias` when the file has one) and `fc2` (feature half), the residual scale `scale_depth / sqrt(L + 1)` for
//!   the target's `L` layers, the target's RoPE, and the unscaled output fed forward as the next feature. The
//!   head's `scale_emb`, `scale_depth` and `dim_model_base` must equal the target's, as CPM.cu asserts; its
//!   FR-Spec subset (`token_id_remap`) is CPM.cu's `freq_N.pt`, which `--frspec-vocab` reads.

use super::config::{Arch, LlamaConfig};
use super::eagle::EagleIn;
use super::frspec::HeadSubset;
use super::llama::{Llama, Names};
use super::weights::{HostTensor, Linear, WeightSource};
use crate::error::{Error, Result};
use crate::gpu::{Gpu, GpuTensor};
use crate::graph::{Graph, TensorId};
use crate::loader::safetensors::SafetensorsModel;
use std::path::Path;

/// Which published layout a MiniCPM head is in (module comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    Vllm,
    CpmCu,
}

/// The head's input: the normed embedding and feature through `fc`, split by columns.
pub struct MiniCpmIn {
    embed_w: Linear,         // [hidden, hidden]: fc's first `hidden` columns
    feature_w: Linear,       // [hidden, hidden]: its last `hidden` columns
    bias: Option<GpuTensor>, // [hidden]: CPM.cu's fc1 bias
    norm1: GpuTensor,        // [hidden]
    norm2: GpuTensor,        // [hidden]
    eps: f32,
    /// The next step's feature is the output times the logit scale (vLLM), or the output itself (CPM.cu).
    pub(super) feeds_scaled: bool,
}

impl MiniCpmIn {
    /// `W_e input_norm1(e) + W_f input_norm2(f)` for embeddings `e` (already times `scale_emb`) and features `f`,
    /// both `[n, hidden]`.
    pub(super) fn input(&self, g: &mut Graph, e: TensorId, f: TensorId) -> Result<TensorId> {
        let (w1, w2) = (g.external(&self.norm1), g.external(&self.norm2));
        let e = g.rms_norm(e, w1, self.eps)?;
        let f = g.rms_norm(f, w2, self.eps)?;
        let a = self.embed_w.forward(g, e, self.bias.as_ref())?;
        let b = self.feature_w.forward(g, f, None)?;
        g.add_scaled(a, b, 1.0)
    }
}

/// The prefix of the head's names in `st` (`model.` or none), when it is a MiniCPM head (it has `input_norm1`).
pub(super) fn prefix_of(st: &SafetensorsModel) -> Option<&'static str> {
    ["model.", ""]
        .into_iter()
        .find(|p| st.get(&format!("{p}input_norm1.weight")).is_some())
}

/// The layout of a MiniCPM head whose names are under `prefix`: CPM.cu's has `layers.N.*` and no prefix.
fn layout_of(st: &SafetensorsModel, prefix: &str) -> Layout {
    let vllm = format!("{prefix}eagle_layers.");
    if prefix.is_empty() && !st.names().any(|n| n.starts_with(&vllm)) && st.names().any(|n| n.starts_with("layers.")) {
        Layout::CpmCu
    } else {
        Layout::Vllm
    }
}

/// The tensors CPM.cu's loader takes from a head file besides `layers.N.*` (it skips `embed_tokens`, the target's,
/// and refuses any other name).
const CPMCU_NAMES: [&str; 5] = [
    "fc.weight",
    "fc.bias",
    "input_norm1.weight",
    "input_norm2.weight",
    "embed_tokens.weight",
];

/// The head's layers under the names the layer loader asks for: `model.layers.{i}.*` -> `{layer_prefix}{N_i}.*`.
struct HeadNames<'a> {
    st: &'a SafetensorsModel,
    dir: &'a Path,
    layer_prefix: String,
    layers: Vec<usize>,
}

impl WeightSource for HeadNames<'_> {
    fn describe(&self) -> String {
        format!("MiniCPM EAGLE head {}", self.dir.display())
    }
    fn tensor(&self, name: &str) -> Result<Option<HostTensor<'_>>> {
        let Some((i, rest)) = name.strip_prefix("model.layers.").and_then(|r| r.split_once('.')) else {
            return self.st.tensor(name);
        };
        match i.parse::<usize>().ok().and_then(|i| self.layers.get(i)) {
            Some(n) => self.st.tensor(&format!("{}{n}.{rest}", self.layer_prefix)),
            None => Ok(None),
        }
    }
}

impl Llama {
    /// Load the MiniCPM EAGLE head in `dir` (its weights `st`, names under `prefix`) for `target` (a MiniCPM of the
    /// same hidden size and vocabulary).
    pub(super) fn load_eagle_minicpm(
        gpu: &Gpu,
        (dir, st, prefix): (&Path, &SafetensorsModel, &'static str),
        target: &Llama,
    ) -> Result<Llama> {
        let bad = |what: String| Error::Invalid(format!("MiniCPM EAGLE head {}: {what}", dir.display()));
        let layout = layout_of(st, prefix);
        let config = dir.join("config.json");
        let mut json = crate::loader::read_json(&config)?;
        let arch = json.pointer("/architectures/0").and_then(|a| a.as_str());
        // CPM.cu reads the head's config for its sizes whatever its architecture says.
        if arch == Some("EagleMiniCPMForCausalLM") || layout == Layout::CpmCu {
            json["architectures"] = serde_json::json!(["MiniCPMForCausalLM"]);
        }
        let mut cfg = LlamaConfig::from_hf_value(&json, &config)?;
        let t = &target.cfg;
        if cfg.arch != Arch::MiniCpm || t.arch != Arch::MiniCpm {
            return Err(bad(format!(
                "a MiniCPM head drafts for a MiniCPM target (head {:?}, target {:?})",
                cfg.arch, t.arch
            )));
        }
        if cfg.hidden != t.hidden || cfg.vocab != t.vocab {
            return Err(bad(format!(
                "config.json: hidden_size {} and vocab_size {} do not match the target's {} and {}",
                cfg.hidden, cfg.vocab, t.hidden, t.vocab
            )));
        }
        let depth = json.get("scale_depth").and_then(|v| v.as_f64());
        match (layout, json.get("mup_denominator")) {
            (Layout::Vllm, Some(d)) => match d.as_f64() {
                Some(d) if d > 0.0 && d.is_finite() => cfg.mup.residual = (depth.unwrap_or(1.0) / d.sqrt()) as f32,
                _ => {
                    return Err(bad(format!(
                        "config.json: mup_denominator {d} is not a positive number"
                    )))
                }
            },
            (Layout::Vllm, None) => {}
            (Layout::CpmCu, d) => {
                // The target's muP settings, as CPM.cu asserts; its residual scale over the target's layers + 1.
                let target_depth = t.mup.residual as f64 * (t.n_layers as f64).sqrt();
                let same = |a: f64, b: f64| (a - b).abs() <= 1e-5 * b.abs().max(1e-30);
                let over = (t.n_layers + 1) as f64;
                let denominator_ok = d.is_none_or(|d| d.as_f64() == Some(over));
                match depth.filter(|&d| same(d, target_depth)) {
                    Some(depth) if denominator_ok => cfg.mup.residual = (depth / over.sqrt()) as f32,
                    _ => {
                        return Err(bad(format!(
                            "config.json: scale_depth {depth:?} (the target's {target_depth}) and mup_denominator \
                             {d:?} (CPM.cu's layout takes the target's layers + 1 = {over})"
                        )))
                    }
                }
                if cfg.mup.emb != t.mup.emb || !same(cfg.mup.logit as f64, t.mup.logit as f64) {
                    return Err(bad(format!(
                        "config.json: scale_emb {} and dim_model_base / hidden_size {} differ from the target's {} \
                         and {}",
                        cfg.mup.emb, cfg.mup.logit, t.mup.emb, t.mup.logit
                    )));
                }
                // CPM.cu's head shares the target's rotary embedding, and its attention is dense.
                cfg.rope_theta = t.rope_theta;
                cfg.rope_style = t.rope_style;
                cfg.rope_dim = t.rope_dim;
                cfg.rope_scaling = t.rope_scaling.clone();
                cfg.sparse = None;
                if let Some(n) = st
                    .names()
                    .find(|n| !n.starts_with("layers.") && !CPMCU_NAMES.contains(n))
                {
                    let hint = match n {
                        "token_id_remap" => {
                            " (CPM.cu takes the FR-Spec subset from freq_N.pt: pass it with --frspec-vocab)"
                        }
                        _ => "",
                    };
                    return Err(bad(format!("{n}: not a tensor of CPM.cu's head layout{hint}")));
                }
            }
        }
        cfg.context = t.context;
        let layer_prefix = match layout {
            Layout::Vllm => format!("{prefix}eagle_layers."),
            Layout::CpmCu => "layers.".to_string(),
        };
        let mut layers: Vec<usize> = st
            .names()
            .filter_map(|n| n.strip_prefix(&layer_prefix)?.split_once('.')?.0.parse().ok())
            .collect();
        layers.sort_unstable();
        layers.dedup();
        if layers.len() != cfg.n_layers {
            return Err(bad(format!(
                "{} {layer_prefix}N layers in the file ({layers:?}), num_hidden_layers {}",
                layers.len(),
                cfg.n_layers
            )));
        }
        let h = cfg.hidden;
        let need = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
            let full = format!("{prefix}{name}");
            let (s, v) = st.f32(&full)?.ok_or_else(|| bad(format!("missing tensor {full}")))?;
            if s != shape {
                return Err(bad(format!("{full}: {s:?}, expected {shape:?}")));
            }
            Ok(v)
        };
        let upload = |name: &str, shape: &[usize], v: &[f32]| GpuTensor::upload_f32(gpu, name, shape, v);
        let bias = match (layout, st.get(&format!("{prefix}fc.bias")).is_some()) {
            (_, false) => None,
            (Layout::CpmCu, true) => Some(upload("eagle.fc.bias", &[h], &need("fc.bias", &[h])?)?),
            (Layout::Vllm, true) => {
                return Err(bad(format!("{prefix}fc.bias: vLLM's layout has no fc bias")));
            }
        };
        let fc = need("fc.weight", &[h, 2 * h])?;
        let half = |from: usize| -> Vec<f32> {
            fc.chunks_exact(2 * h)
                .flat_map(|r| r[from..from + h].to_vec())
                .collect()
        };
        let input = MiniCpmIn {
            embed_w: Linear::Dense(upload("eagle.fc.embed", &[h, h], &half(0))?),
            feature_w: Linear::Dense(upload("eagle.fc.feature", &[h, h], &half(h))?),
            bias,
            norm1: upload("eagle.input_norm1", &[h], &need("input_norm1.weight", &[h])?)?,
            norm2: upload("eagle.input_norm2", &[h], &need("input_norm2.weight", &[h])?)?,
            eps: cfg.rms_eps,
            feeds_scaled: layout == Layout::Vllm,
        };
        let own_head = match st.f32("lm_head.weight")? {
            None => None,
            Some((s, w)) if s == [cfg.vocab, h] => Some(w),
            Some((s, _)) => {
                return Err(bad(format!(
                    "lm_head.weight: {s:?}; a head of other than the full vocabulary [{}, {h}] needs its id map",
                    cfg.vocab
                )))
            }
        };
        let vocab = cfg.vocab;
        let src = HeadNames {
            st,
            dir,
            layer_prefix,
            layers,
        };
        let mut head = Llama::load_sharing(gpu, &src, cfg, Names::Hf, |_, _| {}, Some(target))?;
        head.eagle = Some(EagleIn::MiniCpm(input));
        Ok(match own_head {
            Some(w) => head.with_head_subset(HeadSubset::new(
                gpu,
                Linear::Dense(upload("eagle.lm_head", &[vocab, h], &w)?),
                (0..vocab as u32).collect(),
            )?),
            None => head,
        })
    }
}
