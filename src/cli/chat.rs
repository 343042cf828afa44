//! `shaderlm chat`: interactive multi-turn chat with streaming output. The history goes through the model's
//! template each turn and only the new suffix is prefilled (the KV cache keeps the shared prefix).

use super::common::{ModelArgs, SamplingArgs};
use super::spec::SpecArgs;
use super::DeviceArgs;
use clap::Args;
use shaderlm::generate::spec::{generate_spec, Speculator};
use shaderlm::generate::{generate, GenOptions, Generator};
use shaderlm::model::StepOutputs;
use shaderlm::sampling::Sampler;
use shaderlm::tokenizer::chat::Message;
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// A system message that opens the conversation.
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens per answer.
    #[arg(long, short = 'n', default_value_t = 512)]
    pub max_tokens: usize,
}

pub fn run(args: &ChatArgs, device: &DeviceArgs) -> anyhow::Result<()> {
    let params = args.sampling.params()?;
    args.spec.kind()?;
    let (gpu, loaded) = args.model.load(device)?;
    let draft = args.spec.load_draft(&gpu, &args.model, &loaded)?;
    let mut drafter = args.spec.drafter(&gpu, draft.as_ref(), args.model.chunk, &params)?;
    // One speculator for the whole chat: the adaptive draft length keeps what it learned from turn to turn.
    let spec_opts = args.spec.options()?;
    let mut speculator = drafter.as_deref_mut().map(|d| Speculator::new(d, spec_opts));
    let tok = &loaded.tokenizer;
    let outputs = StepOutputs {
        logits: params.needs_logits(),
        argmax: !params.needs_logits(),
        topk: 0,
        router: false,
        lse: false,
        hidden: SpecArgs::needs_hidden(draft.as_ref()),
        aux_hidden: SpecArgs::needs_aux_hidden(draft.as_ref()),
    };
    let mut gen = Generator::new(&gpu, &loaded.model, loaded.ctx, outputs)?;
    gen.chunk = args.model.chunk;
    gen.warm_up()?;
    let mut sampler = Sampler::new(params.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))?;
    let opening: Vec<Message> = args.system.iter().map(|s| Message::new("system", s)).collect();
    let mut messages = opening.clone();
    eprintln!(
        "{} on {} ({}). /reset clears the conversation, /exit or Ctrl-D quits, Ctrl-C stops an answer.",
        loaded.path.display(),
        gpu.describe(),
        loaded.format
    );
    let stdin = std::io::stdin();
    let mut line = String::new();
    loop {
        eprint!("> ");
        line.clear();
        if stdin.lock().read_line(&mut line)? == 0 {
            eprintln!();
            return Ok(());
        }
        let input = line.trim();
        match input {
            "" => continue,
            "/exit" | "/quit" => return Ok(()),
            "/reset" => {
                messages = opening.clone();
                gen.truncate(0);
                eprintln!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        messages.push(Message::new("user", input));
        let ids = tok.encode_chat(&messages, true)?;
        let shared = gen
            .tokens
            .iter()
            .zip(&ids)
            .take_while(|(a, b)| a == b)
            .count()
            .min(ids.len() - 1);
        if ids.len() + 1 > gen.max_ctx() {
            messages.pop();
            eprintln!(
                "(the conversation no longer fits the context of {} tokens: /reset to start over)",
                gen.max_ctx()
            );
            continue;
        }
        gen.truncate(shared);
        stop.store(false, Ordering::SeqCst);
        let opts = GenOptions {
            max_tokens: args.max_tokens.min(gen.max_ctx() - ids.len()),
            stop_strings: Vec::new(),
            stop_at_eos: true,
        };
        let mut out = std::io::stdout();
        let print = |piece: &str| {
            let _ = out.write_all(piece.as_bytes());
            let _ = out.flush();
            !stop.load(Ordering::SeqCst)
        };
        let result = match &mut speculator {
            Some(spec) => generate_spec(&mut gen, tok, &mut sampler, &ids[shared..], &opts, spec, print).map(|r| r.0),
            None => generate(&mut gen, tok, &mut sampler, &ids[shared..], &opts, print),
        };
        println!();
        match result {
            Ok(r) => {
                eprintln!(
                    "[{} new prompt tokens at {:.1} tok/s, {} tokens at {:.1} tok/s{}]",
                    r.prompt_ids.len(),
                    r.prefill_tok_s(),
                    r.generated.len(),
                    r.decode_tok_s(),
                    if r.stopped_by == "interrupted" {
                        ", interrupted"
                    } else {
                        ""
                    }
                );
                messages.push(Message::new("assistant", r.text.trim_end()));
            }
            Err(e) => {
                messages.pop();
                eprintln!("error: {e}");
            }
        }
    }
}
