//! Subcommands and the device options they share.

mod bench;
mod bench_batch;
mod bench_profile;
mod bench_spec;
mod chat;
mod common;
mod devices;
mod eagle_fit;
mod frspec;
mod generate;
mod info;
mod quantize;
mod serve;
mod spec;

use clap::{Args, Parser, Subcommand};
use shaderlm::gpu::GpuOptions;

#[derive(Parser, Debug)]
#[command(
    name = "shaderlm",
    version,
    about = "Portable LLM inference on any GPU through WGSL compute shaders"
)]
pub struct Cli {
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Adapter selection, shared by every subcommand.
#[derive(Args, Debug, Clone)]
pub struct DeviceArgs {
    /// Graphics API: vulkan, metal, dx12 or gl.
    #[arg(long, global = true, env = "WGPU_BACKEND")]
    pub backend: Option<String>,
    /// Case-insensitive substring of the adapter name.
    #[arg(long, global = true, env = "WGPU_ADAPTER_NAME")]
    pub adapter: Option<String>,
    /// Worker threads of a software (lavapipe/llvmpipe) adapter; 0 runs inline.
    #[arg(long, global = true, env = "LP_NUM_THREADS")]
    pub lp_threads: Option<u32>,
    /// Keep naga's loop bounding in every shader (a counter per loop iteration; dropped by default, as the
    /// engine's loops all end): for comparisons.
    #[arg(long, global = true)]
    pub loop_bounding: bool,
}

impl DeviceArgs {
    pub fn options(&self) -> GpuOptions {
        if let Some(n) = self.lp_threads {
            // Mesa reads this when the instance is created; we are still single-threaded here.
            std::env::set_var("LP_NUM_THREADS", n.to_string());
        }
        GpuOptions {
            backend: self.backend.clone(),
            adapter: self.adapter.clone(),
            loop_bounding: self.loop_bounding,
            ..Default::default()
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Chat with a model (the default model when no --model is given).
    Chat(chat::ChatArgs),
    /// Generate one completion from a prompt, messages or token ids.
    Generate(generate::GenerateArgs),
    /// Prompt-processing and generation throughput, like llama-bench.
    Bench(bench::BenchArgs),
    /// Describe a model file: architecture, sizes, quantization, tokenizer, metadata.
    Info(info::InfoArgs),
    /// List every adapter with its features and key limits; `*` marks the one shaderlm would use.
    Devices,
    /// Quantize a model to a Q4_0 / Q8_0 GGUF file or a 4-bit GPTQ Hugging Face directory, reporting the error.
    Quantize(quantize::QuantizeArgs),
    /// Rank a model's tokens by frequency over a text, for a draft head restricted with --frspec-vocab (FR-Spec).
    Frspec(frspec::FrspecArgs),
    /// Fit a linear EAGLE-1 head to a model's hidden states over a text (ridge regression), for --eagle.
    EagleFit(eagle_fit::EagleFitArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (chat and text completions, streaming, sessions).
    Serve(serve::ServeArgs),
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    // RUST_LOG picks what is logged (e.g. `shaderlm=debug`: each pipeline's creation time); the server also logs its
    // requests by default.
    let default = match cli.command {
        Command::Serve(_) => "warn,shaderlm=info",
        _ => "warn",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default)).init();
    match &cli.command {
        Command::Chat(a) => chat::run(a, &cli.device),
        Command::Generate(a) => generate::run(a, &cli.device),
        Command::Bench(a) => bench::run(a, &cli.device),
        Command::Info(a) => info::run(a, &cli.device),
        Command::Devices => devices::run(&cli.device),
        Command::Quantize(a) => quantize::run(a, &cli.device),
        Command::Frspec(a) => frspec::run(a),
        Command::EagleFit(a) => eagle_fit::run(a, &cli.device),
        Command::Serve(a) => serve::run(a, &cli.device),
    }
}
