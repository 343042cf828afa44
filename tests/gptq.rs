//! GPTQ and AWQ checkpoints end to end. Tiny Llama checkpoints are written in the exact on-disk layouts
//! (config.json with `quantization_config` or a separate quantize_config.json, model.safetensors with `qweight`,
//! `qzeros`, `scales`, `g_idx`, tokenizer.json). For each one:
//! (a) every quantized layer, as the loader leaves it on the device (packed blocks read back, unpacked, its
//!     column permutation undone), against this file's own dequantization of the on-disk tensors, written from the
//!     format description and sharing no code with the loader;
//! (b) the whole model on the GPU against the CPU reference forward, once on the loader's weights (kernel error
//!     alone) and once on this file's dequantized weights.
//! Then bad input: each error must name the tensor or setting and the file.

mod common;

use common::gpu::{gpu, nmse};
use common::steps::{prefill_then_decode, run_steps, LOGITS_AND_ARGMAX};

use common::tiny::{byte_vocab, weights, Tiny};
use half::f16;
use safetensors::Dtype;
use serde_json::{json, Value};
use shaderlm::gpu::{tensor::read_buffer, Gpu};
use shaderlm::loader::safetensors::SafetensorsModel;
use shaderlm::model::weights::{HostData, HostTensor, Linear, WeightSource};
use shaderlm::model::{reference, Llama, LlamaConfig, Names};
use shaderlm::quant::gptq::{quantize, Scheme};
use shaderlm::quant::pack::{unpack, HostPart};
use shaderlm::quant::GgmlType;
use std::collections::HashMap;
use std::path::Path;

/// How the layers' input columns are ordered (GPTQ act-order, `desc_act: true`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Act {
    /// `g_idx = k / group_size`.
    None,
    /// One shuffled order per input (q, k, v share one, gate and up share one), as GPTQ gives layers that see
    /// the same activations: gate and up stay stackable.
    Shared,
    /// A different order for every layer: gate and up cannot be stacked.
    PerLayer,
}

#[derive(Clone, Copy, Debug)]
struct Spec {
    awq: bool,
    bits: u32,
    group_size: i64,
    sym: bool,
    act: Act,
    /// GPTQ `checkpoint_format: "gptq_v2"` (zeros stored as they are, not minus one).
    v2: bool,
    /// The config in quantize_config.json (AutoGPTQ) instead of config.json's quantization_config.
    separate_file: bool,
}

const GPTQ: Spec = Spec {
    awq: false,
    bits: 4,
    group_size: 128,
    sym: true,
    act: Act::None,
    v2: false,
    separate_file: false,
};

/// The tiny model: layers whose K (128 or 256) holds 1 to 8 groups of the tested sizes.
fn tiny() -> Tiny {
    Tiny {
        arch: "llama",
        layers: 2,
        hidden: 128,
        ffn: 256,
        heads: 4,
        kv_heads: 2,
        head_dim: 32,
        vocab: byte_vocab().0.len(),
        tied: true,
    }
}

/// A seeded shuffled act-order assignment: each group keeps its `gs` members (the last one the rest), scattered.
fn shuffled_g_idx(k: usize, gs: usize, seed: u64) -> Vec<i32> {
    let mut p: Vec<usize> = (0..k).collect();
    let mut st = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    for i in (1..k).rev() {
        st ^= st << 13;
        st ^= st >> 7;
        st ^= st << 17;
        p.swap(i, (st % (i as u64 + 1)) as usize);
    }
    let mut g = vec![0; k];
    for (rank, &i) in p.iter().enumerate() {
        g[i] = (rank / gs) as i32;
    }
    g
}

fn scheme(s: &Spec) -> Scheme {
    let gs = (s.group_size > 0).then_some(s.group_size as usize);
    if s.awq {
        Scheme::awq(gs)
    } else {
        let mut sc = Scheme::gptq(s.bits, gs);
        sc.zeros_minus_one = !s.v2;
        sc
    }
}

/// The on-disk quantization config object.
fn quant_json(s: &Spec) -> Value {
    if s.awq {
        json!({"quant_method": "awq", "bits": 4, "group_size": s.group_size, "zero_point": true, "version": "gemm"})
    } else {
        json!({
            "quant_method": "gptq", "bits": s.bits, "group_size": s.group_size, "sym": s.sym,
            "desc_act": s.act != Act::None, "checkpoint_format": if s.v2 { "gptq_v2" } else { "gptq" },
        })
    }
}

/// One tensor to write: name, dtype, shape, little-endian bytes.
type Entry = (String, Dtype, Vec<usize>, Vec<u8>);

fn le32(v: impl IntoIterator<Item = u32>) -> Vec<u8> {
    v.into_iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Write a quantized tiny checkpoint to `dir`; `edit` may change the tensors and the config before they are
/// written (the bad-input tests). Returns the float weights each quantized layer came from.
fn write(dir: &Path, s: &Spec, edit: impl FnOnce(&mut Vec<Entry>, &mut Value)) -> HashMap<String, Vec<f32>> {
    let t = tiny();
    let sc = scheme(s);
    let mut entries: Vec<Entry> = Vec::new();
    let mut floats = HashMap::new();
    for (name, _, shape, w) in weights(&t, 7) {
        let Some(prefix) = name.strip_suffix(".weight").filter(|p| p.ends_with("_proj")) else {
            entries.push((name, Dtype::F32, shape, le32(w.iter().map(|x| x.to_bits()))));
            continue;
        };
        let (n, k) = (shape[0], shape[1]);
        let gs = sc.group_size.unwrap_or(k);
        let layer: u64 = prefix.split('.').nth(2).unwrap().parse().unwrap();
        // Layers that read the same activations (q, k, v; gate, up) share an order under `Act::Shared`.
        let shared_input = |names: &[&str]| names.iter().any(|p| prefix.ends_with(p));
        let input = if shared_input(&["q_proj", "k_proj", "v_proj"]) {
            1
        } else if shared_input(&["gate_proj", "up_proj"]) {
            2
        } else {
            prefix.len() as u64
        };
        let own = prefix
            .bytes()
            .fold(0u64, |h, c| h.wrapping_mul(31).wrapping_add(c as u64));
        let g_idx = match s.act {
            Act::None => None,
            Act::Shared => Some(shuffled_g_idx(k, gs, 100 * layer + input)),
            Act::PerLayer => Some(shuffled_g_idx(k, gs, own)),
        };
        let q = quantize(&sc, &w, n, k, s.sym, g_idx.as_deref()).unwrap();
        entries.push((
            format!("{prefix}.qweight"),
            Dtype::I32,
            q.qweight_shape(&sc).to_vec(),
            le32(q.qweight.iter().copied()),
        ));
        entries.push((
            format!("{prefix}.qzeros"),
            Dtype::I32,
            q.qzeros_shape(&sc).to_vec(),
            le32(q.qzeros.iter().copied()),
        ));
        let scales = q.scales.iter().flat_map(|h| h.to_le_bytes()).collect();
        entries.push((
            format!("{prefix}.scales"),
            Dtype::F16,
            q.scales_shape(&sc).to_vec(),
            scales,
        ));
        if let Some(g) = &q.g_idx {
            entries.push((
                format!("{prefix}.g_idx"),
                Dtype::I32,
                vec![k],
                le32(g.iter().map(|&x| x as u32)),
            ));
        }
        floats.insert(name, w);
    }
    let mut config = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
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
        "tie_word_embeddings": true,
        "torch_dtype": "float16",
        "quantization_config": quant_json(s),
    });
    if s.separate_file {
        let q = config.as_object_mut().unwrap().remove("quantization_config").unwrap();
        std::fs::write(dir.join("quantize_config.json"), q.to_string()).unwrap();
    }
    edit(&mut entries, &mut config);
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&config).unwrap()).unwrap();
    let views: Vec<(String, safetensors::tensor::TensorView)> = entries
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    let (tokens, token_types, merges) = byte_vocab();
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
    floats
}

/// A layer dequantized from its on-disk tensors by the format description: `w [n, k]`, and each weight's
/// `|scale * zero|` (what the Q4_1 minimum's f16 rounding scales with).
struct Dequant {
    w: Vec<f32>,
    scale: Vec<f32>,
    scale_zero: Vec<f32>,
}

/// AWQ packs outputs `8c + ORDER[i]` into nibble `i` of word `c`.
const AWQ_PACK_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

fn i32s(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// GPTQ: `qweight [K * bits / 32, N]` packed along K, `qzeros [G, N * bits / 32]` packed along N (low bits first),
/// `w = scale[g_idx[k], n] * (q - z)`, `z = stored + 1` in the v1 format. AWQ: `qweight [K, N / 8]` and `qzeros`
/// packed along N in AWQ's order, `w = scale[k / gs, n] * (q - z)`.
fn dequant_spec(st: &SafetensorsModel, prefix: &str, s: &Spec, n: usize, k: usize) -> Dequant {
    let raw = |t: &str| st.get(&format!("{prefix}.{t}")).unwrap().2.to_vec();
    let (qweight, qzeros) = (i32s(&raw("qweight")), i32s(&raw("qzeros")));
    let scales: Vec<f32> = raw("scales")
        .chunks_exact(2)
        .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect();
    let per = 32 / s.bits as usize;
    let mask = (1i64 << s.bits) - 1;
    let field = |word: i32, slot: usize| ((word as u32 as i64) >> (s.bits as usize * slot)) & mask;
    let gs = if s.group_size > 0 { s.group_size as usize } else { k };
    let g_idx: Vec<usize> = match st.get(&format!("{prefix}.g_idx")) {
        Some(_) if !s.awq => i32s(&raw("g_idx")).iter().map(|&g| g as usize).collect(),
        _ => (0..k).map(|i| i / gs).collect(),
    };
    let slot_of = |col: usize| -> usize {
        if s.awq {
            AWQ_PACK_ORDER.iter().position(|&o| o == col % 8).unwrap()
        } else {
            col % per
        }
    };
    let mut d = Dequant {
        w: vec![0.0; n * k],
        scale: vec![0.0; n * k],
        scale_zero: vec![0.0; n * k],
    };
    for row in 0..n {
        for col in 0..k {
            let g = g_idx[col];
            let q = if s.awq {
                field(qweight[col * (n / 8) + row / 8], slot_of(row))
            } else {
                field(qweight[(col / per) * n + row], col % per)
            };
            let stored = field(qzeros[g * (n / per) + row / per], slot_of(row));
            let z = if !s.awq && !s.v2 { stored + 1 } else { stored };
            let sc = scales[g * n + row];
            d.w[row * k + col] = sc * (q - z) as f32;
            d.scale[row * k + col] = sc;
            d.scale_zero[row * k + col] = (sc * z as f32).abs();
        }
    }
    d
}

/// The weight as the device holds it: the packed parts read back, unpacked to ggml blocks, dequantized, and its
/// column permutation (read back too) undone: `[n, k]` in the matrix's own column order.
fn device_weight(gpu: &Gpu, lin: &Linear) -> (GgmlType, Vec<f32>, bool) {
    let Linear::Quant { w, perm } = lin else {
        panic!("a GPTQ layer must load as Linear::Quant")
    };
    let words = |t: &shaderlm::gpu::GpuTensor, i: usize| -> Vec<u32> {
        let p = &t.parts[i];
        bytemuck::pod_collect_to_vec(&read_buffer(gpu, &p.buffer, 0, p.bytes).unwrap())
    };
    let parts: Vec<HostPart> = (0..w.quants.parts.len())
        .map(|i| HostPart {
            row0: w.quants.parts[i].row0,
            rows: w.quants.parts[i].rows,
            quants: words(&w.quants, i),
            scales: words(&w.scales, i),
            mins: w.mins.as_ref().map_or(Vec::new(), |m| words(m, i)),
        })
        .collect();
    let raw = unpack(w.format.ty, w.layout, w.n, w.k, &parts).unwrap();
    let blocks = shaderlm::quant::dequantize(w.format.ty, &raw).unwrap();
    let perm: Vec<u32> = match perm {
        Some(p) => bytemuck::pod_collect_to_vec(&p.download(gpu).unwrap()),
        None => (0..w.k as u32).collect(),
    };
    let mut out = vec![0f32; w.n * w.k];
    for row in 0..w.n {
        for (j, &c) in perm.iter().enumerate() {
            out[row * w.k + c as usize] = blocks[row * w.k + j];
        }
    }
    (w.format.ty, out, perm.iter().enumerate().any(|(j, &c)| c as usize != j))
}

/// The test's dequantized weights for the quantized layers, the checkpoint's own tensors for the rest.
struct SpecWeights<'a> {
    st: &'a SafetensorsModel,
    dense: HashMap<String, (Vec<usize>, Vec<f32>)>,
}

impl WeightSource for SpecWeights<'_> {
    fn describe(&self) -> String {
        "weights dequantized by the test".into()
    }
    fn tensor(&self, name: &str) -> shaderlm::Result<Option<HostTensor<'_>>> {
        match self.dense.get(name) {
            Some((shape, w)) => Ok(Some(HostTensor {
                name: name.into(),
                shape: shape.clone(),
                data: HostData::F32(w.clone()),
            })),
            None => self.st.tensor(name),
        }
    }
}

/// Prefill `prompt` tokens, then decode the rest one at a time: the last logits of every step.
fn gpu_logits(model: &Llama, tokens: &[u32], prompt: usize) -> Vec<(usize, Vec<f32>, u32)> {
    let gpu = gpu();
    let steps = prefill_then_decode(tokens.len(), prompt, prompt);
    run_steps(gpu, model, tokens, &steps, 64, LOGITS_AND_ARGMAX)
        .into_iter()
        .map(|(p, r)| (p, r.logits, r.argmax.unwrap()))
        .collect()
}

/// Checks (a) and (b) of the module doc on the checkpoint of `s`.
fn check(s: Spec) {
    let gpu = gpu();
    let dir = tempfile::tempdir().unwrap();
    let floats = write(dir.path(), &s, |_, _| {});
    let st = SafetensorsModel::open(dir.path()).unwrap();
    assert!(st.quant().is_some());
    let want_ty = match (s.bits, s.sym && !s.awq) {
        (8, _) => GgmlType::Q8_0,
        (_, true) => GgmlType::Q4_0,
        _ => GgmlType::Q4_1,
    };
    // (a) Each layer on the device against the format's dequantization. Q4_0 and Q8_0 hold the f16 scale and the
    // codes as they are: equal bit for bit. Q4_1 stores m = -scale * z rounded to f16: half an f16 ulp,
    // 2^-11 |scale * z|, plus the f32 rounding of d * q + m (2^-24 of the larger term, bounded by 1e-6 |w| + |s z|
    // 2^-23). The dequantization must also be the RTN quantization of the original weights: within half a step
    // (scale / 2), plus the f16 rounding of the scale (2^-11) over the 2^(bits-1) steps to the clamped end.
    let mut dense = HashMap::new();
    for (name, orig) in &floats {
        let prefix = name.strip_suffix(".weight").unwrap();
        let host = st.require(name).unwrap();
        let (n, k) = (host.shape[0], host.shape[1]);
        let spec = dequant_spec(&st, prefix, &s, n, k);
        for (i, (a, b)) in spec.w.iter().zip(orig).enumerate() {
            let rtn = (0.5 + (1 << (s.bits - 1)) as f32 / 2048.0) * spec.scale[i] + 1e-6;
            assert!((a - b).abs() <= rtn, "{name}[{i}]: on disk {a}, original {b}");
        }
        let lin = Linear::load(gpu, &host).unwrap();
        let (ty, got, permuted) = device_weight(gpu, &lin);
        assert_eq!(ty, want_ty, "{name}");
        assert_eq!(permuted, s.act != Act::None, "{name}: column permutation");
        for (i, (a, b)) in got.iter().zip(&spec.w).enumerate() {
            let bound = match ty {
                GgmlType::Q4_1 => spec.scale_zero[i] * (1.0 / 2048.0 + 1.0 / (1 << 23) as f32) + 1e-6 * b.abs(),
                _ => 0.0,
            };
            assert!(
                (a - b).abs() <= bound,
                "{name}[{i}]: device {a}, format {b} (bound {bound:e})"
            );
        }
        dense.insert(name.clone(), (vec![n, k], spec.w));
    }
    // (b) The model on the GPU. Against the CPU forward on the loader's own weights: f32 math differing only in
    // summation order (NMSE ~1e-12..1e-10 through 2 layers); 1e-8 as in tests/model.rs, while a wrong gather or
    // block gives > 1e-3. Against the forward on this file's dequantized weights: the same where the blocks are
    // exact; for Q4_1 the minimum's rounding moves each weight by up to 2^-11 |scale * z| (uniformly spread),
    // a weight NMSE of about 2^-22 z^2 / (3 E[(q - z)^2]), ~2.5e-7 for z ~ 8, which the logits inherit (measured
    // 1e-8 to 8e-8): 1e-6, while a wrong zero or scale anywhere gives > 1e-3.
    let cfg = LlamaConfig::from_hf(&dir.path().join("config.json")).unwrap();
    let model = Llama::load(gpu, &st, cfg.clone(), Names::Hf, |_, _| {}).unwrap();
    let tokens: Vec<u32> = (0..10u32).map(|i| (i * 37 + 11) % cfg.vocab as u32).collect();
    let got = gpu_logits(&model, &tokens, 7);
    let loader = reference::logits(&st, &cfg, Names::Hf, &tokens).unwrap();
    let spec_src = SpecWeights { st: &st, dense };
    let spec = reference::logits(&spec_src, &cfg, Names::Hf, &tokens).unwrap();
    let spec_bound = if want_ty == GgmlType::Q4_1 { 1e-6 } else { 1e-8 };
    for (p, logits, arg) in got {
        let e = nmse(&logits, &loader[p]);
        assert!(
            e < 1e-8,
            "{s:?} position {p}: logits nmse {e:e} against the loader's weights"
        );
        assert_eq!(
            arg,
            shaderlm::sampling::argmax(&loader[p]),
            "{s:?} position {p}: argmax"
        );
        let e = nmse(&logits, &spec[p]);
        assert!(
            e < spec_bound,
            "{s:?} position {p}: logits nmse {e:e} against the format's weights"
        );
    }
}

#[test]
fn gptq_4bit_sym_g128_runs_as_q4_0() {
    check(GPTQ);
}

#[test]
fn gptq_4bit_asym_g32_runs_as_q4_1() {
    check(Spec {
        group_size: 32,
        sym: false,
        ..GPTQ
    });
}

#[test]
fn gptq_4bit_sym_act_order_g64_shared_orders() {
    check(Spec {
        group_size: 64,
        act: Act::Shared,
        ..GPTQ
    });
}

#[test]
fn gptq_4bit_asym_act_order_g32_per_layer_orders_from_quantize_config_json() {
    check(Spec {
        group_size: 32,
        sym: false,
        act: Act::PerLayer,
        separate_file: true,
        ..GPTQ
    });
}

#[test]
fn gptq_4bit_asym_per_channel_v2_format() {
    check(Spec {
        group_size: -1,
        sym: false,
        v2: true,
        ..GPTQ
    });
}

#[test]
fn gptq_8bit_sym_g128_runs_as_q8_0() {
    check(Spec { bits: 8, ..GPTQ });
}

#[test]
fn awq_4bit_g64() {
    check(Spec {
        awq: true,
        group_size: 64,
        sym: false,
        ..GPTQ
    });
}

#[test]
fn awq_4bit_g128() {
    check(Spec {
        awq: true,
        sym: false,
        ..GPTQ
    });
}

#[test]
fn gptq_act_order_gate_and_up_stack_only_with_equal_orders() {
    let gpu = gpu();
    for (act, stacked) in [(Act::Shared, true), (Act::PerLayer, false)] {
        let dir = tempfile::tempdir().unwrap();
        let spec = Spec {
            act,
            group_size: 32,
            ..GPTQ
        };
        write(dir.path(), &spec, |_, _| {});
        let st = SafetensorsModel::open(dir.path()).unwrap();
        let parts = [
            st.require("model.layers.0.mlp.gate_proj.weight").unwrap(),
            st.require("model.layers.0.mlp.up_proj.weight").unwrap(),
        ];
        let got = Linear::load_stacked(gpu, "gate_up", &parts).unwrap();
        assert_eq!(got.is_some(), stacked, "{act:?}");
        if let Some(lin) = got {
            // The stacked rows, gate then up, each as its own layer dequantizes.
            let (_, w, _) = device_weight(gpu, &lin);
            let want: Vec<f32> = parts.iter().flat_map(|t| t.to_f32().unwrap()).collect();
            assert_eq!(w, want);
        }
    }
}

#[test]
fn gptq_model_loads_through_the_model_directory() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        &Spec {
            act: Act::Shared,
            ..GPTQ
        },
        |_, _| {},
    );
    let m = shaderlm::model::LoadedModel::open(
        gpu(),
        dir.path(),
        &shaderlm::model::LoadOptions::with_ctx(32),
        |_, _| {},
    )
    .unwrap();
    assert_eq!(m.model.cfg.hidden, 128);
}

/// The error of loading a checkpoint edited by `edit`, at open or at the model load.
fn load_error(s: Spec, edit: impl FnOnce(&mut Vec<Entry>, &mut Value)) -> String {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &s, edit);
    let err = match SafetensorsModel::open(dir.path()) {
        Err(e) => e,
        Ok(st) => {
            let cfg = LlamaConfig::from_hf(&dir.path().join("config.json")).unwrap();
            match Llama::load(gpu(), &st, cfg, Names::Hf, |_, _| {}) {
                Err(e) => e,
                Ok(_) => panic!("{s:?}: an edited checkpoint loaded"),
            }
        }
    };
    err.to_string()
}

/// A change to a checkpoint before it is written.
type Edit = Box<dyn FnOnce(&mut Vec<Entry>, &mut Value)>;

fn set_shape(entries: &mut [Entry], name: &str, shape: Vec<usize>, bytes: usize) {
    let e = entries.iter_mut().find(|e| e.0 == name).unwrap();
    e.2 = shape;
    e.3 = vec![0; bytes];
}

#[test]
fn gptq_bad_input_errors_name_the_tensor_and_file() {
    const Q: &str = "model.layers.0.self_attn.q_proj";
    let cases: Vec<(&str, Spec, Edit, Vec<String>)> = vec![
        (
            "qzeros of another width",
            GPTQ,
            Box::new(|e, _| set_shape(e, &format!("{Q}.qzeros"), vec![1, 17], 4 * 17)),
            vec![format!("{Q}.qzeros"), "model.safetensors".into(), "[1, 17]".into()],
        ),
        (
            "scales of another group count",
            GPTQ,
            Box::new(|e, _| set_shape(e, &format!("{Q}.scales"), vec![2, 128], 2 * 256)),
            vec![format!("{Q}.scales"), "model.safetensors".into()],
        ),
        (
            "g_idx of another length than qweight's K",
            GPTQ,
            Box::new(|e, _| set_shape(e, &format!("{Q}.qweight"), vec![8, 128], 4 * 8 * 128)),
            vec![format!("{Q}.g_idx"), "model.safetensors".into(), "expected [64]".into()],
        ),
        (
            "a whole layer for another K (the model's shape check)",
            GPTQ,
            Box::new(|e, _| {
                set_shape(e, &format!("{Q}.qweight"), vec![8, 128], 4 * 8 * 128);
                e.retain(|x| x.0 != format!("{Q}.g_idx"));
            }),
            vec![format!("{Q}.weight"), "[128, 64]".into()],
        ),
        (
            "scales stored as f32",
            GPTQ,
            Box::new(|e, _| {
                let s = e.iter_mut().find(|x| x.0 == format!("{Q}.scales")).unwrap();
                s.1 = Dtype::F32;
                s.3 = vec![0; 4 * 128];
            }),
            vec![format!("{Q}.scales"), "model.safetensors".into(), "F32".into()],
        ),
        (
            "3 bits",
            GPTQ,
            Box::new(|_, c| c["quantization_config"]["bits"] = json!(3)),
            vec!["config.json".into(), "bits 3".into()],
        ),
        (
            "group size 48",
            GPTQ,
            Box::new(|_, c| c["quantization_config"]["group_size"] = json!(48)),
            vec!["config.json".into(), "group size 48".into()],
        ),
        (
            "act-order without g_idx",
            Spec {
                act: Act::Shared,
                ..GPTQ
            },
            Box::new(|e, _| e.retain(|x| !x.0.ends_with(".g_idx"))),
            vec![".g_idx".into(), "model.safetensors".into(), "desc_act".into()],
        ),
        (
            "a GPTQ config over float weights",
            GPTQ,
            Box::new(|e, _| {
                let t = tiny();
                e.retain(|x| !x.0.contains("_proj."));
                for (name, _, shape, w) in weights(&t, 7).into_iter().filter(|w| w.0.contains("_proj.")) {
                    e.push((name, Dtype::F32, shape, le32(w.iter().map(|x| x.to_bits()))));
                }
            }),
            vec!["config.json".into(), ".qweight".into()],
        ),
        (
            "GPTQ tensors without a quantization config",
            GPTQ,
            Box::new(|_, c| {
                c.as_object_mut().unwrap().remove("quantization_config");
            }),
            vec![
                ".qweight".into(),
                "model.safetensors".into(),
                "quantization_config".into(),
            ],
        ),
        (
            "a g_idx group out of range",
            Spec {
                act: Act::Shared,
                ..GPTQ
            },
            Box::new(|e, _| {
                let g = e.iter_mut().find(|x| x.0 == format!("{Q}.g_idx")).unwrap();
                g.3[..4].copy_from_slice(&5i32.to_le_bytes());
            }),
            vec![format!("{Q}.g_idx"), "model.safetensors".into(), "group 5".into()],
        ),
    ];
    for (what, spec, edit, needles) in cases {
        let e = load_error(spec, edit);
        for n in &needles {
            assert!(e.contains(n.as_str()), "{what}: the error should name {n:?}: {e}");
        }
    }
}
