//! Tiny Llama-family checkpoints with random weights, written in the real on-disk layouts (Hugging Face
//! safetensors + config.json, and GGUF as llama.cpp writes it), for end-to-end tests against the CPU reference.

#![allow(dead_code)]

use shaderlm::loader::gguf::{Value, ValueType};
use shaderlm::loader::gguf_write::GgufWriter;
use shaderlm::quant::GgmlType;
use std::collections::HashMap;
use std::path::Path;

pub struct Tiny {
    pub arch: &'static str, // "llama", "qwen2", "qwen3", "gemma3"
    pub layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub tied: bool,
}

impl Tiny {
    pub fn llama() -> Tiny {
        Tiny {
            arch: "llama",
            layers: 2,
            hidden: 64,
            ffn: 96,
            heads: 4,
            kv_heads: 2,
            head_dim: 32,
            vocab: 101,
            tied: true,
        }
    }

    /// Gemma 3 in small: 6 layers (the 6th global, the others sliding windows of [`GEMMA_WINDOW`] keys), q/k norms,
    /// post-norms, GeGLU, one KV head.
    pub fn gemma3() -> Tiny {
        Tiny {
            arch: "gemma3",
            layers: 6,
            kv_heads: 1,
            ..Tiny::llama()
        }
    }
}

impl Tiny {
    /// Qwen2 in small: rotate-half RoPE pairs, q/k/v biases, one KV head.
    pub fn qwen2() -> Tiny {
        Tiny {
            arch: "qwen2",
            kv_heads: 1,
            ..Tiny::llama()
        }
    }
}

/// As [`write_gguf`] in type `ty`, but v in `v_ty` (Q4_K_M mixes store v apart from q and k): q|k and v load as
/// two matmuls.
pub fn write_gguf_v_apart(path: &Path, t: &Tiny, seed: u64, ty: GgmlType, v_ty: GgmlType) {
    write_gguf_typed(path, t, seed, &|name: &str| {
        if name.contains("attn_v") {
            v_ty
        } else {
            ty
        }
    });
}

/// The sliding window of [`Tiny::gemma3`]: short, so that prompts of a dozen tokens cross it.
pub const GEMMA_WINDOW: usize = 5;

/// Phi-3 in small: q|k|v and gate|up fused in the files, partial rotary (24 of 32 dims), longrope with both
/// contexts past the original 32, and a sliding window of [`PHI3_WINDOW`] keys on every layer.
pub fn phi3() -> Tiny {
    Tiny {
        arch: "phi3",
        ..Tiny::llama()
    }
}
pub const PHI3_WINDOW: usize = 7;
pub const PHI3_ROPE_DIM: usize = 24;
pub const PHI3_ORIGINAL_MAX: usize = 32;

/// Longrope factors (short, long) for `pairs` rotary pairs, as config.json numbers; the tiny Phi-3 and MiniCPM
/// checkpoints share them.
pub fn longrope_factors(pairs: usize) -> (Vec<f64>, Vec<f64>) {
    let short = (0..pairs).map(|j| 1.0 + j as f64 * 0.05).collect();
    let long = (0..pairs).map(|j| 1.0 + j as f64 * 0.9).collect();
    (short, long)
}

/// [`longrope_factors`] as the f32 tensors a GGUF stores.
pub fn longrope_factors_f32(pairs: usize) -> (Vec<f32>, Vec<f32>) {
    let (s, l) = longrope_factors(pairs);
    let f32s = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect();
    (f32s(s), f32s(l))
}

/// Phi-3's files fuse q|k|v (HF `qkv_proj`, GGUF `attn_qkv`) and gate|up (HF `gate_up_proj`; GGUF `ffn_up`, gate
/// rows first): the separate weights of [`weights`] concatenated by rows.
fn fuse_phi3(ws: Vec<(String, String, Vec<usize>, Vec<f32>)>) -> Vec<(String, String, Vec<usize>, Vec<f32>)> {
    let mut out = Vec::new();
    let mut pending: Vec<(String, String, Vec<usize>, Vec<f32>)> = Vec::new();
    let fused = [
        (
            ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"].as_slice(),
            "self_attn.qkv_proj",
            "attn_qkv",
        ),
        (
            ["mlp.gate_proj", "mlp.up_proj"].as_slice(),
            "mlp.gate_up_proj",
            "ffn_up",
        ),
    ];
    for w in ws {
        let Some((parts, hf, gg)) = fused
            .iter()
            .find(|f| f.0.iter().any(|p| w.0.ends_with(&format!("{p}.weight"))))
        else {
            out.push(w);
            continue;
        };
        pending.push(w);
        if pending.len() == parts.len() {
            let layer = pending[0]
                .0
                .rsplit_once(".self_attn")
                .or(pending[0].0.rsplit_once(".mlp"))
                .unwrap()
                .0
                .to_string();
            let i = layer.rsplit_once('.').unwrap().1.to_string();
            let cols = pending[0].2[1];
            let rows: usize = pending.iter().map(|p| p.2[0]).sum();
            let v: Vec<f32> = pending.iter().flat_map(|p| p.3.clone()).collect();
            out.push((
                format!("{layer}.{hf}.weight"),
                format!("blk.{i}.{gg}.weight"),
                vec![rows, cols],
                v,
            ));
            pending.clear();
        }
    }
    out
}

/// [`weights`] as the architecture's files hold them.
pub fn stored(t: &Tiny, seed: u64) -> Vec<(String, String, Vec<usize>, Vec<f32>)> {
    let ws = weights(t, seed);
    if t.arch == "phi3" {
        fuse_phi3(ws)
    } else {
        ws
    }
}

/// Values uniform in [-scale, scale), seeded.
pub fn random(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    super::rng::Rng::new(seed).vec(n, scale)
}

/// (HF name, GGUF name, shape, values) of every weight.
pub fn weights(t: &Tiny, seed: u64) -> Vec<(String, String, Vec<usize>, Vec<f32>)> {
    let mut out = Vec::new();
    let mut n = 0u64;
    let mut add = |hf: String, gg: String, shape: Vec<usize>, scale: f32, offset: f32| {
        n += 1;
        let len = shape.iter().product();
        let v = random(seed * 1000 + n, len, scale)
            .into_iter()
            .map(|x| x + offset)
            .collect();
        out.push((hf, gg, shape, v));
    };
    let (q, kv) = (t.heads * t.head_dim, t.kv_heads * t.head_dim);
    add(
        "model.embed_tokens.weight".into(),
        "token_embd.weight".into(),
        vec![t.vocab, t.hidden],
        1.0,
        0.0,
    );
    for i in 0..t.layers {
        let hf = |s: &str| format!("model.layers.{i}.{s}");
        let gg = |s: &str| format!("blk.{i}.{s}");
        let w = 1.0 / (t.hidden as f32).sqrt();
        add(
            hf("input_layernorm.weight"),
            gg("attn_norm.weight"),
            vec![t.hidden],
            0.2,
            1.0,
        );
        add(
            hf("self_attn.q_proj.weight"),
            gg("attn_q.weight"),
            vec![q, t.hidden],
            2.0 * w,
            0.0,
        );
        add(
            hf("self_attn.k_proj.weight"),
            gg("attn_k.weight"),
            vec![kv, t.hidden],
            2.0 * w,
            0.0,
        );
        add(
            hf("self_attn.v_proj.weight"),
            gg("attn_v.weight"),
            vec![kv, t.hidden],
            w,
            0.0,
        );
        add(
            hf("self_attn.o_proj.weight"),
            gg("attn_output.weight"),
            vec![t.hidden, q],
            w,
            0.0,
        );
        if t.arch == "qwen2" {
            add(hf("self_attn.q_proj.bias"), gg("attn_q.bias"), vec![q], 0.5, 0.0);
            add(hf("self_attn.k_proj.bias"), gg("attn_k.bias"), vec![kv], 0.5, 0.0);
            add(hf("self_attn.v_proj.bias"), gg("attn_v.bias"), vec![kv], 0.5, 0.0);
        }
        if t.arch == "qwen3" || t.arch == "gemma3" {
            add(
                hf("self_attn.q_norm.weight"),
                gg("attn_q_norm.weight"),
                vec![t.head_dim],
                0.2,
                1.0,
            );
            add(
                hf("self_attn.k_norm.weight"),
                gg("attn_k_norm.weight"),
                vec![t.head_dim],
                0.2,
                1.0,
            );
        }
        if t.arch == "gemma3" {
            add(
                hf("post_attention_layernorm.weight"),
                gg("post_attention_norm.weight"),
                vec![t.hidden],
                0.2,
                1.0,
            );
            add(
                hf("pre_feedforward_layernorm.weight"),
                gg("ffn_norm.weight"),
                vec![t.hidden],
                0.2,
                1.0,
            );
            add(
                hf("post_feedforward_layernorm.weight"),
                gg("post_ffw_norm.weight"),
                vec![t.hidden],
                0.2,
                1.0,
            );
        } else {
            add(
                hf("post_attention_layernorm.weight"),
                gg("ffn_norm.weight"),
                vec![t.hidden],
                0.2,
                1.0,
            );
        }
        add(
            hf("mlp.gate_proj.weight"),
            gg("ffn_gate.weight"),
            vec![t.ffn, t.hidden],
            w,
            0.0,
        );
        add(
            hf("mlp.up_proj.weight"),
            gg("ffn_up.weight"),
            vec![t.ffn, t.hidden],
            w,
            0.0,
        );
        add(
            hf("mlp.down_proj.weight"),
            gg("ffn_down.weight"),
            vec![t.hidden, t.ffn],
            1.0 / (t.ffn as f32).sqrt(),
            0.0,
        );
    }
    add(
        "model.norm.weight".into(),
        "output_norm.weight".into(),
        vec![t.hidden],
        0.2,
        1.0,
    );
    if !t.tied {
        add(
            "lm_head.weight".into(),
            "output.weight".into(),
            vec![t.vocab, t.hidden],
            1.0 / (t.hidden as f32).sqrt(),
            0.0,
        );
    }
    out
}

/// `config.json` + `model.safetensors` (f32, or f16 when `half`) as transformers saves them. Gemma's norms are
/// stored as `w` for its `x * (1 + w)` (the GGUF holds `1 + w`), so both layouts of one seed are one model.
pub fn write_hf(dir: &Path, t: &Tiny, seed: u64, half: bool) {
    let arch = match t.arch {
        "qwen2" => "Qwen2ForCausalLM",
        "qwen3" => "Qwen3ForCausalLM",
        "gemma3" => "Gemma3ForCausalLM",
        "phi3" => "Phi3ForCausalLM",
        _ => "LlamaForCausalLM",
    };
    let mut config = serde_json::json!({
        "architectures": [arch],
        "model_type": t.arch,
        "hidden_size": t.hidden,
        "intermediate_size": t.ffn,
        "num_hidden_layers": t.layers,
        "num_attention_heads": t.heads,
        "num_key_value_heads": t.kv_heads,
        "head_dim": t.head_dim,
        "vocab_size": t.vocab,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 256,
        "tie_word_embeddings": t.tied,
        "torch_dtype": if half { "float16" } else { "float32" },
    });
    if t.arch == "gemma3" {
        let extra = serde_json::json!({
            "model_type": "gemma3_text",
            "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": t.head_dim,
            "sliding_window": GEMMA_WINDOW,
            "sliding_window_pattern": 6,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
            "rope_scaling": null,
            "final_logit_softcapping": null,
            "attn_logit_softcapping": null,
        });
        for (k, v) in extra.as_object().unwrap() {
            config[k] = v.clone();
        }
    }
    if t.arch == "phi3" {
        let (short, long) = longrope_factors(PHI3_ROPE_DIM / 2);
        let extra = serde_json::json!({
            "partial_rotary_factor": PHI3_ROPE_DIM as f64 / t.head_dim as f64,
            "sliding_window": PHI3_WINDOW,
            "original_max_position_embeddings": PHI3_ORIGINAL_MAX,
            "rope_scaling": {"type": "longrope", "short_factor": short, "long_factor": long},
        });
        for (k, v) in extra.as_object().unwrap() {
            config[k] = v.clone();
        }
    }
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&config).unwrap()).unwrap();
    let gemma_norm = |name: &str| t.arch == "gemma3" && name.ends_with("norm.weight");
    let ws: Vec<_> = stored(t, seed)
        .into_iter()
        .map(|(hf, gg, shape, v)| {
            let v = if gemma_norm(&hf) {
                v.iter().map(|x| x - 1.0).collect()
            } else {
                v
            };
            (hf, gg, shape, v)
        })
        .collect();
    let ws: Vec<(String, Vec<usize>, Vec<f32>)> = ws.into_iter().map(|(hf, _, shape, v)| (hf, shape, v)).collect();
    write_safetensors(&dir.join("model.safetensors"), &ws, half);
}

/// `tensors` (name, shape, values) as a safetensors file the way transformers saves one (`format: pt`), in f16 when
/// `half`, else f32.
pub fn write_safetensors(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)], half: bool) {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, v)| {
            if half {
                v.iter().flat_map(|x| half::f16::from_f32(*x).to_le_bytes()).collect()
            } else {
                v.iter().flat_map(|x| x.to_le_bytes()).collect()
            }
        })
        .collect();
    let dtype = if half {
        safetensors::Dtype::F16
    } else {
        safetensors::Dtype::F32
    };
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((n, s, _), b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(dtype, s.clone(), b).unwrap(),
            )
        })
        .collect();
    let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    safetensors::serialize_to_file(views, Some(meta), path).unwrap();
}

/// llama.cpp's converter's q/k row order (its `permute`), applied to rotate-half rows: within each head of `hd`
/// rows, rotate-half row `i * hd / 2 + j` goes to row `2j + i` (written from the converter's reshape-and-swap).
pub fn to_interleaved(w: &[f32], heads: usize, cols: usize) -> Vec<f32> {
    let hd = w.len() / cols / heads;
    let mut out = vec![0f32; w.len()];
    for h in 0..heads {
        for i in 0..2 {
            for j in 0..hd / 2 {
                let (src, dst) = (h * hd + i * hd / 2 + j, h * hd + 2 * j + i);
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// A GGUF file as llama.cpp's converter writes a Llama-family model, with matrices in `ty`.
pub fn write_gguf(path: &Path, t: &Tiny, seed: u64, ty: GgmlType) {
    write_gguf_types(path, t, seed, ty, None)
}

/// As [`write_gguf`], but `ffn_up` stored in `up` (k-quant mixes store neighbouring matrices differently).
pub fn write_gguf_types(path: &Path, t: &Tiny, seed: u64, ty: GgmlType, up: Option<GgmlType>) {
    write_gguf_by(path, t, seed, &|name: &str| match up {
        Some(up) if name.ends_with("ffn_up.weight") => up,
        _ => ty,
    })
}

/// The GGUF writer of [`write_gguf`] with each matrix in the type `ty_of` gives for its GGUF name.
fn write_gguf_by(path: &Path, t: &Tiny, seed: u64, ty_of: &dyn Fn(&str) -> GgmlType) {
    let mut w = GgufWriter::new();
    let a = t.arch;
    let k = |s: &str| format!("{a}.{s}");
    w.add_metadata("general.architecture", Value::String(a.into())).unwrap();
    w.add_metadata("general.name", Value::String("tiny random".into()))
        .unwrap();
    w.add_metadata(k("block_count"), Value::U32(t.layers as u32)).unwrap();
    w.add_metadata(k("context_length"), Value::U32(256)).unwrap();
    w.add_metadata(k("embedding_length"), Value::U32(t.hidden as u32))
        .unwrap();
    w.add_metadata(k("feed_forward_length"), Value::U32(t.ffn as u32))
        .unwrap();
    w.add_metadata(k("attention.head_count"), Value::U32(t.heads as u32))
        .unwrap();
    w.add_metadata(k("attention.head_count_kv"), Value::U32(t.kv_heads as u32))
        .unwrap();
    w.add_metadata(k("attention.key_length"), Value::U32(t.head_dim as u32))
        .unwrap();
    w.add_metadata(k("attention.layer_norm_rms_epsilon"), Value::F32(1e-5))
        .unwrap();
    let theta = if a == "gemma3" { 1000000.0 } else { 10000.0 };
    w.add_metadata(k("rope.freq_base"), Value::F32(theta)).unwrap();
    let rope_dim = if a == "phi3" { PHI3_ROPE_DIM } else { t.head_dim };
    w.add_metadata(k("rope.dimension_count"), Value::U32(rope_dim as u32))
        .unwrap();
    if a == "gemma3" {
        w.add_metadata(k("attention.sliding_window"), Value::U32(GEMMA_WINDOW as u32))
            .unwrap();
    }
    if a == "phi3" {
        // As llama.cpp's converter writes Phi-3's longrope: the factor lists as tensors.
        let (short, long) = longrope_factors_f32(PHI3_ROPE_DIM / 2);
        w.add_metadata(k("attention.sliding_window"), Value::U32(PHI3_WINDOW as u32))
            .unwrap();
        w.add_metadata(
            k("rope.scaling.original_context_length"),
            Value::U32(PHI3_ORIGINAL_MAX as u32),
        )
        .unwrap();
        w.add_tensor("rope_factors_short.weight", &[short.len()], GgmlType::F32, &short)
            .unwrap();
        w.add_tensor("rope_factors_long.weight", &[long.len()], GgmlType::F32, &long)
            .unwrap();
    }
    for (_, gg, shape, v) in stored(t, seed) {
        let ty = if shape.len() == 2 { ty_of(&gg) } else { GgmlType::F32 };
        w.add_tensor(gg, &shape, ty, &v).unwrap();
    }
    w.write(path).unwrap();
}

/// As [`write_gguf`], each matrix stored in the type `ty_of` gives for its GGUF name (a k-quant mix such as
/// Q4_K_M); vectors stay F32.
pub fn write_gguf_typed(path: &Path, t: &Tiny, seed: u64, ty_of: &dyn Fn(&str) -> GgmlType) {
    write_gguf_by(path, t, seed, ty_of)
}

/// GPT-2's byte-to-character table: printable bytes map to themselves, the rest to U+0100 upwards.
pub fn byte_char(b: u8) -> char {
    let printable = |b: u8| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    if printable(b) {
        return b as char;
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap()
}

pub const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A byte-level vocabulary (256 byte tokens, a few merges, ChatML specials): (tokens, types, merges).
pub fn byte_vocab() -> (Vec<String>, Vec<i32>, Vec<String>) {
    let enc = |s: &str| s.bytes().map(byte_char).collect::<String>();
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let mut types = vec![1i32; 256];
    let mut merges = Vec::new();
    for (a, b) in [
        ("h", "e"),
        ("l", "l"),
        ("he", "ll"),
        ("hell", "o"),
        (" ", "w"),
        ("o", "r"),
    ] {
        merges.push(format!("{} {}", enc(a), enc(b)));
        tokens.push(enc(&format!("{a}{b}")));
        types.push(1);
    }
    for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] {
        tokens.push(s.into());
        types.push(3);
    }
    (tokens, types, merges)
}

/// A tiny Llama GGUF with a real byte-level tokenizer and a ChatML template in its metadata.
pub fn write_gguf_chat(path: &Path, seed: u64, ty: GgmlType) -> Tiny {
    write_gguf_chat_as(path, Tiny::llama(), seed, ty)
}

/// [`write_gguf_chat`] of the shape `t` (its vocabulary becomes the byte-level one).
pub fn write_gguf_chat_as(path: &Path, mut t: Tiny, seed: u64, ty: GgmlType) -> Tiny {
    let (tokens, types, merges) = byte_vocab();
    t.vocab = tokens.len();
    write_gguf(path, &t, seed, ty);
    let n = tokens.len() as u32;
    rewrite_gguf(
        path,
        path,
        |k, v| (k.into(), v.clone()),
        |w| {
            let types = types.into_iter().map(Value::I32).collect();
            let meta = [
                ("tokenizer.ggml.model", Value::String("gpt2".into())),
                ("tokenizer.ggml.pre", Value::String("smollm".into())),
                ("tokenizer.ggml.token_type", Value::Array(ValueType::I32, types)),
                ("tokenizer.ggml.bos_token_id", Value::U32(n - 2)),
                ("tokenizer.ggml.eos_token_id", Value::U32(n - 1)),
                ("tokenizer.ggml.add_bos_token", Value::Bool(false)),
                ("tokenizer.chat_template", Value::String(CHATML.into())),
            ];
            for (k, v) in meta {
                w.add_metadata(k, v).unwrap();
            }
            w.add_str_array("tokenizer.ggml.tokens", &tokens).unwrap();
            w.add_str_array("tokenizer.ggml.merges", &merges).unwrap();
        },
    );
    t
}

/// Copies the GGUF file `from` to `to` (which may be the same file) with each metadata entry passed through `edit`
/// (key and value in, the entry to write out), then what `add` writes, the tensors unchanged.
pub fn rewrite_gguf(
    from: &Path,
    to: &Path,
    edit: impl Fn(&str, &Value) -> (String, Value),
    add: impl FnOnce(&mut GgufWriter),
) {
    let f = shaderlm::loader::gguf::GgufFile::open(from).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata_entries() {
        let (k, v) = edit(k, v);
        w.add_metadata(k, v).unwrap();
    }
    add(&mut w);
    for info in f.tensors() {
        let data = f.tensor_data(info).unwrap().to_vec();
        w.add_tensor_bytes(info.name.clone(), &info.shape(), info.ggml_type, data)
            .unwrap();
    }
    drop(f);
    w.write(to).unwrap();
}

/// A Hugging Face directory as transformers saves it: config.json, model.safetensors, tokenizer.json and
/// tokenizer_config.json; the chat template in `chat_template.jinja` (current transformers) or inside
/// tokenizer_config.json (older releases).
pub fn write_hf_chat(dir: &Path, seed: u64, template_file: bool) -> Tiny {
    let (tokens, token_types, merges) = byte_vocab();
    let mut t = Tiny::llama();
    t.vocab = tokens.len();
    write_hf(dir, &t, seed, false);
    let spec = shaderlm::tokenizer::VocabSpec {
        model: "gpt2".into(),
        pre: "smollm".into(),
        tokens,
        token_types,
        merges,
        ..Default::default()
    };
    let tok = shaderlm::tokenizer::Tokenizer::from_vocab(&spec).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tok.to_json().unwrap()).unwrap();
    let mut config = serde_json::json!({
        "bos_token": {"content": "<|im_start|>", "special": true},
        "eos_token": "<|im_end|>",
        "add_bos_token": false,
    });
    if template_file {
        std::fs::write(dir.join("chat_template.jinja"), CHATML).unwrap();
    } else {
        config["chat_template"] = serde_json::Value::String(CHATML.into());
    }
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    t
}
