//! BlockFFN end to end on tiny random checkpoints in the published layout (both `ffn_type`s, every router norm):
//! config parsing, the GPU step graph with the sparse expert kernels against the CPU reference forward at every
//! step, `generate --stats`, and bad configs.

mod common;

use common::gpu::{gpu, nmse};
use common::steps::{prefill_then_decode, run_steps};

use common::blockffn::{write_blockffn, EXPERTS, EXPERT_SIZE};
use shaderlm::loader::safetensors::SafetensorsModel;
use shaderlm::model::config::RouterNormKind;
use shaderlm::model::{reference, Llama, LlamaConfig, Names, StepOutputs};
use std::process::Command;

#[test]
fn config_reads_the_blockffn_fields() {
    let dir = tempfile::tempdir().unwrap();
    write_blockffn(dir.path(), 1, "block", "sum");
    let c = LlamaConfig::from_hf(&dir.path().join("config.json")).unwrap();
    let m = c.moe.unwrap();
    assert_eq!(
        (m.experts, m.expert_size, m.per_expert_tensors),
        (EXPERTS, EXPERT_SIZE, true)
    );
    assert_eq!(m.norm, RouterNormKind::Sum { scale: 1.5 });
    let path = dir.path().join("config.json");
    for (key, value, needle) in [
        ("num_shared_experts", serde_json::json!(2), "shared experts"),
        ("router_act", serde_json::json!("gelu"), "router_act"),
        ("expert_size", serde_json::json!(40), "multiple of 32"),
        ("norm_after_router", serde_json::json!("softmax"), "norm_after_router"),
        ("ffn_type", serde_json::json!("moe"), "ffn_type"),
    ] {
        write_blockffn(dir.path(), 1, "block", "sum");
        let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        v[key] = value;
        std::fs::write(&path, v.to_string()).unwrap();
        let e = LlamaConfig::from_hf(&path).unwrap_err().to_string();
        assert!(e.contains(needle), "{key}: {e}");
    }
}

/// Prefill (the chunk kernels over the union of the chunk's experts) then decode (one token's experts), every
/// step's logits against the CPU reference (`BlockMLP` over all experts, inactive ones weighted 0). Bound as for
/// the other tiny models (f32 on both sides, NMSE 1e-8); a skipped expert or a wrong router weight gives > 1e-4.
#[test]
fn blockffn_matches_the_cpu_reference() {
    for (ffn_type, norm) in [("block", "rms"), ("block_linear", "sum"), ("block", "none")] {
        let dir = tempfile::tempdir().unwrap();
        let t = write_blockffn(dir.path(), 3, ffn_type, norm);
        let cfg = LlamaConfig::from_hf(&dir.path().join("config.json")).unwrap();
        let st = SafetensorsModel::open(dir.path()).unwrap();
        let ids: Vec<u32> = (0..24u32).map(|i| (i * 29 + 5) % t.vocab as u32).collect();
        let want = reference::logits_with(&st, &cfg, Names::Hf, &ids, 64).unwrap();
        let model = Llama::load(gpu(), &st, cfg, Names::Hf, |_, _| {}).unwrap();
        let out = StepOutputs {
            logits: true,
            router: true,
            hidden: false,
            ..Default::default()
        };
        let steps = prefill_then_decode(ids.len(), 16, 16);
        for (p, got) in run_steps(gpu(), &model, &ids, &steps, 64, out) {
            let e = nmse(&got.logits, &want[p]);
            assert!(e < 1e-8, "{ffn_type}/{norm}, position {p}: nmse {e:.3e}");
            // Some experts must be inactive and some active, or the sparse path is not exercised.
            let r = &got.router[0];
            let active = r.iter().filter(|&&v| v != 0.0).count();
            assert!(
                active > 0 && active < r.len(),
                "{ffn_type}/{norm}: {active} of {} active",
                r.len()
            );
        }
    }
}

#[test]
fn generate_stats_reports_sparsity_per_layer() {
    let dir = tempfile::tempdir().unwrap();
    write_blockffn(dir.path(), 4, "block", "rms");
    let out = Command::new(env!("CARGO_BIN_EXE_shaderlm"))
        .args([
            "generate",
            "-m",
            dir.path().to_str().unwrap(),
            "--prompt",
            "hello world hello",
            "-n",
            "12",
        ])
        .args(["--temp", "0", "--ignore-eos", "--stats"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("chunk-level sparsity (8 tokens)"), "{err}");
    let rows: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("| 0 |") || l.starts_with("| 1 |"))
        .collect();
    assert_eq!(rows.len(), 2, "{err}");
    for row in rows {
        let pct: Vec<f64> = row
            .split('|')
            .filter_map(|c| c.trim().strip_suffix('%'))
            .map(|c| c.parse().unwrap())
            .collect();
        assert_eq!(pct.len(), 2, "{row}");
        assert!(pct.iter().all(|p| (0.0..100.0).contains(p)), "{row}");
        assert!(
            pct[1] <= pct[0],
            "a chunk's union cannot be sparser than its tokens: {row}"
        );
    }
}
