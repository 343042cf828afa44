//! Golden checks of a real model against fixtures from an independent reference (`models/reference/`): prompt
//! token ids exactly; teacher-forced greedy steps whose argmax equals the reference's, except at a near-tie (top-2
//! gap under [`NEAR_TIE`]) where the engine must take the reference's runner-up; every step's top-5 logits within
//! the model's tolerance.

#![allow(dead_code)]

use shaderlm::generate::Generator;
use shaderlm::gpu::{Gpu, GpuOptions};
use shaderlm::model::load::LoadedModel;
use shaderlm::model::{LoadOptions, StepOutputs};
use shaderlm::tokenizer::chat::Message;
use std::path::Path;

/// One `#[test]` per SmolLM2 golden prompt (`tests/fixtures/smollm2`), each calling `$check(name)`.
#[macro_export]
macro_rules! smollm2_golden_tests {
    ($check:ident) => {
        $crate::smollm2_golden_tests!($check: plain_english, chat_capital, code_python, cjk, emoji,
            chat_multiturn_system, whitespace, long_1k);
    };
    ($check:ident: $($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                $check(stringify!($name));
            }
        )*
    };
}

/// A top-2 gap below this is a near-tie that summation order can flip.
pub const NEAR_TIE: f32 = 0.05;

/// Opens `models/FILE` (failing with how to fetch it) on the default adapter, with a 2048-position context.
pub fn load(file: &str, fetch: &str) -> (Gpu, LoadedModel) {
    load_with(file, fetch, &LoadOptions::with_ctx(2048))
}

/// `load` with other options.
pub fn load_with(file: &str, fetch: &str, opts: &LoadOptions) -> (Gpu, LoadedModel) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("models").join(file);
    assert!(
        path.exists(),
        "this test needs the real model models/{file}: run `bash models/fetch.sh {fetch}` (or `bash setup.sh --test`)"
    );
    let gpu = Gpu::new(&GpuOptions::default()).unwrap_or_else(|e| panic!("the GPU tests need an adapter: {e}"));
    let loaded = LoadedModel::open(&gpu, &path, opts, |_, _| {}).unwrap();
    (gpu, loaded)
}

#[derive(serde::Deserialize)]
pub struct StepRef {
    pub top_ids: Vec<u32>,
    pub top_logits: Vec<f32>,
    pub gap: f32,
}

#[derive(serde::Deserialize)]
pub struct Fixture {
    pub name: String,
    pub kind: String,
    pub messages: Option<Vec<Message>>,
    pub prompt: String,
    pub prompt_tokens: Vec<u32>,
    pub greedy_tokens: Vec<u32>,
    pub steps: Vec<StepRef>,
}

pub fn fixture(dir: &str, name: &str) -> Fixture {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(dir)
        .join(format!("{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// Checks fixture `dir/name` on `loaded`, all its steps; returns the largest top-5 logit difference seen.
pub fn check(gpu: &Gpu, loaded: &LoadedModel, dir: &str, name: &str, logit_tol: f32) -> f32 {
    check_steps(gpu, loaded, dir, name, logit_tol, usize::MAX)
}

/// [`check`] over the fixture's first `steps` steps (the prompt, then `steps - 1` decoded tokens).
pub fn check_steps(gpu: &Gpu, loaded: &LoadedModel, dir: &str, name: &str, logit_tol: f32, steps: usize) -> f32 {
    let mut fx = fixture(dir, name);
    fx.steps.truncate(steps);
    let tok = &loaded.tokenizer;
    // Tokenization: the template renders the same text, and our tokenizer gives the same ids.
    if let Some(messages) = &fx.messages {
        let text = tok.render_chat(messages, true).unwrap();
        assert_eq!(text, fx.prompt, "{}: rendered chat prompt", fx.name);
        assert_eq!(
            tok.encode_chat(messages, true).unwrap(),
            fx.prompt_tokens,
            "{}: chat prompt ids",
            fx.name
        );
    }
    let ids = tok.encode_prompt(&fx.prompt).unwrap();
    assert_eq!(ids, fx.prompt_tokens, "{} ({}): prompt token ids", fx.name, fx.kind);

    let outputs = StepOutputs {
        logits: true,
        argmax: true,
        topk: 0,
        router: false,
        hidden: false,
        aux_hidden: false,
        lse: false,
    };
    let start = std::time::Instant::now();
    let mut gen = Generator::new(gpu, &loaded.model, loaded.ctx, outputs).unwrap();
    // Teacher-forced: feed the reference's tokens; every step's argmax and top-5 logits must agree. Up to the
    // first mismatch this is exactly free-running greedy decoding.
    let mut worst = 0f32;
    let mut ties = Vec::new();
    gen.feed(&ids).unwrap();
    for (j, step) in fx.steps.iter().enumerate() {
        let logits = &gen.result.logits;
        for (id, want) in step.top_ids.iter().zip(&step.top_logits).take(5) {
            let d = (logits[*id as usize] - want).abs();
            worst = worst.max(d);
            assert!(
                d <= logit_tol,
                "{}: step {j} logit of {id}: {} vs {want}",
                fx.name,
                logits[*id as usize]
            );
        }
        let arg = gen.result.argmax.unwrap();
        if arg != fx.greedy_tokens[j] {
            assert!(
                step.gap < NEAR_TIE && arg == step.top_ids[1],
                "{}: greedy token {j} is {arg}, reference {} (runner-up {}) with a top-2 gap of {} (not a \
                 near-tie taken the other way)",
                fx.name,
                fx.greedy_tokens[j],
                step.top_ids[1],
                step.gap
            );
            ties.push(j);
        }
        if j + 1 < fx.steps.len() {
            gen.feed(&fx.greedy_tokens[j..j + 1]).unwrap();
        }
    }
    println!(
        "{}: {} prompt tokens, {} steps in {:.1} s, max |logit diff| {worst:.4}, argmax differs only at near-ties \
         {ties:?}",
        fx.name,
        ids.len(),
        fx.steps.len(),
        start.elapsed().as_secs_f64()
    );
    super::gpu::assert_known_variants(gpu);
    worst
}
