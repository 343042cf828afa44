//! `shaderlm info MODEL`: architecture, sizes, quantization, tokenizer, template and metadata, and whether the model
//! fits the memory budget with the given --ctx, --chunk and --max-memory (the adapter's memory is read without
//! creating a device).

use super::common::ModelArgs;
use super::DeviceArgs;
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct InfoArgs {
    /// A GGUF file or a Hugging Face model directory (else --model).
    #[arg(value_name = "MODEL")]
    pub path: Option<PathBuf>,
    #[command(flatten)]
    pub model: ModelArgs,
}

pub fn run(args: &InfoArgs, device: &DeviceArgs) -> anyhow::Result<()> {
    let path = match &args.path {
        Some(p) => p.clone(),
        None => args.model.path()?,
    };
    print!("{}", shaderlm::model::load::describe(&path)?);
    let gpu = shaderlm::gpu::Gpu::new(&device.options());
    let report = gpu.as_ref().map(|g| shaderlm::gpu::MemoryReport::of(&g.adapter));
    let opts = args.model.options(gpu.as_ref().ok().map(|g| &g.caps));
    let memory = shaderlm::model::load::describe_memory(&path, &opts, report.as_ref().ok());
    match (memory, report) {
        (Ok(line), Ok(_)) => println!("memory: {line}"),
        (Ok(line), Err(e)) => println!("memory: {line} (no adapter to ask: {e})"),
        (Err(e), _) => println!("memory: unknown: {e}"),
    }
    Ok(())
}
