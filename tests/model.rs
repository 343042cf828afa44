//! End to end on tiny random checkpoints in the real layouts: the GPU step graph (prefill through the tiled
//! attention, decode through the split-KV kernel) against the CPU reference forward, logits at every step.

mod common;

use common::gpu::{gpu, nmse};
use common::steps::{prefill_then_decode, run_steps, LOGITS_AND_ARGMAX};

use common::tiny::{
    phi3, write_gguf, write_gguf_typed, write_gguf_types, write_gguf_v_apart, write_hf, Tiny, GEMMA_WINDOW,
    PHI3_ROPE_DIM, PHI3_WINDOW,
};
use shaderlm::loader::gguf::GgufFile;
use shaderlm::loader::safetensors::SafetensorsModel;
use shaderlm::model::weights::WeightSource;
use shaderlm::model::{reference, Llama, LlamaConfig, Names};
use shaderlm::quant::GgmlType;

/// Prefill `prompt` in one step, then decode the rest one token at a time; every step's logits must match the
/// CPU reference. Bound: f32 math on both sides differing only in summation order (NMSE ~1e-12..1e-10 per op,
/// growing through 2 layers); 1e-8 leaves margin while any indexing or masking mistake gives > 1e-3.
fn check(src: &dyn WeightSource, cfg: LlamaConfig, names: Names, tokens: &[u32], prompt: usize) {
    let gpu = gpu();
    let want = reference::logits(src, &cfg, names, tokens).unwrap();
    let model = Llama::load(gpu, src, cfg, names, |_, _| {}).unwrap();
    let steps = prefill_then_decode(tokens.len(), prompt, prompt);
    for (p, out) in run_steps(gpu, &model, tokens, &steps, 64, LOGITS_AND_ARGMAX) {
        let e = nmse(&out.logits, &want[p]);
        assert!(e < 1e-8, "position {p}: logits nmse {e:e}");
        let (arg, best) = (out.argmax.unwrap(), shaderlm::sampling::argmax(&want[p]));
        assert_eq!(arg, best, "position {p}: GPU argmax {arg}, reference {best}");
    }
}

fn tokens(n: usize, vocab: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 11) % vocab as u32).collect()
}

#[test]
fn tiny_llama_safetensors_f32_prefill_and_decode() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), &Tiny::llama(), 1, false);
    let cfg = LlamaConfig::from_hf(&dir.path().join("config.json")).unwrap();
    let st = SafetensorsModel::open(dir.path()).unwrap();
    // 13 prompt tokens take the tiled prefill kernel; then 4 decode steps.
    check(&st, cfg, Names::Hf, &tokens(17, 101), 13);
}

#[test]
fn tiny_llama_safetensors_f16_short_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Tiny::llama();
    t.tied = false;
    write_hf(dir.path(), &t, 2, true);
    let cfg = LlamaConfig::from_hf(&dir.path().join("config.json")).unwrap();
    let st = SafetensorsModel::open(dir.path()).unwrap();
    // 5 prompt tokens go through the split-KV kernel with several queries.
    check(&st, cfg, Names::Hf, &tokens(9, 101), 5);
}

#[test]
fn tiny_qwen2_and_qwen3_safetensors() {
    for arch in ["qwen2", "qwen3"] {
        let dir = tempfile::tempdir().unwrap();
        let mut t = Tiny::llama();
        t.arch = arch;
        t.kv_heads = 1;
        write_hf(dir.path(), &t, 3, false);
        let cfg = LlamaConfig::from_hf(&dir.path().join("config.json")).unwrap();
        assert_eq!((cfg.qkv_bias, cfg.qk_norm), (arch == "qwen2", arch == "qwen3"));
        let st = SafetensorsModel::open(dir.path()).unwrap();
        check(&st, cfg, Names::Hf, &tokens(12, 101), 10);
    }
}

#[test]
fn tiny_llama_gguf_f32_and_f16() {
    for ty in [GgmlType::F32, GgmlType::F16] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        write_gguf(&path, &Tiny::llama(), 4, ty);
        let f = GgufFile::open(&path).unwrap();
        let cfg = LlamaConfig::from_gguf(&f).unwrap();
        check(&f, cfg, Names::Gguf, &tokens(14, 101), 11);
    }
}

#[test]
fn tiny_llama_gguf_with_gate_and_up_stored_differently() {
    // gate F16 and up F32 cannot be stacked into one matmul: the two-matmul path must give the same logits.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_gguf_types(&path, &Tiny::llama(), 5, GgmlType::F16, Some(GgmlType::F32));
    let f = GgufFile::open(&path).unwrap();
    let cfg = LlamaConfig::from_gguf(&f).unwrap();
    check(&f, cfg, Names::Gguf, &tokens(12, 101), 10);
}

#[test]
fn tiny_llama_gguf_with_q_k_v_stored_in_two_groups() {
    // v in another type than q and k (Qwen2.5's Q4_K_M mixes do this): q|k is one matmul and v another; then q alone
    // and k|v stacked. rope_kv reads q, k and v from the two outputs.
    for odd_one in ["attn_v", "attn_q"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        let ty_of = |name: &str| {
            if name.contains(odd_one) {
                GgmlType::F32
            } else {
                GgmlType::F16
            }
        };
        write_gguf_typed(&path, &Tiny::llama(), 8, &ty_of);
        let f = GgufFile::open(&path).unwrap();
        let cfg = LlamaConfig::from_gguf(&f).unwrap();
        check(&f, cfg, Names::Gguf, &tokens(12, 101), 10);
    }
}

#[test]
fn tiny_qwen2_gguf_quantized_rotate_half_pairs() {
    // Qwen2 GGUFs pair dims j and j + head_dim / 2 (rotate-half); with block-quantized q/k the engine loads their rows
    // (and biases) in interleaved order and rotates interleaved pairs, its decode steps in the fused q|k|v GEMVs'
    // epilogue (q|k and v, stored in another type, in one dispatch). The reference keeps the file's order and pairing.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_gguf_v_apart(&path, &Tiny::qwen2(), 11, GgmlType::Q8_0, GgmlType::Q4_1);
    let f = GgufFile::open(&path).unwrap();
    let cfg = LlamaConfig::from_gguf(&f).unwrap();
    assert_eq!(cfg.rope_style, shaderlm::ops::rope::RopeStyle::RotateHalf);
    check(&f, cfg, Names::Gguf, &tokens(12, 101), 8);
}

#[test]
fn tiny_gemma3_safetensors_and_gguf_are_one_model() {
    // 17 tokens, prompt 13: sliding windows of 5 keys on layers 0..5 cut into every prompt row past the 5th and
    // every decode step; layer 5 is global. The HF directory (norms stored as w, x * (1 + w)) and the GGUF (1 + w)
    // hold the same model, so both must match the reference and therefore each other.
    let t = Tiny::gemma3();
    let ids = tokens(17, 101);
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), &t, 6, false);
    let cfg = LlamaConfig::from_hf(&dir.path().join("config.json")).unwrap();
    assert_eq!(cfg.arch, shaderlm::model::Arch::Gemma3);
    assert_eq!((0..6).map(|i| cfg.layer_window(i)).collect::<Vec<_>>(), {
        let mut w = vec![Some(GEMMA_WINDOW); 5];
        w.push(None);
        w
    });
    assert_eq!(cfg.layer_rope(0).0, 10000.0);
    assert_eq!(cfg.layer_rope(5).0, 1000000.0);
    let st = SafetensorsModel::open(dir.path()).unwrap();
    let hf_logits = reference::logits(&st, &cfg, Names::Hf, &ids).unwrap();
    check(&st, cfg.clone(), Names::Hf, &ids, 13);
    let path = dir.path().join("tiny.gguf");
    write_gguf(&path, &t, 6, GgmlType::F32);
    let f = GgufFile::open(&path).unwrap();
    let gcfg = LlamaConfig::from_gguf(&f).unwrap();
    assert_eq!(gcfg.sliding, cfg.sliding);
    let gguf_logits = reference::logits(&f, &gcfg, Names::Gguf, &ids).unwrap();
    for (a, b) in hf_logits.iter().zip(&gguf_logits) {
        assert!(nmse(a, b) < 1e-10, "HF and GGUF layouts differ: {:e}", nmse(a, b));
    }
    check(&f, gcfg, Names::Gguf, &ids, 13);
    // Without the window the logits change: the test would notice a kernel that ignores it.
    let mut no_window = LlamaConfig::from_hf(&dir.path().join("config.json")).unwrap();
    no_window.sliding.as_mut().unwrap().window = 1000;
    let wide = reference::logits(&st, &no_window, Names::Hf, &ids).unwrap();
    assert!(nmse(&wide[16], &hf_logits[16]) > 1e-4);
}

#[test]
fn tiny_phi3_fused_matrices_in_safetensors_and_gguf() {
    // Fused q|k|v and gate|up, partial rotary, longrope (long factors: both contexts pass the original 32) and a
    // sliding window of 7 on every layer, crossed by the 17 tokens. The HF directory (top-level
    // original_max_position_embeddings, as Phi-3 writes it) and the GGUF (llama.cpp's factor tensors) are one model.
    let t = phi3();
    let ids = tokens(17, 101);
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), &t, 7, false);
    let cfg = LlamaConfig::from_hf(&dir.path().join("config.json")).unwrap();
    assert_eq!((cfg.arch, cfg.rope_dim), (shaderlm::model::Arch::Phi3, PHI3_ROPE_DIM));
    assert!((0..t.layers).all(|i| cfg.layer_window(i) == Some(PHI3_WINDOW)));
    assert!(matches!(
        cfg.rope_scaling,
        shaderlm::model::config::RopeScaling::LongRope(_)
    ));
    let st = SafetensorsModel::open(dir.path()).unwrap();
    let hf_logits = reference::logits(&st, &cfg, Names::Hf, &ids).unwrap();
    check(&st, cfg, Names::Hf, &ids, 13);
    let path = dir.path().join("tiny.gguf");
    write_gguf(&path, &t, 7, GgmlType::F32);
    let f = GgufFile::open(&path).unwrap();
    let gcfg = LlamaConfig::from_gguf(&f).unwrap();
    assert_eq!(
        gcfg.rope_scaling,
        LlamaConfig::from_hf(&dir.path().join("config.json"))
            .unwrap()
            .rope_scaling
    );
    let gguf_logits = reference::logits(&f, &gcfg, Names::Gguf, &ids).unwrap();
    for (a, b) in hf_logits.iter().zip(&gguf_logits) {
        assert!(nmse(a, b) < 1e-10, "HF and GGUF layouts differ: {:e}", nmse(a, b));
    }
    check(&f, gcfg, Names::Gguf, &ids, 13);
}
