//! FR-Spec: a draft model's LM head restricted to a frequency-ranked subset of the vocabulary, so that each draft
//! step reads and scores N rows instead of the whole vocabulary (the head is a third or more of a small draft
//! model's weights). Verification keeps the target's full head, so the output does not change; a token outside
//! the subset is never drafted, which only costs acceptance.
//! Source: Zhao et al., "FR-Spec: Accelerating Large-Vocabulary Language Models via Frequency-Ranked Speculative
//! Sampling" (2025).
//!
//! The subset's rows are gathered from the file into their own matrix (N / vocab of the head's bytes): the
//! chunk-tiled layout that CPU adapters read packs 32 rows per tile, so an indexed GEMV over scattered rows would
//! lose the contiguous streams that make it fast there.

use super::load::{tokenizer_from_gguf, LoadedModel};
use super::names::{Names, Role};
use super::weights::{HostData, HostTensor, Linear, WeightSource};
use super::LlamaConfig;
use crate::error::{Error, Result};
use crate::gpu::{DType, Gpu, GpuTensor};
use crate::loader::gguf::GgufFile;
use crate::loader::safetensors::SafetensorsModel;
use crate::tokenizer::Tokenizer;
use std::path::Path;

/// `loaded` scoring only the tokens `ids` (its head's rows for them read again from its file).
pub fn restrict(gpu: &Gpu, loaded: LoadedModel, ids: Vec<u32>) -> Result<LoadedModel> {
    let subset = subset_of(gpu, &loaded, ids)?;
    Ok(LoadedModel {
        model: loaded.model.with_head_subset(subset),
        ..loaded
    })
}

/// The rows for `ids` of `loaded`'s LM head, read again from its file (for its own head, or an EAGLE head that
/// shares it).
pub fn subset_of(gpu: &Gpu, loaded: &LoadedModel, ids: Vec<u32>) -> Result<HeadSubset> {
    let cfg = &loaded.model.cfg;
    if loaded.path.is_dir() {
        let st = SafetensorsModel::open(&loaded.path)?;
        load(gpu, &st, cfg, Names::Hf, ids)
    } else {
        let f = GgufFile::open(&loaded.path)?;
        load(gpu, &f, cfg, Names::Gguf, ids)
    }
}

/// The tokenizer of the model at `path` (a GGUF file or a Hugging Face directory), without its weights.
pub fn tokenizer_of(path: &Path) -> Result<Tokenizer> {
    if path.is_dir() {
        Tokenizer::from_hf_dir(path)
    } else {
        tokenizer_from_gguf(&GgufFile::open(path)?)
    }
}

/// A restricted LM head: `head` holds the rows of the full head for `ids`, in that order.
pub struct HeadSubset {
    pub head: Linear, // [ids.len(), hidden]
    pub ids: Vec<u32>,
    /// `ids` on the device, u32 `[ids.len()]`: a chained draft step maps its argmax through them.
    pub ids_on_device: GpuTensor,
}

impl HeadSubset {
    pub fn new(gpu: &Gpu, head: Linear, ids: Vec<u32>) -> Result<HeadSubset> {
        let ids_on_device = GpuTensor::upload(gpu, "head_ids", &[ids.len()], DType::U32, bytemuck::cast_slice(&ids))?;
        Ok(HeadSubset {
            head,
            ids,
            ids_on_device,
        })
    }
}

/// The head (or, when tied, the embedding) rows of `ids` from `src`, uploaded as their own matrix.
pub fn load(gpu: &Gpu, src: &dyn WeightSource, cfg: &LlamaConfig, names: Names, ids: Vec<u32>) -> Result<HeadSubset> {
    let role = if cfg.tie_embeddings { Role::Embed } else { Role::Head };
    let full = src.require(&names.of(cfg.arch, role, None))?;
    let rows = select_rows(&full, &ids)?;
    HeadSubset::new(gpu, Linear::load(gpu, &rows)?, ids)
}

/// Rows `ids` of the matrix `t` `[rows, cols]`, as a new owned matrix `[ids.len(), cols]`.
fn select_rows(t: &HostTensor<'_>, ids: &[u32]) -> Result<HostTensor<'static>> {
    let [rows, cols] = t.shape[..] else {
        return Err(Error::shape(
            "frspec",
            format!("{}: {:?} is not a matrix", t.name, t.shape),
        ));
    };
    if let Some(bad) = ids.iter().find(|&&i| i as usize >= rows) {
        return Err(Error::Invalid(format!(
            "FR-Spec: token id {bad} is past the {rows} rows of {}",
            t.name
        )));
    }
    let pick = |bytes: &[u8]| -> Vec<u8> {
        let row = bytes.len() / rows;
        ids.iter()
            .flat_map(|&i| &bytes[i as usize * row..(i as usize + 1) * row])
            .copied()
            .collect()
    };
    let data = match &t.data {
        HostData::Quant(ty, b) => HostData::Repacked {
            ty: *ty,
            raw: pick(b),
            perm: None,
        },
        HostData::Repacked { ty, raw, perm } => HostData::Repacked {
            ty: *ty,
            raw: pick(raw),
            perm: perm.clone(),
        },
        HostData::F32(_) | HostData::F16(_) => {
            let v = t.to_f32()?;
            HostData::F32(
                ids.iter()
                    .flat_map(|&i| &v[i as usize * cols..(i as usize + 1) * cols])
                    .copied()
                    .collect(),
            )
        }
    };
    Ok(HostTensor {
        name: format!("{}.frspec{}", t.name, ids.len()),
        shape: vec![ids.len(), cols],
        data,
    })
}

/// The draft vocabulary: the first `n` ids of `ranked` (most frequent first; without a ranking, ids in vocabulary
/// order: byte-level BPE vocabularies number tokens in merge order, roughly by frequency in the tokenizer's
/// training text), every stop token of `tok` forced in, ascending, unique, each below `vocab`.
pub fn subset_ids(ranked: Option<&[u32]>, n: usize, vocab: usize, tok: &Tokenizer) -> Result<Vec<u32>> {
    if n == 0 || n > vocab {
        return Err(Error::Invalid(format!(
            "--frspec-vocab {n}: the draft vocabulary needs 1..={vocab} tokens"
        )));
    }
    let mut ids: Vec<u32> = match ranked {
        Some(r) => r.iter().copied().filter(|&i| (i as usize) < vocab).take(n).collect(),
        None => (0..n as u32).collect(),
    };
    ids.extend((0..vocab as u32).filter(|&i| tok.is_stop(i)));
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// Token ids of `text`, most frequent first (ties to the lower id): the ranking `shaderlm frspec` writes.
pub fn rank(tok: &Tokenizer, text: &str, vocab: usize) -> Result<Vec<u32>> {
    let mut counts = vec![0u64; vocab];
    for id in tok.encode(text, false)? {
        if let Some(c) = counts.get_mut(id as usize) {
            *c += 1;
        }
    }
    let mut ids: Vec<u32> = (0..vocab as u32).filter(|&i| counts[i as usize] > 0).collect();
    ids.sort_by_key(|&i| (std::cmp::Reverse(counts[i as usize]), i));
    Ok(ids)
}

/// A ranking file: a JSON list of token ids, most frequent first (`shaderlm frspec` writes one). FR-Spec's
/// published `freq_N.pt` (a PyTorch pickle) is refused with how to convert it.
pub fn read_ranking(path: &Path) -> Result<Vec<u32>> {
    let bad = |message: String| Error::File {
        path: path.into(),
        message,
    };
    let mut head = [0u8; 2];
    let zip =
        std::io::Read::read(&mut crate::loader::open_regular(path)?, &mut head).is_ok_and(|n| n == 2) && head == *b"PK";
    if zip {
        // FR-Spec's published freq_N.pt: torch.save of a 1-D tensor of token ids, most frequent first.
        let tensors = crate::loader::torch_pickle::read(path)?;
        let ids = match &tensors[..] {
            [(_, t)] if t.shape.len() == 1 => t.to_i64(),
            _ => None,
        };
        let ids = ids.ok_or_else(|| {
            bad(format!(
                "expected one 1-D integer tensor of token ids, found {:?}",
                tensors.iter().map(|(n, t)| (n, t.dtype, &t.shape)).collect::<Vec<_>>()
            ))
        })?;
        return ids
            .iter()
            .map(|&i| u32::try_from(i).map_err(|_| bad(format!("token id {i} is not a valid id"))))
            .collect();
    }
    serde_json::from_str::<Vec<u32>>(&crate::loader::read_text(path)?)
        .map_err(|e| bad(format!("expected a JSON list of token ids, most frequent first: {e}")))
}
