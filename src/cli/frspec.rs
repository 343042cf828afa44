//! `shaderlm frspec`: the token ranking FR-Spec restricts a draft head with, counted over a text in the model's own
//! tokenization, written as a JSON list of ids (most frequent first) for `--frspec-freq`.

use anyhow::Context;
use clap::Args;
use shaderlm::model::frspec;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct FrspecArgs {
    /// The draft model (a GGUF file or a Hugging Face directory): only its tokenizer is read.
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    /// The text to count tokens over (what the model will be asked about: code, chat, a language).
    #[arg(long)]
    pub text: PathBuf,
    /// Ids to keep, most frequent first (0: every id seen).
    #[arg(short = 'n', long, default_value_t = 0)]
    pub n: usize,
    /// Where to write the JSON list.
    #[arg(short = 'o', long)]
    pub output: PathBuf,
}

pub fn run(args: &FrspecArgs) -> anyhow::Result<()> {
    let tok = frspec::tokenizer_of(&args.model).with_context(|| format!("reading {}", args.model.display()))?;
    let text = shaderlm::loader::read_text(&args.text)?;
    let vocab = tok.vocab_size();
    let mut ids = frspec::rank(&tok, &text, vocab)?;
    anyhow::ensure!(!ids.is_empty(), "{}: no tokens in the text", args.text.display());
    if args.n > 0 {
        ids.truncate(args.n);
    }
    std::fs::write(&args.output, serde_json::to_string(&ids)?)
        .with_context(|| format!("writing {}", args.output.display()))?;
    eprintln!(
        "{} token ids ranked by frequency over {} ({} bytes of text) written to {}",
        ids.len(),
        args.text.display(),
        text.len(),
        args.output.display()
    );
    Ok(())
}
