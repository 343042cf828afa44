//! `shaderlm generate`: one completion from a prompt, messages, or raw token ids; streaming text or one JSON object.

use super::common::{ModelArgs, SamplingArgs};
use super::spec::SpecArgs;
use super::DeviceArgs;
use anyhow::{bail, Context};
use clap::Args;
use shaderlm::generate::spec::{generate_spec, Speculator};
use shaderlm::generate::{generate, GenOptions, Generator};
use shaderlm::model::StepOutputs;
use shaderlm::sampling::Sampler;
use shaderlm::tokenizer::chat::Message;
use std::io::{Read, Write};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// The prompt (read from stdin when no prompt, messages or ids are given).
    #[arg(long, short = 'p')]
    pub prompt: Option<String>,
    /// An OpenAI-style JSON list of {"role", "content"} messages, rendered with the model's chat template.
    #[arg(long, conflicts_with_all = ["prompt", "prompt_ids"])]
    pub messages: Option<PathBuf>,
    /// Raw prompt token ids, comma-separated.
    #[arg(long, value_delimiter = ',', conflicts_with = "prompt")]
    pub prompt_ids: Option<Vec<u32>>,
    /// Apply the model's chat template: the prompt becomes a user message.
    #[arg(long)]
    pub chat: bool,
    /// A system message (with --chat or --messages).
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens to generate.
    #[arg(long, short = 'n', default_value_t = 128)]
    pub max_tokens: usize,
    /// Print BlockFFN expert sparsity per layer (token-level, and chunk-level over 8 tokens) and what speculation
    /// did (tokens per step, acceptance by depth, draft and verify time) at the end.
    #[arg(long)]
    pub stats: bool,
    /// Stop when the text contains this (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Keep going past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Instead of generating: run the prompt's first prefill step and one decode step node by node, compare every
    /// node with its op's CPU reference and name the first one past its bound.
    #[arg(long)]
    pub check: bool,
    /// Print one JSON object: prompt_ids, generated_ids, text, and the top-10 raw logits of each step.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &GenerateArgs, device: &DeviceArgs) -> anyhow::Result<()> {
    let params = args.sampling.params()?;
    args.spec.kind()?;
    let (gpu, loaded) = args.model.load(device)?;
    let draft = args.spec.load_draft(&gpu, &args.model, &loaded)?;
    let tok = &loaded.tokenizer;
    let prompt_ids = if let Some(ids) = &args.prompt_ids {
        ids.clone()
    } else {
        let mut messages = Vec::new();
        if let Some(s) = &args.system {
            messages.push(Message::new("system", s));
        }
        if let Some(path) = &args.messages {
            let text = shaderlm::loader::read_text(path)?;
            let list: Vec<Message> = serde_json::from_str(&text)
                .with_context(|| format!("{}: expected a JSON list of {{\"role\", \"content\"}}", path.display()))?;
            messages.extend(list);
            tok.encode_chat(&messages, true)?
        } else {
            let prompt = match &args.prompt {
                Some(p) => p.clone(),
                None => {
                    let mut s = String::new();
                    std::io::stdin()
                        .read_to_string(&mut s)
                        .context("reading the prompt from stdin")?;
                    s
                }
            };
            if args.chat {
                messages.push(Message::new("user", &prompt));
                tok.encode_chat(&messages, true)?
            } else {
                tok.encode(&prompt, true)?
            }
        }
    };
    if prompt_ids.is_empty() {
        bail!("the prompt is empty");
    }
    let outputs = StepOutputs {
        logits: params.needs_logits(),
        argmax: !params.needs_logits(),
        topk: if args.json { 10 } else { 0 },
        lse: false,
        router: args.stats,
        hidden: SpecArgs::needs_hidden(draft.as_ref()),
        aux_hidden: SpecArgs::needs_aux_hidden(draft.as_ref()),
    };
    let mut gen = Generator::new(&gpu, &loaded.model, loaded.ctx, outputs)?;
    gen.chunk = args.model.chunk;
    if args.check {
        return super::common::check_steps(&mut gen, &prompt_ids);
    }
    let mut sampler = Sampler::new(params.clone());
    let opts = GenOptions {
        max_tokens: args.max_tokens,
        stop_strings: args.stop.clone(),
        stop_at_eos: !args.ignore_eos,
    };
    let stdout = std::io::stdout();
    let print = |piece: &str| {
        if !args.json {
            let mut o = stdout.lock();
            let _ = o.write_all(piece.as_bytes());
            let _ = o.flush();
        }
        true
    };
    let mut spec_report = None;
    let out = match args.spec.drafter(&gpu, draft.as_ref(), args.model.chunk, &params)? {
        Some(mut drafter) => {
            let name = drafter.name();
            let mut spec = Speculator::new(&mut *drafter, args.spec.options()?);
            let (out, stats) = generate_spec(&mut gen, tok, &mut sampler, &prompt_ids, &opts, &mut spec, print)?;
            spec_report = Some(stats.report(name));
            out
        }
        None => generate(&mut gen, tok, &mut sampler, &prompt_ids, &opts, print)?,
    };
    if args.json {
        let topk: Vec<_> = out
            .topk
            .iter()
            .map(|(ids, logits)| serde_json::json!({"ids": ids, "logits": logits}))
            .collect();
        let obj = serde_json::json!({
            "prompt_ids": out.prompt_ids,
            "generated_ids": out.generated,
            "text": out.text,
            "topk": topk,
        });
        println!("{obj}");
    } else {
        println!();
    }
    eprintln!(
        "[{} prompt tokens at {:.1} tok/s, {} generated at {:.1} tok/s, stopped by {}]",
        out.prompt_ids.len(),
        out.prefill_tok_s(),
        out.generated.len(),
        out.decode_tok_s(),
        out.stopped_by
    );
    if args.stats {
        match (&gen.moe_stats, &spec_report) {
            (Some(st), _) => eprintln!("BlockFFN expert sparsity:\n{}", st.report()),
            (None, None) => eprintln!("--stats: this model has no BlockFFN experts"),
            (None, Some(_)) => {}
        }
        if let Some(r) = &spec_report {
            eprintln!("{r}");
        }
    }
    Ok(())
}
