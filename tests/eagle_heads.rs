//! EAGLE heads in SafeAILab's published layouts (random weights, written here), against an independent CPU forward
//! written from the published modeling code (`cnets.py`): EAGLE-1 (fc over the embedding and the target's final
//! hidden state, a decoder layer with no input norm, the target's head with no final norm) and EAGLE-3 (fc over the
//! target's three hidden states, the midlayer over the normed embedding and feature, its own norm and head over the
//! draft vocabulary, `d2t`); MiniCPM's heads in vLLM's and CPM.cu's layouts against a forward written from
//! vLLM's `EagleMiniCPM` and CPM.cu's `MiniCPM4EagleImpl`. Drafts in chains and trees keep greedy output equal to
//! plain decoding, and malformed heads are refused by name.

mod common;

use common::rng::Rng;
use safetensors::Dtype;
use shaderlm::generate::eagle::EagleDraft;
use shaderlm::generate::spec::{generate_spec, SpecOptions, Speculator};
use shaderlm::generate::tree::TreeShape;
use shaderlm::generate::{generate, GenOptions, Generator};
use shaderlm::model::eagle3::{feature_layers, FeatureProjector};
use shaderlm::model::weights::WeightSource;
use shaderlm::model::{Llama, LlamaConfig, StepOutputs};
use shaderlm::sampling::{Sampler, SamplingParams};
use std::collections::HashMap;
use std::path::Path;

/// A random EAGLE-3 head for target `t` with `dv` draft tokens (draft id d is target id `ids[d]`), its MLP 64 wide.
struct Head {
    tensors: Vec<(String, Vec<usize>, Vec<f32>)>,
    ids: Vec<u32>,
}

impl Head {
    fn random(t: &LlamaConfig, dv: usize, seed: u64) -> Head {
        let (h, q, kv, ffn) = (t.hidden, t.n_heads * t.head_dim, t.n_kv_heads * t.head_dim, 64);
        let mut rng = Rng::new(seed);
        let mut w = |name: &str, shape: &[usize], amp: f32| {
            let n = shape.iter().product();
            (name.to_string(), shape.to_vec(), rng.vec(n, amp))
        };
        let norm = |name: &str, rng: &mut Rng| {
            let v: Vec<f32> = (0..h).map(|_| 1.0 + 0.2 * rng.f32()).collect();
            (name.to_string(), vec![h], v)
        };
        let mut tensors = vec![
            w("fc.weight", &[h, 3 * h], 0.03),
            w("midlayer.self_attn.q_proj.weight", &[q, 2 * h], 0.05),
            w("midlayer.self_attn.k_proj.weight", &[kv, 2 * h], 0.05),
            w("midlayer.self_attn.v_proj.weight", &[kv, 2 * h], 0.05),
            w("midlayer.self_attn.o_proj.weight", &[h, q], 0.05),
            w("midlayer.mlp.gate_proj.weight", &[ffn, h], 0.05),
            w("midlayer.mlp.up_proj.weight", &[ffn, h], 0.05),
            w("midlayer.mlp.down_proj.weight", &[h, ffn], 0.05),
            w("lm_head.weight", &[dv, h], 0.1),
        ];
        let mut rng = Rng::new(seed + 1);
        for name in [
            "midlayer.input_layernorm.weight",
            "midlayer.hidden_norm.weight",
            "midlayer.post_attention_layernorm.weight",
            "norm.weight",
        ] {
            tensors.push(norm(name, &mut rng));
        }
        // The draft vocabulary: every third token id, in order.
        let ids = (0..dv as u32).map(|d| (3 * d) % t.vocab as u32).collect();
        Head { tensors, ids }
    }

    fn get(&self, name: &str) -> &[f32] {
        self.find(name).unwrap_or_else(|| panic!("no tensor {name}"))
    }

    fn find(&self, name: &str) -> Option<&[f32]> {
        self.tensors.iter().find(|t| t.0 == name).map(|t| &t.2[..])
    }

    /// Write config.json and model.safetensors (`d2t` as published: int64 offsets) into `dir`.
    fn write(&self, dir: &Path, t: &LlamaConfig, d2t: Option<Vec<i64>>) {
        std::fs::create_dir_all(dir).unwrap();
        let config = serde_json::json!({
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "hidden_size": t.hidden,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": t.n_heads,
            "num_key_value_heads": t.n_kv_heads,
            "head_dim": t.head_dim,
            "vocab_size": t.vocab,
            "draft_vocab_size": self.ids.len(),
            "rms_norm_eps": t.rms_eps,
            "rope_theta": t.rope_theta,
            "max_position_embeddings": t.context,
            "tie_word_embeddings": false,
            "torch_dtype": "float32",
        });
        let d2t = d2t.unwrap_or_else(|| {
            self.ids
                .iter()
                .enumerate()
                .map(|(d, &id)| id as i64 - d as i64)
                .collect()
        });
        let mut t2d = vec![0u8; t.vocab];
        self.ids.iter().for_each(|&id| t2d[id as usize] = 1);
        let extra = vec![
            (
                "d2t".into(),
                Dtype::I64,
                vec![d2t.len()],
                bytemuck::cast_slice(&d2t).to_vec(),
            ),
            ("t2d".into(), Dtype::BOOL, vec![t.vocab], t2d),
        ];
        write_head_dir(dir, &config, &self.tensors, extra);
    }
}

/// A head directory: `config` as config.json, and `tensors` (f32) then `extra` (any dtype, raw bytes) as
/// model.safetensors.
fn write_head_dir(
    dir: &Path,
    config: &serde_json::Value,
    tensors: &[(String, Vec<usize>, Vec<f32>)],
    extra: Vec<(String, Dtype, Vec<usize>, Vec<u8>)>,
) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(config).unwrap()).unwrap();
    let bytes: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s, v)| (n.clone(), Dtype::F32, s.clone(), bytemuck::cast_slice(v).to_vec()))
        .chain(extra)
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = bytes
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), &dir.join("model.safetensors")).unwrap();
}

fn matvec(w: &[f32], x: &[f32]) -> Vec<f32> {
    w.chunks_exact(x.len())
        .map(|r| r.iter().zip(x).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() as f32)
        .collect()
}

fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps as f64).sqrt();
    x.iter().zip(w).map(|(v, w)| (*v as f64 * inv) as f32 * w).collect()
}

/// Hugging Face's Llama rotation (rotate_half) of one head at position `pos`.
fn rope(x: &mut [f32], pos: usize, theta: f32) {
    let d = x.len();
    for i in 0..d / 2 {
        let a = pos as f64 / (theta as f64).powf(2.0 * i as f64 / d as f64);
        let (s, c) = a.sin_cos();
        let (x0, x1) = (x[i] as f64, x[i + d / 2] as f64);
        x[i] = (x0 * c - x1 * s) as f32;
        x[i + d / 2] = (x1 * c + x0 * s) as f32;
    }
}

/// The published forward over entries 0..n (token `tokens[j]` with feature `feats[j]`, at position j): every
/// entry's output hidden state, and the last entry's logits (EAGLE-3: its own norm and head over the draft
/// vocabulary; EAGLE-1: `target_head` `[vocab, hidden]` over the output, no norm). `p` is the layer's name prefix.
/// Which published head the CPU forward computes.
#[derive(Clone, Copy)]
enum Variant<'a> {
    /// EAGLE-1, scored by the target's head `[vocab, hidden]`.
    V1(&'a [f32]),
    V3,
    /// MiniCPM's heads: the target's head, `scale_emb`, the residual scale, the output scale
    /// (`dim_model_base / hidden`), the prefix of `fc` and the input norms (`model.` in vLLM's layout, none in
    /// CPM.cu's, where `fc.bias` may be), its layer's name prefix, whether the scaled output is the next feature
    /// (vLLM) or the output itself (CPM.cu).
    MiniCpm {
        head: &'a [f32],
        emb: f32,
        residual: f32,
        out: f32,
        prefix: &'a str,
        layer: &'a str,
        feeds_scaled: bool,
    },
}

fn cpu_forward(
    head: &Head,
    t: &LlamaConfig,
    embed: &[f32],
    (tokens, feats): (&[u32], &[Vec<f32>]),
    variant: Variant<'_>,
) -> (Vec<Vec<f32>>, Vec<f32>) {
    let (h, hd, nh, nkv) = (t.hidden, t.head_dim, t.n_heads, t.n_kv_heads);
    let eps = t.rms_eps;
    let v1 = matches!(variant, Variant::V1(_));
    let p = match variant {
        Variant::V1(_) => "layers.0",
        Variant::V3 => "midlayer",
        Variant::MiniCpm { layer, .. } => layer,
    };
    let w = |name: &str| head.get(&format!("{p}.{name}"));
    let (mut qs, mut ks, mut vs, mut residual) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (j, (&tok, f)) in tokens.iter().zip(feats).enumerate() {
        let e = &embed[tok as usize * h..(tok as usize + 1) * h];
        if let Variant::MiniCpm { emb, prefix, .. } = variant {
            // fc(cat(norm1(e * scale_emb), norm2(f))) (+ CPM.cu's fc1 bias), the residual stream; the layer then
            // norms its input.
            let e: Vec<f32> = e.iter().map(|v| v * emb).collect();
            let mut cat = rms_norm(&e, head.get(&format!("{prefix}input_norm1.weight")), eps);
            cat.extend(rms_norm(f, head.get(&format!("{prefix}input_norm2.weight")), eps));
            let mut x = matvec(head.get(&format!("{prefix}fc.weight")), &cat);
            if let Some(b) = head.find(&format!("{prefix}fc.bias")) {
                x.iter_mut().zip(b).for_each(|(x, b)| *x += b);
            }
            let xn = rms_norm(&x, w("input_layernorm.weight"), eps);
            residual.push(x);
            let mut q = matvec(w("self_attn.q_proj.weight"), &xn);
            let mut k = matvec(w("self_attn.k_proj.weight"), &xn);
            q.chunks_exact_mut(hd).for_each(|c| rope(c, j, t.rope_theta));
            k.chunks_exact_mut(hd).for_each(|c| rope(c, j, t.rope_theta));
            qs.push(q);
            ks.push(k);
            vs.push(matvec(w("self_attn.v_proj.weight"), &xn));
            continue;
        }
        let x = if v1 {
            // EAGLE-1: fc(cat(e, f)) + b, which is also the residual stream (no input norm).
            let cat: Vec<f32> = e.iter().chain(f).copied().collect();
            let x: Vec<f32> = matvec(head.get("fc.weight"), &cat)
                .iter()
                .zip(head.get("fc.bias"))
                .map(|(a, b)| a + b)
                .collect();
            residual.push(x.clone());
            x
        } else {
            let mut x = rms_norm(e, w("input_layernorm.weight"), eps);
            x.extend(rms_norm(f, w("hidden_norm.weight"), eps));
            residual.push(f.clone());
            x
        };
        let mut q = matvec(w("self_attn.q_proj.weight"), &x);
        let mut k = matvec(w("self_attn.k_proj.weight"), &x);
        q.chunks_exact_mut(hd).for_each(|c| rope(c, j, t.rope_theta));
        k.chunks_exact_mut(hd).for_each(|c| rope(c, j, t.rope_theta));
        qs.push(q);
        ks.push(k);
        vs.push(matvec(w("self_attn.v_proj.weight"), &x));
    }
    let mut outs = Vec::new();
    for (j, f) in residual.iter().enumerate() {
        let mut a = vec![0f32; nh * hd];
        for head_i in 0..nh {
            let kvh = head_i / (nh / nkv);
            let qh = &qs[j][head_i * hd..(head_i + 1) * hd];
            let scores: Vec<f64> = (0..=j)
                .map(|i| {
                    let kh = &ks[i][kvh * hd..(kvh + 1) * hd];
                    qh.iter().zip(kh).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() / (hd as f64).sqrt()
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let z: f64 = p.iter().sum();
            for d in 0..hd {
                let v: f64 = (0..=j).map(|i| p[i] * vs[i][kvh * hd + d] as f64).sum();
                a[head_i * hd + d] = (v / z) as f32;
            }
        }
        let rs = match variant {
            Variant::MiniCpm { residual, .. } => residual,
            _ => 1.0,
        };
        let o = matvec(w("self_attn.o_proj.weight"), &a);
        let r: Vec<f32> = f.iter().zip(&o).map(|(x, y)| x + rs * y).collect();
        let x = rms_norm(&r, w("post_attention_layernorm.weight"), eps);
        let g = matvec(w("mlp.gate_proj.weight"), &x);
        let u = matvec(w("mlp.up_proj.weight"), &x);
        let m: Vec<f32> = g.iter().zip(&u).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
        let d = matvec(w("mlp.down_proj.weight"), &m);
        outs.push(r.iter().zip(&d).map(|(x, y)| x + rs * y).collect::<Vec<f32>>());
    }
    let logits = match variant {
        Variant::V1(th) => matvec(th, outs.last().unwrap()),
        Variant::V3 => matvec(
            head.get("lm_head.weight"),
            &rms_norm(outs.last().unwrap(), head.get("norm.weight"), eps),
        ),
        Variant::MiniCpm {
            head,
            out,
            feeds_scaled,
            ..
        } => {
            let scaled: Vec<f32> = outs.last().unwrap().iter().map(|v| v * out).collect();
            if feeds_scaled {
                outs.iter_mut().for_each(|o| o.iter_mut().for_each(|v| *v *= out));
            }
            matvec(head, &scaled)
        }
    };
    (outs, logits)
}

fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let err: f64 = got.iter().zip(want).map(|(a, b)| (*a as f64 - *b as f64).powi(2)).sum();
    let norm: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    err / norm.max(1e-30)
}

#[test]
fn eagle3_heads_match_a_cpu_forward_draft_losslessly_and_bad_heads_are_refused() {
    let (gpu, loaded) = common::golden::load("SmolLM2-135M-Instruct.Q4_1.gguf", "");
    let t = &loaded.model.cfg;
    let dv = 4096;
    let head = Head::random(t, dv, 31);
    let dir = tempfile::tempdir().unwrap();
    head.write(dir.path(), t, None);
    let model = Llama::load_eagle(&gpu, dir.path(), &loaded.model).unwrap();
    assert!(model.is_eagle3());
    assert_eq!(
        model.head_ids().unwrap(),
        head.ids.as_slice(),
        "d2t maps draft ids to token ids"
    );

    // The target's three hidden states per prompt token, and the head's step over them.
    let fx = common::golden::fixture("smollm2", "chat_capital");
    let prompt = &fx.prompt_tokens[..24];
    let aux_out = StepOutputs {
        argmax: true,
        aux_hidden: true,
        ..Default::default()
    };
    let mut target = Generator::new(&gpu, &loaded.model, loaded.ctx, aux_out).unwrap();
    target.feed(prompt).unwrap();
    let h = t.hidden;
    let aux = target.result.aux_hidden.clone();
    assert_eq!(
        aux.len(),
        prompt.len() * 3 * h,
        "[n, 3 hidden] for layers {:?}",
        feature_layers(t.n_layers)
    );
    let mut features = Vec::new();
    FeatureProjector::default()
        .project(&gpu, &model, &aux, &mut features)
        .unwrap();
    let head_out = StepOutputs {
        logits: true,
        hidden: true,
        argmax: true,
        ..Default::default()
    };
    let mut hg = Generator::new(&gpu, &model, loaded.ctx, head_out).unwrap();
    let n = prompt.len() - 1;
    hg.feed_with(&prompt[1..], &features[..n * h]).unwrap();
    // The CPU forward from the published code: the feature fc(cat(low, mid, high)), entries (t_{j+1}, f_j).
    // The target's embedding rows, dequantized on the CPU from the file.
    let gguf = shaderlm::loader::gguf::GgufFile::open(&loaded.path).unwrap();
    let table = gguf.require("token_embd.weight").unwrap().to_f32().unwrap();
    let feats: Vec<Vec<f32>> = (0..n)
        .map(|j| matvec(head.get("fc.weight"), &aux[j * 3 * h..(j + 1) * 3 * h]))
        .collect();
    let (outs, logits) = cpu_forward(&head, t, &table, (&prompt[1..], &feats), Variant::V3);
    let want_hidden: Vec<f32> = outs.concat();
    let (e1, e2) = (nmse(&hg.result.hidden, &want_hidden), nmse(&hg.result.logits, &logits));
    println!("head vs CPU forward: hidden NMSE {e1:.2e}, logits NMSE {e2:.2e}");
    assert!(e1 < 1e-8 && e2 < 1e-8, "hidden {e1:e}, logits {e2:e}");
    let best = logits
        .iter()
        .enumerate()
        .fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b })
        .0;
    assert_eq!(hg.result.argmax, Some(head.ids[best]), "the argmax goes through d2t");

    // Lossless: chains and trees, greedy, with a follow-up turn.
    let full = StepOutputs {
        argmax: true,
        aux_hidden: true,
        ..Default::default()
    };
    let mut gen = Generator::new(&gpu, &loaded.model, loaded.ctx, full).unwrap();
    let tok = &loaded.tokenizer;
    let opts = GenOptions {
        max_tokens: 16,
        stop_strings: Vec::new(),
        stop_at_eos: false,
    };
    let follow = tok.encode("\nAgain, shorter.", false).unwrap();
    let turn = |gen: &mut Generator<'_>, spec: Option<&mut Speculator<'_>>| {
        gen.truncate(0);
        let mut sampler = Sampler::new(SamplingParams::greedy());
        let first = match spec {
            Some(s) => {
                generate_spec(gen, tok, &mut sampler, &fx.prompt_tokens, &opts, s, |_| true)
                    .unwrap()
                    .0
            }
            None => generate(gen, tok, &mut sampler, &fx.prompt_tokens, &opts, |_| true).unwrap(),
        };
        let mut next = vec![*first.generated.last().unwrap()];
        next.extend_from_slice(&follow);
        let second = generate(gen, tok, &mut sampler, &next, &opts, |_| true).unwrap();
        (first.generated, second.generated)
    };
    let plain = turn(&mut gen, None);
    let mut draft = EagleDraft::for_trees(&gpu, &model, loaded.ctx, 4).unwrap();
    for tree in [
        None,
        Some(TreeShape {
            depth: 3,
            topk: 4,
            size: 16,
        }),
    ] {
        let mut spec = Speculator::new(
            &mut draft,
            SpecOptions {
                min_accepted: 0.0,
                tree,
                ..Default::default()
            },
        );
        assert_eq!(turn(&mut gen, Some(&mut spec)), plain, "EAGLE-3, tree {tree:?}");
    }

    // Malformed heads are refused by name.
    let bad = |d2t: Option<Vec<i64>>, edit: &dyn Fn(&mut Head), want: &str| {
        let dir = tempfile::tempdir().unwrap();
        let mut h2 = Head::random(t, 64, 5);
        edit(&mut h2);
        h2.write(dir.path(), t, d2t);
        let err = Llama::load_eagle(&gpu, dir.path(), &loaded.model)
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains(want), "{err}");
    };
    bad(Some(vec![t.vocab as i64; 64]), &|_| {}, "d2t[0]");
    bad(Some(vec![0; 63]), &|_| {}, "d2t");
    bad(None, &|h| h.tensors.retain(|x| x.0 != "fc.weight"), "fc.weight");
    bad(
        None,
        &|h| {
            h.tensors
                .iter_mut()
                .filter(|x| x.0 == "lm_head.weight")
                .for_each(|x| x.1 = vec![32, 2 * x.1[1]])
        },
        "lm_head.weight",
    );
}

/// A random EAGLE-1 head (SafeAILab's `layers.0.*` layout with `fc` `[hidden, 2 hidden]` and its bias) against the
/// CPU forward: the target's final-normed hidden states as features, the head's step over (t_{j+1}, f_j).
#[test]
fn eagle1_heads_match_a_cpu_forward() {
    let (gpu, loaded) = common::golden::load("SmolLM2-135M-Instruct.Q4_1.gguf", "");
    let t = &loaded.model.cfg;
    let (h, q, kv, ffn) = (t.hidden, t.n_heads * t.head_dim, t.n_kv_heads * t.head_dim, 64);
    let mut rng = Rng::new(41);
    let mut w = |name: &str, shape: &[usize], amp: f32| {
        let n = shape.iter().product();
        (name.to_string(), shape.to_vec(), rng.vec(n, amp))
    };
    let mut tensors = vec![
        w("fc.weight", &[h, 2 * h], 0.03),
        w("fc.bias", &[h], 0.1),
        w("layers.0.self_attn.q_proj.weight", &[q, h], 0.05),
        w("layers.0.self_attn.k_proj.weight", &[kv, h], 0.05),
        w("layers.0.self_attn.v_proj.weight", &[kv, h], 0.05),
        w("layers.0.self_attn.o_proj.weight", &[h, q], 0.05),
        w("layers.0.mlp.gate_proj.weight", &[ffn, h], 0.05),
        w("layers.0.mlp.up_proj.weight", &[ffn, h], 0.05),
        w("layers.0.mlp.down_proj.weight", &[h, ffn], 0.05),
    ];
    tensors.push((
        "layers.0.post_attention_layernorm.weight".into(),
        vec![h],
        (0..h).map(|i| 1.0 + 0.001 * i as f32).collect(),
    ));
    let head = Head {
        tensors,
        ids: Vec::new(),
    };
    let dir = tempfile::tempdir().unwrap();
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h, "intermediate_size": ffn,
        "num_hidden_layers": 1, "num_attention_heads": t.n_heads, "num_key_value_heads": t.n_kv_heads,
        "head_dim": t.head_dim, "vocab_size": t.vocab, "rms_norm_eps": t.rms_eps, "rope_theta": t.rope_theta,
        "max_position_embeddings": t.context, "tie_word_embeddings": false, "torch_dtype": "float32",
    });
    write_head_dir(dir.path(), &config, &head.tensors, Vec::new());
    let model = Llama::load_eagle(&gpu, dir.path(), &loaded.model).unwrap();
    assert!(model.is_eagle() && !model.is_eagle3());

    let fx = common::golden::fixture("smollm2", "code_python");
    let prompt = &fx.prompt_tokens[..20];
    let out = StepOutputs {
        argmax: true,
        hidden: true,
        ..Default::default()
    };
    let mut target = Generator::new(&gpu, &loaded.model, loaded.ctx, out).unwrap();
    target.feed(prompt).unwrap();
    let features = target.result.hidden.clone();
    let n = prompt.len() - 1;
    let head_out = StepOutputs {
        logits: true,
        hidden: true,
        ..Default::default()
    };
    let mut hg = Generator::new(&gpu, &model, loaded.ctx, head_out).unwrap();
    hg.feed_with(&prompt[1..], &features[..n * h]).unwrap();
    let gguf = shaderlm::loader::gguf::GgufFile::open(&loaded.path).unwrap();
    let table = gguf.require("token_embd.weight").unwrap().to_f32().unwrap(); // tied: also the head
    let feats: Vec<Vec<f32>> = features.chunks_exact(h).take(n).map(<[f32]>::to_vec).collect();
    let (outs, logits) = cpu_forward(&head, t, &table, (&prompt[1..], &feats), Variant::V1(&table));
    let (e1, e2) = (
        nmse(&hg.result.hidden, &outs.concat()),
        nmse(&hg.result.logits, &logits),
    );
    println!("EAGLE-1 head vs CPU forward: hidden NMSE {e1:.2e}, logits NMSE {e2:.2e}");
    // f32 sums in another order than the f64 ones here: NMSE near 1e-13 measured.
    assert!(e1 < 1e-8 && e2 < 1e-8, "hidden {e1:e}, logits {e2:e}");
}

/// A random MiniCPM EAGLE head (vLLM's EagleMiniCPM layout: `model.fc`, `model.input_norm1/2`, its one layer named
/// `model.eagle_layers.7.*` as vLLM numbers them after the target's) for a tiny MiniCPM target: the head's step
/// equals the CPU forward of the published code (scale_emb, both input norms, the layer's input norm, the residual
/// scale over `mup_denominator`, the output over hidden / dim_model_base into the target's head), drafting in a
/// chain and a tree keeps greedy output plain, and a head of the wrong shape is refused.
#[test]
fn minicpm_eagle_heads_match_a_cpu_forward_and_draft_losslessly() {
    minicpm_head(false);
}

/// The same in CPM.cu's layout (MiniCPM4-8B-Eagle-FRSpec, `MiniCPM4EagleImpl`): `fc.weight` split into fc1 (with
/// `fc.bias`) and fc2, `input_norm1/2`, `layers.0.*`, `embed_tokens.weight` in the file and ignored, the residual
/// scale over the target's layers + 1, the target's RoPE (the head's config says another theta), the unscaled
/// output fed forward; a `token_id_remap` in the file, an `lm_head.weight` or another scale_depth are refused.
#[test]
fn cpmcu_minicpm4_eagle_heads_match_a_cpu_forward_and_draft_losslessly() {
    minicpm_head(true);
}

fn minicpm_head(cpmcu: bool) {
    let gpu = common::gpu::gpu();
    let tdir = tempfile::tempdir().unwrap();
    common::minicpm::write_minicpm(tdir.path(), 51, None);
    if cpmcu {
        // A target with plain RoPE, whose theta the head must take in place of its own.
        let path = tdir.path().join("config.json");
        let mut c: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        c.as_object_mut().unwrap().remove("rope_scaling");
        std::fs::write(&path, c.to_string()).unwrap();
    }
    let loaded = shaderlm::model::load::LoadedModel::open(
        gpu,
        tdir.path(),
        &shaderlm::model::LoadOptions::with_ctx(128),
        |_, _| {},
    )
    .unwrap();
    let t = &loaded.model.cfg;
    let (h, q, kv, ffn) = (t.hidden, t.n_heads * t.head_dim, t.n_kv_heads * t.head_dim, 64);
    let (prefix, layer) = if cpmcu {
        ("", "layers.0")
    } else {
        ("model.", "model.eagle_layers.7")
    };
    let mut rng = Rng::new(61);
    let mut w = |name: String, shape: &[usize], amp: f32| {
        let n = shape.iter().product();
        (name, shape.to_vec(), rng.vec(n, amp))
    };
    let mut tensors = vec![
        w(format!("{prefix}fc.weight"), &[h, 2 * h], 0.1),
        w(format!("{layer}.self_attn.q_proj.weight"), &[q, h], 0.1),
        w(format!("{layer}.self_attn.k_proj.weight"), &[kv, h], 0.1),
        w(format!("{layer}.self_attn.v_proj.weight"), &[kv, h], 0.1),
        w(format!("{layer}.self_attn.o_proj.weight"), &[h, q], 0.1),
        w(format!("{layer}.mlp.gate_proj.weight"), &[ffn, h], 0.1),
        w(format!("{layer}.mlp.up_proj.weight"), &[ffn, h], 0.1),
        w(format!("{layer}.mlp.down_proj.weight"), &[h, ffn], 0.1),
    ];
    if cpmcu {
        tensors.push(w("fc.bias".into(), &[h], 0.5));
        tensors.push(w("embed_tokens.weight".into(), &[t.vocab, h], 9.0));
    }
    for (i, name) in [
        format!("{prefix}input_norm1.weight"),
        format!("{prefix}input_norm2.weight"),
    ]
    .into_iter()
    .chain([
        format!("{layer}.input_layernorm.weight"),
        format!("{layer}.post_attention_layernorm.weight"),
    ])
    .enumerate()
    {
        tensors.push((
            name,
            vec![h],
            (0..h).map(|j| 1.0 + 0.01 * ((i * 7 + j) % 13) as f32).collect(),
        ));
    }
    let head = Head {
        tensors,
        ids: Vec::new(),
    };
    let write = |dir: &Path, head: &Head, layers: usize, depth: f32| {
        let mut config = serde_json::json!({
            "architectures": ["EagleMiniCPMForCausalLM"], "model_type": "minicpm", "hidden_size": h,
            "intermediate_size": ffn, "num_hidden_layers": layers, "num_attention_heads": t.n_heads,
            "num_key_value_heads": t.n_kv_heads, "head_dim": t.head_dim, "vocab_size": t.vocab,
            "rms_norm_eps": t.rms_eps, "rope_theta": 10000.0, "max_position_embeddings": 256, "scale_emb": 12,
            "scale_depth": depth, "dim_model_base": 16, "mup_denominator": 2, "tie_word_embeddings": false,
        });
        if cpmcu {
            let c = config.as_object_mut().unwrap();
            c.remove("mup_denominator");
            c.insert("architectures".into(), serde_json::json!(["MiniCPMForCausalLM"]));
            c.insert("rope_theta".into(), serde_json::json!(500000.0));
        }
        write_head_dir(dir, &config, &head.tensors, Vec::new());
    };
    let hdir = tempfile::tempdir().unwrap();
    write(hdir.path(), &head, 1, 0.35);
    let model = Llama::load_eagle(gpu, hdir.path(), &loaded.model).unwrap();
    assert!(model.is_eagle() && !model.is_eagle3());

    let prompt: Vec<u32> = (0..14u32).map(|i| (i * 37 + 5) % t.vocab as u32).collect();
    let out = StepOutputs {
        argmax: true,
        hidden: true,
        ..Default::default()
    };
    let mut target = Generator::new(gpu, &loaded.model, 64, out).unwrap();
    target.feed(&prompt).unwrap();
    let features = target.result.hidden.clone();
    let n = prompt.len() - 1;
    let head_out = StepOutputs {
        logits: true,
        hidden: true,
        ..Default::default()
    };
    let mut hg = Generator::new(gpu, &model, 64, head_out).unwrap();
    hg.feed_with(&prompt[1..], &features[..n * h]).unwrap();
    let st = shaderlm::loader::safetensors::SafetensorsModel::open(tdir.path()).unwrap();
    let table = st.f32("model.embed_tokens.weight").unwrap().unwrap().1; // tied: also the target's head
    let feats: Vec<Vec<f32>> = features.chunks_exact(h).take(n).map(<[f32]>::to_vec).collect();
    let denominator = if cpmcu { t.n_layers + 1 } else { 2 };
    let variant = Variant::MiniCpm {
        head: &table,
        emb: 12.0,
        residual: 0.35 / (denominator as f32).sqrt(),
        out: 16.0 / h as f32,
        prefix,
        layer,
        feeds_scaled: !cpmcu,
    };
    let (outs, logits) = cpu_forward(&head, t, &table, (&prompt[1..], &feats), variant);
    let (e1, e2) = (
        nmse(&hg.result.hidden, &outs.concat()),
        nmse(&hg.result.logits, &logits),
    );
    println!("MiniCPM head (CPM.cu layout: {cpmcu}) vs CPU forward: hidden NMSE {e1:.2e}, logits NMSE {e2:.2e}");
    assert!(e1 < 1e-8 && e2 < 1e-8, "hidden {e1:e}, logits {e2:e}");

    // Lossless with the head drafting, in a chain and in a tree.
    let tok = &loaded.tokenizer;
    let opts = GenOptions {
        max_tokens: 12,
        stop_strings: Vec::new(),
        stop_at_eos: false,
    };
    let mut gen = Generator::new(gpu, &loaded.model, 64, out).unwrap();
    let mut sampler = Sampler::new(SamplingParams::greedy());
    let plain = generate(&mut gen, tok, &mut sampler, &prompt, &opts, |_| true)
        .unwrap()
        .generated;
    let mut draft = EagleDraft::for_trees(gpu, &model, 64, 3).unwrap();
    for tree in [
        None,
        Some(TreeShape {
            depth: 3,
            topk: 3,
            size: 8,
        }),
    ] {
        gen.truncate(0);
        let mut spec = Speculator::new(
            &mut draft,
            SpecOptions {
                min_accepted: 0.0,
                tree,
                ..Default::default()
            },
        );
        let (s, _) = generate_spec(&mut gen, tok, &mut sampler, &prompt, &opts, &mut spec, |_| true).unwrap();
        assert_eq!(
            s.generated, plain,
            "MiniCPM head (CPM.cu layout: {cpmcu}), tree {tree:?}"
        );
    }

    let bad_dir = tempfile::tempdir().unwrap();
    let refused = |tensors: Vec<(String, Vec<usize>, Vec<f32>)>, layers: usize, depth: f32| {
        let head = Head {
            tensors,
            ids: Vec::new(),
        };
        write(bad_dir.path(), &head, layers, depth);
        let e = Llama::load_eagle(gpu, bad_dir.path(), &loaded.model)
            .err()
            .expect("refused");
        e.to_string()
    };
    let with = |name: &str, shape: &[usize]| {
        let mut v = head.tensors.clone();
        v.push((name.to_string(), shape.to_vec(), vec![1.0; shape.iter().product()]));
        v
    };
    if cpmcu {
        // FR-Spec's ids belong in freq_N.pt, CPM.cu's loader has no head of its own, and the muP scales are the
        // target's.
        let e = refused(with("token_id_remap", &[8]), 1, 0.35);
        assert!(e.contains("token_id_remap") && e.contains("--frspec-vocab"), "{e}");
        let e = refused(with("lm_head.weight", &[t.vocab, h]), 1, 0.35);
        assert!(e.contains("lm_head.weight") && e.contains("CPM.cu"), "{e}");
        let e = refused(head.tensors.clone(), 1, 0.5);
        assert!(e.contains("scale_depth"), "{e}");
        let e = refused(with("layers.1.input_layernorm.weight", &[h]), 1, 0.35);
        assert!(e.contains("layers."), "{e}");
    } else {
        // Two layers in the file for one in the config, and a head of part of the vocabulary: refused by name.
        let e = refused(with("model.eagle_layers.8.input_layernorm.weight", &[h]), 1, 0.35);
        assert!(e.contains("eagle_layers"), "{e}");
        let e = refused(with("lm_head.weight", &[8, h]), 1, 0.35);
        assert!(e.contains("lm_head.weight"), "{e}");
        let e = refused(with("model.fc.bias", &[h]), 1, 0.35);
        assert!(e.contains("fc.bias"), "{e}");
    }
}
