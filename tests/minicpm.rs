//! MiniCPM4 end to end on a tiny random checkpoint in the published layout: config parsing (muP scalings,
//! longrope, sparse_config) and the GPU step graph against the CPU reference forward, at every step.

mod common;

use common::gpu::{gpu, nmse};
use common::steps::{prefill_then_decode, run_steps};
use shaderlm::gpu::{Gpu, GpuOptions};
use std::sync::OnceLock;

use common::minicpm::{write_minicpm, write_minicpm_gguf, ORIGINAL_MAX};
use shaderlm::loader::safetensors::SafetensorsModel;
use shaderlm::model::load::LoadedModel;
use shaderlm::model::{
    reference, Arch, AttentionMode, Llama, LlamaConfig, LoadOptions, Names, SparseOverrides, StepOutputs,
};

fn tokens(n: usize, vocab: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 11) % vocab as u32).collect()
}

/// Feeds `tokens[..prompt]` in steps of at most `chunk` tokens, then decodes the rest one at a time, with a
/// cache of `max_ctx` positions; returns (position, logits) of the last token of every step.
fn run_gpu(model: &Llama, tokens: &[u32], prompt: usize, chunk: usize, max_ctx: usize) -> Vec<(usize, Vec<f32>)> {
    let steps = prefill_then_decode(tokens.len(), prompt, chunk);
    run_steps(gpu(), model, tokens, &steps, max_ctx, LOGITS)
        .into_iter()
        .map(|(p, out)| (p, out.logits))
        .collect()
}

const LOGITS: StepOutputs = StepOutputs {
    logits: true,
    argmax: false,
    topk: 0,
    router: false,
    hidden: false,
    aux_hidden: false,
    lse: false,
};

#[test]
fn config_reads_mup_longrope_and_sparse_config() {
    let dir = tempfile::tempdir().unwrap();
    let sparse = serde_json::json!({"kernel_size": 32, "kernel_stride": 16, "block_size": 64, "init_blocks": 1,
        "window_size": 2048, "topk": 64, "use_nope": false, "dense_len": 8192});
    let t = write_minicpm(dir.path(), 1, Some(sparse));
    let c = LlamaConfig::from_hf(&dir.path().join("config.json")).unwrap();
    assert_eq!(c.arch, Arch::MiniCpm);
    assert_eq!(c.mup.emb, 12.0);
    assert!((c.mup.residual - 0.35 / (t.layers as f32).sqrt()).abs() < 1e-7);
    assert_eq!(c.mup.logit, 16.0 / t.hidden as f32);
    let shaderlm::model::config::RopeScaling::LongRope(l) = &c.rope_scaling else {
        panic!("not longrope: {:?}", c.rope_scaling)
    };
    assert_eq!(l.original_max, ORIGINAL_MAX);
    // sqrt(1 + ln(256 / 32) / ln(32)) = sqrt(1.6)
    assert!((l.attn_factor - 1.6f32.sqrt()).abs() < 1e-6, "{}", l.attn_factor);
    // MiniCPM's own MiniCPMLongRoPE builds its table for max_position_embeddings (256 > 32): the long factors,
    // for a cache within the original context too (tests/tiny_fixtures.rs checks this against that code).
    assert_eq!(l.factors(ORIGINAL_MAX)[1], 1.9);
    assert_eq!(l.factors(ORIGINAL_MAX + 1)[1], 1.9);
    let mut by_session = l.clone();
    by_session.fixed_ctx = None;
    assert_eq!(by_session.factors(ORIGINAL_MAX)[1], 1.05);
    let s = c.sparse.unwrap();
    assert_eq!((s.kernel_size, s.kernel_stride, s.block_size), (32, 16, 64));
    assert_eq!((s.init_blocks, s.window_size, s.topk, s.dense_len), (1, 2048, 64, 8192));
}

#[test]
fn bad_minicpm_configs_are_named() {
    let dir = tempfile::tempdir().unwrap();
    write_minicpm(dir.path(), 1, Some(serde_json::json!({"block_size": 60})));
    let e = LlamaConfig::from_hf(&dir.path().join("config.json"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("sparse attention settings"), "{e}");
    write_minicpm(dir.path(), 1, None);
    let path = dir.path().join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v["rope_scaling"]["long_factor"] = serde_json::json!([1.0, 2.0]);
    std::fs::write(&path, v.to_string()).unwrap();
    let e = LlamaConfig::from_hf(&path).unwrap_err().to_string();
    assert!(e.contains("long_factor"), "{e}");
}

/// The muP scalings and longrope (MiniCPM's long factors for every cache size, see above):
/// chunked prefill then decode, every step's logits against the CPU reference. Bound as in tests/model.rs: f32
/// on both sides, differing in summation order only (NMSE 1e-8; an indexing or scaling mistake gives > 1e-3).
#[test]
fn minicpm_dense_matches_the_cpu_reference() {
    let dir = tempfile::tempdir().unwrap();
    let t = write_minicpm(dir.path(), 5, None);
    let cfg = LlamaConfig::from_hf(&dir.path().join("config.json")).unwrap();
    let st = SafetensorsModel::open(dir.path()).unwrap();
    let model = Llama::load(gpu(), &st, cfg.clone(), Names::Hf, |_, _| {}).unwrap();
    for max_ctx in [ORIGINAL_MAX, 64] {
        let ids = tokens(if max_ctx == 64 { 40 } else { 20 }, t.vocab);
        let want = reference::logits_with(&st, &cfg, Names::Hf, &ids, max_ctx).unwrap();
        for (p, logits) in run_gpu(&model, &ids, ids.len() - 4, 7, max_ctx) {
            let e = nmse(&logits, &want[p]);
            assert!(e < 1e-8, "ctx {max_ctx}, position {p}: nmse {e:.3e}");
        }
    }
}

/// MiniCPM4-8B's embedding (73448 x 4096 f16, 602 MB) is larger than a storage binding on many adapters: with
/// the binding limit forced down to 16 KiB every matrix of the tiny model is split into row parts, and the logits
/// must not change.
#[test]
fn minicpm_runs_with_tensors_split_across_bindings() {
    static SMALL: OnceLock<Gpu> = OnceLock::new();
    let small = SMALL.get_or_init(|| {
        let opts = GpuOptions {
            max_binding_override: Some(16 << 10),
            ..Default::default()
        };
        Gpu::new(&opts).unwrap_or_else(|e| panic!("the GPU tests need an adapter: {e}"))
    });
    let dir = tempfile::tempdir().unwrap();
    let t = write_minicpm(dir.path(), 9, None);
    let cfg = LlamaConfig::from_hf(&dir.path().join("config.json")).unwrap();
    let st = SafetensorsModel::open(dir.path()).unwrap();
    let model = Llama::load(small, &st, cfg.clone(), Names::Hf, |_, _| {}).unwrap();
    let ids = tokens(12, t.vocab);
    let want = reference::logits_with(&st, &cfg, Names::Hf, &ids, 24).unwrap();
    assert!(
        t.vocab * t.hidden * 4 > 4 * (16 << 10),
        "the embedding must need several parts"
    );
    let (_, out) = &run_steps(small, &model, &ids, &[ids.len()], 24, LOGITS)[0];
    let e = nmse(&out.logits, &want[ids.len() - 1]);
    assert!(e < 1e-8, "nmse {e:.3e}");
}

/// A tiny sparse_config (windows 8/4 and 32/16, blocks of 16, dense below 48 keys; budget topk + local = 6: the
/// init block, 2 local blocks and the query's own are forced, 2 more by score) so a 110-token run crosses dense_len
/// and scores among up to 7 blocks: chunked prefill (sparse and dense steps, the prefill kernels) and decode (the
/// split kernels), every step against the CPU reference replaying the same steps. Bound as above; the sparse run
/// must also differ from a dense one, or the test would not see the selection at all.
#[test]
fn minicpm_sparse_attention_matches_the_cpu_reference() {
    let dir = tempfile::tempdir().unwrap();
    let sparse = serde_json::json!({"kernel_size": 8, "kernel_stride": 4, "block_size": 16, "init_blocks": 1,
        "window_size": 32, "topk": 4, "use_nope": false, "dense_len": 48});
    let t = write_minicpm(dir.path(), 21, Some(sparse));
    let cfg = LlamaConfig::from_hf(&dir.path().join("config.json")).unwrap();
    let st = SafetensorsModel::open(dir.path()).unwrap();
    let model = Llama::load(gpu(), &st, cfg.clone(), Names::Hf, |_, _| {}).unwrap();
    let (max_ctx, prompt, chunk) = (128, 90, 20);
    let ids = tokens(110, t.vocab);
    let steps = prefill_then_decode(ids.len(), prompt, chunk);
    let want = reference::logits_steps(&st, &cfg, Names::Hf, &ids, max_ctx, &steps).unwrap();
    let mut dense_cfg = cfg.clone();
    dense_cfg.sparse = None;
    let dense = reference::logits_with(&st, &dense_cfg, Names::Hf, &ids, max_ctx).unwrap();
    let apart = nmse(&dense[ids.len() - 1], &want[ids.len() - 1]);
    assert!(
        apart > 1e-6,
        "sparse and dense attention agree (nmse {apart:.2e}): the selection is not exercised"
    );
    let mut worst = 0f64;
    for (p, logits) in run_gpu(&model, &ids, prompt, chunk, max_ctx) {
        let e = nmse(&logits, &want[p]);
        assert!(
            e < 1e-8,
            "position {p}: nmse {e:.3e} against the sparse reference ({:.3e} against the dense one)",
            nmse(&logits, &dense[p])
        );
        worst = worst.max(e);
    }
    println!("sparse MiniCPM: worst nmse {worst:.3e} (sparse vs dense reference {apart:.2e})");
}

/// MiniCPM as llama.cpp's converter writes it to GGUF (architecture `minicpm`: permuted q/k rows, the muP factors
/// as embedding/residual/logit scales, longrope factors as tensors) is the same model as its Hugging Face layout:
/// the CPU forwards of both agree, and the GPU matches on the GGUF at every step.
#[test]
fn minicpm_gguf_is_the_hugging_face_model() {
    let dir = tempfile::tempdir().unwrap();
    let t = write_minicpm(dir.path(), 9, None);
    let hf_cfg = LlamaConfig::from_hf(&dir.path().join("config.json")).unwrap();
    let st = SafetensorsModel::open(dir.path()).unwrap();
    let path = dir.path().join("tiny.gguf");
    write_minicpm_gguf(&path, &t, 9);
    let f = shaderlm::loader::gguf::GgufFile::open(&path).unwrap();
    let cfg = LlamaConfig::from_gguf(&f).unwrap();
    assert_eq!(cfg.arch, Arch::MiniCpm);
    assert_eq!(cfg.rope_scaling, hf_cfg.rope_scaling);
    let close = |a: f32, b: f32| (a - b).abs() <= 1e-6 * b.abs();
    assert!(close(cfg.mup.emb, hf_cfg.mup.emb) && close(cfg.mup.residual, hf_cfg.mup.residual));
    assert!(
        close(cfg.mup.logit, hf_cfg.mup.logit),
        "{:?} vs {:?}",
        cfg.mup,
        hf_cfg.mup
    );
    let ids = tokens(20, t.vocab);
    let max_ctx = 64;
    let want = reference::logits_with(&f, &cfg, Names::Gguf, &ids, max_ctx).unwrap();
    let hf = reference::logits_with(&st, &hf_cfg, Names::Hf, &ids, max_ctx).unwrap();
    for (p, (a, b)) in want.iter().zip(&hf).enumerate() {
        let e = nmse(a, b);
        assert!(e < 1e-10, "position {p}: GGUF and HF layouts differ (nmse {e:.3e})");
    }
    let model = Llama::load(gpu(), &f, cfg, Names::Gguf, |_, _| {}).unwrap();
    for (p, logits) in run_gpu(&model, &ids, 16, 7, max_ctx) {
        let e = nmse(&logits, &want[p]);
        assert!(e < 1e-8, "position {p}: nmse {e:.3e}");
    }
}

/// `LoadOptions::attention` decides the config before upload: the model's own `sparse_config` (with overrides),
/// dense, or sparse settings that do not fit together, refused before anything is allocated.
#[test]
fn load_options_choose_the_attention_before_upload() {
    let dir = tempfile::tempdir().unwrap();
    let sparse = serde_json::json!({"kernel_size": 8, "kernel_stride": 4, "block_size": 16, "init_blocks": 1,
        "window_size": 32, "topk": 4, "use_nope": false, "dense_len": 48});
    write_minicpm(dir.path(), 3, Some(sparse));
    let open = |attention| {
        let opts = LoadOptions {
            attention,
            ..LoadOptions::with_ctx(64)
        };
        LoadedModel::open(gpu(), dir.path(), &opts, |_, _| {}).map(|m| m.model.cfg.sparse)
    };
    let own = open(AttentionMode::default()).unwrap().unwrap();
    assert_eq!((own.block_size, own.topk, own.dense_len), (16, 4, 48));
    let topk = SparseOverrides {
        topk: Some(2),
        ..Default::default()
    };
    assert_eq!(open(AttentionMode::Model(topk)).unwrap().unwrap().topk, 2);
    assert_eq!(open(AttentionMode::Dense).unwrap(), None);
    let window = SparseOverrides {
        window_size: Some(100),
        ..Default::default()
    };
    let e = open(AttentionMode::Sparse(window)).unwrap_err().to_string();
    assert!(e.contains("sparse attention settings do not fit together"), "{e}");
}
