//! `shaderlm quantize`: write a model as a Q4_0 / Q8_0 GGUF file or a 4-bit GPTQ Hugging Face directory, print the
//! RMSE each tensor picked up, and with `--eval` what the user loses in the model's predictions: the mean KL
//! divergence of next-token distributions and both perplexities over a text, run on the GPU.

use super::DeviceArgs;
use anyhow::{ensure, Context};
use clap::{Args, ValueEnum};
use shaderlm::generate::Generator;
use shaderlm::gpu::Gpu;
use shaderlm::model::StepOutputs;
use shaderlm::model::{LoadOptions, LoadedModel};
use shaderlm::quantize::{self as qm, Format, Method, Report};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum MethodArg {
    /// Round to nearest.
    Rtn,
    /// GPTQ: Hessian-based error compensation over a calibration text (runs the model on the CPU).
    Gptq,
}

#[derive(Args, Debug)]
pub struct QuantizeArgs {
    /// The model to quantize: a GGUF file or a Hugging Face directory.
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    /// Where to write: a GGUF file (q4_0, q8_0) or a directory (gptq4).
    #[arg(long, short = 'o')]
    pub out: PathBuf,
    /// q4_0 or q8_0 (GGUF; the output head stays Q8_0), or gptq4 (a Hugging Face GPTQ directory for AutoGPTQ,
    /// GPTQModel, transformers and shaderlm; embeddings, head and norms in f16).
    #[arg(long, short = 'f')]
    pub format: String,
    /// GPTQ inputs per scale: a multiple of 32, or -1 for one group per row [default: 128].
    #[arg(long, allow_negative_numbers = true)]
    pub group_size: Option<i64>,
    /// GPTQ: symmetric quantization (zero point fixed at 8) instead of asymmetric.
    #[arg(long)]
    pub sym: bool,
    #[arg(long, value_enum, default_value = "rtn")]
    pub method: MethodArg,
    /// Calibration text file for --method gptq [default: a built-in passage].
    #[arg(long, value_name = "FILE")]
    pub calib_text: Option<PathBuf>,
    /// Most calibration tokens.
    #[arg(long, default_value_t = 256)]
    pub calib_tokens: usize,
    /// GPTQ damping, a fraction of the Hessian's mean diagonal added to it. AutoGPTQ's 0.01 assumes 128 x 2048
    /// calibration tokens; a few hundred leave the Hessian rank-deficient, and more damping generalizes better
    /// (SmolLM2-135M, 4-bit g128: mean KL on unseen text 0.29 at 0.1, 0.32 at 0.01, 0.35 round-to-nearest).
    #[arg(long, default_value_t = 0.1)]
    pub damp: f64,
    /// Replace an existing output.
    #[arg(long)]
    pub force: bool,
    /// Compare the original and the quantized model on the GPU: mean KL divergence of the next-token
    /// distributions, perplexity of each, top-1 agreement.
    #[arg(long)]
    pub eval: bool,
    /// Text for --eval (implies it) [default: a built-in paragraph].
    #[arg(long, value_name = "FILE")]
    pub eval_text: Option<PathBuf>,
    /// Most tokens of the evaluation text.
    #[arg(long, default_value_t = 256)]
    pub eval_tokens: usize,
    /// List every tensor, vectors included (default: the matrices).
    #[arg(long)]
    pub all: bool,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// The default evaluation text: prose the model has not been calibrated on.
const EVAL_TEXT: &str = "The lighthouse keeper kept a logbook in which he recorded the weather, the ships that \
passed, and, in the margins, small observations that had nothing to do with either: the day the gulls arrived early, \
the evening the sea turned the colour of pewter, the morning his kettle refused to boil. When the lighthouse was \
automated, the logbooks were sent to the county archive, where a young historian found them twenty years later. She \
had come looking for shipping records. She stayed for the margins. Over the following winter she read every volume, \
and by spring she had begun to write a book about a man who had spent forty years watching the horizon and had \
noticed, in all that time, that nothing ever happened the same way twice.";

/// What the quantized model loses on a text.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Eval {
    /// Predicted positions (text tokens minus one).
    pub positions: usize,
    /// Mean and largest KL(original || quantized) of the next-token distributions, in nats.
    pub kl_mean: f64,
    pub kl_max: f64,
    pub ppl_original: f64,
    pub ppl_quantized: f64,
    /// Fraction of positions whose argmax agrees.
    pub top1_agreement: f64,
}

fn read_text(path: &Option<PathBuf>, default: &str) -> anyhow::Result<String> {
    match path {
        Some(p) => Ok(shaderlm::loader::read_text(p)?),
        None => Ok(default.to_string()),
    }
}

/// Log-softmax of `logits` (f64).
fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = logits.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln() + m;
    logits.iter().map(|&x| x as f64 - lse).collect()
}

/// Teacher-forced log-probabilities of the next token after each prefix of `ids` (all but the last token fed).
fn log_probs(gpu: &Gpu, path: &Path, ids: &[u32]) -> anyhow::Result<Vec<Vec<f64>>> {
    let loaded = LoadedModel::open(gpu, path, &LoadOptions::with_ctx(ids.len() + 1), |_, _| {})
        .with_context(|| format!("loading {}", path.display()))?;
    let outputs = StepOutputs {
        logits: true,
        ..Default::default()
    };
    let mut gen = Generator::new(gpu, &loaded.model, loaded.ctx, outputs)?;
    let mut out = Vec::with_capacity(ids.len());
    for &id in &ids[..ids.len() - 1] {
        gen.feed(&[id])?;
        out.push(log_softmax(&gen.result.logits));
    }
    Ok(out)
}

/// Run both models over `text` (tokenized by the original's tokenizer) on the GPU.
pub fn evaluate(
    device: &DeviceArgs,
    original: &Path,
    quantized: &Path,
    text: &str,
    max: usize,
) -> anyhow::Result<Eval> {
    let gpu = Gpu::new(&device.options())?;
    let tok = match shaderlm::quantize::source::Source::open(original)?.tokenizer() {
        Ok(t) => t,
        Err(e) => anyhow::bail!("--eval needs the model's tokenizer: {e}"),
    };
    let mut ids = tok.encode(text, true)?;
    ids.truncate(max.max(2));
    ensure!(ids.len() >= 2, "the evaluation text is shorter than 2 tokens");
    let p = log_probs(&gpu, original, &ids)?;
    let q = log_probs(&gpu, quantized, &ids)?;
    ensure!(
        p[0].len() == q[0].len(),
        "the quantized model has a vocabulary of {}, the original {}",
        q[0].len(),
        p[0].len()
    );
    let argmax = |v: &[f64]| v.iter().enumerate().fold(0, |b, (i, x)| if *x > v[b] { i } else { b });
    let (mut kl_sum, mut kl_max, mut nll_p, mut nll_q, mut agree) = (0f64, 0f64, 0f64, 0f64, 0usize);
    for (j, (lp, lq)) in p.iter().zip(&q).enumerate() {
        let kl: f64 = lp.iter().zip(lq).map(|(a, b)| a.exp() * (a - b)).sum::<f64>().max(0.0);
        kl_sum += kl;
        kl_max = kl_max.max(kl);
        let next = ids[j + 1] as usize;
        nll_p -= lp[next];
        nll_q -= lq[next];
        agree += usize::from(argmax(lp) == argmax(lq));
    }
    let n = p.len() as f64;
    Ok(Eval {
        positions: p.len(),
        kl_mean: kl_sum / n,
        kl_max,
        ppl_original: (nll_p / n).exp(),
        ppl_quantized: (nll_q / n).exp(),
        top1_agreement: agree as f64 / n,
    })
}

fn print_report(r: &Report, all: bool) {
    let rows: Vec<_> = r.tensors.iter().filter(|t| all || t.shape.len() == 2).collect();
    let width = rows.iter().map(|t| t.name.len()).max().unwrap_or(6).max(6);
    println!(
        "{:width$}  {:>12}  {:>6}  {:>10}  {:>7}",
        "tensor", "shape", "stored", "RMSE", "RMSE/RMS"
    );
    for t in &rows {
        let shape = t.shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x");
        println!(
            "{:width$}  {shape:>12}  {:>6}  {:>10.3e}  {:>7.2}%",
            t.name,
            t.stored,
            t.rmse,
            100.0 * t.rmse / t.rms.max(f64::MIN_POSITIVE)
        );
    }
    let skipped = r.tensors.len() - rows.len();
    if skipped > 0 {
        let mut kinds: Vec<&str> = r
            .tensors
            .iter()
            .filter(|t| t.shape.len() != 2)
            .map(|t| t.stored.as_str())
            .collect();
        kinds.dedup();
        println!("({skipped} vectors kept in {}; --all lists them)", kinds.join("/"));
    }
    let (rmse, rel) = r.total();
    let weights: usize = r.tensors.iter().filter(|t| t.shape.len() == 2).map(|t| t.numel()).sum();
    println!(
        "total over {} matrices ({:.1} M weights): RMSE {rmse:.3e}, {:.2}% of their RMS",
        r.tensors.iter().filter(|t| t.shape.len() == 2).count(),
        weights as f64 / 1e6,
        100.0 * rel
    );
    for n in &r.notes {
        println!("note: {n}");
    }
}

pub fn run(a: &QuantizeArgs, device: &DeviceArgs) -> anyhow::Result<()> {
    let format = Format::parse(&a.format, a.group_size.unwrap_or(128), a.sym)?;
    if !matches!(format, Format::Gptq4 { .. }) {
        ensure!(
            a.group_size.is_none() && !a.sym,
            "--group-size and --sym are GPTQ settings; {} has fixed 32-weight symmetric blocks",
            format.describe()
        );
    }
    if matches!(a.method, MethodArg::Rtn) {
        ensure!(a.calib_text.is_none(), "--calib-text is for --method gptq");
    }
    ensure!(
        a.damp.is_finite() && a.damp >= 0.0,
        "--damp must be a non-negative fraction"
    );
    let eval_text = if a.eval || a.eval_text.is_some() {
        Some(read_text(&a.eval_text, EVAL_TEXT)?)
    } else {
        None
    };
    let opts = qm::Options {
        format,
        method: match a.method {
            MethodArg::Rtn => Method::Rtn,
            MethodArg::Gptq => Method::Gptq,
        },
        calib_text: read_text(&a.calib_text, qm::CALIBRATION_TEXT)?,
        calib_tokens: a.calib_tokens,
        damp: a.damp,
        force: a.force,
    };
    let t0 = Instant::now();
    let report = qm::quantize_model(&a.model, &a.out, &opts, &mut |line| eprintln!("{line}"))
        .with_context(|| format!("quantizing {}", a.model.display()))?;
    let secs = t0.elapsed().as_secs_f64();
    let eval = match &eval_text {
        Some(text) => {
            eprintln!("evaluating both models on the GPU ...");
            Some(evaluate(device, &a.model, &a.out, text, a.eval_tokens)?)
        }
        None => None,
    };
    if a.json {
        let (rmse, rel) = report.total();
        let v = serde_json::json!({
            "format": format.describe(),
            "method": format!("{:?}", opts.method).to_lowercase(),
            "output": a.out,
            "bytes": report.bytes,
            "seconds": secs,
            "total_rmse": rmse,
            "total_relative_rmse": rel,
            "tensors": report.tensors.iter().map(|t| serde_json::json!({
                "name": t.name, "shape": t.shape, "stored": t.stored, "rmse": t.rmse, "rms": t.rms,
            })).collect::<Vec<_>>(),
            "notes": report.notes,
            "eval": eval,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    print_report(&report, a.all);
    println!(
        "wrote {} ({:.1} MiB, {}) in {secs:.1} s",
        a.out.display(),
        report.bytes as f64 / (1 << 20) as f64,
        format.describe()
    );
    if let Some(e) = eval {
        println!(
            "eval over {} positions: mean KL {:.4} nats (max {:.3}), perplexity {:.3} -> {:.3}, top-1 agreement \
             {:.1}%",
            e.positions,
            e.kl_mean,
            e.kl_max,
            e.ppl_original,
            e.ppl_quantized,
            100.0 * e.top1_agreement
        );
    }
    Ok(())
}
