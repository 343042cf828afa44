//! `shaderlm bench`: prompt processing (ppN) and generation (tgN) throughput like llama-bench, mean ± stdev over
//! repetitions, as Markdown, JSON or CSV, naming the adapter, backend and model; `--profile` adds a per-op table.

use super::common::ModelArgs;
use super::DeviceArgs;
use clap::{Args, ValueEnum};
use shaderlm::generate::Generator;
use shaderlm::model::StepOutputs;
use std::collections::BTreeMap;
use std::time::Instant;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Output {
    Md,
    Json,
    Csv,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt lengths to process (comma-separated); 0 skips.
    #[arg(short = 'p', long = "n-prompt", value_delimiter = ',', default_value = "512")]
    pub prompt: Vec<usize>,
    /// Tokens to generate (comma-separated); 0 skips.
    #[arg(short = 'n', long = "n-gen", value_delimiter = ',', default_value = "128")]
    pub gen: Vec<usize>,
    /// Repetitions of each test.
    #[arg(short = 'r', long, default_value_t = 5)]
    pub repetitions: usize,
    #[arg(short = 'o', long, value_enum, default_value = "md")]
    pub output: Output,
    /// Also print a per-op profile of one decode step.
    #[arg(long)]
    pub profile: bool,
    /// Benchmark random weights at a published model's shape instead of a model file (smollm2-135m,
    /// qwen2.5-0.5b, llama-1b, llama-8b): speed only, no download.
    #[arg(long, value_name = "SHAPE")]
    pub synthetic: Option<String>,
    /// Weight type of the synthetic model's matrices (F16, Q4_0, Q4_1, Q8_0, ...).
    #[arg(long, value_name = "TYPE", default_value = "Q4_0", requires = "synthetic")]
    pub synthetic_type: String,
}

/// A synthetic model file in the temporary directory, removed when dropped.
struct TempModel(std::path::PathBuf);

impl Drop for TempModel {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn synthetic_model(name: &str, ty: &str) -> anyhow::Result<TempModel> {
    use shaderlm::model::synthetic;
    let shape = synthetic::shape(name)?;
    let ty = (0..64)
        .filter_map(shaderlm::quant::GgmlType::from_id)
        .find(|t| t.name().eq_ignore_ascii_case(ty))
        .ok_or_else(|| anyhow::anyhow!("unknown weight type {ty:?}"))?;
    let path = std::env::temp_dir().join(format!("shaderlm-synthetic-{}-{}.gguf", name, std::process::id()));
    let file = TempModel(path);
    eprintln!("writing a random {ty} model of {name}'s shape to {}", file.0.display());
    synthetic::write_gguf(&file.0, &shape, ty, 1)?;
    Ok(file)
}

struct Row {
    test: String,
    tokens: usize,
    samples: Vec<f64>, // tok/s
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let m = v.iter().sum::<f64>() / v.len().max(1) as f64;
    let var = v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len().max(2) - 1) as f64;
    (m, var.sqrt())
}

pub fn run(args: &BenchArgs, device: &DeviceArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.repetitions > 0, "-r must be at least 1");
    let synthetic = match &args.synthetic {
        Some(name) => Some(synthetic_model(name, &args.synthetic_type)?),
        None => None,
    };
    let mut model_args = args.model.clone();
    if let Some(file) = &synthetic {
        model_args.model = Some(file.0.clone());
    }
    let (gpu, loaded) = model_args.load(device)?;
    let model = &loaded.model;
    let outputs = StepOutputs {
        argmax: true,
        ..Default::default()
    };
    let mut gen = Generator::new(&gpu, model, loaded.ctx, outputs)?;
    gen.chunk = args.model.chunk;
    let vocab = model.cfg.vocab as u32;
    let ids = |n: usize| -> Vec<u32> { (0..n as u32).map(|i| (i * 7919 + 13) % vocab).collect() };
    let mut rows = Vec::new();
    for &p in args.prompt.iter().filter(|&&p| p > 0) {
        anyhow::ensure!(
            p <= gen.max_ctx(),
            "-p {p} is over the context of {} (--ctx)",
            gen.max_ctx()
        );
        let prompt = ids(p);
        gen.truncate(0);
        gen.feed(&prompt)?; // warm-up: builds and compiles the plans
        let mut samples = Vec::new();
        for _ in 0..args.repetitions {
            gen.truncate(0);
            let t = Instant::now();
            gen.feed(&prompt)?;
            samples.push(p as f64 / t.elapsed().as_secs_f64());
        }
        rows.push(Row {
            test: format!("pp{p}"),
            tokens: p,
            samples,
        });
    }
    for &n in args.gen.iter().filter(|&&n| n > 0) {
        anyhow::ensure!(
            n <= gen.max_ctx(),
            "-n {n} is over the context of {} (--ctx)",
            gen.max_ctx()
        );
        gen.truncate(0);
        gen.feed(&[1])?; // warm-up
        let mut samples = Vec::new();
        for _ in 0..args.repetitions {
            gen.truncate(0);
            let mut token = 1;
            let t = Instant::now();
            for _ in 0..n {
                gen.feed(&[token])?;
                token = gen.result.argmax.unwrap_or(1);
            }
            samples.push(n as f64 / t.elapsed().as_secs_f64());
        }
        rows.push(Row {
            test: format!("tg{n}"),
            tokens: n,
            samples,
        });
    }
    let dispatches = gen.decode_dispatches()?;
    let weight_bytes = model.weight_bytes_per_token();
    let info = &gpu.info;
    let name = loaded
        .path
        .file_name()
        .map_or_else(|| loaded.path.display().to_string(), |f| f.to_string_lossy().into());
    match args.output {
        Output::Md => {
            println!("adapter: {}", gpu.describe());
            println!(
                "model: {name} ({}), context {}, prefill chunk {}",
                loaded.format,
                gen.max_ctx(),
                gen.chunk
            );
            println!();
            println!("| model | backend | test | t/s |");
            println!("|---|---|---|---:|");
            for r in &rows {
                let (m, sd) = mean_sd(&r.samples);
                println!("| {name} | {:?} | {} | {m:.2} ± {sd:.2} |", info.backend, r.test);
            }
            println!();
            println!(
                "decode step: {dispatches} dispatches, {:.1} MiB of weights read per token",
                weight_bytes as f64 / (1 << 20) as f64
            );
            if let Some(r) = rows.iter().find(|r| r.test.starts_with("tg")) {
                let (m, _) = mean_sd(&r.samples);
                println!(
                    "effective weight bandwidth while decoding: {:.2} GB/s",
                    m * weight_bytes as f64 / 1e9
                );
            }
        }
        Output::Json => {
            let list: Vec<_> = rows
                .iter()
                .map(|r| {
                    let (m, sd) = mean_sd(&r.samples);
                    serde_json::json!({
                        "model": name, "format": loaded.format, "adapter": info.name, "backend": format!("{:?}", info.backend),
                        "test": r.test, "tokens": r.tokens, "avg_ts": m, "stddev_ts": sd, "samples_ts": r.samples,
                        "decode_dispatches": dispatches, "weight_bytes_per_token": weight_bytes,
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&list)?);
        }
        Output::Csv => {
            println!(
                "model,format,adapter,backend,test,tokens,avg_ts,stddev_ts,decode_dispatches,weight_bytes_per_token"
            );
            for r in &rows {
                let (m, sd) = mean_sd(&r.samples);
                println!(
                    "{name},{},\"{}\",{:?},{},{},{m:.3},{sd:.3},{dispatches},{weight_bytes}",
                    loaded.format, info.name, info.backend, r.test, r.tokens
                );
            }
        }
    }
    if args.profile {
        gen.truncate(0);
        gen.feed(&ids(64))?;
        let prof = gen.profile_decode()?;
        let mut by_op: BTreeMap<String, (usize, usize, f64, u64)> = BTreeMap::new();
        for p in &prof {
            let op = p.label.rsplit('.').next().unwrap_or(&p.label).to_string();
            let e = by_op.entry(op).or_default();
            e.0 += 1;
            e.1 += p.dispatches;
            e.2 += p.micros;
            e.3 += p.cost.bytes_read + p.cost.bytes_written;
        }
        let total: f64 = prof.iter().map(|p| p.micros).sum();
        let clock = if prof.first().is_some_and(|p| p.timed_on_gpu) {
            "GPU timestamps"
        } else {
            "wall clock per node"
        };
        println!();
        println!(
            "decode step at position 64, {clock}: {:.2} ms in {} nodes",
            total / 1e3,
            prof.len()
        );
        println!("| op | nodes | dispatches | ms | share | GB/s |");
        println!("|---|---:|---:|---:|---:|---:|");
        let mut ops: Vec<_> = by_op.into_iter().collect();
        ops.sort_by(|a, b| b.1 .2.total_cmp(&a.1 .2));
        for (op, (nodes, d, us, bytes)) in ops {
            println!(
                "| {op} | {nodes} | {d} | {:.3} | {:.1}% | {:.2} |",
                us / 1e3,
                100.0 * us / total.max(1e-9),
                bytes as f64 / (us * 1e3).max(1e-9)
            );
        }
    }
    Ok(())
}
