//! The GPTQ output: a Hugging Face directory as AutoGPTQ saves one (v1 checkpoint format, no act-order), readable by
//! AutoGPTQ, GPTQModel, transformers and shaderlm: `model.safetensors` with `X.qweight` (i32 `[K / 8, N]`),
//! `X.qzeros` (i32 `[G, N / 8]`), `X.scales` (f16 `[G, N]`) and `X.g_idx` (i32 `[K]`) per decoder linear layer and
//! everything else in f16; `config.json` with its `quantization_config` (and the same object in
//! `quantize_config.json` for older AutoGPTQ); the tokenizer files, copied from a Hugging Face input or written from
//! a GGUF input's vocabulary (`tokenizer.json`, and `tokenizer_config.json` with BOS, EOS and the chat template).

use super::source::{Container, Source};
use super::{write_then_commit, Sink, Stored};
use crate::error::{Error, Result};
use crate::loader::gguf::GgufFile;
use crate::model::config::RopeScaling;
use crate::model::load::tokenizer_from_gguf;
use crate::model::{Arch, LlamaConfig};
use crate::ops::rope::RopeStyle;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Tokenizer files of a Hugging Face model, copied as they are.
const TOKENIZER_FILES: [&str; 9] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
];

/// Files besides the weights: (file name, contents).
type Files = Vec<(String, Vec<u8>)>;

struct Tensor {
    name: String,
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

pub struct HfSink {
    files: Files,
    tensors: Vec<Tensor>,
}

fn json_bytes(v: &Value) -> Vec<u8> {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s.into_bytes()
}

/// An f32 as the shortest decimal that reads back as it (1e-5, not 9.999999747378752e-6).
fn short(x: f32) -> Value {
    format!("{x}").parse::<f64>().map_or(Value::Null, |f| json!(f))
}

impl HfSink {
    pub fn new(src: &Source, group_size: Option<usize>, sym: bool, damp: f64) -> Result<HfSink> {
        let quant = json!({
            "quant_method": "gptq",
            "bits": 4,
            "group_size": group_size.map_or(-1, |g| g as i64),
            "desc_act": false,
            "sym": sym,
            "checkpoint_format": "gptq",
            "damp_percent": damp,
            "static_groups": false,
            "true_sequential": true,
            "model_file_base_name": "model",
        });
        let mut files = Vec::new();
        let config = match &src.container {
            Container::Hf(_) => {
                let path = src.path.join("config.json");
                let mut v = crate::loader::read_json(&path)?;
                let Some(o) = v.as_object_mut() else {
                    return Err(Error::File {
                        path,
                        message: "not a JSON object".into(),
                    });
                };
                o.insert("torch_dtype".into(), json!("float16"));
                o.insert("quantization_config".into(), quant.clone());
                for name in TOKENIZER_FILES {
                    let p = src.path.join(name);
                    if p.is_file() {
                        let bytes = std::fs::read(&p).map_err(|source| Error::Io { path: p, source })?;
                        files.push((name.to_string(), bytes));
                    }
                }
                v
            }
            Container::Gguf(f) => {
                let (config, tok_files) = from_gguf(f, &src.cfg, &quant)?;
                files.extend(tok_files);
                config
            }
        };
        files.push(("config.json".into(), json_bytes(&config)));
        files.push(("quantize_config.json".into(), json_bytes(&quant)));
        Ok(HfSink {
            files,
            tensors: Vec::new(),
        })
    }
}

/// config.json (from the GGUF hyper-parameters) and the tokenizer files of a GGUF input.
fn from_gguf(f: &GgufFile, c: &LlamaConfig, quant: &Value) -> Result<(Value, Files)> {
    let bad = |message: String| Error::File {
        path: f.path().into(),
        message,
    };
    if c.rope_dim != c.head_dim {
        return Err(bad(format!(
            "RoPE over {} of {} head dims has no transformers Llama config",
            c.rope_dim, c.head_dim
        )));
    }
    let (arch, model_type) = match c.arch {
        Arch::Llama => ("LlamaForCausalLM", "llama"),
        Arch::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
        Arch::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
        Arch::MiniCpm => return Err(bad("MiniCPM from GGUF is not supported".into())),
        Arch::Gemma3 | Arch::Phi3 => {
            return Err(bad(
                "Gemma 3 and Phi-3 are not written as Hugging Face directories here".into(),
            ))
        }
    };
    let rope_scaling = match &c.rope_scaling {
        RopeScaling::None => Value::Null,
        RopeScaling::Linear { factor } => json!({"rope_type": "linear", "factor": short(*factor)}),
        other => {
            return Err(bad(format!(
                "rope scaling {other:?} is not written to config.json here"
            )))
        }
    };
    debug_assert!(c.arch != Arch::Llama || c.rope_style == RopeStyle::Interleaved);
    let tok = tokenizer_from_gguf(f)?;
    let text = |id: Option<u32>| id.and_then(|i| tok.token_text(i)).map_or(Value::Null, Value::String);
    let mut config = json!({
        "architectures": [arch],
        "model_type": model_type,
        "hidden_size": c.hidden,
        "intermediate_size": c.ffn,
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "vocab_size": c.vocab,
        "rms_norm_eps": short(c.rms_eps),
        "rope_theta": short(c.rope_theta),
        "max_position_embeddings": c.context,
        "tie_word_embeddings": c.tie_embeddings,
        "hidden_act": "silu",
        "attention_bias": c.qkv_bias,
        "attention_dropout": 0.0,
        "torch_dtype": "float16",
        "bos_token_id": tok.bos,
        "eos_token_id": tok.eos,
        "rope_scaling": rope_scaling,
        "quantization_config": quant,
    });
    if c.arch == Arch::Qwen2 {
        config["use_sliding_window"] = json!(false);
    }
    let mut tok_config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": text(tok.bos),
        "eos_token": text(tok.eos),
        "add_bos_token": tok.add_bos,
        "model_max_length": c.context,
        "clean_up_tokenization_spaces": false,
    });
    if let Some(t) = &tok.chat_template {
        tok_config["chat_template"] = json!(t);
    }
    let generation = json!({"bos_token_id": tok.bos, "eos_token_id": tok.eos});
    let files = vec![
        ("tokenizer.json".to_string(), tok.to_json()?.into_bytes()),
        ("tokenizer_config.json".to_string(), json_bytes(&tok_config)),
        ("generation_config.json".to_string(), json_bytes(&generation)),
    ];
    Ok((config, files))
}

fn le_bytes<T: Copy, const N: usize>(v: &[T], to: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    v.iter().flat_map(|&x| to(x)).collect()
}

impl Sink for HfSink {
    fn add(&mut self, name: &str, shape: &[usize], stored: Stored) -> Result<()> {
        use safetensors::Dtype;
        let mut push = |name: String, dtype: Dtype, shape: Vec<usize>, bytes: Vec<u8>| {
            self.tensors.push(Tensor {
                name,
                dtype,
                shape,
                bytes,
            })
        };
        match stored {
            Stored::F32(v) => push(name.into(), Dtype::F32, shape.to_vec(), le_bytes(&v, f32::to_le_bytes)),
            Stored::F16(h) => push(name.into(), Dtype::F16, shape.to_vec(), le_bytes(&h, u16::to_le_bytes)),
            Stored::Ggml(ty, _) => {
                return Err(Error::Invalid(format!(
                    "{name}: {ty} blocks do not go in a GPTQ checkpoint"
                )))
            }
            Stored::Gptq(t) => {
                let prefix = name
                    .strip_suffix(".weight")
                    .ok_or_else(|| Error::Invalid(format!("{name}: a GPTQ layer's name ends in .weight")))?;
                let s = crate::quant::gptq::Scheme::gptq(4, None);
                let g = t.scales.len() / t.n.max(1);
                let g_idx = t.g_idx.clone().unwrap_or_else(|| vec![0; t.k]);
                push(
                    format!("{prefix}.qweight"),
                    Dtype::I32,
                    t.qweight_shape(&s).to_vec(),
                    le_bytes(&t.qweight, u32::to_le_bytes),
                );
                push(
                    format!("{prefix}.qzeros"),
                    Dtype::I32,
                    vec![g, t.n / 8],
                    le_bytes(&t.qzeros, u32::to_le_bytes),
                );
                push(
                    format!("{prefix}.scales"),
                    Dtype::F16,
                    vec![g, t.n],
                    le_bytes(&t.scales, u16::to_le_bytes),
                );
                push(
                    format!("{prefix}.g_idx"),
                    Dtype::I32,
                    vec![t.k],
                    le_bytes(&g_idx, i32::to_le_bytes),
                );
            }
        }
        Ok(())
    }

    fn finish(self: Box<Self>, out: &Path) -> Result<u64> {
        write_then_commit(out, |tmp| write_dir(tmp, &self.files, &self.tensors))
    }
}

fn write_dir(dir: &Path, files: &Files, tensors: &[Tensor]) -> Result<u64> {
    let io = |path: PathBuf| move |source| Error::Io { path, source };
    std::fs::create_dir(dir).map_err(io(dir.to_path_buf()))?;
    let mut bytes = 0u64;
    for (name, data) in files {
        std::fs::write(dir.join(name), data).map_err(io(dir.join(name)))?;
        bytes += data.len() as u64;
    }
    let views = tensors
        .iter()
        .map(|t| {
            safetensors::tensor::TensorView::new(t.dtype, t.shape.clone(), &t.bytes)
                .map(|v| (t.name.clone(), v))
                .map_err(|e| Error::Invalid(format!("{}: {e}", t.name)))
        })
        .collect::<Result<Vec<_>>>()?;
    let path = dir.join("model.safetensors");
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), &path).map_err(|e| Error::File {
        path: path.clone(),
        message: e.to_string(),
    })?;
    bytes += std::fs::metadata(&path).map_err(io(path.clone()))?.len();
    Ok(bytes)
}
