//! The device memory a model needs, computed from its files before anything is uploaded, and the budget it must
//! fit. Weights are counted as the kernels store them (f16 and f32 rows, quantized blocks repacked and padded to
//! whole tiles, vectors as f32), the KV cache for the session's context (with InfLLM-v2's compressed keys), and the
//! scratch of the steps a session plans (a full prefill chunk, a shorter one for a prompt's remainder, the decode
//! step: each plan keeps its own intermediate buffers, about one layer's worth, the logits and their read-back).
//! The estimates are upper bounds of what the device allocates (`tests/budget.rs` checks them against the
//! allocator's report). The budget is `--max-memory`, else what the adapter reports ([`MemoryReport::limit`]).

use super::config::LlamaConfig;
use super::options::KvType;
use crate::error::{Error, Result};
use crate::gpu::pipelines::PARAMS_BYTES;
use crate::gpu::{DType, MemoryReport};
use crate::graph::UNIFORM_ARRAY_BYTES;
use crate::loader::gguf::GgufFile;
use crate::loader::safetensors::{SafetensorsModel, StDtype};
use crate::ops::attention_decode::{splits_for, MAX_SPLITS, MAX_TOKENS};
use crate::ops::attention_prefill::HEAD_DIMS;
use crate::quant::pack::{Format, QK, TILE};
use crate::quant::GgmlType;
use std::path::Path;

/// A byte count printed in binary units: `512 B`, `1.5 KiB`, `4.0 GiB`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl std::fmt::Display for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
        if self.0 < 1024 {
            return write!(f, "{} B", self.0);
        }
        let mut v = self.0 as f64 / 1024.0;
        let mut unit = 0;
        while v >= 1024.0 && unit + 1 < UNITS.len() {
            v /= 1024.0;
            unit += 1;
        }
        write!(f, "{v:.1} {}", UNITS[unit])
    }
}

/// A size as `--max-memory` takes it: bytes (`1048576`), or a number with a binary unit, `K`, `M`, `G` or `T`
/// (also `KiB`, `MB`, ...; case-insensitive; `1.5G` is allowed). Zero, overflow and anything else are errors.
pub fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let bad = || format!("expected a size such as 4G, 512M or 1048576 (bytes), got {text:?}");
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(bad()),
    };
    let bytes = if number.contains('.') {
        let v: f64 = number.parse().map_err(|_| bad())?;
        let b = v * (1u64 << shift) as f64;
        if !(b.is_finite() && b < u64::MAX as f64) {
            return Err(bad());
        }
        b as u64
    } else {
        let v: u64 = number.parse().map_err(|_| bad())?;
        v.checked_mul(1 << shift).ok_or_else(bad)?
    };
    if bytes == 0 {
        return Err(format!("a size must be positive, got {text:?}"));
    }
    Ok(bytes)
}

/// What a model takes on the device: weights, the KV caches of its sessions, scratch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryNeed {
    pub weights: u64,
    /// KV caches (and compressed keys, RoPE tables) of `sessions` sessions of `ctx` positions.
    pub kv: u64,
    /// The planned steps' intermediate buffers, parameters and read-backs (every session's).
    pub scratch: u64,
    pub ctx: usize,
    pub sessions: usize,
}

impl MemoryNeed {
    pub fn total(&self) -> u64 {
        self.weights.saturating_add(self.kv).saturating_add(self.scratch)
    }
}

impl std::fmt::Display for MemoryNeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sessions = match self.sessions {
            1 => String::new(),
            n => format!(" x {n} sessions"),
        };
        write!(
            f,
            "{} (weights {} + KV cache {} for {} positions{sessions} + scratch {})",
            Bytes(self.total()),
            Bytes(self.weights),
            Bytes(self.kv),
            self.ctx,
            Bytes(self.scratch)
        )
    }
}

/// Sizes the memory of a model whose config is final (attention options applied) and whose weights take
/// `weights` bytes on the device, for sessions of any context with prefill steps of `chunk` tokens.
pub struct Sizing<'a> {
    pub cfg: &'a LlamaConfig,
    pub weights: u64,
    pub chunk: usize,
    pub kv_type: KvType,
    /// Sessions holding a cache and plans at once.
    pub sessions: usize,
}

impl Sizing<'_> {
    /// The memory a session of `ctx` positions needs; an error (naming the sizes) when a product overflows.
    pub fn need(&self, ctx: usize) -> Result<MemoryNeed> {
        let c = self.cfg;
        let overflow = || Error::Invalid(format!("the memory of a {ctx}-position context overflows: {c:?}"));
        let kv = kv_bytes(c, ctx, self.kv_type.dtype()).ok_or_else(overflow)?;
        let n = self.chunk.clamp(1, ctx.max(1));
        let prefill = step_bytes(c, ctx, n).ok_or_else(overflow)?;
        let decode = step_bytes(c, ctx, 1).ok_or_else(overflow)?;
        // The plans a session keeps: a full prefill chunk, a shorter one (a prompt's remainder) and the decode
        // step, each dense and, with compressed keys, sparse as well.
        let kinds = 1 + u64::from(has_sparse_cache(c, ctx));
        let scratch = prefill
            .checked_mul(2)
            .and_then(|p| p.checked_add(decode)?.checked_mul(kinds))
            .ok_or_else(overflow)?;
        let sessions = self.sessions as u64;
        Ok(MemoryNeed {
            weights: self.weights,
            kv: kv.checked_mul(sessions).ok_or_else(overflow)?,
            scratch: scratch.checked_mul(sessions).ok_or_else(overflow)?,
            ctx,
            sessions: self.sessions,
        })
    }

    /// The largest context of at most `up_to` positions whose need fits `bytes`, if any does.
    pub fn largest_ctx_within(&self, bytes: u64, up_to: usize) -> Option<usize> {
        let fits = |ctx: usize| self.need(ctx).is_ok_and(|n| n.total() <= bytes);
        if !fits(1) {
            return None;
        }
        let (mut lo, mut hi) = (1, up_to.max(1)); // fits(lo); the answer is in lo..=hi
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        Some(lo)
    }
}

/// The memory a model may use: `--max-memory` when given, else what the adapter reports, else no limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Budget {
    pub bytes: Option<u64>,
    /// Where the figure comes from, for messages.
    pub by: String,
    /// Whether it is `--max-memory`'s (else the adapter's report).
    from_flag: bool,
}

impl Budget {
    pub fn new(max_memory: Option<u64>, report: Option<&MemoryReport>) -> Budget {
        match (max_memory, report.and_then(MemoryReport::limit)) {
            (Some(b), _) => Budget {
                bytes: Some(b),
                by: "--max-memory".into(),
                from_flag: true,
            },
            (None, Some((b, by))) => Budget {
                bytes: Some(b),
                by,
                from_flag: false,
            },
            (None, None) => Budget {
                bytes: None,
                by: "no limit: the adapter reports no memory size and --max-memory is not set".into(),
                from_flag: false,
            },
        }
    }

    /// The budget left once `bytes` are taken by `what` (nothing when `bytes` is 0).
    pub fn less(self, bytes: u64, what: &str) -> Budget {
        match self.bytes {
            Some(b) if bytes > 0 => Budget {
                bytes: Some(b.saturating_sub(bytes)),
                by: format!("{} less the {} that {what} takes", self.by, Bytes(bytes)),
                ..self
            },
            _ => self,
        }
    }

    /// `Ok(need)` when the session of `ctx` positions fits, else the error saying how much is needed, how much is
    /// allowed and which context would fit (checked before anything is allocated).
    pub fn check(&self, path: &Path, sizing: &Sizing<'_>, ctx: usize) -> Result<MemoryNeed> {
        let need = sizing.need(ctx)?;
        match self.bytes {
            Some(allowed) if need.total() > allowed => Err(Error::OverBudget {
                path: path.into(),
                need,
                allowed: Bytes(allowed),
                by: self.by.clone(),
                advice: self.advice(sizing, allowed, ctx),
            }),
            _ => Ok(need),
        }
    }

    /// What lowers the need under `allowed`: a smaller `--ctx` when one fits, else nothing but more memory.
    fn advice(&self, sizing: &Sizing<'_>, allowed: u64, ctx: usize) -> String {
        let more = match (self.from_flag, sizing.sessions) {
            (true, 1) => "raise --max-memory",
            (false, 1) => "set --max-memory if more is free",
            (true, _) => "run fewer sessions at once or raise --max-memory",
            (false, _) => "run fewer sessions at once or set --max-memory if more is free",
        };
        match sizing.largest_ctx_within(allowed, ctx) {
            Some(fit) => format!("lower --ctx (--ctx {fit} fits) or {more}"),
            None => {
                let least = sizing.need(1).map_or(0, |n| n.total());
                format!(
                    "even a context of 1 does not fit (it needs {}): {more}, or use a smaller or more quantized \
                     model",
                    Bytes(least)
                )
            }
        }
    }

    /// One line for `shaderlm info`: the need, the budget, and whether it fits.
    pub fn report(&self, sizing: &Sizing<'_>, ctx: usize) -> Result<String> {
        let need = sizing.need(ctx)?;
        Ok(match self.bytes {
            None => format!("{need}; budget: {}", self.by),
            Some(b) if need.total() <= b => format!("{need}; fits the {} allowed by {}", Bytes(b), self.by),
            Some(b) => format!(
                "{need}; does NOT fit the {} allowed by {}: {}",
                Bytes(b),
                self.by,
                self.advice(sizing, b, ctx)
            ),
        })
    }
}

/// Whether a session of `ctx` positions keeps InfLLM-v2 compressed keys (as `sparse::new_caches` decides).
fn has_sparse_cache(c: &LlamaConfig, ctx: usize) -> bool {
    c.sparse
        .is_some_and(|s| s.windows().1.count(ctx) > 0 && s.dense_len <= ctx)
}

/// Bytes of a session's KV cache: K and V per layer `[n_kv, ctx, head_dim]`, the compressed keys of sparse
/// attention, the RoPE divisor tables.
pub fn kv_bytes(c: &LlamaConfig, ctx: usize, dtype: DType) -> Option<u64> {
    let per_layer = dtype.bytes(c.n_kv_heads.checked_mul(ctx)?.checked_mul(c.head_dim)?);
    let mut total = per_layer.checked_mul(2)?.checked_mul(c.n_layers as u64)?;
    if has_sparse_cache(c, ctx) {
        let (fine, coarse) = c.sparse?.windows();
        let windows = (fine.count(ctx) + coarse.count(ctx)) as u64;
        let keys = windows * (c.n_kv_heads * c.head_dim * 4) as u64;
        total = total.checked_add(keys.checked_mul(c.n_layers as u64)?)?;
    }
    total.checked_add(2 * 4 * c.rope_dim as u64)
}

/// Upper bound of the buffers one planned step of `n` tokens allocates in a session of `ctx` positions: all of a
/// layer's intermediates (the plan's pool hands them on from layer to layer), the last token's norm, logits, top-k
/// and their read-back, uniform-array padding and the parameter blocks.
fn step_bytes(c: &LlamaConfig, ctx: usize, n: usize) -> Option<u64> {
    let (h, q, kv, d) = (c.hidden, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.head_dim);
    // Per token: residuals, norms, projections and post-norms (hidden); q, its norm, rope and the attention output
    // (q); k and v, their norms and rope (kv); the FFN's gate|up, activation and column gathers.
    // (Sizes the config check bounds are added plainly; the others checked.)
    let ffn = match &c.moe {
        Some(m) => m
            .experts
            .checked_mul(m.expert_size)?
            .checked_mul(3)?
            .checked_add(m.experts.checked_mul(4)?)?,
        None => 4 * c.ffn,
    };
    let mut per_token = (10 * h + 5 * q + 4 * kv).checked_add(ffn)?;
    if n <= MAX_TOKENS || !HEAD_DIMS.contains(&d) {
        // Split-KV attention's partial outputs and (max, sum) pairs.
        let splits = if c.sparse.is_some() {
            MAX_SPLITS
        } else {
            splits_for(ctx)
        };
        per_token += c.n_heads * splits * (d + 2);
    }
    if let (Some(s), true) = (&c.sparse, has_sparse_cache(c, ctx)) {
        // Block scores, the selected blocks, the normalizer's partial sums.
        let blocks = ctx.div_ceil(s.block_size).checked_add(s.selection().budget)?;
        let tiles = s.windows().1.count(ctx).div_ceil(64).max(1);
        let sparse = c
            .n_kv_heads
            .checked_mul(blocks)?
            .checked_add(c.n_heads.checked_mul(2 * tiles)?)?;
        per_token = per_token.checked_add(sparse)?;
    }
    let layer = (n as u64).checked_mul(per_token as u64)?.checked_mul(4)?;
    // The last token's rows, norm, logits (and their staging copy for the read-back), top-k ids and values.
    let tail = (n as u64)
        .checked_add(2 * h as u64 + 4 * c.vocab as u64)?
        .checked_mul(4)?;
    // A uniform-array tensor's buffer is padded to 64 KiB; a layer binds a few (the matmul inputs on CPU adapters).
    let uniforms = 8 * UNIFORM_ARRAY_BYTES;
    // One parameter block per dispatch: at most 32 per layer, at a 256-byte stride.
    let params = (c.n_layers as u64 + 1) * 32 * PARAMS_BYTES.max(256);
    layer.checked_add(tail)?.checked_add(uniforms + params)
}

/// Device bytes of a `[rows, cols]` matrix of `ty` as the engine stores it; `None` for types it cannot store (the
/// load then fails with its own error).
fn matrix_bytes(ty: GgmlType, rows: u64, cols: u64) -> Option<u64> {
    Some(match ty {
        GgmlType::F32 | GgmlType::BF16 => rows.checked_mul(cols)?.checked_mul(4)?,
        GgmlType::F16 => rows.checked_mul(cols.div_ceil(2).checked_mul(4)?)?,
        ty => {
            let format = Format::new(ty).ok()?;
            // Rows padded to whole tiles (a fused matrix is split in up to three, each padded), scale words
            // rounded up.
            let padded = rows
                .checked_next_multiple_of(TILE as u64)?
                .checked_add(2 * TILE as u64)?;
            let blocks = cols.div_ceil(QK as u64);
            let row = (blocks as f64 * format.device_bytes()).ceil() as u64 + 12;
            padded.checked_mul(row)?
        }
    })
}

/// Device bytes of a tensor of row-major `shape`: vectors as f32, anything else as `[rows, last dim]`.
fn tensor_bytes(ty: GgmlType, shape: &[usize]) -> Option<u64> {
    let cols = *shape.last()? as u64;
    let rows = shape[..shape.len() - 1]
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d as u64))?;
    if shape.len() == 1 {
        return cols.checked_mul(4);
    }
    matrix_bytes(ty, rows, cols)
}

/// Allocations are rounded up to their memory's alignment: a bound per buffer (a quantized weight has up to three).
const ALIGN_SLACK: u64 = 3 * 4096;

/// Device bytes of every tensor of a GGUF file (a type the engine cannot run counts as its file bytes).
pub fn gguf_weights(f: &GgufFile) -> u64 {
    f.tensors()
        .iter()
        .map(|t| tensor_bytes(t.ggml_type, &t.shape()).unwrap_or(t.n_bytes as u64) + ALIGN_SLACK)
        .fold(0, u64::saturating_add)
}

/// Device bytes of every tensor of a safetensors model: GPTQ / AWQ layers as the ggml blocks they are repacked
/// into (their zeros and scales folded in; `g_idx` as a u32 permutation).
pub fn safetensors_weights(st: &SafetensorsModel) -> u64 {
    let bits = st.quant().map(|q| q.scheme.bits);
    let size = |name: &str| -> u64 {
        let Some((dtype, shape, bytes, _)) = st.get(name) else {
            return 0;
        };
        let file = bytes.len() as u64;
        let ty = match dtype {
            StDtype::F32 => GgmlType::F32,
            StDtype::F16 => GgmlType::F16,
            StDtype::BF16 => GgmlType::BF16,
            StDtype::I32 => match (name.rsplit('.').next(), bits, shape) {
                (Some("qweight"), Some(b @ (4 | 8)), &[packed, n]) => {
                    let ty = if b == 4 { GgmlType::Q4_1 } else { GgmlType::Q8_0 };
                    let k = packed as u64 * (32 / b as u64);
                    return matrix_bytes(ty, n as u64, k).unwrap_or(file) + ALIGN_SLACK;
                }
                (Some("qzeros" | "scales"), ..) => return 0,
                _ => return file,
            },
            StDtype::I64 | StDtype::Bool => return file,
        };
        tensor_bytes(ty, shape).unwrap_or(file) + ALIGN_SLACK
    };
    st.names().map(size).fold(0, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::SparseConfig;

    /// Llama-3-8B's published shape.
    fn llama_8b() -> LlamaConfig {
        use crate::model::config::{Arch, Glu, Mup, RopeScaling};
        LlamaConfig {
            arch: Arch::Llama,
            n_layers: 32,
            hidden: 4096,
            ffn: 14336,
            n_heads: 32,
            n_kv_heads: 8,
            head_dim: 128,
            vocab: 128256,
            rms_eps: 1e-5,
            rope_theta: 500000.0,
            rope_style: crate::ops::rope::RopeStyle::RotateHalf,
            rope_dim: 128,
            rope_scaling: RopeScaling::None,
            context: 8192,
            tie_embeddings: false,
            qkv_bias: false,
            qk_norm: false,
            mup: Mup::default(),
            attn_scale: 128f32.powf(-0.5),
            ffn_act: Glu::Silu,
            post_norms: false,
            sliding: None,
            sparse: None,
            moe: None,
        }
    }

    #[test]
    fn sizes_parse_in_binary_units() {
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("512mib"), Ok(512 << 20));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("2TB"), Ok(2 << 40));
        assert_eq!(parse_size(" 7 b "), Ok(7));
        for bad in [
            "",
            "G",
            "-1",
            "0",
            "0.0M",
            "4X",
            "1e9",
            "nan",
            "18446744073709551616",
            "16777216T",
            "1.2.3G",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn bytes_print_in_binary_units() {
        assert_eq!(Bytes(512).to_string(), "512 B");
        assert_eq!(Bytes(1536).to_string(), "1.5 KiB");
        assert_eq!(Bytes(4 << 30).to_string(), "4.0 GiB");
        assert_eq!(Bytes(u64::MAX).to_string(), "16.0 EiB");
    }

    #[test]
    fn kv_cache_of_llama_8b_is_the_published_figure() {
        // 32 layers x K and V x 8 heads x 128 dims x 4 bytes = 256 KiB per position in f32.
        let c = llama_8b();
        let kv = kv_bytes(&c, 8192, DType::F32).unwrap();
        assert_eq!(kv - 8 * c.rope_dim as u64, 8192 * 256 * 1024);
    }

    #[test]
    fn sparse_caches_add_their_compressed_keys() {
        let mut c = llama_8b();
        let dense = kv_bytes(&c, 16384, DType::F32).unwrap();
        c.sparse = Some(SparseConfig::MINICPM4);
        let sparse = kv_bytes(&c, 16384, DType::F32).unwrap();
        // C1: (16384 - 32) / 16 + 1 windows, C2: (16384 - 128) / 64 + 1, each 8 heads x 128 dims of f32 per layer.
        let windows = (16384 - 32) / 16 + 1 + (16384 - 128) / 64 + 1;
        assert_eq!(sparse - dense, 32 * windows * 8 * 128 * 4);
        // Below dense_len a session keeps none.
        assert_eq!(kv_bytes(&c, 4096, DType::F32), kv_bytes(&llama_8b(), 4096, DType::F32));
    }

    #[test]
    fn crafted_head_counts_are_refused_by_the_budget_not_allocated() {
        // 4096 KV heads of 1024 dims, as the fuzzer's 70 MB file asked: 32 GiB per layer at 1024 positions.
        let mut c = llama_8b();
        c.n_layers = 1;
        (c.n_heads, c.n_kv_heads, c.head_dim) = (4096, 4096, 1024);
        let sizing = Sizing {
            cfg: &c,
            weights: 70 << 20,
            chunk: 128,
            kv_type: KvType::F32,
            sessions: 1,
        };
        let budget = Budget::new(Some(16 << 30), None);
        let e = budget
            .check(Path::new("crafted.gguf"), &sizing, 1024)
            .unwrap_err()
            .to_string();
        for part in ["crafted.gguf", "KV cache 32.0 GiB", "--max-memory", "16.0 GiB", "--ctx"] {
            assert!(e.contains(part), "{part:?} missing: {e}");
        }
    }

    #[test]
    fn the_advised_context_is_the_largest_that_fits() {
        let c = llama_8b();
        let sizing = Sizing {
            cfg: &c,
            weights: 4 << 30,
            chunk: 128,
            kv_type: KvType::F32,
            sessions: 1,
        };
        let allowed = 5 << 30;
        let fit = sizing.largest_ctx_within(allowed, 8192).unwrap();
        assert!(sizing.need(fit).unwrap().total() <= allowed);
        assert!(sizing.need(fit + 1).unwrap().total() > allowed);
        // About 1 GiB left for 256 KiB per position, less the scratch.
        assert!((3500..4096).contains(&fit), "{fit}");
        let budget = Budget::new(Some(allowed), None);
        let e = budget
            .check(Path::new("m.gguf"), &sizing, 8192)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("--ctx {fit} fits")), "{e}");
        assert!(budget.check(Path::new("m.gguf"), &sizing, fit).is_ok());
        // Weights alone over the budget: no context helps.
        let heavy = Sizing {
            weights: 6 << 30,
            ..sizing
        };
        assert_eq!(heavy.largest_ctx_within(allowed, 8192), None);
        let e = budget.check(Path::new("m.gguf"), &heavy, 8192).unwrap_err().to_string();
        assert!(e.contains("even a context of 1 does not fit"), "{e}");
    }

    #[test]
    fn the_budget_is_the_flag_else_the_adapter_else_none() {
        let report = MemoryReport {
            adapter: "gpu".into(),
            device_heap: Some(80 << 30),
            host_available: None,
            max_buffer: 1 << 31,
        };
        assert_eq!(Budget::new(Some(1 << 30), Some(&report)).bytes, Some(1 << 30));
        assert_eq!(Budget::new(None, Some(&report)).bytes, Some(80 << 30));
        assert_eq!(Budget::new(None, None).bytes, None);
        let none = MemoryReport {
            device_heap: None,
            ..report
        };
        let b = Budget::new(None, Some(&none));
        assert_eq!(b.bytes, None);
        assert!(b.by.contains("no limit"));
    }

    #[test]
    fn weights_count_as_the_device_stores_them() {
        // Q4_0 keeps its 18 bytes per 32 weights; rows are padded to tiles, plus slack for splits and scale words.
        let q4 = matrix_bytes(GgmlType::Q4_0, 4096, 4096).unwrap();
        let exact = 4096 * 4096 / 32 * 18;
        assert!(q4 >= exact && q4 < exact + exact / 32, "{q4} vs {exact}");
        assert_eq!(matrix_bytes(GgmlType::F16, 3, 5), Some(3 * 3 * 4));
        assert_eq!(matrix_bytes(GgmlType::BF16, 3, 5), Some(3 * 5 * 4));
        assert_eq!(tensor_bytes(GgmlType::F16, &[7]), Some(28), "vectors are f32");
        assert_eq!(tensor_bytes(GgmlType::F32, &[2, 3, 4]), Some(96));
        assert_eq!(tensor_bytes(GgmlType::F32, &[]), None);
        assert_eq!(
            matrix_bytes(GgmlType::Q4_0, u64::MAX, 4096),
            None,
            "overflow is no size"
        );
    }

    #[test]
    fn a_huge_context_overflows_into_an_error_not_a_wrap() {
        let mut c = llama_8b();
        (c.n_layers, c.n_kv_heads, c.head_dim) = (4096, 4096, 1024);
        let sizing = Sizing {
            cfg: &c,
            weights: 0,
            chunk: usize::MAX,
            kv_type: KvType::F32,
            sessions: 1,
        };
        assert!(sizing.need(usize::MAX / 2).is_err());
    }
}
