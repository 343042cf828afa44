//! Options shared by the model subcommands: which model, how much context and memory, sampling; loading with a
//! progress bar.

use super::DeviceArgs;
use anyhow::Context;
use clap::Args;
use shaderlm::gpu::{Caps, Gpu};
use shaderlm::model::load::LoadedModel;
use shaderlm::model::{AttentionMode, KvType, LoadOptions, SparseOverrides};
use shaderlm::sampling::SamplingParams;
use std::path::PathBuf;

/// Where `chat` and friends look when no `--model` is given.
pub const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A GGUF file or a Hugging Face model directory [default: models/SmolLM2-135M-Instruct.Q4_1.gguf].
    #[arg(long, short = 'm', env = "SHADERLM_MODEL")]
    pub model: Option<PathBuf>,
    /// KV-cache positions (at most the model's trained context).
    #[arg(long, default_value_t = shaderlm::model::options::DEFAULT_CTX)]
    pub ctx: usize,
    /// Tokens per prefill step.
    #[arg(long, default_value_t = shaderlm::model::options::DEFAULT_CHUNK)]
    pub chunk: usize,
    /// Most device memory the model may take: weights + KV cache (--ctx) + scratch, e.g. 4G, 512M or bytes
    /// [default: the adapter's memory where it reports one; for CPU adapters the host's available memory].
    #[arg(long, value_name = "SIZE", value_parser = shaderlm::model::budget::parse_size)]
    pub max_memory: Option<u64>,
    /// KV-cache element type, f32 or f16: f16 halves the cache's memory and the attention's reads (keys and values
    /// are rounded to f16 as they are cached; the attention's math stays f32) [default: per adapter, f32 only where
    /// f16 measured no faster: CPU adapters without subgroups, such as llvmpipe under GL].
    #[arg(long, value_name = "TYPE", value_parser = KvType::parse)]
    pub kv_type: Option<KvType>,
    #[command(flatten)]
    pub attention: AttentionArgs,
}

/// InfLLM-v2 sparse attention: MiniCPM4 models bring their own `sparse_config`; any other Llama-family model can use
/// it training-free with `--sparse-attention`. Unset values come from the model's config, else MiniCPM4's.
#[derive(Args, Debug, Clone, Default)]
pub struct AttentionArgs {
    /// Attend sparsely past --sparse-dense-len keys (InfLLM-v2 block selection), also on models not trained for it.
    #[arg(long, conflicts_with = "dense_attention")]
    pub sparse_attention: bool,
    /// Always attend densely, even on a model with a sparse_config.
    #[arg(long)]
    pub dense_attention: bool,
    /// Keys per selectable block [default: 64].
    #[arg(long, value_name = "N")]
    pub sparse_block_size: Option<usize>,
    /// Blocks chosen by score, besides the initial and local ones [default: 64].
    #[arg(long, value_name = "N")]
    pub sparse_topk: Option<usize>,
    /// Leading blocks always attended [default: 1].
    #[arg(long, value_name = "N")]
    pub sparse_init_blocks: Option<usize>,
    /// Recent keys always attended, a multiple of the block size [default: 2048].
    #[arg(long, value_name = "N")]
    pub sparse_window: Option<usize>,
    /// KV lengths below this attend densely [default: 8192].
    #[arg(long, value_name = "N")]
    pub sparse_dense_len: Option<usize>,
}

impl AttentionArgs {
    /// The attention these flags ask for; the model layer checks them against the model's own config.
    pub fn mode(&self) -> AttentionMode {
        let overrides = SparseOverrides {
            block_size: self.sparse_block_size,
            topk: self.sparse_topk,
            init_blocks: self.sparse_init_blocks,
            window_size: self.sparse_window,
            dense_len: self.sparse_dense_len,
        };
        if self.dense_attention {
            AttentionMode::Dense
        } else if self.sparse_attention {
            AttentionMode::Sparse(overrides)
        } else {
            AttentionMode::Model(overrides)
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temperature: f32,
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repetition_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Tokens the penalties look back over.
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub penalty_last_n: usize,
    /// Random seed (default: from the clock). The same seed, prompt and model give the same output.
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    pub fn params(&self) -> anyhow::Result<SamplingParams> {
        anyhow::ensure!(
            self.temperature.is_finite() && self.temperature >= 0.0,
            "--temp must be >= 0"
        );
        anyhow::ensure!((0.0..=1.0).contains(&self.top_p), "--top-p must be in [0, 1]");
        anyhow::ensure!((0.0..=1.0).contains(&self.min_p), "--min-p must be in [0, 1]");
        anyhow::ensure!(self.repetition_penalty > 0.0, "--repeat-penalty must be > 0");
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        Ok(SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            penalty_last_n: self.penalty_last_n,
            seed,
        })
    }
}

impl ModelArgs {
    pub fn path(&self) -> anyhow::Result<PathBuf> {
        match &self.model {
            Some(p) => Ok(p.clone()),
            None => {
                let p = PathBuf::from(DEFAULT_MODEL);
                anyhow::ensure!(
                    p.exists(),
                    "the default model is not at {DEFAULT_MODEL}: fetch it with `bash models/fetch.sh` \
                     (from the repository root), or pass --model PATH"
                );
                Ok(p)
            }
        }
    }

    /// How these flags open a model on an adapter with `caps` (`None`: no adapter to ask, an f32 cache by default).
    pub fn options(&self, caps: Option<&Caps>) -> LoadOptions {
        LoadOptions {
            ctx: self.ctx,
            attention: self.attention.mode(),
            kv_type: self
                .kv_type
                .unwrap_or_else(|| caps.map_or(KvType::F32, KvType::default_for)),
            chunk: self.chunk,
            max_memory: self.max_memory,
            sessions: 1,
            reserved: 0,
            layers: None,
        }
    }

    /// Open the device and load the model (within its memory budget), with a progress bar on stderr.
    pub fn load(&self, device: &DeviceArgs) -> anyhow::Result<(Gpu, LoadedModel)> {
        self.load_sessions(device, 1)
    }

    /// [`ModelArgs::load`] for `sessions` sessions holding a KV cache at once: the budget counts each one's.
    pub fn load_sessions(&self, device: &DeviceArgs, sessions: usize) -> anyhow::Result<(Gpu, LoadedModel)> {
        let path = self.path()?;
        let gpu = Gpu::new(&device.options())?;
        let bar = indicatif::ProgressBar::new(1);
        bar.set_style(
            indicatif::ProgressStyle::with_template("loading {msg} [{bar:30}] {pos}/{len} layers")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_message(path.display().to_string());
        let opts = LoadOptions {
            sessions,
            ..self.options(Some(&gpu.caps))
        };
        let loaded = LoadedModel::open(&gpu, &path, &opts, |i, n| {
            bar.set_length(n as u64);
            bar.set_position(i as u64);
        })
        .with_context(|| format!("loading {}", path.display()))?;
        bar.finish_and_clear();
        Ok((gpu, loaded))
    }
}

/// The check mode of `generate` and `bench`: a prefill step over the first `chunk` prompt tokens, then one decode
/// step, each run node by node against the ops' CPU references; prints a report per step and fails naming the
/// first node past its op's bound.
pub fn check_steps(gen: &mut shaderlm::generate::Generator<'_>, prompt: &[u32]) -> anyhow::Result<()> {
    let first = &prompt[..prompt.len().min(gen.chunk.max(1))];
    anyhow::ensure!(!first.is_empty(), "--check needs a prompt");
    let opts = shaderlm::graph::CheckOptions::default();
    let mut all_passed = true;
    for (what, ids) in [("prefill", first), ("decode", &first[..1])] {
        let pos = gen.tokens.len();
        let verdicts = gen.check_step(ids, &opts)?;
        let (text, passed) = shaderlm::graph::check::report(&verdicts);
        println!(
            "check: {what} step of {} tokens at position {pos}, {} nodes",
            ids.len(),
            verdicts.len()
        );
        println!("{text}");
        all_passed &= passed;
    }
    anyhow::ensure!(
        all_passed,
        "--check: a node is past its bound (see FIRST FAILURE above)"
    );
    Ok(())
}
