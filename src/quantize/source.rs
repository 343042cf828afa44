//! The model being quantized: a GGUF file or a Hugging Face directory with its config and tokenizer, and its
//! tensors by role, named in either convention. Llama's q/k rows are moved between the two RoPE layouts on the way:
//! llama.cpp's converter permutes them for ggml's interleaved RoPE (pairs `(2j, 2j + 1)` of a head), a Hugging Face
//! checkpoint keeps rotate-half order (pairs `(j, j + head_dim / 2)`).

use crate::error::{Error, Result};
use crate::loader::gguf::GgufFile;
use crate::loader::safetensors::SafetensorsModel;
use crate::model::load::tokenizer_from_gguf;
use crate::model::weights::WeightSource;
use crate::model::{Arch, LlamaConfig, Names};
use crate::ops::rope::RopeStyle;
use crate::tokenizer::Tokenizer;
use std::path::{Path, PathBuf};

pub use crate::model::names::Role;

/// Per-layer roles in the order a layer runs them (and llama.cpp writes them); Gemma 3's post-norms where it has
/// them.
pub const LAYER_ROLES: [Role; 16] = [
    Role::AttnNorm,
    Role::Q,
    Role::QBias,
    Role::K,
    Role::KBias,
    Role::V,
    Role::VBias,
    Role::QNorm,
    Role::KNorm,
    Role::O,
    Role::PostAttnNorm,
    Role::FfnNorm,
    Role::Gate,
    Role::Up,
    Role::Down,
    Role::PostFfnNorm,
];

/// One tensor of the model: a role, in layer `layer` for per-layer roles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelTensor {
    pub role: Role,
    pub layer: Option<usize>,
}

impl ModelTensor {
    /// The tensor's name in `names`. The Llama family's names serve: Gemma 3's differ only in Hugging Face files,
    /// which `quantize` does not read or write for it ([`Source::check_output`]).
    pub fn name(&self, names: Names) -> String {
        names.of(Arch::Llama, self.role, self.layer)
    }
}

/// Where the model's tensors are.
pub enum Container {
    Gguf(GgufFile),
    Hf(SafetensorsModel),
}

/// An opened input model.
pub struct Source {
    pub path: PathBuf,
    pub cfg: LlamaConfig,
    pub container: Container,
}

impl Source {
    /// Open a GGUF file or a Hugging Face directory the engine can run.
    pub fn open(path: &Path) -> Result<Source> {
        if !path.exists() {
            return Err(Error::File {
                path: path.into(),
                message: "no such file or directory".into(),
            });
        }
        if path.is_file() {
            let f = GgufFile::open(path)?;
            let cfg = LlamaConfig::from_gguf(&f)?;
            Ok(Source {
                path: path.into(),
                cfg,
                container: Container::Gguf(f),
            })
        } else {
            let cfg = LlamaConfig::from_hf(&path.join("config.json"))?;
            let st = SafetensorsModel::open(path)?;
            Ok(Source {
                path: path.into(),
                cfg,
                container: Container::Hf(st),
            })
        }
    }

    /// Whether this input can be written in the `to` convention (GGUF or Hugging Face). The writers know the
    /// Llama family's Hugging Face configs only, so Gemma 3 and sliding-window models go from GGUF to GGUF alone
    /// (the input's metadata is copied); Phi-3's fused matrices and BlockFFN's experts are not read at all yet.
    pub fn check_output(&self, to: Names) -> Result<()> {
        let c = &self.cfg;
        let refuse = |message: &str| {
            Err(Error::File {
                path: self.path.clone(),
                message: message.into(),
            })
        };
        if c.arch == Arch::Phi3 {
            return refuse("quantize does not support Phi-3 yet (its fused q|k|v and gate|up matrices)");
        }
        if c.moe.is_some() {
            return refuse("quantize does not support BlockFFN's experts yet");
        }
        if (c.arch == Arch::Gemma3 || c.sliding.is_some()) && (self.names(), to) != (Names::Gguf, Names::Gguf) {
            return refuse("quantize writes Gemma 3 and sliding-window models only GGUF to GGUF (q4_0, q8_0) yet");
        }
        Ok(())
    }

    /// The naming convention of the input.
    pub fn names(&self) -> Names {
        match self.container {
            Container::Gguf(_) => Names::Gguf,
            Container::Hf(_) => Names::Hf,
        }
    }

    pub fn weights(&self) -> &dyn WeightSource {
        match &self.container {
            Container::Gguf(f) => f,
            Container::Hf(st) => st,
        }
    }

    /// The model's tokenizer (for calibration text).
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        match &self.container {
            Container::Gguf(f) => tokenizer_from_gguf(f),
            Container::Hf(_) => Tokenizer::from_hf_dir(&self.path),
        }
    }

    fn has(&self, name: &str) -> bool {
        match &self.container {
            Container::Gguf(f) => f.tensor(name).is_some(),
            Container::Hf(st) => {
                st.get(name).is_some()
                    || name
                        .strip_suffix(".weight")
                        .is_some_and(|p| st.get(&format!("{p}.qweight")).is_some())
            }
        }
    }

    /// Every tensor the engine's Llama implementation reads that the file holds, in llama.cpp's order:
    /// embedding, layers, final norm, head (absent when tied).
    pub fn tensors(&self) -> Vec<ModelTensor> {
        let names = self.names();
        let mut out = vec![ModelTensor {
            role: Role::Embed,
            layer: None,
        }];
        for i in 0..self.cfg.n_layers {
            for role in LAYER_ROLES {
                out.push(ModelTensor { role, layer: Some(i) });
            }
        }
        out.push(ModelTensor {
            role: Role::FinalNorm,
            layer: None,
        });
        if !self.cfg.tie_embeddings {
            out.push(ModelTensor {
                role: Role::Head,
                layer: None,
            });
        }
        out.retain(|t| self.has(&t.name(names)));
        out
    }

    /// Whether q/k rows must be permuted between this input and an output in the `to` convention: only for the
    /// Llama architecture, whose GGUF files hold them in ggml's interleaved order.
    fn rope_permutation(&self, to: Names) -> Option<Permutation> {
        match (self.names(), to) {
            (Names::Gguf, Names::Hf) if self.cfg.rope_style == RopeStyle::Interleaved => Some(Permutation::ToHf),
            (Names::Hf, Names::Gguf) if self.cfg.arch == Arch::Llama => Some(Permutation::ToGguf),
            _ => None,
        }
    }

    /// The RoPE pairing of q/k rows as [`Source::read`] returns them for the `to` convention: the input's own,
    /// unless the rows are moved between the two layouts.
    pub fn rope_style(&self, to: Names) -> RopeStyle {
        match self.rope_permutation(to) {
            Some(Permutation::ToGguf) => RopeStyle::Interleaved,
            Some(Permutation::ToHf) => RopeStyle::RotateHalf,
            None => self.cfg.rope_style,
        }
    }

    /// A tensor's row-major shape and values as f32 (dequantized), with q/k rows in the `to` convention's order.
    pub fn read(&self, t: &ModelTensor, to: Names) -> Result<(Vec<usize>, Vec<f32>)> {
        let h = self.weights().require(&t.name(self.names()))?;
        let shape = h.shape.clone();
        let mut v = h.to_f32()?;
        let n: usize = shape.iter().product();
        if v.len() != n {
            return Err(Error::Invalid(format!(
                "{}: {} values for shape {shape:?}",
                h.name,
                v.len()
            )));
        }
        let heads = match t.role {
            Role::Q | Role::QBias => Some(self.cfg.n_heads),
            Role::K | Role::KBias => Some(self.cfg.n_kv_heads),
            _ => None,
        };
        if let (Some(heads), Some(p)) = (heads, self.rope_permutation(to)) {
            let cols = if shape.len() == 2 { shape[1] } else { 1 };
            v = permute_rows(&v, heads, cols, p)?;
        }
        Ok((shape, v))
    }
}

/// Which way q/k rows move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Permutation {
    /// Rotate-half order to ggml's interleaved order (llama.cpp's converter, HF -> GGUF).
    ToGguf,
    /// Back (GGUF -> HF).
    ToHf,
}

/// Permute the rows of `[heads * head_dim, cols]` between rotate-half and interleaved order (every dim rotated:
/// [`crate::model::rope_pairs::interleaved_order`], the layout llama.cpp's converter makes).
pub fn permute_rows(v: &[f32], heads: usize, cols: usize, p: Permutation) -> Result<Vec<f32>> {
    let rows = v.len() / cols.max(1);
    if heads == 0 || cols == 0 || v.len() != rows * cols || !rows.is_multiple_of(2 * heads) {
        return Err(Error::Invalid(format!(
            "cannot permute {rows} rows as {heads} RoPE heads of an even size"
        )));
    }
    let hd = rows / heads;
    let mut out = vec![0f32; v.len()];
    for (interleaved, rotate_half) in crate::model::rope_pairs::interleaved_order(rows, hd, hd)
        .into_iter()
        .enumerate()
    {
        let (from, to) = match p {
            Permutation::ToGguf => (rotate_half, interleaved),
            Permutation::ToHf => (interleaved, rotate_half),
        };
        out[to * cols..(to + 1) * cols].copy_from_slice(&v[from * cols..(from + 1) * cols]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_round_trips_and_moves_pairs() {
        let (heads, hd, cols) = (3, 8, 2);
        let v: Vec<f32> = (0..heads * hd * cols).map(|i| i as f32).collect();
        let g = permute_rows(&v, heads, cols, Permutation::ToGguf).unwrap();
        assert_eq!(permute_rows(&g, heads, cols, Permutation::ToHf).unwrap(), v);
        // Head 1, rotate-half rows j = 1 and j + 4 = 5 become interleaved rows 2 and 3.
        let row = |x: &[f32], r: usize| x[r * cols];
        assert_eq!(row(&g, hd + 2), row(&v, hd + 1));
        assert_eq!(row(&g, hd + 3), row(&v, hd + 5));
        assert!(permute_rows(&v, 5, cols, Permutation::ToGguf).is_err());
    }
}
