//! The step loop the model tests share: tokens through the GPU step graph in a given schedule of step sizes, as
//! the generator runs them (each step dense or sparse by the KV length it reaches, decode plans reused).

#![allow(dead_code)]
use super::gpu::gpu;
use shaderlm::gpu::Gpu;
use shaderlm::loader::gguf::GgufFile;
use shaderlm::loader::safetensors::SafetensorsModel;
use shaderlm::model::{Llama, LlamaConfig, Names, Step, StepInputs, StepOutputs, StepResult};
use std::path::Path;

/// The weights of a tiny checkpoint (a GGUF file or a Hugging Face directory), without a tokenizer.
pub fn weights(path: &Path) -> Llama {
    if path.is_dir() {
        let cfg = LlamaConfig::from_hf(&path.join("config.json")).unwrap();
        let st = SafetensorsModel::open(path).unwrap();
        Llama::load(gpu(), &st, cfg, Names::Hf, |_, _| {}).unwrap()
    } else {
        let f = GgufFile::open(path).unwrap();
        let cfg = LlamaConfig::from_gguf(&f).unwrap();
        Llama::load(gpu(), &f, cfg, Names::Gguf, |_, _| {}).unwrap()
    }
}

/// `n` token ids below `vocab`, a different run for each seed.
pub fn tokens(n: usize, vocab: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + 11 + seed * 13) % vocab as u32)
        .collect()
}

/// The bit patterns of `v`, to compare f32 results exactly.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Runs `tokens` through `model` in steps of the sizes in `steps` on a fresh cache of `max_ctx` positions; returns,
/// per step, the position of its last token and what it read back.
pub fn run_steps(
    gpu: &Gpu,
    model: &Llama,
    tokens: &[u32],
    steps: &[usize],
    max_ctx: usize,
    outputs: StepOutputs,
) -> Vec<(usize, StepResult)> {
    assert_eq!(steps.iter().sum::<usize>(), tokens.len(), "the steps cover the tokens");
    let cache = model.new_cache(gpu, max_ctx).unwrap();
    let mut decode: [Option<Step>; 2] = [None, None];
    let mut got = Vec::with_capacity(steps.len());
    let mut pos = 0;
    for &n in steps {
        let sparse = cache.sparse_at(&model.cfg, pos + n);
        let plan = |n| model.step_with(gpu, &cache, n, outputs, sparse).unwrap();
        let mut fresh;
        let step = if n == 1 {
            decode[usize::from(sparse)].get_or_insert_with(|| plan(1))
        } else {
            fresh = plan(n);
            &mut fresh
        };
        let mut out = StepResult::default();
        let inputs = StepInputs {
            tokens: &tokens[pos..pos + n],
            pos,
        };
        step.run(gpu, inputs, &mut out).unwrap();
        got.push((pos + n - 1, out));
        pos += n;
    }
    got
}

/// Step sizes for `n` tokens: the first `prompt` in chunks of at most `chunk`, then one at a time.
pub fn prefill_then_decode(n: usize, prompt: usize, chunk: usize) -> Vec<usize> {
    let mut steps: Vec<usize> = (0..prompt).step_by(chunk).map(|p| chunk.min(prompt - p)).collect();
    steps.extend(std::iter::repeat_n(1, n - prompt));
    steps
}

/// Logits and argmax only.
pub const LOGITS_AND_ARGMAX: StepOutputs = StepOutputs {
    logits: true,
    argmax: true,
    topk: 0,
    router: false,
    hidden: false,
    aux_hidden: false,
    lse: false,
};
