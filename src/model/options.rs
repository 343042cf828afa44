//! How a model is opened: the context of its sessions, dense or sparse attention, the KV-cache type, the prefill
//! chunk and the memory budget. Decided before anything is uploaded, and applied to the config there, so no caller
//! rewrites a loaded model.

use super::config::{LlamaConfig, SparseConfig};
use crate::error::{Error, Result};
use crate::gpu::{Caps, DType};

/// The KV-cache positions a session gets when nothing else is asked for.
pub const DEFAULT_CTX: usize = 4096;
/// Tokens per prefill step when nothing else is asked for.
pub const DEFAULT_CHUNK: usize = 128;

/// Options of [`super::load::LoadedModel::open`].
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// KV-cache positions of each session, clamped to the trained context.
    pub ctx: usize,
    pub attention: AttentionMode,
    pub kv_type: KvType,
    /// Tokens per prefill step of the sessions (sizes their scratch buffers).
    pub chunk: usize,
    /// Most device memory the model may take (weights, each session's KV cache and scratch); `None`: what the
    /// adapter reports (see [`super::budget::Budget`]).
    pub max_memory: Option<u64>,
    /// Sessions that hold a KV cache at once (`serve --parallel`, `bench -b`): the budget counts each one's cache
    /// and scratch.
    pub sessions: usize,
    /// Device memory that a model already loaded beside this one takes (a draft model's target): the budget's
    /// room is what it leaves.
    pub reserved: u64,
    /// Keep only the first N layers (the final norm and head stay): a layer-skipping self-draft for speculative
    /// decoding. `None`: every layer.
    pub layers: Option<usize>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions::with_ctx(DEFAULT_CTX)
    }
}

impl LoadOptions {
    /// A context of `ctx` positions; the model's own attention, an f32 cache.
    pub fn with_ctx(ctx: usize) -> LoadOptions {
        LoadOptions {
            ctx,
            attention: AttentionMode::default(),
            kv_type: KvType::F32,
            chunk: DEFAULT_CHUNK,
            max_memory: None,
            sessions: 1,
            reserved: 0,
            layers: None,
        }
    }

    /// `cfg` as these options open it: the attention mode applied, the layers cut to `layers`.
    pub fn configure(&self, cfg: LlamaConfig) -> Result<LlamaConfig> {
        let mut cfg = self.attention.apply(cfg)?;
        if let Some(n) = self.layers {
            if n == 0 || n > cfg.n_layers {
                return Err(Error::Invalid(format!(
                    "keeping {n} layers of a model of {} (--draft-layers takes 1..={})",
                    cfg.n_layers, cfg.n_layers
                )));
            }
            cfg.n_layers = n;
        }
        Ok(cfg)
    }
}

/// Dense or InfLLM-v2 sparse attention. Unset override fields keep the model's `sparse_config`, else MiniCPM4's
/// published values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionMode {
    /// As the model was trained: sparse for a model with a `sparse_config` (with the overrides applied), dense for
    /// any other (where overrides are an error: they would be silently ignored).
    Model(SparseOverrides),
    /// Always dense, even on a model with a `sparse_config`.
    Dense,
    /// Sparse past `dense_len`, also on a model not trained for it (training-free).
    Sparse(SparseOverrides),
}

impl Default for AttentionMode {
    fn default() -> Self {
        AttentionMode::Model(SparseOverrides::default())
    }
}

/// Per-field changes to the sparse attention settings; `None` keeps the value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SparseOverrides {
    pub block_size: Option<usize>,
    pub topk: Option<usize>,
    pub init_blocks: Option<usize>,
    pub window_size: Option<usize>,
    pub dense_len: Option<usize>,
}

impl SparseOverrides {
    pub fn is_empty(&self) -> bool {
        *self == SparseOverrides::default()
    }

    fn apply(&self, s: SparseConfig) -> SparseConfig {
        SparseConfig {
            block_size: self.block_size.unwrap_or(s.block_size),
            topk: self.topk.unwrap_or(s.topk),
            init_blocks: self.init_blocks.unwrap_or(s.init_blocks),
            window_size: self.window_size.unwrap_or(s.window_size),
            dense_len: self.dense_len.unwrap_or(s.dense_len),
            ..s
        }
    }
}

impl AttentionMode {
    /// `cfg` with this attention: its `sparse` settings replaced, checked to fit together.
    pub fn apply(&self, cfg: LlamaConfig) -> Result<LlamaConfig> {
        let overrides = match self {
            AttentionMode::Dense => {
                return Ok(LlamaConfig { sparse: None, ..cfg });
            }
            AttentionMode::Model(o) if cfg.sparse.is_none() => {
                if o.is_empty() {
                    return Ok(cfg);
                }
                return Err(Error::Invalid(
                    "the --sparse-* settings need --sparse-attention for this model (it has no sparse_config)".into(),
                ));
            }
            AttentionMode::Model(o) | AttentionMode::Sparse(o) => o,
        };
        let s = overrides.apply(cfg.sparse.unwrap_or(SparseConfig::MINICPM4));
        cfg.with_sparse(s)
    }
}

/// Element type of the KV cache: f32, or f16 (half the memory and the attention's reads; keys and values rounded
/// to f16 as they are cached, the attention's math in f32 either way).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvType {
    #[default]
    F32,
    F16,
}

impl KvType {
    pub fn dtype(self) -> DType {
        match self {
            KvType::F32 => DType::F32,
            KvType::F16 => DType::F16,
        }
    }

    /// The cache type for an adapter with `caps`, by measurement: f16 halves the bytes attention decode reads (on
    /// lavapipe tg32 at depth 2048 went from 11.8 to 15 tok/s), except on CPU adapters without subgroups (llvmpipe
    /// under GL), where unpacking the halves cost what the bytes saved; and f32 where f16 data cannot be unpacked.
    pub fn default_for(caps: &Caps) -> KvType {
        if !caps.f16_in_f32 || caps.cpu_adapter && !caps.subgroups {
            KvType::F32
        } else {
            KvType::F16
        }
    }

    /// `f32` or `f16` (as `--kv-type` takes it).
    pub fn parse(s: &str) -> Result<KvType> {
        match s {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            _ => Err(Error::Invalid(format!("KV-cache type {s:?}: want f32 or f16"))),
        }
    }
}
