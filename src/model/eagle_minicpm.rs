//! MiniCPM's EAGLE heads (MiniCPM4-8B-Eagle), in the layout vLLM's `EagleMiniCPMForCausalLM` reads: `fc.weight`
//! `[hidden, 2 hidden]` (no bias) over `cat(input_norm1(embed(t) * scale_emb), input_norm2(f))`, then MiniCPM decoder
//! layers (`eagle_layers.N.*`, with their input norms and the residual scale `scale_depth / sqrt(mup_denominator)`),
//! and the output divided by `hidden_size / dim_model_base` into the target's LM head; that scaled output is the
//! next draft step's feature. Names with or without the `model.` prefix; the layers keep whatever indices the file
//! gives them (vLLM numbers them after the target's). The embedding is the target's; an `lm_head.weight` of the full
//! vocabulary in the file is the head's own.

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

/// The head's input: the normed embedding and feature through `fc`, split by columns.
pub struct MiniCpmIn {
    embed_w: Linear,   // [hidden, hidden]: fc's first `hidden` columns
    feature_w: Linear, // [hidden, hidden]: its last `hidden` columns
    norm1: GpuTensor,  // [hidden]
    norm2: GpuTensor,  // [hidden]
    eps: f32,
}

impl MiniCpmIn {
    /// `W_e input_norm1(e) + W_f input_norm2(f)` for embeddings `e` (already times `scale_emb`) and features `f`,
    /// both `[n, hidden]`.
    pub(super) fn input(&self, g: &mut Graph, e: TensorId, f: TensorId) -> Result<TensorId> {
        let (w1, w2) = (g.external(&self.norm1), g.external(&self.norm2));
        let e = g.rms_norm(e, w1, self.eps)?;
        let f = g.rms_norm(f, w2, self.eps)?;
        let a = self.embed_w.forward(g, e, None)?;
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

/// The head's layers under the names the layer loader asks for: `model.layers.{i}.*` -> `{prefix}eagle_layers.{N_i}.*`.
struct HeadNames<'a> {
    st: &'a SafetensorsModel,
    dir: &'a Path,
    prefix: &'static str,
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
            Some(n) => self.st.tensor(&format!("{}eagle_layers.{n}.{rest}", self.prefix)),
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
        let config = dir.join("config.json");
        let mut json = crate::loader::read_json(&config)?;
        if json.pointer("/architectures/0").and_then(|a| a.as_str()) == Some("EagleMiniCPMForCausalLM") {
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
        if let Some(d) = json.get("mup_denominator") {
            let depth = json.get("scale_depth").and_then(|v| v.as_f64()).unwrap_or(1.0);
            match d.as_f64() {
                Some(d) if d > 0.0 && d.is_finite() => cfg.mup.residual = (depth / d.sqrt()) as f32,
                _ => {
                    return Err(bad(format!(
                        "config.json: mup_denominator {d} is not a positive number"
                    )))
                }
            }
        }
        cfg.context = t.context;
        let mut layers: Vec<usize> = st
            .names()
            .filter_map(|n| {
                n.strip_prefix(prefix)?
                    .strip_prefix("eagle_layers.")?
                    .split_once('.')?
                    .0
                    .parse()
                    .ok()
            })
            .collect();
        layers.sort_unstable();
        layers.dedup();
        if layers.len() != cfg.n_layers {
            return Err(bad(format!(
                "{} eagle_layers in the file ({layers:?}), num_hidden_layers {}",
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
        if st.get(&format!("{prefix}fc.bias")).is_some() {
            return Err(bad(format!("{prefix}fc.bias: this layout's fc has no bias")));
        }
        let fc = need("fc.weight", &[h, 2 * h])?;
        let half = |from: usize| -> Vec<f32> {
            fc.chunks_exact(2 * h)
                .flat_map(|r| r[from..from + h].to_vec())
                .collect()
        };
        let upload = |name: &str, shape: &[usize], v: &[f32]| GpuTensor::upload_f32(gpu, name, shape, v);
        let input = MiniCpmIn {
            embed_w: Linear::Dense(upload("eagle.fc.embed", &[h, h], &half(0))?),
            feature_w: Linear::Dense(upload("eagle.fc.feature", &[h, h], &half(h))?),
            norm1: upload("eagle.input_norm1", &[h], &need("input_norm1.weight", &[h])?)?,
            norm2: upload("eagle.input_norm2", &[h], &need("input_norm2.weight", &[h])?)?,
            eps: cfg.rms_eps,
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
            prefix,
            layers,
        };
        let mut head = Llama::load_sharing(gpu, &src, cfg, Names::Hf, |_, _| {}, Some(target))?;
        head.eagle = Some(EagleIn::MiniCpm(input));
        Ok(match own_head {
            Some(w) => head.with_head_subset(HeadSubset {
                head: Linear::Dense(upload("eagle.lm_head", &[vocab, h], &w)?),
                ids: (0..vocab as u32).collect(),
            }),
            None => head,
        })
    }
}
