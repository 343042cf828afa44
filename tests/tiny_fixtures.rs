//! Tiny random checkpoints of every architecture, committed under tests/fixtures/tiny/ in the layouts their own
//! code saves (config.json + safetensors as transformers 4 / 5 or the remote code writes them; llama.cpp GGUFs for
//! Llama and Phi-3), against logits from models/reference/tiny.py: a float64 numpy forward written from the published
//! modeling code that shares no loader, config parser, tensor names or math with shaderlm. The engine runs on the
//! GPU in several step schedules (one-shot prefill, prefill then decode, every token decoded, chunked prefill over
//! a filled cache) and every position a schedule yields must match the fixture.
//!
//! Bound. The fixture holds the float64 forward's logits rounded to 6 significant digits (relative error 5e-7);
//! the engine computes in f32 on the same weight values (every stored value is an f16, so f16 and f32 copies agree
//! exactly). f32 rounding (unit 6e-8) in dot products of at most 128 terms, softmax, norms and rope gives a
//! relative error of ~1e-6 per op; through 2..6 layers of ~10 ops with residual growth of a few times, and the
//! logits' magnitude S (the fixture's largest |logit|, at least 1), the expected error is ~1e-5 S. The bound is
//! |engine - fixture| <= 5e-5 * S at every logit, 5x that (measured on lavapipe: at most 3.4e-6 * S, Phi-3's
//! 16-token case; Gemma 3's six layers 3e-6 * S), while every convention slip the script measures
//! (llama3 rope scaling dropped, GGUF q/k rows read without their permutation, Gemma's window one key wider,
//! query_pre_attn_scalar ignored, MiniCPM's short longrope factors, Phi-3's other longrope factors, its window
//! dropped or one wider, its attention factor dropped) moves the logits by 1e-2 * S or more. The greedy
//! token must match wherever the fixture's top-2 gap exceeds twice the bound.

mod common;

use common::gpu::gpu;
use common::steps::{run_steps, LOGITS_AND_ARGMAX};

use serde_json::Value;
use shaderlm::loader::gguf::GgufFile;
use shaderlm::loader::safetensors::SafetensorsModel;
use shaderlm::model::weights::WeightSource;
use shaderlm::model::{Llama, LlamaConfig, Names};
use std::path::PathBuf;

const REL_BOUND: f64 = 5e-5;

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tiny")
        .join(name)
}

struct Expected {
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
    gap: Vec<f64>,
    argmax: Vec<u32>,
    scale: f64,
}

fn expected(name: &str, file: &str) -> Expected {
    let path = dir(name).join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "missing fixture {}: {e} (regenerate with `python models/reference/tiny.py`)",
            path.display()
        )
    });
    let v: Value = serde_json::from_str(&text).unwrap();
    let nums = |key: &str| -> Vec<f64> {
        v[key]
            .as_array()
            .unwrap_or_else(|| panic!("{name}: no {key}"))
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    let logits: Vec<Vec<f32>> = v["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect();
    let e = Expected {
        tokens: nums("tokens").into_iter().map(|x| x as u32).collect(),
        gap: nums("gap"),
        argmax: nums("argmax").into_iter().map(|x| x as u32).collect(),
        scale: v["max_abs_logit"].as_f64().unwrap().max(1.0),
        logits,
    };
    assert_eq!(e.logits.len(), e.tokens.len(), "{name}: one logits row per token");
    e
}

/// Runs `tokens` through the model in steps of the given sizes (a fresh cache of `max_ctx` positions); returns
/// (position, logits, argmax) of the last token of every step.
fn run(model: &Llama, tokens: &[u32], steps: &[usize], max_ctx: usize) -> Vec<(usize, Vec<f32>, u32)> {
    run_steps(gpu(), model, tokens, steps, max_ctx, LOGITS_AND_ARGMAX)
        .into_iter()
        .map(|(p, out)| (p, out.logits, out.argmax.unwrap()))
        .collect()
}

/// The schedules every checkpoint runs: one-shot prefill (tiled prefill kernel), prefill then decode (split-KV
/// decode kernel), every token decoded (every position), and chunked prefill over a filled cache.
fn schedules(n: usize) -> Vec<Vec<usize>> {
    let mut s = vec![vec![n]];
    let mut pd = vec![10];
    pd.extend(std::iter::repeat_n(1, n - 10));
    s.push(pd);
    s.push(vec![1; n]);
    s.push(vec![5, 4, n - 9]);
    s
}

/// Checks the model against the fixture in every schedule; returns the largest |engine - fixture| seen.
fn check(name: &str, label: &str, src: &dyn WeightSource, cfg: LlamaConfig, names: Names, max_ctx: usize) -> f64 {
    check_file(name, "expected.json", label, src, cfg, names, max_ctx)
}

/// [`check`] against one of the checkpoint's fixture files.
fn check_file(
    name: &str,
    file: &str,
    label: &str,
    src: &dyn WeightSource,
    cfg: LlamaConfig,
    names: Names,
    max_ctx: usize,
) -> f64 {
    let want = expected(name, file);
    let model = Llama::load(gpu(), src, cfg, names, |_, _| {}).unwrap();
    let bound = REL_BOUND * want.scale;
    let mut worst = 0f64;
    let mut failures = Vec::new();
    for steps in schedules(want.tokens.len()) {
        for (p, logits, arg) in run(&model, &want.tokens, &steps, max_ctx) {
            assert_eq!(logits.len(), want.logits[p].len(), "{label}: vocabulary size");
            let err = logits
                .iter()
                .zip(&want.logits[p])
                .map(|(a, b)| (a - b).abs() as f64)
                .fold(0.0, f64::max);
            worst = worst.max(err);
            if err > bound {
                failures.push(format!(
                    "steps {steps:?}, position {p}: max |diff| {err:.3e} > {bound:.3e}"
                ));
            }
            if want.gap[p] > 2.0 * bound && arg != want.argmax[p] {
                failures.push(format!(
                    "steps {steps:?}, position {p}: argmax {arg}, fixture {} (gap {})",
                    want.argmax[p], want.gap[p]
                ));
            }
        }
    }
    eprintln!(
        "{label}: max |engine - fixture| {worst:.3e} (bound {bound:.3e}, {:.2e} of max |logit|)",
        worst / want.scale
    );
    assert!(
        failures.is_empty(),
        "{label} disagrees with the fixture:\n{}",
        failures.join("\n")
    );
    worst
}

fn check_hf(name: &str, max_ctx: usize) -> f64 {
    let d = dir(name);
    let cfg = LlamaConfig::from_hf(&d.join("config.json"))
        .unwrap_or_else(|e| panic!("{name}: config.json: {e} (missing fixture? run models/reference/tiny.py)"));
    let st = SafetensorsModel::open(&d).unwrap_or_else(|e| panic!("{name}: safetensors: {e}"));
    check(name, &format!("{name} (safetensors)"), &st, cfg, Names::Hf, max_ctx)
}

#[test]
fn llama_safetensors_transformers4_config_llama3_rope() {
    check_hf("llama", 64);
}

#[test]
fn llama_gguf_as_llama_cpp_writes_it() {
    let path = dir("llama").join("model.gguf");
    let f = GgufFile::open(&path).unwrap_or_else(|e| panic!("missing fixture {}: {e}", path.display()));
    let cfg = LlamaConfig::from_gguf(&f).unwrap();
    check("llama", "llama (GGUF)", &f, cfg, Names::Gguf, 64);
}

#[test]
fn qwen2_safetensors_f16_biases_tied() {
    check_hf("qwen2", 64);
}

#[test]
fn qwen3_safetensors_transformers5_config() {
    check_hf("qwen3", 64);
}

#[test]
fn gemma3_safetensors_transformers5_config_sliding_window() {
    check_hf("gemma3", 64);
}

/// A cache of max_position_embeddings positions, as a session at the model's full context has.
#[test]
fn minicpm4_dense_mup_longrope() {
    check_hf("minicpm4", 256);
}

/// The published MiniCPMLongRoPE picks its factors once, for max_position_embeddings (256 here, past the original
/// 32), and so uses long_factor at every length; an engine running with a short context must give the same logits.
#[test]
fn minicpm4_longrope_factors_do_not_depend_on_the_context_size() {
    check_hf("minicpm4", 16);
}

#[test]
fn blockffn_block_rms_router() {
    check_hf("blockffn_block_rms", 64);
}

#[test]
fn blockffn_block_linear_sum_router() {
    check_hf("blockffn_linear_sum", 64);
}

/// Phi-3 / Phi-4-mini from its HF files (fused qkv_proj and gate_up_proj, longrope with the original context at
/// the top level, 24 of 32 dims rotated, a window of 6 on both layers). Longrope's factors depend on the length:
/// transformers takes long_factor when the sequence passes original_max_position_embeddings (16), llama.cpp and
/// the engine when the session's cache does. expected.json holds 24 tokens (long under transformers' rule) and the
/// cache here is 64 (long under the engine's): both rules agree.
#[test]
fn phi3_safetensors_fused_longrope_partial_rotary_sliding_window() {
    phi3_hf("expected.json", 64);
}

/// Within the original context: 16 tokens (short_factor under transformers' rule, 16 is not past 16) and a cache
/// of 16 (short under the engine's).
#[test]
fn phi3_safetensors_short_factors_within_the_original_context() {
    phi3_hf("expected_short.json", 16);
}

/// The same model as llama.cpp's converter writes `phi3`: attn_qkv and a fused ffn_up, rows in HF's order,
/// rope_factors_long/short.weight, rope.scaling.attn_factor and original_context_length, attention.sliding_window
/// (applied, as transformers does; llama.cpp itself disables Phi-3's window on load).
#[test]
fn phi3_gguf_as_llama_cpp_writes_it() {
    phi3_gguf("expected.json", 64);
}

#[test]
fn phi3_gguf_short_factors_within_the_original_context() {
    phi3_gguf("expected_short.json", 16);
}

fn phi3_hf(file: &str, max_ctx: usize) -> f64 {
    let name = "phi3_safetensors";
    let d = dir(name);
    let cfg = LlamaConfig::from_hf(&d.join("config.json"))
        .unwrap_or_else(|e| panic!("{name}: config.json: {e} (missing fixture? run models/reference/tiny.py)"));
    let st = SafetensorsModel::open(&d).unwrap_or_else(|e| panic!("{name}: safetensors: {e}"));
    let label = format!("{name} {file} (cache {max_ctx})");
    check_file(name, file, &label, &st, cfg, Names::Hf, max_ctx)
}

fn phi3_gguf(file: &str, max_ctx: usize) -> f64 {
    let name = "phi3_gguf";
    let path = dir(name).join("model.gguf");
    let f = GgufFile::open(&path).unwrap_or_else(|e| panic!("missing fixture {}: {e}", path.display()));
    let cfg = LlamaConfig::from_gguf(&f).unwrap();
    let label = format!("{name} {file} (cache {max_ctx})");
    check_file(name, file, &label, &f, cfg, Names::Gguf, max_ctx)
}

/// MiniCPM4 with InfLLM-v2 sparse attention active (`sparse_config`: windows 8/4 and 32/16, blocks of 16, one init
/// block, one local block, topk 4, so 5 blocks per query; dense below 48 keys): 110 tokens in each step schedule
/// the fixture records (dense prefill chunks then decode across dense_len; one sparse prefill then decode; sparse
/// prefill chunks), every step's last position from `first_position` on against the numpy InfLLM-v2 of tiny.py.
/// Same bound as the dense checkpoints: the selection itself is stable under f32 rounding (the fixture's
/// `min_selection_margin`, the smallest relative score gap across a selection cut-off, is 1e-2, against ~1e-6
/// rounding). The engine with sparse attention switched off must miss the fixture by more than 10x the bound, or
/// the selection would not be exercised.
#[test]
fn minicpm4_infllm_v2_sparse_attention() {
    let name = "minicpm4_sparse";
    let d = dir(name);
    let cfg = LlamaConfig::from_hf(&d.join("config.json"))
        .unwrap_or_else(|e| panic!("{name}: config.json: {e} (missing fixture? run models/reference/tiny.py)"));
    assert!(cfg.sparse.is_some(), "{name}: sparse_config not read");
    let st = SafetensorsModel::open(&d).unwrap_or_else(|e| panic!("{name}: safetensors: {e}"));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(d.join("expected.json")).unwrap()).unwrap();
    let tokens: Vec<u32> = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    let first = v["first_position"].as_u64().unwrap() as usize;
    let logits: Vec<Vec<f32>> = v["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect();
    assert_eq!(first + logits.len(), tokens.len());
    let scale = v["max_abs_logit"].as_f64().unwrap().max(1.0);
    let bound = REL_BOUND * scale;
    let gap: Vec<f64> = v["gap"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let argmax: Vec<u32> = v["argmax"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    let diff = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs() as f64).fold(0.0, f64::max);
    let max_ctx = 128;
    let model = Llama::load(gpu(), &st, cfg.clone(), Names::Hf, |_, _| {}).unwrap();
    let (mut worst, mut failures) = (0f64, Vec::new());
    for (label, steps) in v["schedules"].as_object().unwrap() {
        let steps: Vec<usize> = steps
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as usize)
            .collect();
        for (p, got, arg) in run(&model, &tokens, &steps, max_ctx) {
            if p < first {
                continue;
            }
            let (i, err) = (p - first, diff(&got, &logits[p - first]));
            worst = worst.max(err);
            if err > bound {
                failures.push(format!("{label}, position {p}: max |diff| {err:.3e} > {bound:.3e}"));
            }
            if gap[i] > 2.0 * bound && arg != argmax[i] {
                failures.push(format!(
                    "{label}, position {p}: argmax {arg}, fixture {} (gap {})",
                    argmax[i], gap[i]
                ));
            }
        }
    }
    let mut dense_cfg = cfg;
    dense_cfg.sparse = None;
    let dense = Llama::load(gpu(), &st, dense_cfg, Names::Hf, |_, _| {}).unwrap();
    let steps = vec![1; tokens.len()];
    let apart = run(&dense, &tokens, &steps, max_ctx)
        .iter()
        .filter(|(p, ..)| *p >= first)
        .map(|(p, got, _)| diff(got, &logits[p - first]))
        .fold(0.0, f64::max);
    eprintln!(
        "{name}: max |engine - fixture| {worst:.3e} (bound {bound:.3e}, {:.2e} of max |logit|); dense engine misses by {apart:.3e}",
        worst / scale
    );
    assert!(
        apart > 10.0 * bound,
        "dense attention matches the sparse fixture ({apart:.3e}): selection not exercised"
    );
    assert!(
        failures.is_empty(),
        "{name} disagrees with the fixture:\n{}",
        failures.join("\n")
    );
}
