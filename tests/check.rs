//! The check mode: a decoder-shaped graph (embedding, RMSNorm with the residual add, f32 and quantized matmuls,
//! RoPE, KV-cache write, attention, GLU, argmax) and a chain of super-block matmuls and quantized experts (both
//! weight layouts) pass node by node on a clean run, and a fault injected into one node's output is blamed on that
//! node alone (the nodes after it are checked on the inputs they were given). Model steps: Qwen2, MiniCPM4's sparse
//! attention, BlockFFN's experts.

mod common;

use common::gpu::{assert_known_variants, gpu};
use shaderlm::gpu::packed::PackedWeight;
use shaderlm::gpu::{DType, GpuTensor};
use shaderlm::graph::{CheckOptions, Graph, NodeCheck, Plan, StepVars, Tap};
use shaderlm::ops::moe_common::MoeWeight;
use shaderlm::ops::moe_router::RouterNorm;
use shaderlm::ops::rope::{RopeConfig, RopeStyle};
use shaderlm::ops::silu_mul::Glu;
use shaderlm::quant::pack::Layout;
use shaderlm::quant::GgmlType;

const VOCAB: usize = 40;
const HEADS: usize = 2;
const HD: usize = 32;
/// Hidden size: the attention output `[t, HEADS * HD]` feeds the residual directly.
const D: usize = HEADS * HD;
const CTX: usize = 16;
const FFN: usize = 96;
const TOKENS: usize = 3;

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed.wrapping_mul(40503)) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

fn f32_tensor(g: &mut Graph, name: &str, shape: &[usize], seed: u32) -> shaderlm::graph::TensorId {
    let v = values(shape.iter().product(), seed);
    let t = GpuTensor::upload(gpu(), name, shape, DType::F32, bytemuck::cast_slice(&v)).unwrap();
    g.external(&t)
}

fn packed(name: &str, ty: GgmlType, n: usize, k: usize, seed: u32) -> PackedWeight {
    packed_in(name, ty, Layout::for_caps(&gpu().caps), &values(n * k, seed), n, k)
}

fn packed_in(name: &str, ty: GgmlType, layout: Layout, w: &[f32], n: usize, k: usize) -> PackedWeight {
    let raw = shaderlm::quant::quantize(ty, w).unwrap();
    PackedWeight::upload_with(gpu(), name, ty, layout, n, k, &raw).unwrap()
}

/// One decoder layer over `TOKENS` tokens at position 5, then the argmax of the logits; the check's verdicts.
fn decoder(fault: Option<usize>) -> Vec<NodeCheck> {
    let gpu = gpu();
    let mut g = Graph::new();
    let ids = g.input("ids", &[TOKENS], DType::U32);
    let table = f32_tensor(&mut g, "token_embd", &[VOCAB, D], 1);
    let norm1 = f32_tensor(&mut g, "attn_norm", &[D], 2);
    let norm2 = f32_tensor(&mut g, "ffn_norm", &[D], 3);
    let proj: Vec<_> = (0..3).map(|i| f32_tensor(&mut g, "wqkv", &[D, D], 4 + i)).collect();
    let k_cache = f32_tensor(&mut g, "k_cache", &[HEADS, CTX, HD], 8);
    let v_cache = f32_tensor(&mut g, "v_cache", &[HEADS, CTX, HD], 9);
    let gate_up = packed("gate_up", GgmlType::Q4_0, 2 * FFN, D, 10);
    let output = packed("output", GgmlType::Q8_0, VOCAB, FFN, 11);

    let x = g.embedding(ids, table).unwrap();
    g.tap(x, Tap::Embed);
    g.set_prefix("layer0.");
    let h = g.rms_norm(x, norm1, 1e-5).unwrap();
    g.tap(h, Tap::AttnNorm(0));
    let heads = |g: &mut Graph, w| {
        let y = g.matmul(h, w, None).unwrap();
        g.reshape(y, &[TOKENS, HEADS, HD]).unwrap()
    };
    let (q, k, v) = (heads(&mut g, proj[0]), heads(&mut g, proj[1]), heads(&mut g, proj[2]));
    let (q, k) = g
        .rope_pair(q, k, RopeConfig::new(RopeStyle::RotateHalf, 10000.0, HD))
        .unwrap();
    g.tap(q, Tap::Rope(0));
    g.kv_write_pair(k, v, k_cache, v_cache).unwrap();
    let a = g
        .attention_decode(q, k_cache, v_cache, 1.0 / (HD as f32).sqrt())
        .unwrap();
    g.tap(a, Tap::AttnOut(0));
    let a = g.reshape(a, &[TOKENS, D]).unwrap();
    let (_residual, h2) = g.add_rms_norm(x, a, norm2, 1e-5).unwrap();
    g.tap(h2, Tap::FfnNorm(0));
    let gu = g.matmul_q(h2, &gate_up, None).unwrap();
    let act = g.glu_fused(gu, Glu::Silu).unwrap();
    g.tap(act, Tap::FfnAct(0));
    g.set_prefix("");
    let logits = g.matmul_q(act, &output, None).unwrap();
    g.tap(logits, Tap::Logits);
    let best = g.argmax(logits).unwrap();
    g.output(best);
    let mut plan = Plan::new(gpu, g).unwrap();
    plan.write_input(gpu, ids, bytemuck::cast_slice(&[3u32, 17, 39]))
        .unwrap();
    plan.check(gpu, &StepVars { pos: 5 }, &CheckOptions { fault }).unwrap()
}

fn describe(report: &[NodeCheck]) -> String {
    report
        .iter()
        .map(|n| format!("{} {}: {:?} / {}", n.index, n.name(), n.nmse, n.bound))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_clean_run_passes_every_node_and_checks_each_op() {
    let report = decoder(None);
    assert!(report.iter().all(NodeCheck::passed), "{}", describe(&report));
    let checked: Vec<&str> = report.iter().filter(|n| n.nmse.is_some()).map(|n| n.op).collect();
    for op in [
        "embedding",
        "rms_norm",
        "matmul",
        "rope",
        "kv_write",
        "attention_decode",
        "matmul_q",
        "silu_mul",
        "topk",
    ] {
        assert!(checked.contains(&op), "{op} was not checked:\n{}", describe(&report));
    }
    let named: Vec<String> = report.iter().filter_map(|n| n.tap.clone()).collect();
    assert_eq!(
        named,
        [
            "embed",
            "attn_norm[0]",
            "rope[0]",
            "attn_out[0]",
            "ffn_norm[0]",
            "ffn_act[0]",
            "logits"
        ]
    );
}

#[test]
fn a_fault_in_one_node_is_blamed_on_that_node_alone() {
    let clean = decoder(None);
    for tap in ["attn_norm[0]", "attn_out[0]", "ffn_act[0]", "logits"] {
        let node = clean.iter().find(|n| n.tap.as_deref() == Some(tap)).unwrap();
        let report = decoder(Some(node.index));
        let failed: Vec<usize> = report.iter().filter(|n| !n.passed()).map(|n| n.index).collect();
        assert_eq!(failed, [node.index], "fault in {tap}:\n{}", describe(&report));
    }
}

const EXPERTS: usize = 16;
const DE: usize = 32;
/// K of the super-block chain: one 256-weight super-block per row.
const KS: usize = 256;

/// Super-block matmuls around BlockFFN's experts, all quantized in `layout`: a Q2_K router (a quarter of the
/// experts always active, a quarter for some tokens, half never: the up kernel leaves their columns unwritten),
/// ReLU routing, Q4_K experts up, Q6_K down, a Q3_K head.
fn quantized_experts(layout: Layout, fault: Option<usize>) -> Vec<NodeCheck> {
    let gpu = gpu();
    let mut g = Graph::new();
    let x = g.input("x", &[TOKENS, KS], DType::F32);
    // x >= 0: experts 0..4 see positive logits from every token, 4..8 from some, 8..16 none (zero rows).
    let mut router = values(EXPERTS * KS, 21);
    router[..EXPERTS / 4 * KS].iter_mut().for_each(|w| *w = w.abs());
    router[EXPERTS / 2 * KS..].fill(0.0);
    let router = packed_in("router", GgmlType::Q2_K, layout, &router, EXPERTS, KS);
    let up = packed_in(
        "up",
        GgmlType::Q4_K,
        layout,
        &values(EXPERTS * DE * KS, 22),
        EXPERTS * DE,
        KS,
    );
    let down = packed_in(
        "down",
        GgmlType::Q6_K,
        layout,
        &values(KS * EXPERTS * DE, 23),
        KS,
        EXPERTS * DE,
    );
    let head = packed_in("head", GgmlType::Q3_K, layout, &values(VOCAB * KS, 24), VOCAB, KS);
    let logits = g.matmul_q(x, &router, None).unwrap();
    let (r, active) = g.moe_route(logits, RouterNorm::None).unwrap();
    let h = g.moe_up(x, MoeWeight::Quant(&up), r, active, DE).unwrap();
    let y = g.moe_down(h, MoeWeight::Quant(&down), active, DE).unwrap();
    let out = g.matmul_q(y, &head, None).unwrap();
    g.output(out);
    let mut plan = Plan::new(gpu, g).unwrap();
    let xs: Vec<f32> = values(TOKENS * KS, 20).iter().map(|v| v.abs()).collect();
    plan.write_input(gpu, x, bytemuck::cast_slice(&xs)).unwrap();
    plan.check(gpu, &StepVars { pos: 0 }, &CheckOptions { fault }).unwrap()
}

#[test]
fn super_block_matmuls_and_quantized_experts_are_checked_in_both_layouts() {
    for layout in [Layout::Tiled, Layout::Rows] {
        let clean = quantized_experts(layout, None);
        assert!(clean.iter().all(NodeCheck::passed), "{layout:?}:\n{}", describe(&clean));
        assert!(
            clean.iter().all(|n| n.nmse.is_some()),
            "{layout:?}:\n{}",
            describe(&clean)
        );
        let ops: Vec<&str> = clean.iter().map(|n| n.op).collect();
        assert_eq!(
            ops,
            ["matmul_q", "moe_router", "moe_up", "moe_down", "matmul_q"],
            "{layout:?}"
        );
        // A fault in the expert kernels' output, or in the last (Q3_K) matmul, is blamed on that node alone.
        for node in [2, 3, 4] {
            let report = quantized_experts(layout, Some(node));
            let failed: Vec<usize> = report.iter().filter(|n| !n.passed()).map(|n| n.index).collect();
            assert_eq!(
                failed,
                [node],
                "{layout:?}, fault in node {node}:\n{}",
                describe(&report)
            );
        }
    }
    assert_known_variants(gpu());
}

/// A tiny Qwen2 (biases, GQA) in the Hugging Face layout: a clean decode step passes the check at every node; a
/// fault injected into layer 1's attention output is reported as the first failure, by its tap name.
#[test]
fn a_model_step_localizes_a_fault_by_its_tap() {
    use common::tiny::{write_hf, Tiny};
    use shaderlm::generate::Generator;
    use shaderlm::loader::safetensors::SafetensorsModel;
    use shaderlm::model::{Llama, LlamaConfig, Names, StepOutputs};
    let dir = tempfile::tempdir().unwrap();
    let t = Tiny {
        arch: "qwen2",
        ..Tiny::llama()
    };
    write_hf(dir.path(), &t, 3, false);
    let cfg = LlamaConfig::from_hf(&dir.path().join("config.json")).unwrap();
    let st = SafetensorsModel::open(dir.path()).unwrap();
    let model = Llama::load(gpu(), &st, cfg, Names::Hf, |_, _| {}).unwrap();
    let outputs = StepOutputs {
        argmax: true,
        ..Default::default()
    };
    let prompt = [5u32, 17, 33, 2, 71];
    let mut gen = Generator::new(gpu(), &model, 32, outputs).unwrap();
    gen.check_step(&prompt, &CheckOptions::default()).unwrap();
    let clean = gen.check_step(&[9], &CheckOptions::default()).unwrap();
    assert!(clean.iter().all(NodeCheck::passed), "{}", describe(&clean));
    let target = clean
        .iter()
        .find(|n| n.tap.as_deref() == Some("attn_out[1]"))
        .expect("layer 1's attention output is tapped");

    let mut gen = Generator::new(gpu(), &model, 32, outputs).unwrap();
    gen.check_step(&prompt, &CheckOptions::default()).unwrap();
    let faulty = gen
        .check_step(
            &[9],
            &CheckOptions {
                fault: Some(target.index),
            },
        )
        .unwrap();
    let (text, passed) = shaderlm::graph::check::report(&faulty);
    assert!(!passed);
    assert!(
        text.contains(&format!(
            "FIRST FAILURE: node {} blk.1.attention_decode (attn_out[1])",
            target.index
        )),
        "{text}"
    );
    let failed: Vec<usize> = faulty.iter().filter(|n| !n.passed()).map(|n| n.index).collect();
    assert_eq!(failed, [target.index], "{}", describe(&faulty));
}

/// Every node of a model's steps within its bound, and the ops the check must have covered.
fn clean_steps(model: &shaderlm::model::Llama, steps: &[&[u32]], max_ctx: usize, ops: &[&str]) {
    use shaderlm::generate::Generator;
    use shaderlm::model::StepOutputs;
    let outputs = StepOutputs {
        argmax: true,
        ..Default::default()
    };
    let mut gen = Generator::new(gpu(), model, max_ctx, outputs).unwrap();
    let mut checked = Vec::new();
    for ids in steps {
        let report = gen.check_step(ids, &CheckOptions::default()).unwrap();
        assert!(report.iter().all(NodeCheck::passed), "{}", describe(&report));
        checked.extend(report.iter().filter(|n| n.nmse.is_some()).map(|n| n.op));
    }
    for op in ops {
        assert!(checked.contains(op), "{op} was not checked");
    }
    assert_known_variants(gpu());
}

/// InfLLM-v2 (compressed keys, block scores, sparse attention) and BlockFFN (router, experts) steps are checked
/// node by node too.
#[test]
fn sparse_attention_and_expert_steps_pass_the_check() {
    use shaderlm::loader::safetensors::SafetensorsModel;
    use shaderlm::model::{Llama, LlamaConfig, Names};
    let dir = tempfile::tempdir().unwrap();
    let sparse = serde_json::json!({"kernel_size": 8, "kernel_stride": 4, "block_size": 16, "init_blocks": 1,
        "window_size": 32, "topk": 4, "use_nope": false, "dense_len": 48});
    common::minicpm::write_minicpm(dir.path(), 21, Some(sparse));
    let cfg = LlamaConfig::from_hf(&dir.path().join("config.json")).unwrap();
    let st = SafetensorsModel::open(dir.path()).unwrap();
    let model = Llama::load(gpu(), &st, cfg, Names::Hf, |_, _| {}).unwrap();
    let prompt: Vec<u32> = (0..60).map(|i| (i * 37 + 11) % 300).collect();
    let ops = ["kv_compress", "block_score", "block_topk", "attention_sparse"];
    clean_steps(&model, &[&prompt, &[7]], 128, &ops);

    let dir = tempfile::tempdir().unwrap();
    common::blockffn::write_blockffn(dir.path(), 4, "block", "rms");
    let cfg = LlamaConfig::from_hf(&dir.path().join("config.json")).unwrap();
    let st = SafetensorsModel::open(dir.path()).unwrap();
    let model = Llama::load(gpu(), &st, cfg, Names::Hf, |_, _| {}).unwrap();
    let ops = ["moe_router", "moe_up", "moe_down"];
    clean_steps(&model, &[&[5, 9, 13, 2], &[7]], 32, &ops);
}

/// A Gemma 3 decode step, fused on CPU adapters with subgroups (the post-norms and residual adds in the GEMVs'
/// prologues, whose reference also checks the residual stream they write; q|k|v in one weight, and in two formats
/// in one dispatch), passes the check node by node.
#[test]
fn a_fused_gemma3_step_passes_the_check() {
    use common::steps::weights;
    use common::tiny::{write_gguf_v_apart, Tiny};
    for (ty, v_ty) in [(GgmlType::Q4_1, GgmlType::Q4_1), (GgmlType::Q5_0, GgmlType::Q8_0)] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gemma3.gguf");
        write_gguf_v_apart(&path, &Tiny::gemma3(), 45, ty, v_ty);
        let model = weights(&path);
        let ops = ["matmul_q", "rope_kv", "attention_decode"];
        clean_steps(&model, &[&[3, 1, 4, 1, 5], &[9], &[2]], 64, &ops);
    }
}
