//! `shaderlm bench --spec`: plain and speculative greedy decoding of the same prompts in one run, interleaved per
//! repetition: tok/s of each and the speedup, tokens per verification step, acceptance by draft depth, and draft /
//! verify time. The two outputs must be identical; a difference is an error (speculation is lossless).

use super::spec::{LoadedDraft, SpecArgs, SpecKind};
use clap::ValueEnum;
use shaderlm::generate::spec::{generate_spec, SpecStats, Speculator};
use shaderlm::generate::{generate, GenOptions, Generator};
use shaderlm::model::load::LoadedModel;
use shaderlm::sampling::{Sampler, SamplingParams};
use shaderlm::tokenizer::chat::Message;
use std::time::Duration;

/// Built-in prompt sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SpecPrompts {
    /// Answers grounded in a text the prompt gives (repeat, edit, quote): prompt lookup's case.
    Grounded,
    /// Writing code from a description: a draft model's case.
    Code,
}

const PARAGRAPH: &str = "Speculative decoding speeds up inference by letting a cheap drafter propose several tokens \
that the large model then verifies in a single forward pass. Because the verification keeps only the tokens the \
large model would have produced anyway, the output is identical to ordinary decoding. Prompt lookup is the simplest \
drafter: it copies spans of the prompt whenever the recent output matches them.";

const CODE: &str = "def mean(values):\n    total = 0\n    for v in values:\n        total += v\n    return total / \
len(values)\n\n\ndef variance(values):\n    m = mean(values)\n    total = 0\n    for v in values:\n        total += \
(v - m) ** 2\n    return total / len(values)\n";

fn prompts(set: SpecPrompts) -> Vec<(&'static str, String)> {
    match set {
        SpecPrompts::Grounded => vec![
            (
                "repeat",
                format!("Repeat the following paragraph exactly, word for word:\n\n{PARAGRAPH}"),
            ),
            (
                "edit",
                format!(
                    "Rewrite this paragraph with \"speculative decoding\" replaced by \"drafting\":\n\n{PARAGRAPH}"
                ),
            ),
            (
                "code_edit",
                format!("Rename the variable `total` to `acc` in this code and print the whole code:\n\n{CODE}"),
            ),
        ],
        SpecPrompts::Code => vec![
            (
                "fizzbuzz",
                "Write a Python function fizzbuzz(n) that returns the FizzBuzz list up to n.".into(),
            ),
            (
                "sort",
                "Write a Python function that sorts a list of dictionaries by the key 'age'.".into(),
            ),
            (
                "primes",
                "Write a Python function that returns all prime numbers below n with a sieve.".into(),
            ),
        ],
    }
}

/// The measurements of one prompt: plain and speculative decode times and tokens, and what speculation did.
struct Measured {
    name: &'static str,
    tokens: usize,
    plain: Duration,
    spec: Duration,
    stats: SpecStats,
}

/// Plain and speculative generation of up to `n` tokens per prompt, `reps` times each (after one warm-up of
/// each), on one session; prints the table.
pub fn run(
    gen: &mut Generator<'_>,
    loaded: &LoadedModel,
    spec_args: &SpecArgs,
    draft: Option<&LoadedDraft>,
    set: Option<SpecPrompts>,
    n: usize,
    reps: usize,
) -> anyhow::Result<()> {
    let kind = spec_args.kind()?.unwrap_or(SpecKind::Lookup);
    let set = set.unwrap_or(match kind {
        SpecKind::Lookup => SpecPrompts::Grounded,
        SpecKind::Draft | SpecKind::Eagle => SpecPrompts::Code,
    });
    let gpu = gen.gpu();
    let mut drafter = match spec_args.drafter(gpu, draft, gen.chunk, &SamplingParams::greedy())? {
        Some(d) => d,
        None => Box::new(shaderlm::generate::draft::Lookup::default()),
    };
    let name = drafter.name();
    let mut speculator = Speculator::new(&mut *drafter, spec_args.options()?);
    let tok = &loaded.tokenizer;
    let opts = GenOptions {
        max_tokens: n,
        stop_strings: Vec::new(),
        stop_at_eos: true,
    };
    let mut rows = Vec::new();
    for (pname, text) in prompts(set) {
        // A model without a chat template (a synthetic one) gets the prompt as plain text.
        let ids = match tok.chat_template {
            Some(_) => tok.encode_chat(&[Message::new("user", &text)], true)?,
            None => tok.encode(&text, true)?,
        };
        let mut m = Measured {
            name: pname,
            tokens: 0,
            plain: Duration::ZERO,
            spec: Duration::ZERO,
            stats: SpecStats::default(),
        };
        for rep in 0..=reps {
            // Plain first in even repetitions, speculative first in odd ones: whatever the host does to the
            // second run of a pair (or the first) falls on both.
            let run_plain = |gen: &mut Generator<'_>| {
                gen.truncate(0);
                generate(
                    gen,
                    tok,
                    &mut Sampler::new(SamplingParams::greedy()),
                    &ids,
                    &opts,
                    |_| true,
                )
            };
            let mut run_spec = |gen: &mut Generator<'_>| {
                gen.truncate(0);
                let mut sampler = Sampler::new(SamplingParams::greedy());
                generate_spec(gen, tok, &mut sampler, &ids, &opts, &mut speculator, |_| true)
            };
            let (plain, (spec, stats)) = if rep % 2 == 0 {
                let plain = run_plain(gen)?;
                (plain, run_spec(gen)?)
            } else {
                let spec = run_spec(gen)?;
                (run_plain(gen)?, spec)
            };
            anyhow::ensure!(
                spec.generated == plain.generated,
                "bench --spec: speculative output differs from plain decoding on prompt {pname:?} (a bug; please report it)"
            );
            if rep > 0 {
                m.tokens += plain.generated.len();
                m.plain += plain.decode_time;
                m.spec += spec.decode_time;
                m.stats.merge(&stats);
            }
        }
        rows.push(m);
    }
    print_table(&rows, name, kind, reps);
    Ok(())
}

fn print_table(rows: &[Measured], source: &str, kind: SpecKind, reps: usize) {
    println!();
    println!("speculative decoding ({source}, {kind:?}), greedy, {reps} repetitions, same run:");
    println!("| prompt | tokens | plain t/s | spec t/s | speedup | tokens/step | drafts accepted |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let tps = |n: usize, d: Duration| n as f64 / d.as_secs_f64().max(1e-9);
    let mut total = Measured {
        name: "all",
        tokens: 0,
        plain: Duration::ZERO,
        spec: Duration::ZERO,
        stats: SpecStats::default(),
    };
    for m in rows {
        total.tokens += m.tokens;
        total.plain += m.plain;
        total.spec += m.spec;
        total.stats.merge(&m.stats);
    }
    for m in rows.iter().chain([&total]) {
        let (p, s) = (tps(m.tokens, m.plain), tps(m.tokens, m.spec));
        println!(
            "| {} | {} | {p:.2} | {s:.2} | {:.2}x | {:.2} | {}/{} |",
            m.name,
            m.tokens,
            s / p.max(1e-9),
            m.stats.mean_accepted_len(),
            m.stats.accepted,
            m.stats.drafted
        );
    }
    println!("{}", total.stats.report(source));
}
