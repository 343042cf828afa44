//! Opening a model from a path: a GGUF file, or a Hugging Face directory (config.json, safetensors,
//! tokenizer.json); with its tokenizer, within its memory budget; and a summary for `shaderlm info`.

use super::budget::{self, Budget, MemoryNeed, Sizing};
use super::config::LlamaConfig;
use super::llama::{Llama, Names};
use super::options::LoadOptions;
use crate::error::{Error, Result};
use crate::gpu::{Gpu, MemoryReport};
use crate::loader::gguf::GgufFile;
use crate::loader::safetensors::SafetensorsModel;
use crate::tokenizer::{Tokenizer, VocabSpec};
use std::path::{Path, PathBuf};

/// A model ready to run, with the tokenizer that goes with it.
pub struct LoadedModel {
    pub model: Llama,
    pub tokenizer: Tokenizer,
    pub path: PathBuf,
    /// e.g. "GGUF Q4_1" or "safetensors F16".
    pub format: String,
    /// The context asked for, clamped to the trained context: the KV-cache size of sessions.
    pub ctx: usize,
    /// The device memory the model and one session of `ctx` positions take (checked against the budget before
    /// anything was uploaded).
    pub memory: MemoryNeed,
}

/// Build the tokenizer a GGUF file describes in its `tokenizer.ggml.*` metadata.
pub fn tokenizer_from_gguf(f: &GgufFile) -> Result<Tokenizer> {
    if f.metadata("tokenizer.ggml.tokens").is_none() {
        return Err(Error::File {
            path: f.path().into(),
            message: "no tokenizer: the file has no tokenizer.ggml.tokens".into(),
        });
    }
    let strings = |k: &str| -> Result<Vec<String>> {
        Ok(match f.metadata(k) {
            Some(_) => f.get_str_array(k)?.into_iter().map(str::to_string).collect(),
            None => Vec::new(),
        })
    };
    let tokens = strings("tokenizer.ggml.tokens")?;
    let token_types = match f.metadata("tokenizer.ggml.token_type") {
        Some(_) => f.get_i32_array("tokenizer.ggml.token_type")?,
        None => vec![crate::tokenizer::TOKEN_NORMAL; tokens.len()],
    };
    let scores = match f.metadata("tokenizer.ggml.scores") {
        Some(_) => f.get_f32_array("tokenizer.ggml.scores")?,
        None => Vec::new(),
    };
    let model = f.get_str("tokenizer.ggml.model")?.to_string();
    let spec = VocabSpec {
        pre: f
            .get_opt::<&str>("tokenizer.ggml.pre")?
            .unwrap_or("default")
            .to_string(),
        merges: strings("tokenizer.ggml.merges")?,
        bos: f.get_opt::<u32>("tokenizer.ggml.bos_token_id")?,
        eos: f.get_opt::<u32>("tokenizer.ggml.eos_token_id")?,
        // llama.cpp's default: SentencePiece vocabularies add BOS, byte-level BPE ones do not.
        add_bos: f
            .get_opt::<bool>("tokenizer.ggml.add_bos_token")?
            .unwrap_or(model == "llama"),
        add_space_prefix: f.get_opt::<bool>("tokenizer.ggml.add_space_prefix")?,
        chat_template: f.get_opt::<&str>("tokenizer.chat_template")?.map(str::to_string),
        model,
        tokens,
        token_types,
        scores,
    };
    let mut tok = Tokenizer::from_vocab(&spec).map_err(|e| Error::File {
        path: f.path().into(),
        message: e.to_string(),
    })?;
    if let Some(eot) = f.get_opt::<u32>("tokenizer.ggml.eot_token_id")? {
        if !tok.end_of_turn.contains(&eot) && Some(eot) != tok.eos && (eot as usize) < tok.vocab_size {
            tok.end_of_turn.push(eot);
        }
    }
    Ok(tok)
}

/// A model path is a GGUF file unless it is a directory (anything else, a FIFO included, is refused when opened
/// as a file: `open_regular`).
fn is_gguf(path: &Path) -> bool {
    !path.is_dir()
}

impl LoadedModel {
    /// Open the model at `path` and upload it, configured by `opts` before anything is allocated; a model that
    /// does not fit its memory budget (`opts.max_memory`, else what the adapter reports) is refused first.
    pub fn open(gpu: &Gpu, path: &Path, opts: &LoadOptions, progress: impl FnMut(usize, usize)) -> Result<LoadedModel> {
        if !path.exists() {
            return Err(Error::File {
                path: path.into(),
                message: "no such file or directory".into(),
            });
        }
        let budget = Budget::new(opts.max_memory, Some(&gpu.memory())).less(opts.reserved, "the target model");
        let (model, tokenizer, format, memory) = if is_gguf(path) {
            let f = GgufFile::open(path)?;
            let cfg = opts.configure(LlamaConfig::from_gguf(&f)?)?;
            let mut tokenizer = tokenizer_from_gguf(&f)?;
            if tokenizer.chat_template.is_none() && cfg.arch == super::Arch::Gemma3 {
                tokenizer.chat_template = Some(crate::tokenizer::chat::GEMMA3_TEMPLATE.into());
            }
            let memory = budget.check(
                path,
                &sizing(&cfg, budget::gguf_weights(&f), opts),
                session_ctx(&cfg, opts),
            )?;
            let format = format!("GGUF {}", weight_types(&f));
            (
                Llama::load(gpu, &f, cfg, Names::Gguf, progress)?,
                tokenizer,
                format,
                memory,
            )
        } else {
            let cfg = opts.configure(LlamaConfig::from_hf(&path.join("config.json"))?)?;
            let tokenizer = Tokenizer::from_hf_dir(path)?;
            let st = SafetensorsModel::open(path)?;
            let sizing = sizing(&cfg, budget::safetensors_weights(&st), opts);
            let memory = budget.check(path, &sizing, session_ctx(&cfg, opts))?;
            let model = Llama::load(gpu, &st, cfg, Names::Hf, progress)?;
            (model, tokenizer, "safetensors".to_string(), memory)
        };
        Ok(LoadedModel {
            ctx: opts.ctx.min(model.cfg.context),
            model: model.with_kv_type(opts.kv_type),
            tokenizer,
            path: path.into(),
            format,
            memory,
        })
    }
}

/// The context of a session: the one asked for, at most the trained one.
fn session_ctx(cfg: &LlamaConfig, opts: &LoadOptions) -> usize {
    opts.ctx.min(cfg.context)
}

fn sizing<'a>(cfg: &'a LlamaConfig, weights: u64, opts: &LoadOptions) -> Sizing<'a> {
    Sizing {
        cfg,
        weights,
        chunk: opts.chunk,
        kv_type: opts.kv_type,
        sessions: opts.sessions.max(1),
    }
}

/// For `shaderlm info`: the memory the model at `path` needs with `opts` (weights, KV cache, scratch), the budget
/// (`opts.max_memory`, else `report`'s) and whether it fits; nothing is uploaded.
pub fn describe_memory(path: &Path, opts: &LoadOptions, report: Option<&MemoryReport>) -> Result<String> {
    let (cfg, weights) = if is_gguf(path) {
        let f = GgufFile::open(path)?;
        let cfg = opts.configure(LlamaConfig::from_gguf(&f)?)?;
        (cfg, budget::gguf_weights(&f))
    } else {
        let cfg = opts.configure(LlamaConfig::from_hf(&path.join("config.json"))?)?;
        (cfg, budget::safetensors_weights(&SafetensorsModel::open(path)?))
    };
    Budget::new(opts.max_memory, report).report(&sizing(&cfg, weights, opts), session_ctx(&cfg, opts))
}

/// The distinct tensor types of the matrices in a GGUF file, most common first.
fn weight_types(f: &GgufFile) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for t in f.tensors().iter().filter(|t| t.dims.len() == 2) {
        let name = t.ggml_type.to_string();
        match counts.iter_mut().find(|c| c.0 == name) {
            Some(c) => c.1 += 1,
            None => counts.push((name, 1)),
        }
    }
    counts.sort_by_key(|c| std::cmp::Reverse(c.1));
    counts.iter().map(|c| c.0.clone()).collect::<Vec<_>>().join("+")
}

/// Tensors grouped by role (`blk.N.` dropped), each with its types and counts, in file order.
fn tensor_groups(f: &GgufFile) -> Vec<(String, Vec<(crate::quant::GgmlType, usize)>)> {
    let mut groups: Vec<(String, Vec<(crate::quant::GgmlType, usize)>)> = Vec::new();
    for t in f.tensors() {
        let role = match t.name.strip_prefix("blk.") {
            Some(rest) => format!("blk.*.{}", rest.split_once('.').map_or(rest, |(_, r)| r)),
            None => t.name.clone(),
        };
        let i = match groups.iter().position(|g| g.0 == role) {
            Some(i) => i,
            None => {
                groups.push((role, Vec::new()));
                groups.len() - 1
            }
        };
        match groups[i].1.iter_mut().find(|e| e.0 == t.ggml_type) {
            Some(e) => e.1 += 1,
            None => groups[i].1.push((t.ggml_type, 1)),
        }
    }
    groups
}

/// A human-readable summary of a model file: architecture, sizes, quantization, tokenizer, template, metadata.
pub fn describe(path: &Path) -> Result<String> {
    use std::fmt::Write;
    let mut s = String::new();
    if is_gguf(path) {
        let f = GgufFile::open(path)?;
        let cfg = LlamaConfig::from_gguf(&f);
        let _ = writeln!(
            s,
            "file: {} (GGUF v{}, {} tensors)",
            path.display(),
            f.version(),
            f.tensors().len()
        );
        let _ = writeln!(s, "architecture: {}", f.architecture().unwrap_or("?"));
        match &cfg {
            Ok(c) => {
                let _ = writeln!(s, "config: {c:?}");
                let _ = writeln!(s, "parameters: {:.1} M", c.n_params() as f64 / 1e6);
            }
            Err(e) => {
                let _ = writeln!(s, "config: not runnable here: {e}");
            }
        }
        let bytes: usize = f.tensors().iter().map(|t| t.n_bytes).sum();
        let _ = writeln!(
            s,
            "weights: {} ({:.1} MiB)",
            weight_types(&f),
            bytes as f64 / (1 << 20) as f64
        );
        let _ = writeln!(s, "tensor groups:");
        let groups = tensor_groups(&f);
        for (group, types) in &groups {
            let list: Vec<String> = types.iter().map(|(t, n)| format!("{t} x{n}")).collect();
            let _ = writeln!(s, "  {group}: {}", list.join(", "));
        }
        let unsupported: Vec<String> = groups
            .iter()
            .flat_map(|(g, types)| types.iter().map(move |(t, _)| (g, *t)))
            .filter(|(_, t)| !t.is_supported())
            .map(|(g, t)| format!("{g} is {t}"))
            .collect();
        let runs = match (&cfg, unsupported.is_empty()) {
            (Ok(_), true) => "yes".to_string(),
            (Err(e), _) => format!("no: {e}"),
            (Ok(_), false) => format!(
                "no: {} (this build runs {})",
                unsupported.join(", "),
                crate::quant::GgmlType::supported_names()
            ),
        };
        let _ = writeln!(s, "runs here: {runs}");
        match tokenizer_from_gguf(&f) {
            Ok(t) => {
                let _ = writeln!(
                    s,
                    "tokenizer: {} tokens, bos {:?}, eos {:?}, end of turn {:?}, add bos {}",
                    t.vocab_size, t.bos, t.eos, t.end_of_turn, t.add_bos
                );
            }
            Err(e) => {
                let _ = writeln!(s, "tokenizer: {e}");
            }
        }
        let _ = writeln!(s, "metadata:");
        for (k, v) in f.metadata_entries() {
            let text = v.to_string();
            let short: String = text.chars().take(100).collect();
            let more = if text.chars().count() > 100 { " ..." } else { "" };
            let _ = writeln!(s, "  {k} = {short}{more}");
        }
    } else {
        let cfg = LlamaConfig::from_hf(&path.join("config.json"))?;
        let _ = writeln!(s, "directory: {} (Hugging Face)", path.display());
        let _ = writeln!(s, "config: {cfg:?}");
        let _ = writeln!(s, "parameters: {:.1} M", cfg.n_params() as f64 / 1e6);
        let st = SafetensorsModel::open(path)?;
        let _ = writeln!(s, "tensors: {}", st.names().count());
        let tok = Tokenizer::from_hf_dir(path)?;
        let _ = writeln!(
            s,
            "tokenizer: {} tokens, bos {:?}, eos {:?}",
            tok.vocab_size, tok.bos, tok.eos
        );
        let _ = writeln!(
            s,
            "chat template: {}",
            if tok.chat_template.is_some() { "yes" } else { "no" }
        );
    }
    Ok(s)
}
