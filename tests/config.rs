//! Model configs as transformers 4.x and 5.x write them (`rope_parameters` / `rope_scaling`, `model_type` without
//! `architectures`, Gemma 3's layer types), GGUF rope keys, and the RoPE scaling types against values worked from
//! transformers' `modeling_rope_utils` formulas.

use shaderlm::model::config::{Glu, RopeScaling};
use shaderlm::model::{Arch, LlamaConfig};
use std::path::Path;

fn base() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 101,
        "max_position_embeddings": 8192,
    })
}

/// [`base`] with head dim 128 (64 rotary pairs), base `theta` and `rope_scaling` set to `scaling`.
fn scaled(theta: f64, scaling: serde_json::Value) -> LlamaConfig {
    let mut v = base();
    v["head_dim"] = 128.into();
    v["hidden_size"] = 512.into();
    v["rope_theta"] = theta.into();
    v["rope_scaling"] = scaling;
    read(&v).unwrap()
}

fn read(v: &serde_json::Value) -> shaderlm::Result<LlamaConfig> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, v.to_string()).unwrap();
    LlamaConfig::from_hf(&path)
}

#[test]
fn transformers_5_rope_parameters_set_the_base() {
    // SmolLM2 as transformers 5 writes it: no top-level rope_theta, `dtype` instead of `torch_dtype`.
    let mut v = base();
    v["rope_parameters"] = serde_json::json!({"rope_theta": 100000.0, "rope_type": "default"});
    v["dtype"] = "bfloat16".into();
    let c = read(&v).unwrap();
    assert_eq!(c.rope_theta, 100000.0);
    assert_eq!(c.rope_scaling, RopeScaling::None);
    // transformers 4: top-level rope_theta.
    let mut v = base();
    v["rope_theta"] = 100000.0.into();
    v["torch_dtype"] = "float32".into();
    assert_eq!(read(&v).unwrap().rope_theta, 100000.0);
}

#[test]
fn model_type_names_the_architecture_when_architectures_is_absent() {
    let mut v = base();
    v.as_object_mut().unwrap().remove("architectures");
    v["model_type"] = "qwen2".into();
    let c = read(&v).unwrap();
    assert_eq!(c.arch, Arch::Qwen2);
    assert!(c.qkv_bias);
    v["model_type"] = "gpt_neox".into();
    let e = read(&v).unwrap_err().to_string();
    assert!(e.contains("gpt_neox") && e.contains("LlamaForCausalLM"), "{e}");
}

#[test]
fn unknown_rope_types_and_unsupported_math_are_errors_that_name_them() {
    let mut v = base();
    v["rope_scaling"] = serde_json::json!({"rope_type": "su", "factor": 2.0});
    let e = read(&v).unwrap_err().to_string();
    assert!(
        e.contains("\"su\"") && e.contains("llama3") && e.contains("config.json"),
        "{e}"
    );
    let mut v = base();
    v["final_logit_softcapping"] = 30.0.into();
    assert!(read(&v).unwrap_err().to_string().contains("final_logit_softcapping"));
    let mut v = base();
    v["hidden_act"] = "relu2".into();
    assert!(read(&v).unwrap_err().to_string().contains("relu2"));
    let mut v = base();
    v["rope_scaling"] = serde_json::json!({"rope_type": "linear", "factor": -1.0});
    assert!(read(&v).unwrap_err().to_string().contains("factor"));
}

/// Llama 3.1's published scaling (factor 8, low 1, high 4, original 8192, base 500000), worked by hand from
/// transformers' `_compute_llama3_parameters`: wavelengths below 8192 / 4 = 2048 keep their frequency, above
/// 8192 are divided by 8, in between blended by `smooth = (8192 / wavelen - 1) / 3`.
#[test]
fn llama3_divisors_follow_the_published_rule() {
    let scaling = serde_json::json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
    let c = scaled(500000.0, scaling);
    let s = c.rope_scaling.session(c.rope_theta, 128, 8192);
    let d = s.divisors.unwrap();
    assert_eq!(d.len(), 64);
    for (j, &dj) in d.iter().enumerate() {
        let inv = 500000f64.powf(-2.0 * j as f64 / 128.0);
        let wavelen = 2.0 * std::f64::consts::PI / inv;
        let want = if wavelen < 2048.0 {
            1.0
        } else if wavelen > 8192.0 {
            8.0
        } else {
            let smooth = (8192.0 / wavelen - 1.0) / 3.0;
            1.0 / ((1.0 - smooth) / 8.0 + smooth)
        };
        assert!((dj as f64 - want).abs() < 1e-5 * want, "pair {j}: {dj} vs {want}");
    }
    assert_eq!(d[0], 1.0);
    assert_eq!(d[63], 8.0);
    assert!(d.iter().any(|&x| x > 1.0 && x < 8.0), "no blended frequency: {d:?}");
}

/// YaRN as Qwen2.5 documents it (factor 4, original 32768, base 1e6, head dim 128): dims below the beta_fast
/// correction keep their frequency, those past beta_slow's are divided by 4, and cos/sin scale by 0.1 ln 4 + 1.
#[test]
fn yarn_ramp_and_attention_factor() {
    // max_position_embeddings (8192 in `base`) does not enter: original_max_position_embeddings is given.
    let c = scaled(
        1000000.0,
        serde_json::json!({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
    );
    let s = c.rope_scaling.session(c.rope_theta, 128, 131072);
    assert!((s.attn_factor - (0.1 * 4f32.ln() + 1.0)).abs() < 1e-6);
    let d = s.divisors.unwrap();
    // find_correction_dim(r) = 128 ln(32768 / (2 pi r)) / (2 ln 1e6): r = 32 -> 23.6 (floor 23), r = 1 -> 39.65 (ceil 40).
    let (low, high) = (23.0f64, 40.0f64);
    for (j, &dj) in d.iter().enumerate() {
        let ramp = ((j as f64 - low) / (high - low)).clamp(0.0, 1.0);
        let e = 1.0 - ramp;
        let want = 1.0 / ((1.0 - e) / 4.0 + e);
        assert!((dj as f64 - want).abs() < 1e-5, "pair {j}: {dj} vs {want}");
    }
    assert_eq!((d[0], d[63]), (1.0, 4.0));
}

#[test]
fn dynamic_ntk_raises_the_base_past_the_trained_context() {
    let mut v = base();
    v["rope_theta"] = 10000.0.into();
    v["max_position_embeddings"] = 2048.into();
    v["rope_scaling"] = serde_json::json!({"rope_type": "dynamic", "factor": 2.0});
    let c = read(&v).unwrap();
    let rot = c.rope_dim as f64;
    assert_eq!(c.rope_scaling.session(10000.0, c.rope_dim, 2048).theta, 10000.0);
    let s = c.rope_scaling.session(10000.0, c.rope_dim, 4096);
    // base * (factor * seq / max - (factor - 1))^(dim / (dim - 2)) = 10000 * 3^(16/14)
    let want = 10000.0 * 3f64.powf(rot / (rot - 2.0));
    assert!((s.theta as f64 - want).abs() < 1e-3 * want, "{} vs {want}", s.theta);
}

#[test]
fn gemma3_configs_old_and_new() {
    let gemma = |extra: serde_json::Value| {
        let mut v = serde_json::json!({
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 7, "num_attention_heads": 4,
            "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 101, "max_position_embeddings": 32768,
            "query_pre_attn_scalar": 16, "sliding_window": 512, "hidden_activation": "gelu_pytorch_tanh",
        });
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        read(&v).unwrap()
    };
    // transformers 4.5x: rope_theta + rope_local_base_freq, the pattern from sliding_window_pattern.
    let c = gemma(
        serde_json::json!({"rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "sliding_window_pattern": 6, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}),
    );
    assert_eq!(c.ffn_act, Glu::GeluTanh);
    assert!(c.post_norms && c.qk_norm && c.tie_embeddings);
    assert_eq!(c.attn_scale, 0.25);
    assert_eq!(c.mup.emb, 8.0);
    let windows: Vec<bool> = (0..7).map(|i| c.layer_window(i).is_some()).collect();
    assert_eq!(windows, [true, true, true, true, true, false, true]);
    assert_eq!(c.layer_rope(0), (10000.0, &RopeScaling::None));
    assert_eq!(c.layer_rope(5), (1000000.0, &RopeScaling::Linear { factor: 8.0 }));
    // transformers 5: layer_types and rope_parameters per layer type.
    let c = gemma(serde_json::json!({
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
            "sliding_attention", "sliding_attention", "full_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}));
    let windows: Vec<bool> = (0..7).map(|i| c.layer_window(i).is_some()).collect();
    assert_eq!(windows, [true, false, true, true, true, true, false]);
    assert_eq!(c.layer_rope(1), (1000000.0, &RopeScaling::Linear { factor: 8.0 }));
    assert_eq!(c.layer_rope(2), (10000.0, &RopeScaling::None));
}

#[test]
fn gguf_rope_keys_are_read_or_refused() {
    use shaderlm::loader::gguf::{GgufFile, Value};
    use shaderlm::loader::gguf_write::GgufWriter;
    let write = |path: &Path, extra: &[(&str, Value)], freqs: Option<Vec<f32>>| {
        let mut w = GgufWriter::new();
        let meta = [
            ("general.architecture", Value::String("llama".into())),
            ("llama.block_count", Value::U32(1)),
            ("llama.context_length", Value::U32(256)),
            ("llama.embedding_length", Value::U32(64)),
            ("llama.feed_forward_length", Value::U32(96)),
            ("llama.attention.head_count", Value::U32(2)),
            ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ];
        for (k, v) in meta.into_iter().chain(extra.iter().cloned()) {
            w.add_metadata(k, v).unwrap();
        }
        w.add_tensor(
            "token_embd.weight",
            &[10, 64],
            shaderlm::quant::GgmlType::F32,
            &vec![0.0; 640],
        )
        .unwrap();
        if let Some(f) = freqs {
            w.add_tensor("rope_freqs.weight", &[f.len()], shaderlm::quant::GgmlType::F32, &f)
                .unwrap();
        }
        w.write(path).unwrap();
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let freqs: Vec<f32> = (0..16).map(|i| 1.0 + i as f32).collect();
    write(&path, &[], Some(freqs.clone()));
    let c = LlamaConfig::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    assert_eq!(c.rope_scaling, RopeScaling::Divisors(freqs));
    write(
        &path,
        &[
            ("llama.rope.scaling.type", Value::String("yarn".into())),
            ("llama.rope.scaling.factor", Value::F32(4.0)),
            ("llama.rope.scaling.original_context_length", Value::U32(64)),
        ],
        None,
    );
    let c = LlamaConfig::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    assert!(matches!(
        c.rope_scaling,
        RopeScaling::Yarn {
            factor: 4.0,
            original_max: 64,
            ..
        }
    ));
    // A sliding window of 0 is none (an error for Llama, which has no windows here, only when it is set).
    write(&path, &[("llama.attention.sliding_window", Value::U32(0))], None);
    assert!(LlamaConfig::from_gguf(&GgufFile::open(&path).unwrap())
        .unwrap()
        .sliding
        .is_none());
    write(&path, &[("llama.rope.scaling.type", Value::String("su".into()))], None);
    let e = LlamaConfig::from_gguf(&GgufFile::open(&path).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("llama.rope.scaling.type") && e.contains("\"su\""), "{e}");
    write(&path, &[], Some(vec![1.0; 3]));
    let e = LlamaConfig::from_gguf(&GgufFile::open(&path).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("rope_freqs.weight"), "{e}");
}
