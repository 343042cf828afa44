//! SmolLM2-135M-Instruct as a Hugging Face directory whose config.json and generation_config.json transformers 5
//! wrote (`models/reference/smollm2_hf_config.py`: `rope_parameters`, `dtype`, no `rope_theta`), with the GGUF's
//! weights (dequantized to f32, exactly the values of the Q4_1 / Q8_0 blocks; q/k rows back in Hugging Face's
//! order) and tokenizer, must match the same golden fixtures as the GGUF (`tests/golden.rs`, same bound). A config
//! reader that missed `rope_parameters` would rotate with base 10000 instead of 100000 and fail at once.

mod common;

use common::golden;
use shaderlm::gpu::{Gpu, GpuOptions};
use shaderlm::model::load::LoadedModel;
use shaderlm::model::{LoadOptions, Names};
use shaderlm::quantize::source::Source;
use std::path::Path;

/// As tests/golden.rs (the f32 weights here are the very values the GGUF's blocks decode to).
const LOGIT_TOL: f32 = 2e-3;

/// Writes the directory: the committed transformers 5 configs, f32 safetensors from the GGUF, tokenizer files.
fn write_dir(dir: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let gguf = root.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        gguf.exists(),
        "this test needs the default model: run `bash models/fetch.sh`"
    );
    for f in ["config.json", "generation_config.json"] {
        std::fs::copy(root.join("tests/fixtures/smollm2-hf").join(f), dir.join(f)).unwrap();
    }
    let src = Source::open(&gguf).unwrap();
    let tensors: Vec<(String, Vec<usize>, Vec<f32>)> = src
        .tensors()
        .iter()
        .map(|t| {
            let (shape, v) = src.read(t, Names::Hf).unwrap();
            (t.name(Names::Hf), shape, v)
        })
        .collect();
    common::tiny::write_safetensors(&dir.join("model.safetensors"), &tensors, false);
    let tok = src.tokenizer().unwrap();
    std::fs::write(dir.join("tokenizer.json"), tok.to_json().unwrap()).unwrap();
    let text = |id: Option<u32>| id.and_then(|i| tok.token_text(i)).unwrap();
    let config = serde_json::json!({
        "bos_token": text(tok.bos),
        "eos_token": text(tok.eos),
        "add_bos_token": tok.add_bos,
        "chat_template": tok.chat_template,
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
}

#[test]
fn smollm2_hugging_face_directory_from_transformers_5_matches_the_golden_fixtures() {
    let dir = tempfile::tempdir().unwrap();
    write_dir(dir.path());
    let gpu = Gpu::new(&GpuOptions::default()).unwrap_or_else(|e| panic!("the GPU tests need an adapter: {e}"));
    let loaded = LoadedModel::open(&gpu, dir.path(), &LoadOptions::with_ctx(2048), |_, _| {}).unwrap();
    assert_eq!(
        loaded.model.cfg.rope_theta, 100000.0,
        "rope_parameters.rope_theta not read"
    );
    for name in ["plain_english", "chat_capital", "cjk"] {
        golden::check(&gpu, &loaded, "smollm2", name, LOGIT_TOL);
    }
}
