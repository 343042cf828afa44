//! EAGLE-3 draft heads (Li, Wei, Zhang, Zhang, "EAGLE-3: Scaling up Inference Acceleration of Large Language Models
//! via Training-Time Test", 2025), as SafeAILab publishes them: a Llama `config.json` of one layer with
//! `draft_vocab_size`, and in `model.safetensors` `fc.weight` `[hidden, 3 hidden]`, the decoder layer `midlayer.*`
//! (its q, k and v over `2 hidden` columns, and `hidden_norm` beside `input_layernorm`), `norm.weight`, its own
//! `lm_head.weight` `[draft_vocab, hidden]` and `d2t` (draft id d is target id `d + d2t[d]`).
//! The target's feature at position j is `fc(cat(h_low, h_mid, h_high))`, the target's hidden states entering
//! layers 2, n/2 and n - 3 ([`feature_layers`], `StepOutputs::aux_hidden`, projected by [`FeatureProjector`]). For
//! token `t_{j+1}` and feature `f_j`, the layer attends over `cat(input_norm(embed(t_{j+1})), hidden_norm(f_j))` with
//! `f_j` as its residual stream; its output is the predicted feature `f_{j+1}` (fed to the next draft step as is),
//! and `lm_head(norm(output))` scores the draft vocabulary, mapped to token ids through `d2t` (a restricted head,
//! as FR-Spec's). The embedding is the target's.

use super::config::{Arch, LlamaConfig};
use super::eagle::EagleIn;
use super::frspec::HeadSubset;
use super::llama::{Llama, Names};
use super::weights::{HostData, HostTensor, Linear, WeightSource};
use crate::error::{Error, Result};
use crate::gpu::{DType, Gpu, GpuTensor};
use crate::graph::{Graph, Plan, StepVars, TensorId};
use crate::loader::safetensors::SafetensorsModel;
use std::collections::HashMap;
use std::path::Path;

/// The EAGLE-3 layer's two inputs: the norms of the embedding and of the feature, and the embedding half of its
/// q|k|v projection; and `fc`, which projects the target's three hidden states to a feature.
pub struct Eagle3In {
    input_norm: GpuTensor,  // [hidden]
    hidden_norm: GpuTensor, // [hidden]
    eps: f32,
    qkv_embed: Linear, // [q + k + v columns, hidden]: the first `hidden` columns of q_proj, k_proj, v_proj
    fc: Linear,        // [hidden, 3 hidden]
}

impl Eagle3In {
    /// The embedding half of q|k|v: `W_e input_norm(e)`, `[n, q + k + v]`.
    pub(super) fn qkv_embed(&self, g: &mut Graph, e: TensorId) -> Result<TensorId> {
        let w = g.external(&self.input_norm);
        let x = g.rms_norm(e, w, self.eps)?;
        self.qkv_embed.forward(g, x, None)
    }

    /// `hidden_norm(f)`, the feature half's input.
    pub(super) fn hidden_norm(&self, g: &mut Graph, f: TensorId) -> Result<TensorId> {
        let w = g.external(&self.hidden_norm);
        g.rms_norm(f, w, self.eps)
    }
}

/// The target layers whose input hidden states an EAGLE-3 head reads, in order: 2, n / 2 and n - 3 (SafeAILab's
/// choice, which trained heads expect). An error for targets of fewer than 7 layers (the three would not differ).
pub fn feature_layers(n_layers: usize) -> Result<[usize; 3]> {
    if n_layers < 7 {
        return Err(Error::Invalid(format!(
            "EAGLE-3 reads the hidden states entering layers 2, n/2 and n-3: a target of {n_layers} layers has no three"
        )));
    }
    Ok([2, n_layers / 2, n_layers - 3])
}

/// Whether `st` holds an EAGLE-3 head (a `midlayer`).
pub(super) fn is_layout(st: &SafetensorsModel) -> bool {
    st.get("midlayer.self_attn.q_proj.weight").is_some()
}

/// The head's tensors under the names the layer loader asks for: `model.layers.0.*` -> `midlayer.*`, q, k and v as
/// their feature halves (their last `hidden` columns), and the input norm the generic layer would apply served as
/// ones (never used: the head layer's input is [`EagleIn::layer_input`]'s).
struct Head3Names<'a> {
    st: &'a SafetensorsModel,
    dir: &'a Path,
    hidden: usize,
}

impl WeightSource for Head3Names<'_> {
    fn describe(&self) -> String {
        format!("EAGLE-3 head {}", self.dir.display())
    }
    fn tensor(&self, name: &str) -> Result<Option<HostTensor<'_>>> {
        let h = self.hidden;
        let Some(rest) = name.strip_prefix("model.layers.0.") else {
            return self.st.tensor(name);
        };
        if rest == "input_layernorm.weight" {
            return Ok(Some(HostTensor {
                name: name.into(),
                shape: vec![h],
                data: HostData::F32(vec![1.0; h]),
            }));
        }
        let own = format!("midlayer.{rest}");
        if !["q_proj", "k_proj", "v_proj"]
            .iter()
            .any(|p| rest == format!("self_attn.{p}.weight"))
        {
            return self.st.tensor(&own);
        }
        let Some((shape, w)) = self.st.f32(&own)? else {
            return Ok(None);
        };
        let [rows, cols] = shape[..] else {
            return Err(Error::shape(
                "load",
                format!("{own}: {shape:?}, expected [rows, {}]", 2 * h),
            ));
        };
        if cols != 2 * h {
            return Err(Error::shape(
                "load",
                format!("{own}: {shape:?}, expected [{rows}, {}]", 2 * h),
            ));
        }
        Ok(Some(HostTensor {
            name: name.into(),
            shape: vec![rows, h],
            data: HostData::F32(columns(&w, 2 * h, h..2 * h)),
        }))
    }
}

/// Columns `range` of the rows of `w` (rows of `width`).
fn columns(w: &[f32], width: usize, range: std::ops::Range<usize>) -> Vec<f32> {
    w.chunks_exact(width).flat_map(|r| r[range.clone()].to_vec()).collect()
}

impl Llama {
    /// Load the EAGLE-3 head in `dir` for `target` (the hidden size and vocabulary checked, `d2t` checked to map
    /// into the vocabulary).
    pub(super) fn load_eagle3(gpu: &Gpu, dir: &Path, st: &SafetensorsModel, target: &Llama) -> Result<Llama> {
        let bad = |what: String| Error::Invalid(format!("EAGLE-3 head {}: {what}", dir.display()));
        let config = dir.join("config.json");
        let mut json = crate::loader::read_json(&config)?;
        // SafeAILab names the architecture LlamaForCausalLMEagle3: a Llama layer otherwise.
        if json.pointer("/architectures/0").and_then(|a| a.as_str()) == Some("LlamaForCausalLMEagle3") {
            json["architectures"] = serde_json::json!(["LlamaForCausalLM"]);
        }
        let mut cfg = LlamaConfig::from_hf_value(&json, &config)?;
        let t = &target.cfg;
        if cfg.arch != Arch::Llama || cfg.n_layers != 1 {
            return Err(bad(format!(
                "config.json: an EAGLE-3 head is a Llama of 1 layer, not {:?} of {}",
                cfg.arch, cfg.n_layers
            )));
        }
        let target_hidden = json
            .get("target_hidden_size")
            .and_then(|v| v.as_u64())
            .map(|v| v as usize);
        if cfg.hidden != t.hidden || target_hidden.is_some_and(|th| th != t.hidden) || cfg.vocab != t.vocab {
            return Err(bad(format!(
                "config.json: hidden_size {} (target_hidden_size {target_hidden:?}) and vocab_size {} do not match \
                 the target's {} and {}",
                cfg.hidden, cfg.vocab, t.hidden, t.vocab
            )));
        }
        feature_layers(t.n_layers).map_err(|e| bad(e.to_string()))?;
        let dv = match json.get("draft_vocab_size") {
            None => cfg.vocab,
            Some(v) => match v.as_u64() {
                Some(n) if (1..=cfg.vocab as u64).contains(&n) => n as usize,
                _ => return Err(bad(format!("config.json: draft_vocab_size {v} (1..={})", cfg.vocab))),
            },
        };
        cfg.context = t.context;
        let h = cfg.hidden;
        let need = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
            let (s, v) = st.f32(name)?.ok_or_else(|| bad(format!("missing tensor {name}")))?;
            if s != shape {
                return Err(bad(format!("{name}: {s:?}, expected {shape:?}")));
            }
            Ok(v)
        };
        let fc = need("fc.weight", &[h, 3 * h])?;
        let (q_dim, kv_dim) = (cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim);
        let mut qkv_embed = Vec::with_capacity((q_dim + 2 * kv_dim) * h);
        for (p, rows) in [("q", q_dim), ("k", kv_dim), ("v", kv_dim)] {
            let w = need(&format!("midlayer.self_attn.{p}_proj.weight"), &[rows, 2 * h])?;
            qkv_embed.extend(columns(&w, 2 * h, 0..h));
        }
        let input_norm = need("midlayer.input_layernorm.weight", &[h])?;
        let hidden_norm = need("midlayer.hidden_norm.weight", &[h])?;
        let norm = need("norm.weight", &[h])?;
        let lm_head = need("lm_head.weight", &[dv, h])?;
        let ids: Vec<u32> = match st.i64s("d2t")? {
            None if dv == cfg.vocab => (0..dv as u32).collect(),
            None => {
                return Err(bad(format!(
                    "missing tensor d2t (draft_vocab_size {dv} < vocab_size {})",
                    cfg.vocab
                )))
            }
            Some((shape, _)) if shape != [dv] => return Err(bad(format!("d2t: {shape:?}, expected [{dv}]"))),
            Some((_, d2t)) => d2t
                .iter()
                .enumerate()
                .map(|(d, &off)| match (d as i64).checked_add(off) {
                    Some(id) if (0..cfg.vocab as i64).contains(&id) => Ok(id as u32),
                    _ => Err(bad(format!(
                        "d2t[{d}] = {off} maps draft id {d} outside the vocabulary of {}",
                        cfg.vocab
                    ))),
                })
                .collect::<Result<_>>()?,
        };
        let eps = cfg.rms_eps;
        let src = Head3Names { st, dir, hidden: h };
        let mut head = Llama::load_sharing(gpu, &src, cfg, Names::Hf, |_, _| {}, Some(target))?;
        if head.qkv_groups(0) != 1 {
            return Err(bad(
                "q_proj, k_proj and v_proj must be stored alike (one stacked projection)".into(),
            ));
        }
        let upload = |name: &str, shape: &[usize], v: &[f32]| GpuTensor::upload_f32(gpu, name, shape, v);
        head.norm = upload("eagle3.norm", &[h], &norm)?;
        head.eagle = Some(EagleIn::V3(Eagle3In {
            input_norm: upload("eagle3.input_norm", &[h], &input_norm)?,
            hidden_norm: upload("eagle3.hidden_norm", &[h], &hidden_norm)?,
            eps,
            qkv_embed: Linear::Dense(upload("eagle3.qkv_embed", &[q_dim + 2 * kv_dim, h], &qkv_embed)?),
            fc: Linear::Dense(upload("eagle3.fc", &[h, 3 * h], &fc)?),
        }));
        let lm_head = Linear::Dense(upload("eagle3.lm_head", &[dv, h], &lm_head)?);
        Ok(head.with_head_subset(HeadSubset::new(gpu, lm_head, ids)?))
    }
}

/// Projects the target's three hidden states `[n, 3 hidden]` to an EAGLE-3 head's features `[n, hidden]` (`fc`), one
/// plan per row count (at most 16 kept).
#[derive(Default)]
pub struct FeatureProjector {
    plans: HashMap<usize, (Plan, TensorId, TensorId)>,
}

impl FeatureProjector {
    /// `out` (cleared) = `fc(aux)` for the rows of `aux` `[n, 3 hidden]`.
    pub fn project(&mut self, gpu: &Gpu, head: &Llama, aux: &[f32], out: &mut Vec<f32>) -> Result<()> {
        let Some(EagleIn::V3(v3)) = &head.eagle else {
            return Err(Error::Invalid("feature projection needs an EAGLE-3 head".into()));
        };
        let h = head.cfg.hidden;
        if aux.is_empty() || !aux.len().is_multiple_of(3 * h) {
            return Err(Error::Invalid(format!(
                "{} values of the target's hidden states, not [n, 3 x {h}]",
                aux.len()
            )));
        }
        let n = aux.len() / (3 * h);
        if !self.plans.contains_key(&n) {
            if self.plans.len() >= 16 {
                self.plans.clear();
            }
            let mut g = Graph::new();
            let x = g.input("aux_hidden", &[n, 3 * h], DType::F32);
            let y = v3.fc.forward(&mut g, x, None)?;
            g.output(y);
            self.plans.insert(n, (Plan::new(gpu, g)?, x, y));
        }
        let (plan, x, y) = self.plans.get_mut(&n).expect("just inserted");
        plan.write_input(gpu, *x, bytemuck::cast_slice(aux))?;
        plan.run(gpu, &StepVars::default())?;
        plan.read_into(*y, out)
    }
}
