//! `shaderlm bench`: prompt processing (ppN) and generation (tgN) throughput like llama-bench, mean ± stdev over
//! repetitions, as Markdown, JSON or CSV, naming the adapter, backend and model; `--profile` adds a per-op table.

use super::bench_spec::SpecPrompts;
use super::common::ModelArgs;
use super::spec::SpecArgs;
use super::DeviceArgs;
use clap::{Args, ValueEnum};
use shaderlm::generate::Generator;
use shaderlm::model::StepOutputs;
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
    /// Tokens already in the cache before each test (comma-separated), like llama-bench's depth: the context is
    /// filled once (untimed) and each repetition starts from it. The profile runs at the last depth (or 64).
    #[arg(short = 'd', long = "n-depth", value_delimiter = ',', default_value = "0")]
    pub depth: Vec<usize>,
    /// Sessions decoding together (comma-separated): each B > 1 adds `tgN x B`, the tokens per second of B
    /// sessions decoding N tokens each in batched steps (as `serve` runs them), all sessions counted.
    #[arg(short = 'b', long = "batch", value_delimiter = ',', default_value = "1")]
    pub batch: Vec<usize>,
    /// Repetitions of each test.
    #[arg(short = 'r', long, default_value_t = 5)]
    pub repetitions: usize,
    #[arg(short = 'o', long, value_enum, default_value = "md")]
    pub output: Output,
    /// Instead of timing: run a prefill step (of the first prompt length, at most one chunk) and a decode step
    /// node by node against the ops' CPU references, naming the first node past its bound.
    #[arg(long)]
    pub check: bool,
    /// Also print a per-op profile of one decode step.
    #[arg(long)]
    pub profile: bool,
    /// Profile a speculative verification step of this many rows instead (the plan `--spec` runs after N - 1
    /// drafts).
    #[arg(long, value_name = "N", default_value_t = 1, requires = "profile", value_parser = clap::value_parser!(u16).range(1..=8))]
    pub profile_rows: u16,
    /// Benchmark random weights at a published model's shape instead of a model file (smollm2-135m,
    /// qwen2.5-0.5b, llama-1b, llama-8b): speed only, no download.
    #[arg(long, value_name = "SHAPE")]
    pub synthetic: Option<String>,
    /// Weight type of the synthetic model's matrices (F16, Q4_0, Q4_1, Q8_0, ...).
    #[arg(long, value_name = "TYPE", default_value = "Q4_0", requires = "synthetic")]
    pub synthetic_type: String,
    /// With --spec: plain against speculative greedy decoding of built-in prompts (up to the first -n tokens each)
    /// in one run, instead of pp/tg.
    #[command(flatten)]
    pub spec: SpecArgs,
    /// The prompts of --spec [default: grounded for lookup, code for a draft model].
    #[arg(long, value_enum)]
    pub spec_prompts: Option<SpecPrompts>,
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

pub(super) struct Row {
    pub(super) test: String,
    pub(super) tokens: usize,
    pub(super) samples: Vec<f64>, // tok/s
}

/// Most sessions of `-b` (as `serve --parallel`).
const MAX_BATCH: usize = 1 << 10;

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
    args.spec.kind()?;
    // The plain session, plus the largest batch's sessions.
    let batch = args.batch.iter().copied().filter(|&b| b > 1).max().unwrap_or(0);
    anyhow::ensure!(batch <= MAX_BATCH, "-b {batch}: at most {MAX_BATCH} sessions");
    let (gpu, loaded) = model_args.load_sessions(device, 1 + batch)?;
    let draft = args.spec.load_draft(&gpu, &model_args, &loaded)?;
    let outputs = StepOutputs {
        argmax: true,
        hidden: SpecArgs::needs_hidden(draft.as_ref()),
        aux_hidden: SpecArgs::needs_aux_hidden(draft.as_ref()),
        ..Default::default()
    };
    let mut gen = Generator::new(&gpu, &loaded.model, loaded.ctx, outputs)?;
    gen.chunk = args.model.chunk;
    let vocab = loaded.model.cfg.vocab as u32;
    let ids = |n: usize| -> Vec<u32> { (0..n as u32).map(|i| (i * 7919 + 13) % vocab).collect() };
    if args.check {
        let p = args.prompt.iter().copied().find(|&p| p > 0).unwrap_or(1);
        return super::common::check_steps(&mut gen, &ids(p));
    }
    if args.spec.kind()?.is_some() {
        let n = args.gen.iter().copied().find(|&n| n > 0).unwrap_or(128);
        let (reps, set) = (args.repetitions, args.spec_prompts);
        return super::bench_spec::run(&mut gen, &loaded, &args.spec, draft.as_ref(), set, n, reps);
    }
    let mut rows = Vec::new();
    for &d in &args.depth {
        let filled = Depth::fill(&mut gen, &ids(d))?;
        for &p in args.prompt.iter().filter(|&&p| p > 0) {
            rows.push(prompt_processing(&mut gen, &filled, &ids(p), args.repetitions)?);
        }
        for &n in args.gen.iter().filter(|&&n| n > 0) {
            rows.push(generation(&mut gen, &filled, n, args.repetitions)?);
            for &b in args.batch.iter().filter(|&&b| b > 1) {
                let (model, ctx) = (&loaded.model, gen.max_ctx());
                let reps = args.repetitions;
                rows.push(super::bench_batch::generation(&gpu, model, ctx, &ids(d), b, n, reps)?);
            }
        }
    }
    let report = Report {
        name: loaded
            .path
            .file_name()
            .map_or_else(|| loaded.path.display().to_string(), |f| f.to_string_lossy().into()),
        format: &loaded.format,
        adapter: &gpu.info.name,
        backend: format!("{:?}", gpu.info.backend),
        dispatches: gen.decode_dispatches()?,
        weight_bytes: loaded.model.weight_bytes_per_token(),
        rows,
    };
    match args.output {
        Output::Md => {
            println!("adapter: {}", gpu.describe());
            println!(
                "model: {} ({}), context {}, prefill chunk {}",
                report.name,
                loaded.format,
                gen.max_ctx(),
                gen.chunk
            );
            report.print_md();
        }
        Output::Json => report.print_json()?,
        Output::Csv => report.print_csv(),
    }
    if args.profile {
        let at = args.depth.last().copied().filter(|&d| d > 0).unwrap_or(64);
        gen.truncate(0);
        gen.feed(&ids(at))?;
        super::bench_profile::print(&gpu, &mut gen, usize::from(args.profile_rows))?;
    }
    Ok(())
}

/// The tokens a test starts after (`-d`), filled into the cache once.
struct Depth(usize);

impl Depth {
    fn fill(gen: &mut Generator<'_>, ids: &[u32]) -> anyhow::Result<Depth> {
        anyhow::ensure!(
            ids.len() < gen.max_ctx(),
            "-d {} leaves no room in the context of {} (--ctx)",
            ids.len(),
            gen.max_ctx()
        );
        gen.truncate(0);
        if !ids.is_empty() {
            gen.feed(ids)?;
        }
        Ok(Depth(ids.len()))
    }

    /// The test name with llama-bench's depth suffix.
    fn name(&self, test: String) -> String {
        match self.0 {
            0 => test,
            d => format!("{test} @ d{d}"),
        }
    }

    fn check_room(&self, gen: &Generator<'_>, flag: &str, n: usize) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.0 + n <= gen.max_ctx(),
            "{flag} {n} after -d {} is over the context of {} (--ctx)",
            self.0,
            gen.max_ctx()
        );
        Ok(())
    }
}

/// ppN: prefill `prompt` after the depth's tokens, after one warm-up run that builds and compiles the plans.
fn prompt_processing(
    gen: &mut Generator<'_>,
    depth: &Depth,
    prompt: &[u32],
    repetitions: usize,
) -> anyhow::Result<Row> {
    let p = prompt.len();
    depth.check_room(gen, "-p", p)?;
    gen.truncate(depth.0);
    gen.feed(prompt)?;
    let mut samples = Vec::new();
    for _ in 0..repetitions {
        gen.truncate(depth.0);
        let t = Instant::now();
        gen.feed(prompt)?;
        samples.push(p as f64 / t.elapsed().as_secs_f64());
    }
    Ok(Row {
        test: depth.name(format!("pp{p}")),
        tokens: p,
        samples,
    })
}

/// tgN: decode `n` greedy tokens one step each after the depth's tokens, after one warm-up step.
fn generation(gen: &mut Generator<'_>, depth: &Depth, n: usize, repetitions: usize) -> anyhow::Result<Row> {
    depth.check_room(gen, "-n", n)?;
    gen.truncate(depth.0);
    gen.feed(&[1])?;
    let mut samples = Vec::new();
    for _ in 0..repetitions {
        gen.truncate(depth.0);
        let mut token = 1;
        let t = Instant::now();
        for _ in 0..n {
            gen.feed(&[token])?;
            token = gen.result.argmax.unwrap_or(1);
        }
        samples.push(n as f64 / t.elapsed().as_secs_f64());
    }
    Ok(Row {
        test: depth.name(format!("tg{n}")),
        tokens: n,
        samples,
    })
}

/// The measured rows and what they were measured on.
struct Report<'a> {
    name: String,
    format: &'a str,
    adapter: &'a str,
    backend: String,
    /// Of one decode step.
    dispatches: usize,
    weight_bytes: u64,
    rows: Vec<Row>,
}

impl Report<'_> {
    fn print_md(&self) {
        println!();
        println!("| model | backend | test | t/s |");
        println!("|---|---|---|---:|");
        for r in &self.rows {
            let (m, sd) = mean_sd(&r.samples);
            println!("| {} | {} | {} | {m:.2} ± {sd:.2} |", self.name, self.backend, r.test);
        }
        println!();
        println!(
            "decode step: {} dispatches, {:.1} MiB of weights read per token",
            self.dispatches,
            self.weight_bytes as f64 / (1 << 20) as f64
        );
        if let Some(r) = self.rows.iter().find(|r| r.test.starts_with("tg")) {
            let (m, _) = mean_sd(&r.samples);
            println!(
                "effective weight bandwidth while decoding: {:.2} GB/s",
                m * self.weight_bytes as f64 / 1e9
            );
        }
    }

    fn print_json(&self) -> anyhow::Result<()> {
        let list: Vec<_> = self
            .rows
            .iter()
            .map(|r| {
                let (m, sd) = mean_sd(&r.samples);
                serde_json::json!({
                    "model": self.name, "format": self.format, "adapter": self.adapter, "backend": self.backend,
                    "test": r.test, "tokens": r.tokens, "avg_ts": m, "stddev_ts": sd, "samples_ts": r.samples,
                    "decode_dispatches": self.dispatches, "weight_bytes_per_token": self.weight_bytes,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
        Ok(())
    }

    fn print_csv(&self) {
        println!("model,format,adapter,backend,test,tokens,avg_ts,stddev_ts,decode_dispatches,weight_bytes_per_token");
        for r in &self.rows {
            let (m, sd) = mean_sd(&r.samples);
            println!(
                "{},{},\"{}\",{},{},{},{m:.3},{sd:.3},{},{}",
                self.name,
                self.format,
                self.adapter,
                self.backend,
                r.test,
                r.tokens,
                self.dispatches,
                self.weight_bytes
            );
        }
    }
}
