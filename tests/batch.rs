//! Sessions decoding together decode what each decodes alone: every row of a batched step ([`Batch`]) equals that
//! session's own one-token step bit for bit (logits and argmax), with the sessions at different positions and
//! contexts, batches of 2 to 8 whose members change from step to step (the rest stepping alone), across
//! architectures and weight formats, and on the real default model.

mod common;

use common::gpu::gpu;
use common::steps::{bits, tokens, weights, LOGITS_AND_ARGMAX};
use common::tiny::{phi3, write_gguf, write_gguf_v_apart, write_hf, Tiny};
use shaderlm::generate::batch::Batch;
use shaderlm::generate::Generator;
use shaderlm::model::load::LoadedModel;
use shaderlm::model::{Llama, LoadOptions};
use shaderlm::quant::GgmlType;
use std::path::Path;

/// Which sessions step together at step `t` of `n` sessions: all of them, then the even ones, then the first two
/// and the last, ... (every session is in at least every other step; the rest step alone).
fn members(t: usize, n: usize) -> Vec<usize> {
    match t % 4 {
        0 | 2 => (0..n).collect(),
        1 => (0..n).step_by(2).collect(),
        _ => (0..n).filter(|&s| s < 2 || s == n - 1).collect(),
    }
}

/// `prompts.len()` sessions (session `s` with a cache of `ctxs[s % ctxs.len()]` positions) each decode `steps`
/// greedy tokens alone, recording every step's logits and argmax; then again from the same prompts with the
/// sessions stepping together by [`members`]. Every row must equal the session's step alone bit for bit.
fn batch_rows_equal_decode_steps(label: &str, model: &Llama, prompts: &[Vec<u32>], ctxs: &[usize], steps: usize) {
    let gpu = gpu();
    assert!(model.can_batch(gpu), "{label}: the model cannot batch on this adapter");
    let n = prompts.len();
    let ctx = |s: usize| ctxs[s % ctxs.len()];
    // (ids fed, outputs after each) per session, alone.
    let mut want = Vec::new();
    for (s, prompt) in prompts.iter().enumerate() {
        let mut gen = Generator::new(gpu, model, ctx(s), LOGITS_AND_ARGMAX).unwrap();
        gen.feed(prompt).unwrap();
        let mut fed = Vec::new();
        let mut outs = Vec::new();
        for _ in 0..steps {
            let t = gen.result.argmax.unwrap();
            gen.feed(&[t]).unwrap();
            fed.push(t);
            outs.push((bits(&gen.result.logits), gen.result.argmax.unwrap()));
        }
        want.push((fed, outs));
    }
    let mut gens: Vec<Generator> = (0..n)
        .map(|s| Generator::new(gpu, model, ctx(s), LOGITS_AND_ARGMAX).unwrap())
        .collect();
    for (g, p) in gens.iter_mut().zip(prompts) {
        g.feed(p).unwrap();
    }
    let mut batch = Batch::new(LOGITS_AND_ARGMAX);
    let vocab = model.cfg.vocab;
    let mut done = vec![0usize; n];
    let mut batched_rows = 0;
    for t in 0..2 * steps {
        let keys: Vec<usize> = members(t, n).into_iter().filter(|&s| done[s] < steps).collect();
        if keys.is_empty() {
            continue;
        }
        let ids: Vec<u32> = keys.iter().map(|&s| want[s].0[done[s]]).collect();
        let mut members: Vec<&mut Generator> = gens
            .iter_mut()
            .enumerate()
            .filter(|(s, _)| keys.contains(s))
            .map(|(_, g)| g)
            .collect();
        batch.feed(&keys, &mut members, &ids).unwrap();
        batched_rows += keys.len();
        for (r, &s) in keys.iter().enumerate() {
            let (logits, argmax) = &want[s].1[done[s]];
            let got = bits(&batch.result.logits[r * vocab..(r + 1) * vocab]);
            let at = prompts[s].len() + done[s];
            assert!(
                got == *logits,
                "{label}: session {s} (row {r} of {}) at position {at} differs from its step alone",
                keys.len()
            );
            assert_eq!(
                batch.result.row_argmax[r], *argmax,
                "{label}: argmax of session {s} at {at}"
            );
            done[s] += 1;
        }
        // The sessions left out step alone, as the server runs a session with drafts.
        for s in 0..n {
            if keys.contains(&s) || done[s] >= steps || t % 3 != 0 {
                continue;
            }
            gens[s].feed(&[want[s].0[done[s]]]).unwrap();
            assert!(
                bits(&gens[s].result.logits) == want[s].1[done[s]].0,
                "{label}: session {s} alone"
            );
            done[s] += 1;
        }
    }
    assert!(
        done.iter().all(|&d| d == steps),
        "{label}: sessions left behind: {done:?}"
    );
    assert!(
        batched_rows >= n * steps / 2,
        "{label}: only {batched_rows} batched rows"
    );
}

/// Prompts of different lengths, so the sessions sit at different positions.
fn prompts(n: usize, vocab: usize) -> Vec<Vec<u32>> {
    (0..n).map(|s| tokens(3 + 5 * s, vocab, s as u32)).collect()
}

#[test]
fn batch_rows_equal_decode_steps_llama_gguf_formats_and_sizes() {
    for (ty, sessions) in [
        (GgmlType::F32, 3),
        (GgmlType::F16, 5),
        (GgmlType::Q4_0, 2),
        (GgmlType::Q4_1, 4),
        (GgmlType::Q8_0, 8),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        write_gguf(&path, &Tiny::llama(), 41, ty);
        let model = weights(&path);
        let label = format!("llama {ty} x{sessions}");
        batch_rows_equal_decode_steps(&label, &model, &prompts(sessions, 101), &[96, 64], 10);
    }
}

/// Models with q/k norms (so rope_kv stays a dispatch) from GGUF in quantized formats, whose one-token steps run
/// fused on CPU adapters with subgroups while batched steps run the unfused kernels: Gemma 3 (its post-norms and
/// residual adds in the GEMVs' prologues, `matmul_q_post_norm`) and Qwen3; q|k|v as one weight, and as q|k and v
/// in two formats (one dispatch, `matmul_q_two_normed`). There the decode step keeps within the fused budget of 6
/// dispatches per layer + 10.
#[test]
fn batch_rows_equal_decode_steps_qk_norm_ggufs_fused() {
    let mut qwen3 = Tiny::qwen2();
    qwen3.arch = "qwen3";
    for t in [Tiny::gemma3(), qwen3] {
        for (ty, v_ty) in [(GgmlType::Q4_0, GgmlType::Q4_0), (GgmlType::Q4_1, GgmlType::Q8_0)] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("tiny.gguf");
            write_gguf_v_apart(&path, &t, 44, ty, v_ty);
            let model = weights(&path);
            let label = format!("{} {ty} v {v_ty}", t.arch);
            batch_rows_equal_decode_steps(&label, &model, &prompts(3, 101), &[64, 96], 8);
            let caps = &gpu().caps;
            if caps.cpu_adapter && caps.subgroups && caps.subgroup_size >= 8 {
                let mut gen = Generator::new(gpu(), &model, 64, LOGITS_AND_ARGMAX).unwrap();
                gen.feed(&[1, 2, 3]).unwrap();
                let dispatches = gen.decode_dispatches().unwrap();
                assert!(
                    dispatches <= 6 * t.layers + 10,
                    "{label}: {dispatches} dispatches per decode step for {} layers",
                    t.layers
                );
            }
        }
    }
}

#[test]
fn batch_rows_equal_decode_steps_hf_architectures() {
    let mut cases: Vec<(&str, Tiny)> = Vec::new();
    let mut qwen2 = Tiny::llama();
    qwen2.arch = "qwen2";
    cases.push(("qwen2", qwen2));
    // Gemma 3: windows of 5 keys on 5 of 6 layers, each session's own rotations per layer kind.
    cases.push(("gemma3", Tiny::gemma3()));
    // Phi-3's longrope: the sessions' caches of 16 and 96 positions rotate with the short and long factors.
    cases.push(("phi3", phi3()));
    for (label, t) in cases {
        let dir = tempfile::tempdir().unwrap();
        write_hf(dir.path(), &t, 42, false);
        let model = weights(dir.path());
        let ctxs: &[usize] = if label == "phi3" { &[96, 16] } else { &[64] };
        batch_rows_equal_decode_steps(label, &model, &prompts(3, 101)[..], ctxs, 8);
    }
}

#[test]
fn batch_rows_equal_decode_steps_smollm2() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "this test needs the default model: run `bash models/fetch.sh`"
    );
    let loaded = LoadedModel::open(gpu(), &path, &LoadOptions::with_ctx(256), |_, _| {}).unwrap();
    let tok = &loaded.tokenizer;
    let prompts: Vec<Vec<u32>> = ["The capital of France is", "def fib(n):", "Once upon a time, in a land"]
        .iter()
        .map(|p| tok.encode(p, true).unwrap())
        .collect();
    batch_rows_equal_decode_steps("smollm2", &loaded.model, &prompts, &[256], 6);
}

#[test]
fn a_batch_refuses_mismatched_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_gguf(&path, &Tiny::llama(), 43, GgmlType::Q8_0);
    let model = weights(&path);
    let gpu = gpu();
    let mut a = Generator::new(gpu, &model, 8, LOGITS_AND_ARGMAX).unwrap();
    let mut b = Generator::new(gpu, &model, 8, LOGITS_AND_ARGMAX).unwrap();
    a.feed(&[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    b.feed(&[1]).unwrap();
    let mut batch = Batch::new(LOGITS_AND_ARGMAX);
    let err = batch
        .feed(&[0, 1], &mut [&mut a, &mut b], &[9, 9])
        .unwrap_err()
        .to_string();
    assert!(err.contains("do not fit the context"), "{err}");
    let err = batch.feed(&[0], &mut [&mut b], &[500]).unwrap_err().to_string();
    assert!(err.contains("outside the vocabulary"), "{err}");
    let err = batch.feed(&[0, 1], &mut [&mut b], &[9]).unwrap_err().to_string();
    assert!(err.contains("1 sessions with 2 keys"), "{err}");
    assert_eq!(b.tokens.len(), 1, "a refused step feeds nothing");
}
