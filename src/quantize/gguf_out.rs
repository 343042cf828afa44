//! The GGUF output: every metadata entry of a GGUF input (tokenizer and chat template included) with the new file
//! type; for a Hugging Face input, the metadata llama.cpp's converter writes (hyper-parameters under the
//! architecture's prefix, and the tokenizer of a byte-level BPE `tokenizer.json` as `tokenizer.ggml.*`).

use super::source::{Container, Source};
use super::{write_then_commit, Format, Sink, Stored};
use crate::error::{Error, Result};
use crate::loader::gguf::{Value, ValueType};
use crate::loader::gguf_write::GgufWriter;
use crate::model::config::RopeScaling;
use crate::model::{Arch, LlamaConfig};
use crate::quant::GgmlType;
use crate::tokenizer::{Tokenizer, VocabSpec, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_USER_DEFINED};
use std::path::Path;

/// llama.cpp's `LLAMA_FTYPE_MOSTLY_*` of a format.
fn file_type(format: Format) -> u32 {
    match format {
        Format::Q8_0 => 7,
        _ => 2,
    }
}

/// ggml's token type for padding ids the vocabulary lacks (`UNUSED`).
const TOKEN_UNUSED: i32 = 5;

pub struct GgufSink {
    w: GgufWriter,
    /// GGUF input tensors the model does not read (e.g. `rope_freqs.weight`), copied as they are.
    extra: Vec<(String, Vec<usize>, GgmlType, Vec<u8>)>,
}

impl GgufSink {
    pub fn new(src: &Source, format: Format) -> Result<GgufSink> {
        let mut w = GgufWriter::new();
        let mut extra = Vec::new();
        match &src.container {
            Container::Gguf(f) => {
                for (k, v) in f.metadata_entries() {
                    w.add_metadata(k, v.clone())?;
                }
                let known: Vec<String> = src.tensors().iter().map(|t| t.name(src.names())).collect();
                for info in f.tensors().iter().filter(|t| !known.contains(&t.name)) {
                    let data = f.tensor_data(info)?.to_vec();
                    extra.push((info.name.clone(), info.shape(), info.ggml_type, data));
                }
            }
            Container::Hf(_) => {
                hyper_parameters(&mut w, &src.cfg, &src.path)?;
                tokenizer_metadata(&mut w, &src.path, src.cfg.vocab)?;
            }
        }
        w.add_metadata("general.file_type", Value::U32(file_type(format)))?;
        w.add_metadata("general.quantization_version", Value::U32(2))?;
        Ok(GgufSink { w, extra })
    }
}

impl Sink for GgufSink {
    fn add(&mut self, name: &str, shape: &[usize], stored: Stored) -> Result<()> {
        match stored {
            Stored::F32(v) => self.w.add_tensor(name, shape, GgmlType::F32, &v),
            Stored::F16(h) => {
                let bytes = h.iter().flat_map(|x| x.to_le_bytes()).collect();
                self.w.add_tensor_bytes(name, shape, GgmlType::F16, bytes)
            }
            Stored::Ggml(ty, raw) => self.w.add_tensor_bytes(name, shape, ty, raw),
            Stored::Gptq(_) => Err(Error::Invalid(format!("{name}: GPTQ tensors do not go in a GGUF file"))),
        }
    }

    fn finish(self: Box<Self>, out: &Path) -> Result<u64> {
        let GgufSink { mut w, extra } = *self;
        for (name, shape, ty, data) in extra {
            w.add_tensor_bytes(name, &shape, ty, data)?;
        }
        write_then_commit(out, |tmp| {
            w.write(tmp)?;
            std::fs::metadata(tmp).map(|m| m.len()).map_err(|source| Error::Io {
                path: tmp.into(),
                source,
            })
        })
    }
}

/// `{arch}.*` hyper-parameters as llama.cpp's converter writes them.
fn hyper_parameters(w: &mut GgufWriter, c: &LlamaConfig, dir: &Path) -> Result<()> {
    let arch = match c.arch {
        Arch::Llama => "llama",
        Arch::Qwen2 => "qwen2",
        Arch::Qwen3 => "qwen3",
        Arch::MiniCpm | Arch::Gemma3 | Arch::Phi3 => return Err(Error::File {
            path: dir.into(),
            message:
                "MiniCPM and Gemma 3 checkpoints are not written as GGUF here (shaderlm runs MiniCPM from its Hugging \
                          Face layout): quantize to gptq4 instead"
                    .into(),
        }),
    };
    let linear = match &c.rope_scaling {
        RopeScaling::None => None,
        RopeScaling::Linear { factor } => Some(*factor),
        other => {
            return Err(Error::File {
                path: dir.into(),
                message: format!("rope scaling {other:?} has no GGUF form here: quantize to gptq4 instead"),
            })
        }
    };
    let k = |s: &str| format!("{arch}.{s}");
    let u = |x: usize| Value::U32(x as u32);
    let name = dir
        .file_name()
        .map_or("model".into(), |n| n.to_string_lossy().to_string());
    w.add_metadata("general.architecture", Value::String(arch.into()))?;
    w.add_metadata("general.name", Value::String(name))?;
    w.add_metadata(k("block_count"), u(c.n_layers))?;
    w.add_metadata(k("context_length"), u(c.context))?;
    w.add_metadata(k("embedding_length"), u(c.hidden))?;
    w.add_metadata(k("feed_forward_length"), u(c.ffn))?;
    w.add_metadata(k("attention.head_count"), u(c.n_heads))?;
    w.add_metadata(k("attention.head_count_kv"), u(c.n_kv_heads))?;
    w.add_metadata(k("attention.key_length"), u(c.head_dim))?;
    w.add_metadata(k("attention.value_length"), u(c.head_dim))?;
    w.add_metadata(k("attention.layer_norm_rms_epsilon"), Value::F32(c.rms_eps))?;
    w.add_metadata(k("rope.freq_base"), Value::F32(c.rope_theta))?;
    w.add_metadata(k("rope.dimension_count"), u(c.rope_dim))?;
    w.add_metadata(k("vocab_size"), u(c.vocab))?;
    if let Some(factor) = linear {
        w.add_metadata(k("rope.scaling.type"), Value::String("linear".into()))?;
        w.add_metadata(k("rope.scaling.factor"), Value::F32(factor))?;
    }
    Ok(())
}

/// Text exercising every pre-tokenizer rule the engine knows (digits alone, in threes or runs; contractions in
/// either case; newlines, tabs and space runs; letters of several scripts; emoji and punctuation runs).
const PROBE: &str = "Hello World! HELLO'S i'm I'M we'll WE'LL don't DON'T\n\n  \t 3 33 333 3333 33333 1.5e10 \
                     ($42.00) ...?! --- === \"quoted\" a\r\nb   c\u{3000}d  naïve café Ünïcödé 日本語のテキスト \
                     한국어 русский текст 🚀🌍 (tab\there) x=y+z^2 <|not special|> end.";

/// Pre-tokenizer names tried, in order; the first whose tokenizer encodes [`PROBE`] as `tokenizer.json` does wins.
/// Names with the same split rules behave alike in llama.cpp too.
const PRE_CANDIDATES: [&str; 5] = ["smollm", "llama-bpe", "qwen2", "gpt-2", "default"];

fn bad(path: &Path, message: impl Into<String>) -> Error {
    Error::File {
        path: path.into(),
        message: message.into(),
    }
}

/// Whether a tokenizer.json pre-tokenizer (or one in a sequence) is byte-level.
fn has_byte_level(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Object(o) => {
            o.get("type").and_then(|t| t.as_str()) == Some("ByteLevel") || o.values().any(has_byte_level)
        }
        serde_json::Value::Array(a) => a.iter().any(has_byte_level),
        _ => false,
    }
}

/// `tokenizer.ggml.*` from a byte-level BPE `tokenizer.json` (GPT-2 style: SmolLM, Llama 3, Qwen), as llama.cpp's
/// converter writes them: every id up to the model's vocabulary (missing ones as `[PADi]`), special added tokens as
/// control tokens and other added tokens as user-defined; the pre-tokenizer found by encoding a probe text (as the
/// converter does by hashing one); BOS, EOS, the add-BOS rule and the chat template from `tokenizer_config.json`.
/// The result is checked: a tokenizer built from the written metadata must encode the probe as `tokenizer.json`
/// does.
fn tokenizer_metadata(w: &mut GgufWriter, dir: &Path, model_vocab: usize) -> Result<()> {
    let path = dir.join("tokenizer.json");
    let v = crate::loader::read_json(&path)?;
    let model = &v["model"];
    let spm = "only byte-level BPE tokenizers (GPT-2 style, as SmolLM, Llama 3 and Qwen use) are converted to GGUF \
               metadata here; for this model use llama.cpp's convert_hf_to_gguf.py, or quantize to gptq4";
    if model["type"].as_str() != Some("BPE") || !has_byte_level(&v["pre_tokenizer"]) {
        return Err(bad(&path, format!("the tokenizer is not byte-level BPE: {spm}")));
    }
    if model["byte_fallback"].as_bool() == Some(true) {
        return Err(bad(
            &path,
            format!("a byte-fallback (SentencePiece-style) tokenizer: {spm}"),
        ));
    }
    let vocab = model["vocab"]
        .as_object()
        .ok_or_else(|| bad(&path, "model.vocab is not an object"))?;
    let mut tokens: Vec<Option<(String, i32)>> = Vec::new();
    let mut put = |id: u64, text: &str, ty: i32| -> Result<()> {
        let id = usize::try_from(id)
            .ok()
            .filter(|&i| i < 1 << 24)
            .ok_or_else(|| bad(&path, "a token id is too large"))?;
        if tokens.len() <= id {
            tokens.resize(id + 1, None);
        }
        tokens[id] = Some((text.to_string(), ty));
        Ok(())
    };
    for (t, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| bad(&path, format!("token {t:?} has no integer id")))?;
        put(id, t, TOKEN_NORMAL)?;
    }
    for a in v["added_tokens"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let (Some(id), Some(content)) = (a["id"].as_u64(), a["content"].as_str()) else {
            return Err(bad(&path, "an added token without id or content"));
        };
        let ty = if a["special"].as_bool() == Some(true) {
            TOKEN_CONTROL
        } else {
            TOKEN_USER_DEFINED
        };
        put(id, content, ty)?;
    }
    let n = tokens.len().max(model_vocab);
    let (mut texts, mut types) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        match tokens.get(i).cloned().flatten() {
            Some((t, ty)) => {
                texts.push(t);
                types.push(ty);
            }
            None => {
                texts.push(format!("[PAD{i}]"));
                types.push(TOKEN_UNUSED);
            }
        }
    }
    let merges = model["merges"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|m| match m {
            serde_json::Value::String(s) => Ok(s.clone()),
            serde_json::Value::Array(p) if p.len() == 2 => match (p[0].as_str(), p[1].as_str()) {
                (Some(a), Some(b)) => Ok(format!("{a} {b}")),
                _ => Err(bad(&path, "a merge that is not two strings")),
            },
            _ => Err(bad(&path, "a merge that is neither \"a b\" nor [a, b]")),
        })
        .collect::<Result<Vec<String>>>()?;
    let hf = Tokenizer::from_hf_dir(dir)?;
    let want = hf.encode(PROBE, false)?;
    let mut spec = VocabSpec {
        model: "gpt2".into(),
        pre: String::new(),
        tokens: texts,
        token_types: types,
        scores: Vec::new(),
        merges,
        bos: hf.bos,
        eos: hf.eos,
        add_bos: hf.add_bos,
        add_space_prefix: None,
        chat_template: hf.chat_template.clone(),
    };
    let pre = PRE_CANDIDATES
        .iter()
        .find(|pre| {
            spec.pre = pre.to_string();
            Tokenizer::from_vocab(&spec)
                .and_then(|t| t.encode(PROBE, false))
                .is_ok_and(|ids| ids == want)
        })
        .ok_or_else(|| {
            bad(
                &path,
                format!(
                    "no pre-tokenizer known here ({}) splits text as this tokenizer.json does: use llama.cpp's \
                     convert_hf_to_gguf.py, or quantize to gptq4",
                    PRE_CANDIDATES.join(", ")
                ),
            )
        })?;
    w.add_metadata("tokenizer.ggml.model", Value::String("gpt2".into()))?;
    w.add_metadata("tokenizer.ggml.pre", Value::String(pre.to_string()))?;
    w.add_str_array("tokenizer.ggml.tokens", &spec.tokens)?;
    let types = spec.token_types.iter().map(|&t| Value::I32(t)).collect();
    w.add_metadata("tokenizer.ggml.token_type", Value::Array(ValueType::I32, types))?;
    w.add_str_array("tokenizer.ggml.merges", &spec.merges)?;
    if let Some(b) = spec.bos {
        w.add_metadata("tokenizer.ggml.bos_token_id", Value::U32(b))?;
    }
    if let Some(e) = spec.eos {
        w.add_metadata("tokenizer.ggml.eos_token_id", Value::U32(e))?;
    }
    w.add_metadata("tokenizer.ggml.add_bos_token", Value::Bool(spec.add_bos))?;
    if let Some(t) = &spec.chat_template {
        w.add_metadata("tokenizer.chat_template", Value::String(t.clone()))?;
    }
    Ok(())
}
