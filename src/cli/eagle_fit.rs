//! `shaderlm eagle-fit`: a linear EAGLE-1 head for a model, fitted by ridge regression to the model's own hidden
//! states over a text ([`shaderlm::model::eagle_fit`]), written as a head directory for `--eagle`.

use super::common::ModelArgs;
use super::DeviceArgs;
use anyhow::Context;
use clap::Args;
use shaderlm::generate::Generator;
use shaderlm::loader::gguf::GgufFile;
use shaderlm::loader::safetensors::SafetensorsModel;
use shaderlm::model::eagle_fit::{write_head, Ridge};
use shaderlm::model::names::{Names, Role};
use shaderlm::model::weights::WeightSource;
use shaderlm::model::StepOutputs;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct EagleFitArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text the model reads; its own generated text fits best (the head drafts what the model writes).
    #[arg(long)]
    pub text: PathBuf,
    /// The head directory to write (config.json, model.safetensors).
    #[arg(short = 'o', long)]
    pub output: PathBuf,
    /// Ridge penalty per sample.
    #[arg(long, default_value_t = 1e-3)]
    pub lambda: f64,
}

/// Samples at the end of the text on which the fit's agreement with the model is reported.
const CHECKED: usize = 32;

pub fn run(args: &EagleFitArgs, device: &DeviceArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.lambda.is_finite() && args.lambda > 0.0, "--lambda must be > 0");
    let (gpu, loaded) = args.model.load(device)?;
    let cfg = &loaded.model.cfg;
    anyhow::ensure!(!loaded.model.is_eagle(), "{} is an EAGLE head", loaded.path.display());
    let text = shaderlm::loader::read_text(&args.text)?;
    let ids = loaded.tokenizer.encode(&text, false)?;
    anyhow::ensure!(
        ids.len() >= 16,
        "{}: {} tokens, too few to fit on",
        args.text.display(),
        ids.len()
    );
    // The embedding rows as the engine scales them, under the architecture's name in the file.
    let embed = if loaded.path.is_dir() {
        let st = SafetensorsModel::open(&loaded.path)?;
        st.require(&Names::Hf.of(cfg.arch, Role::Embed, None))?.to_f32()?
    } else {
        let f = GgufFile::open(&loaded.path)?;
        f.require(&Names::Gguf.of(cfg.arch, Role::Embed, None))?.to_f32()?
    };
    let h = cfg.hidden;
    anyhow::ensure!(embed.len() == cfg.vocab * h, "the embedding is not [vocab, hidden]");
    let scale = cfg.mup.emb;
    let row = |t: u32| -> Vec<f32> {
        embed[t as usize * h..(t as usize + 1) * h]
            .iter()
            .map(|&v| v * scale)
            .collect()
    };
    let outputs = StepOutputs {
        hidden: true,
        ..Default::default()
    };
    let mut gen = Generator::new(&gpu, &loaded.model, loaded.ctx, outputs)?;
    gen.chunk = args.model.chunk;
    let mut ridge = Ridge::new(h);
    let t0 = Instant::now();
    // The last window's (e, f, next f) samples, kept to report how often the fit agrees with the model.
    let mut kept: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = Vec::new();
    for window in ids.chunks(loaded.ctx) {
        kept.clear();
        gen.truncate(0);
        let mut features = Vec::with_capacity(window.len() * h);
        for chunk in window.chunks(gen.chunk.max(1)) {
            gen.feed(chunk)?;
            features.extend_from_slice(&gen.result.hidden);
        }
        // Sample j: (e(t_{j+1}), f_j) -> f_{j+1}.
        for j in 0..window.len() - 1 {
            let f = &features[j * h..(j + 1) * h];
            let y = &features[(j + 1) * h..(j + 2) * h];
            ridge.add(&row(window[j + 1]), f, y);
            if j + 1 + CHECKED >= window.len() {
                kept.push((row(window[j + 1]), f.to_vec(), y.to_vec()));
            }
        }
    }
    let features_s = t0.elapsed().as_secs_f64();
    let (fc, bias) = ridge.solve(args.lambda)?;
    write_head(&args.output, cfg, &fc, &bias).with_context(|| format!("writing {}", args.output.display()))?;
    // Top-1 agreement through the tied or untied head, on the host (tied models only: the embedding is the head).
    if cfg.tie_embeddings {
        let top = |x: &[f32]| -> usize {
            let score = |v: usize| embed[v * h..(v + 1) * h].iter().zip(x).map(|(a, b)| a * b).sum::<f32>();
            (0..cfg.vocab)
                .max_by(|&a, &b| score(a).total_cmp(&score(b)))
                .unwrap_or(0)
        };
        let agree = kept
            .iter()
            .filter(|(e, f, y)| {
                let p: Vec<f32> = (0..h)
                    .map(|r| {
                        let w = &fc[r * 2 * h..(r + 1) * 2 * h];
                        bias[r] + e.iter().chain(f.iter()).zip(w).map(|(a, b)| a * b).sum::<f32>()
                    })
                    .collect();
                top(&p) == top(y)
            })
            .count();
        eprintln!(
            "the fitted head's top token equals the model's on {agree} of the last {} samples",
            kept.len()
        );
    }
    eprintln!(
        "fitted on {} samples of {} ({:.1} s of features, {:.1} s in all); head written to {}",
        ridge.samples,
        args.text.display(),
        features_s,
        t0.elapsed().as_secs_f64(),
        args.output.display()
    );
    Ok(())
}
