//! Checkpoints that store q|k|v and gate|up as single matrices (Phi-3 / Phi-4-mini: HF `qkv_proj`, `gate_up_proj`;
//! GGUF `attn_qkv`, and `ffn_up` holding gate then up), served under the separate names the model loads, as row
//! slices of the fused matrices (no copy of quantized data).

use super::config::{Arch, LlamaConfig};
use super::llama::Names;
use super::weights::{HostTensor, WeightSource};
use crate::error::Result;

/// A weight source that splits fused matrices (for architectures that fuse them); other names pass through.
pub struct Unfused<'s> {
    pub src: &'s dyn WeightSource,
    pub names: Names,
    /// Whether the architecture fuses (Phi-3); otherwise every name passes through.
    pub fused: bool,
    /// Rows of q (`n_heads * head_dim`) and of each of k and v (`n_kv * head_dim`).
    pub q_rows: usize,
    pub kv_rows: usize,
    /// Rows of each of gate and up.
    pub ffn: usize,
}

impl<'s> Unfused<'s> {
    /// `src` as the model `cfg` with `names` reads it.
    pub fn of(src: &'s dyn WeightSource, cfg: &LlamaConfig, names: Names) -> Unfused<'s> {
        Unfused {
            src,
            names,
            fused: cfg.arch == Arch::Phi3,
            q_rows: cfg.n_heads * cfg.head_dim,
            kv_rows: cfg.n_kv_heads * cfg.head_dim,
            ffn: cfg.ffn,
        }
    }

    /// For a separate matrix name: (fused name, first row, rows).
    fn part(&self, name: &str) -> Option<(String, usize, usize)> {
        if !self.fused {
            return None;
        }
        let (q, kv, f) = (self.q_rows, self.kv_rows, self.ffn);
        let (prefix, leaf) = name.rsplit_once('.').filter(|(_, l)| *l == "weight")?;
        let (layer, role) = prefix.rsplit_once('.')?;
        let (fused, r0, n) = match (self.names, role) {
            (Names::Hf, "q_proj") => ("qkv_proj", 0, q),
            (Names::Hf, "k_proj") => ("qkv_proj", q, kv),
            (Names::Hf, "v_proj") => ("qkv_proj", q + kv, kv),
            (Names::Hf, "gate_proj") => ("gate_up_proj", 0, f),
            (Names::Hf, "up_proj") => ("gate_up_proj", f, f),
            (Names::Gguf, "attn_q") => ("attn_qkv", 0, q),
            (Names::Gguf, "attn_k") => ("attn_qkv", q, kv),
            (Names::Gguf, "attn_v") => ("attn_qkv", q + kv, kv),
            (Names::Gguf, "ffn_gate") => ("ffn_up", 0, f),
            (Names::Gguf, "ffn_up") => ("ffn_up", f, f),
            _ => return None,
        };
        Some((format!("{layer}.{fused}.{leaf}"), r0, n))
    }
}

impl WeightSource for Unfused<'_> {
    fn describe(&self) -> String {
        self.src.describe()
    }
    fn tensor(&self, name: &str) -> Result<Option<HostTensor<'_>>> {
        let Some((fused, r0, n)) = self.part(name) else {
            return self.src.tensor(name);
        };
        match self.src.tensor(&fused)? {
            // GGUF's ffn_up is the fused gate|up (2 ffn rows) or, in a file that also has ffn_gate, up alone.
            Some(t) if fused == name && t.shape.first() != Some(&(2 * self.ffn)) => Ok(Some(t)),
            Some(t) => Ok(Some(t.rows(name, r0, n)?)),
            // Stored apart after all.
            None => self.src.tensor(name),
        }
    }
}
