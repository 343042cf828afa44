//! EAGLE-1 draft heads (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty"), as
//! SafeAILab publishes them: a directory with a Llama `config.json` of one layer and the weights `fc.weight` `[hidden,
//! 2 hidden]` (+ `fc.bias`) and `layers.0.*` in transformers' names, in `model.safetensors` (a published
//! `pytorch_model.bin` must be converted first: `safetensors`' `convert` script, or `torch.load` + `save_file`). For
//! token `t_{j+1}` and the target's feature `f_j` (its final-normed hidden state at position j), the head computes
//! `fc(cat(embed(t_{j+1}), f_j))`, runs its decoder layer with no input norm, and scores the output with the
//! target's LM head directly: the output is the predicted feature `f_{j+1}`, and its logits the draft for `t_{j+2}`.
//! The head is a one-layer [`Llama`] sharing the target's embedding and head; its steps take the features as a
//! second input ([`super::Step::write_features`]).

use super::config::{Arch, LlamaConfig};
use super::llama::{Llama, Names};
use super::weights::{HostData, HostTensor, Linear, WeightSource};
use crate::error::{Error, Result};
use crate::gpu::{Gpu, GpuTensor};
use crate::graph::{Graph, TensorId};
use crate::loader::safetensors::SafetensorsModel;
use std::path::Path;

/// How a head takes its two inputs, the token embeddings `e` and the features `f` (both `[n, hidden]`).
pub(super) enum EagleIn {
    /// EAGLE-1: the input projection split by columns, `fc(cat(e, f)) = W_e e + W_f f + b`; the layer has no input
    /// norm and its output goes to the target's head with no final norm.
    V1 {
        embed_w: Linear,         // [hidden, hidden]: fc's first `hidden` columns
        feature_w: Linear,       // [hidden, hidden]: its last `hidden` columns
        bias: Option<GpuTensor>, // [hidden]
    },
    /// EAGLE-3 ([`super::eagle3`]): the layer's q|k|v over `cat(input_norm(e), hidden_norm(f))` split by columns
    /// (the feature half is the layer's own q|k|v, the embedding half `qkv_embed` is added to it), `f` the residual.
    V3(super::eagle3::Eagle3In),
    /// MiniCPM's head ([`super::eagle_minicpm`]): `fc(cat(norm1(e), norm2(f)))` split by columns, then MiniCPM
    /// layers with their input norms, the output scaled by the logit scale into the target's head.
    MiniCpm(super::eagle_minicpm::MiniCpmIn),
}

impl EagleIn {
    /// The head layer's residual stream `[n, hidden]`, and what its q|k|v projection adds (`[n, q + k + v]`).
    pub(super) fn input(&self, g: &mut Graph, e: TensorId, f: TensorId) -> Result<(TensorId, Option<TensorId>)> {
        match self {
            EagleIn::V1 {
                embed_w,
                feature_w,
                bias,
            } => {
                let a = embed_w.forward(g, e, bias.as_ref())?;
                let b = feature_w.forward(g, f, None)?;
                Ok((g.add_scaled(a, b, 1.0)?, None))
            }
            EagleIn::V3(v3) => Ok((f, Some(v3.qkv_embed(g, e)?))),
            EagleIn::MiniCpm(m) => Ok((m.input(g, e, f)?, None)),
        }
    }

    /// The input of the head layer's attention from its residual stream `h`: EAGLE-1's layer has no input norm;
    /// None where the layer's own input norm applies (MiniCPM's head).
    pub(super) fn layer_input(&self, g: &mut Graph, h: TensorId) -> Result<Option<TensorId>> {
        match self {
            EagleIn::V1 { .. } => Ok(Some(h)),
            EagleIn::V3(v3) => Ok(Some(v3.hidden_norm(g, h)?)),
            EagleIn::MiniCpm(_) => Ok(None),
        }
    }
}

/// The head's tensors under the names the layer loader asks for (`model.layers.0.*` -> `layers.0.*`), with the input
/// norm it does not have served as ones (never used: layer 0 of a head skips its input norm).
struct HeadNames<'a> {
    st: &'a SafetensorsModel,
    dir: &'a Path,
    hidden: usize,
}

impl WeightSource for HeadNames<'_> {
    fn describe(&self) -> String {
        format!("EAGLE head {}", self.dir.display())
    }
    fn tensor(&self, name: &str) -> Result<Option<HostTensor<'_>>> {
        if name == "model.layers.0.input_layernorm.weight" {
            return Ok(Some(HostTensor {
                name: name.into(),
                shape: vec![self.hidden],
                data: HostData::F32(vec![1.0; self.hidden]),
            }));
        }
        match name.strip_prefix("model.") {
            Some(rest) => self.st.tensor(rest),
            None => self.st.tensor(name),
        }
    }
}

impl Llama {
    /// Load the EAGLE head in `dir` for drafting for `target` (same hidden size and vocabulary, checked): EAGLE-1,
    /// sharing the target's embedding and LM head, or EAGLE-3 (a `midlayer`, see [`super::eagle3`]).
    pub fn load_eagle(gpu: &Gpu, dir: &Path, target: &Llama) -> Result<Llama> {
        let bad = |what: String| Error::Invalid(format!("EAGLE head {}: {what}", dir.display()));
        if !dir.join("model.safetensors").exists() && dir.join("pytorch_model.bin").exists() {
            // The published pickle: read by the restricted reader, loaded through a converted copy.
            let tmp = std::env::temp_dir().join(format!("shaderlm-eagle-{}", std::process::id()));
            let convert = || -> Result<Llama> {
                std::fs::create_dir_all(&tmp).map_err(|source| Error::Io {
                    path: tmp.clone(),
                    source,
                })?;
                let tensors = crate::loader::torch_pickle::read(&dir.join("pytorch_model.bin"))?;
                crate::loader::torch_pickle::write_safetensors(&tensors, &tmp.join("model.safetensors"))?;
                std::fs::copy(dir.join("config.json"), tmp.join("config.json")).map_err(|source| Error::Io {
                    path: dir.join("config.json"),
                    source,
                })?;
                Self::load_eagle(gpu, &tmp, target)
            };
            let head = convert().map_err(|e| bad(format!("pytorch_model.bin: {e}")));
            let _ = std::fs::remove_dir_all(&tmp);
            return head;
        }
        // The weights tell the layout: EAGLE-3's midlayer, MiniCPM's input norms, else EAGLE-1.
        let st = SafetensorsModel::open(dir)?;
        if super::eagle3::is_layout(&st) {
            return Self::load_eagle3(gpu, dir, &st, target);
        }
        if let Some(prefix) = super::eagle_minicpm::prefix_of(&st) {
            return Self::load_eagle_minicpm(gpu, (dir, &st, prefix), target);
        }
        let mut cfg = LlamaConfig::from_hf(&dir.join("config.json"))?;
        let t = &target.cfg;
        if cfg.arch != Arch::Llama || cfg.n_layers != 1 {
            return Err(bad(format!(
                "config.json: an EAGLE-1 head is a Llama of 1 layer, not {:?} of {}",
                cfg.arch, cfg.n_layers
            )));
        }
        if cfg.hidden != t.hidden || cfg.vocab != t.vocab {
            return Err(bad(format!(
                "config.json: hidden_size {} and vocab_size {} do not match the target's {} and {}",
                cfg.hidden, cfg.vocab, t.hidden, t.vocab
            )));
        }
        // Positions as the target's (the head drafts at the target's positions).
        cfg.context = t.context;
        let h = cfg.hidden;
        let fc = st
            .tensor("fc.weight")?
            .ok_or_else(|| bad("missing tensor fc.weight".into()))?;
        if fc.shape != [h, 2 * h] {
            return Err(bad(format!("fc.weight: {:?}, expected [{h}, {}]", fc.shape, 2 * h)));
        }
        let w = fc.to_f32()?;
        let half = |second: bool| -> Vec<f32> {
            let from = if second { h } else { 0 };
            w.chunks_exact(2 * h)
                .flat_map(|row| row[from..from + h].to_vec())
                .collect()
        };
        let bias = match st.tensor("fc.bias")? {
            Some(b) if b.shape == [h] => Some(GpuTensor::upload_f32(gpu, "eagle.fc.bias", &[h], &b.to_f32()?)?),
            Some(b) => return Err(bad(format!("fc.bias: {:?}, expected [{h}]", b.shape))),
            None => None,
        };
        let input = EagleIn::V1 {
            embed_w: Linear::Dense(GpuTensor::upload_f32(gpu, "eagle.fc.embed", &[h, h], &half(false))?),
            feature_w: Linear::Dense(GpuTensor::upload_f32(gpu, "eagle.fc.feature", &[h, h], &half(true))?),
            bias,
        };
        let src = HeadNames {
            st: &st,
            dir,
            hidden: h,
        };
        let mut head = Llama::load_sharing(gpu, &src, cfg, Names::Hf, |_, _| {}, Some(target))?;
        head.eagle = Some(input);
        Ok(head)
    }

    /// Whether this is an EAGLE head (its steps take features: [`super::Step::write_features`]).
    pub fn is_eagle(&self) -> bool {
        self.eagle.is_some()
    }

    /// Whether this is an EAGLE-3 head (its target's features are three layers' hidden states, projected by
    /// [`super::eagle3::FeatureProjector`]).
    pub fn is_eagle3(&self) -> bool {
        matches!(self.eagle, Some(EagleIn::V3(_)))
    }
}
