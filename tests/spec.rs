//! Speculative decoding is lossless. (1) A verification step computes, row for row and bit for bit, what one-token
//! decode steps compute, for every architecture, weight format and attention kind, also after rejected drafts were
//! rolled back. (2) Generation with drafts (prompt lookup, a draft model) gives plain decoding's tokens, greedy and
//! seeded, on the SmolLM2 golden prompts, and leaves the cache as plain decoding does, so a follow-up turn continues
//! identically. (3) A draft with another vocabulary is refused by name.

mod common;

use common::blockffn::write_blockffn;
use common::gpu::gpu;
use common::minicpm::write_minicpm;
use common::rng::Rng;
use common::spec_runs::{run, run_with, Plain, Smol};
use common::steps::{bits, tokens, weights, LOGITS_AND_ARGMAX};
use common::tiny::{
    phi3, random, stored, weights as tiny_weights, write_gguf, write_gguf_chat, write_gguf_chat_as, write_gguf_v_apart,
    write_hf, write_safetensors, Tiny,
};
use shaderlm::generate::draft::{check_same_vocab, DraftModel, Drafter, Lookup};
use shaderlm::generate::eagle::EagleDraft;
use shaderlm::generate::spec::{generate_spec, SpecOptions, Speculator, PROBE_DRAFTS};
use shaderlm::generate::{GenOptions, Generator};
use shaderlm::gpu::Gpu;
use shaderlm::model::load::LoadedModel;
use shaderlm::model::{frspec, Llama, LoadOptions, StepOutputs};
use shaderlm::quant::GgmlType;
use shaderlm::sampling::{Sampler, SamplingParams};
use std::path::Path;

fn open(gpu: &Gpu, path: &Path, ctx: usize) -> LoadedModel {
    LoadedModel::open(gpu, path, &LoadOptions::with_ctx(ctx), |_, _| {})
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Feeds `prompt` then `cont` one token at a time (plain decoding), and again with verification steps of the
/// sizes in `verify` (each keeping `keep` of its rows, the rest rolled back as rejected drafts); every verified
/// row's logits and argmax must equal the one-token step's bit for bit.
fn verify_rows_equal_decode_steps(label: &str, model: &Llama, prompt: &[u32], cont: &[u32]) {
    let gpu = gpu();
    let ctx = 128;
    let mut plain = Generator::new(gpu, model, ctx, LOGITS_AND_ARGMAX).unwrap();
    plain.feed(prompt).unwrap();
    let mut want = Vec::new(); // the outputs after prompt + cont[..=i]
    for &t in cont {
        plain.feed(&[t]).unwrap();
        want.push((bits(&plain.result.logits), plain.result.argmax.unwrap()));
    }
    let mut spec = Generator::new(gpu, model, ctx, LOGITS_AND_ARGMAX).unwrap();
    spec.feed(prompt).unwrap();
    let vocab = model.cfg.vocab;
    // (rows verified, rows kept): 5 rows with 3 rejected, 8 rows (the most) with all kept, 2 rows with one kept...
    let schedule = [(5, 2), (8, 8), (2, 1), (6, 4), (3, 3)];
    let mut done = 0;
    for (rows, keep) in schedule {
        let rows = rows.min(cont.len() - done);
        if rows == 0 {
            break;
        }
        spec.verify(&cont[done..done + rows]).unwrap();
        for r in 0..rows {
            let got = bits(&spec.result.logits[r * vocab..(r + 1) * vocab]);
            let (logits, argmax) = &want[done + r];
            assert!(
                got == *logits,
                "{label}: verified row {r} of {rows} (position {}) differs from the one-token step",
                prompt.len() + done + r
            );
            assert_eq!(spec.result.row_argmax[r], *argmax, "{label}: argmax of row {r}");
        }
        let keep = keep.min(rows);
        spec.truncate(prompt.len() + done + keep);
        done += keep;
    }
    assert!(done >= 12, "{label}: the schedule verified only {done} tokens");
}

#[test]
fn verify_rows_equal_decode_steps_llama_gguf_formats() {
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        write_gguf(&path, &Tiny::llama(), 31, ty);
        let model = weights(&path);
        verify_rows_equal_decode_steps(&format!("llama {ty}"), &model, &tokens(9, 101, 1), &tokens(30, 101, 2));
    }
    // k-quants need rows of 256: a wider model.
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        let t = Tiny {
            hidden: 256,
            ffn: 256,
            heads: 4,
            head_dim: 64,
            ..Tiny::llama()
        };
        write_gguf(&path, &t, 32, ty);
        let model = weights(&path);
        verify_rows_equal_decode_steps(&format!("llama {ty}"), &model, &tokens(9, 101, 3), &tokens(30, 101, 4));
    }
    // Qwen2 as its GGUFs are: rotate-half pairs (loaded in interleaved order), q/k/v biases, and v in another type
    // than q and k (Q4_K_M's mix), so the fused decode step's q|k|v is two GEMVs with the rope epilogue; and a
    // gate|up of more tiles than take the norm in their prologue (matmul_q::NORM_PROLOGUE_TILES), normed apart.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let t = Tiny {
        ffn: 16 * (shaderlm::ops::matmul_q::NORM_PROLOGUE_TILES + 4),
        ..Tiny::qwen2()
    };
    write_gguf_v_apart(&path, &t, 36, GgmlType::Q4_1, GgmlType::Q8_0);
    let model = weights(&path);
    verify_rows_equal_decode_steps("qwen2 Q4_1 + Q8_0 v", &model, &tokens(9, 101, 9), &tokens(30, 101, 10));
}

#[test]
fn verify_rows_equal_decode_steps_hf_architectures() {
    let mut cases: Vec<(&str, Tiny)> = Vec::new();
    for arch in ["qwen2", "qwen3"] {
        let mut t = Tiny::llama();
        t.arch = arch;
        t.kv_heads = 1;
        cases.push((arch, t));
    }
    // Gemma 3: windows of 5 keys on 5 of 6 layers, crossed inside every verification step.
    cases.push(("gemma3", Tiny::gemma3()));
    cases.push(("phi3", phi3()));
    for (label, t) in cases {
        let dir = tempfile::tempdir().unwrap();
        write_hf(dir.path(), &t, 33, false);
        let model = weights(dir.path());
        verify_rows_equal_decode_steps(label, &model, &tokens(11, 101, 5), &tokens(30, 101, 6));
    }
}

#[test]
fn verify_rows_equal_decode_steps_minicpm_dense_sparse_and_blockffn() {
    let dir = tempfile::tempdir().unwrap();
    let t = write_minicpm(dir.path(), 34, None);
    let model = weights(dir.path());
    verify_rows_equal_decode_steps("minicpm", &model, &tokens(9, t.vocab, 7), &tokens(30, t.vocab, 8));
    // InfLLM-v2 past dense_len 48: the verification steps attend sparsely and write compressed keys; rolled-back
    // drafts must leave no trace in them.
    let dir = tempfile::tempdir().unwrap();
    let sparse = serde_json::json!({"kernel_size": 8, "kernel_stride": 4, "block_size": 16, "init_blocks": 1,
        "window_size": 32, "topk": 4, "use_nope": false, "dense_len": 48});
    let t = write_minicpm(dir.path(), 35, Some(sparse));
    let model = weights(dir.path());
    assert!(model.cfg.sparse.is_some());
    verify_rows_equal_decode_steps(
        "minicpm sparse",
        &model,
        &tokens(60, t.vocab, 9),
        &tokens(30, t.vocab, 10),
    );
    for norm in ["sum", "rms"] {
        let dir = tempfile::tempdir().unwrap();
        let t = write_blockffn(dir.path(), 36, "block", norm);
        let model = weights(dir.path());
        let label = format!("blockffn {norm}");
        verify_rows_equal_decode_steps(&label, &model, &tokens(9, t.vocab, 11), &tokens(30, t.vocab, 12));
    }
}

/// SmolLM2 on two golden prompts, one session each for the target and the draft (reset between runs, so plans are
/// built once): prompt lookup, SmolLM2 drafting for itself (which must then be accepted whole) and an EAGLE-1 head
/// (random fc, in the published layout) with 1, 3 and 7 drafts per step, greedy and seeded sampling: the same tokens as plain decoding, and the same continuation in a
/// follow-up turn (the cache holds what plain decoding leaves).
#[test]
fn speculative_generation_equals_plain_on_smollm2() {
    let smol = Smol::new();
    let (gpu, loaded, follow, seeded) = (&smol.gpu, &smol.loaded, &smol.follow, smol.seeded.clone());
    let mut target = smol.target();
    let mut draft = smol.self_draft(StepOutputs {
        argmax: true,
        ..Default::default()
    });
    let mut lookup = Lookup::default();
    let head = smol.head();
    let mut eagle = EagleDraft::new(gpu, &head, loaded.ctx).unwrap();
    // (prompt, sampling, drafts per step)
    let runs = [
        ("chat_capital", SamplingParams::greedy(), vec![1, 3, 7]),
        ("code_python", SamplingParams::greedy(), vec![3]),
        ("chat_capital", seeded, vec![3]),
    ];
    for (name, params, ks) in runs {
        let fx = common::golden::fixture("smollm2", name);
        let prompt = &fx.prompt_tokens;
        let label = format!("{name} at temperature {}", params.temperature);
        target.truncate(0);
        let plain = Plain::run(&mut target, loaded, &params, (prompt, follow), 16);
        let (p1, p2) = (&plain.first, &plain.second);
        for k in ks {
            let sources: [(&str, &mut dyn Drafter); 3] = [
                ("lookup", &mut lookup),
                ("self-draft", &mut draft),
                ("eagle", &mut eagle),
            ];
            for (source, drafter) in sources {
                target.truncate(0);
                let (s1, s2, st) = run(&mut target, loaded, &params, prompt, follow, 16, Some((drafter, k)));
                plain.assert_reproduced(&target, (&s1, &s2), &format!("{label}, {source} k={k}"));
                println!(
                    "{label}, {source} k={k}: {} verification steps, {}/{} drafts accepted",
                    st.verify_steps, st.accepted, st.drafted
                );
                if source == "self-draft" {
                    assert!(st.drafted > 0, "{label}: the draft proposed nothing");
                    // After the first step (whose catch-up is the whole prompt), every chain was drafted and
                    // verified in one submission.
                    assert!(
                        st.one_submission > 0 && st.one_submission + 1 >= st.verify_steps,
                        "{label} k={k}: {} of {} verification steps in one submission",
                        st.one_submission,
                        st.verify_steps
                    );
                    if params.temperature == 0.0 {
                        assert_eq!(
                            st.accepted, st.drafted,
                            "{label}: a greedy self-draft must be accepted whole"
                        );
                    }
                }
            }
            // The same draft in two submissions per step (draft, then verification): the same output.
            draft.one_submission = false;
            target.truncate(0);
            let (s1, s2, st) = run(&mut target, loaded, &params, prompt, follow, 16, Some((&mut draft, k)));
            draft.one_submission = true;
            assert_eq!(s1.generated, p1.generated, "{label}, two submissions k={k}: first turn");
            assert_eq!(
                s2.generated, p2.generated,
                "{label}, two submissions k={k}: follow-up turn"
            );
            assert_eq!(
                st.one_submission, 0,
                "{label} k={k}: drafted in the verification's submission"
            );
        }
        // Draft lengths chosen step by step (up to 7): the same output. The self-draft, always right, drafts the
        // longest chains once its probe is accepted (shorter ones only where the token budget ends).
        let sources: [(&str, &mut dyn Drafter); 2] = [("lookup", &mut lookup), ("self-draft", &mut draft)];
        for (source, drafter) in sources {
            let opts = SpecOptions {
                max_draft: 7,
                min_accepted: 0.0,
                adaptive: true,
                ..Default::default()
            };
            target.truncate(0);
            let (s1, s2, st) = run_with(
                &mut target,
                loaded,
                &params,
                (prompt, follow),
                16,
                Some((drafter, opts)),
            );
            plain.assert_reproduced(&target, (&s1, &s2), &format!("{label}, {source} adaptive"));
            let chains = &st.steps_by_drafts;
            println!("{label}, {source} adaptive: chain steps by drafts {chains:?}");
            if source == "self-draft" && params.temperature == 0.0 {
                assert_eq!(chains.len(), 8, "{label}: the self-draft never drafted 7: {chains:?}");
            }
        }
    }
}

#[test]
fn a_draft_with_another_vocabulary_is_refused() {
    let gpu = gpu();
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.gguf");
    write_gguf_chat(&a, 1, GgmlType::F32);
    let a = open(gpu, &a, 64);
    let (_, smol) = common::golden::load("SmolLM2-135M-Instruct.Q4_1.gguf", "");
    let e = check_same_vocab(
        (&smol.tokenizer, smol.model.cfg.vocab, "target.gguf"),
        (&a.tokenizer, a.model.cfg.vocab, "draft.gguf"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("draft.gguf") && e.contains("target.gguf") && e.contains("vocabulary"),
        "{e}"
    );
    // Another model with the same vocabulary (other weights) may draft.
    let b = dir.path().join("b.gguf");
    write_gguf_chat(&b, 2, GgmlType::Q8_0);
    let b = open(gpu, &b, 64);
    check_same_vocab(
        (&a.tokenizer, a.model.cfg.vocab, "a"),
        (&b.tokenizer, b.model.cfg.vocab, "b"),
    )
    .unwrap();
}

/// FR-Spec: SmolLM2 drafting for itself with its head restricted to 2048 and 8192 tokens: the restricted logits
/// are the full head's at those ids bit for bit, a draft token is always in the subset, a chain of drafts (its
/// argmaxes mapped to token ids on the device) equals one step at a time, and the output is plain greedy
/// decoding's with every step after the first drafted in the verification's submission.
#[test]
fn frspec_restricted_draft_head_is_lossless() {
    let (gpu, loaded) = common::golden::load("SmolLM2-135M-Instruct.Q4_1.gguf", "");
    let fx = common::golden::fixture("smollm2", "chat_capital");
    let prompt = &fx.prompt_tokens;
    let mut target = Generator::new(&gpu, &loaded.model, loaded.ctx, LOGITS_AND_ARGMAX).unwrap();
    let follow = loaded.tokenizer.encode("\nAnd of Spain?", false).unwrap();
    let (p1, p2, _) = run(
        &mut target,
        &loaded,
        &SamplingParams::greedy(),
        prompt,
        &follow,
        16,
        None,
    );
    target.truncate(0);
    target.feed(prompt).unwrap();
    let full = target.result.logits.clone();
    // Vocabulary order (the first n ids), and a ranking whose subset index is no token id: both turns' tokens
    // first, then every third id.
    let vocab = loaded.model.cfg.vocab as u32;
    let scattered: Vec<u32> = p1
        .generated
        .iter()
        .chain(&p2.generated)
        .copied()
        .chain((0..vocab).step_by(3))
        .collect();
    for (n, ranking) in [(2048, None), (8192, None), (scattered.len(), Some(&scattered[..]))] {
        let (_, draft) = common::golden::load("SmolLM2-135M-Instruct.Q4_1.gguf", "");
        let ids = frspec::subset_ids(ranking, n, draft.model.cfg.vocab, &draft.tokenizer).unwrap();
        assert!(ids.iter().any(|&i| draft.tokenizer.is_stop(i)));
        match ranking {
            None => assert!(ids.len() >= n),
            // Most subset indices are not the token id they stand for.
            Some(_) => assert!(ids.iter().enumerate().filter(|&(j, &i)| j as u32 != i).count() > ids.len() / 2),
        }
        let draft = frspec::restrict(&gpu, draft, ids.clone()).unwrap();
        let mut dgen = Generator::new(&gpu, &draft.model, draft.ctx, LOGITS_AND_ARGMAX).unwrap();
        dgen.feed(prompt).unwrap();
        assert_eq!(dgen.result.logits.len(), ids.len());
        for (j, &id) in ids.iter().enumerate() {
            assert_eq!(
                dgen.result.logits[j].to_bits(),
                full[id as usize].to_bits(),
                "restricted logit {j} (token {id}) differs from the full head's"
            );
        }
        assert!(ids.contains(&dgen.result.argmax.unwrap()));
        // Three drafts one step at a time, then chained on the device: the same token ids.
        let mut want = vec![dgen.result.argmax.unwrap()];
        for _ in 0..2 {
            dgen.feed(&want[want.len() - 1..]).unwrap();
            want.push(dgen.result.argmax.unwrap());
        }
        dgen.truncate(prompt.len() - 1);
        dgen.feed_chain(&prompt[prompt.len() - 1..], 3).unwrap();
        assert_eq!(dgen.result.row_argmax, want, "FR-Spec {n}: chained drafts");
        dgen.truncate(0);
        let mut drafter = DraftModel::greedy(dgen, 0.0);
        target.truncate(0);
        let params = SamplingParams::greedy();
        let (s1, s2, st) = run(
            &mut target,
            &loaded,
            &params,
            prompt,
            &follow,
            16,
            Some((&mut drafter, 3)),
        );
        assert_eq!(s1.generated, p1.generated, "FR-Spec {n}: first turn");
        assert_eq!(s2.generated, p2.generated, "FR-Spec {n}: follow-up turn");
        assert!(
            st.one_submission > 0 && st.one_submission + 2 >= st.verify_steps,
            "FR-Spec {n}: {} of {} steps in one submission",
            st.one_submission,
            st.verify_steps
        );
        println!("FR-Spec {n}: {}/{} drafts accepted", st.accepted, st.drafted);
        assert!(st.accepted > 0, "FR-Spec {n}: nothing accepted");
    }
}

#[test]
fn frspec_rankings_and_bad_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chat.gguf");
    write_gguf_chat(&path, 1, GgmlType::F32);
    let tok = frspec::tokenizer_of(&path).unwrap();
    let vocab = tok.vocab_size();
    // "aaa" outnumbers "b": the ranking puts a's token first.
    let ranked = frspec::rank(&tok, "aaaaaa b aaaaaa", vocab).unwrap();
    let a = tok.encode("a", false).unwrap()[0];
    assert_eq!(ranked.first(), Some(&a), "{ranked:?}");
    let ids = frspec::subset_ids(Some(&ranked), 1, vocab, &tok).unwrap();
    assert!(
        ids.contains(&a) && ids.iter().filter(|&&i| tok.is_stop(i)).count() >= 1,
        "{ids:?}"
    );
    for n in [0, vocab + 1] {
        let e = frspec::subset_ids(None, n, vocab, &tok).unwrap_err().to_string();
        assert!(e.contains("--frspec-vocab"), "{e}");
    }
    let bad = dir.path().join("freq_8192.pt");
    std::fs::write(&bad, b"PK\x03\x04 a zip archive").unwrap();
    let e = frspec::read_ranking(&bad).unwrap_err().to_string();
    assert!(e.contains("freq_8192.pt") && e.contains("zip"), "{e}");
    std::fs::write(&bad, "[1, 2, -3]").unwrap();
    let e = frspec::read_ranking(&bad).unwrap_err().to_string();
    assert!(e.contains("freq_8192.pt") && e.contains("token ids"), "{e}");
    std::fs::write(&bad, "[5, 1, 2]").unwrap();
    assert_eq!(frspec::read_ranking(&bad).unwrap(), [5, 1, 2]);
}

/// Proposes tokens the target never chose at that position: one more than the last token.
struct Wrong;

impl Drafter for Wrong {
    fn propose(&mut self, history: &[u32], max: usize, out: &mut Vec<u32>) -> shaderlm::Result<()> {
        out.clear();
        let last = *history.last().unwrap_or(&0);
        out.extend((1..=max as u32).map(|i| (last + i) % 200));
        Ok(())
    }
    fn name(&self) -> &'static str {
        "wrong"
    }
}

/// Drafts that are never right: the output is still plain decoding's, and speculation turns itself off after the
/// first 2 verification steps, each of one draft (the probe before any draft is accepted); the rest are one-token
/// steps.
#[test]
fn speculation_that_does_not_pay_turns_itself_off() {
    let gpu = gpu();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chat.gguf");
    write_gguf_chat(&path, 3, GgmlType::Q8_0);
    let loaded = open(gpu, &path, 128);
    let mut target = Generator::new(gpu, &loaded.model, loaded.ctx, LOGITS_AND_ARGMAX).unwrap();
    let prompt = tokens(12, loaded.model.cfg.vocab, 13);
    let params = SamplingParams::greedy();
    let (p1, ..) = run(&mut target, &loaded, &params, &prompt, &[5], 40, None);
    target.truncate(0);
    let opts = GenOptions {
        max_tokens: 40,
        stop_strings: Vec::new(),
        stop_at_eos: false,
    };
    let mut wrong = Wrong;
    let mut spec = Speculator::new(&mut wrong, SpecOptions::default());
    let mut sampler = Sampler::new(params);
    let (s1, st) = generate_spec(
        &mut target,
        &loaded.tokenizer,
        &mut sampler,
        &prompt,
        &opts,
        &mut spec,
        |_| true,
    )
    .unwrap();
    assert_eq!(s1.generated, p1.generated);
    let why = st
        .turned_off
        .as_deref()
        .expect("speculation should have turned itself off");
    assert!(why.contains("drafts accepted per step"), "{why}");
    assert_eq!(st.verify_steps, 2, "{st:?}");
    assert_eq!(st.drafted, 2 * PROBE_DRAFTS, "{st:?}");
    assert!(st.plain_steps >= 30, "{st:?}");
}

/// A layer-skipping self-draft: the target's own file with only its first layer drafts for it, losslessly; a cut
/// to no layers or past the model's is refused.
#[test]
fn a_model_cut_to_its_first_layers_drafts_for_itself() {
    let gpu = gpu();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chat.gguf");
    write_gguf_chat_as(
        &path,
        Tiny {
            tied: false,
            ..Tiny::llama()
        },
        7,
        GgmlType::Q8_0,
    );
    let target = open(gpu, &path, 128);
    let cut = |layers| {
        let opts = LoadOptions {
            layers: Some(layers),
            ..LoadOptions::with_ctx(128)
        };
        LoadedModel::open(gpu, &path, &opts, |_, _| {})
    };
    for bad in [0, 3] {
        let e = cut(bad).err().expect("a bad cut is refused").to_string();
        assert!(e.contains("--draft-layers"), "{e}");
    }
    let draft = cut(1).unwrap();
    assert_eq!(draft.model.cfg.n_layers, 1);
    let prompt = tokens(10, target.model.cfg.vocab, 15);
    let mut gen = Generator::new(gpu, &target.model, target.ctx, LOGITS_AND_ARGMAX).unwrap();
    let params = SamplingParams::greedy();
    let (p1, p2, _) = run(&mut gen, &target, &params, &prompt, &[3, 4], 30, None);
    gen.truncate(0);
    let dgen = Generator::new(gpu, &draft.model, draft.ctx, LOGITS_AND_ARGMAX).unwrap();
    let mut drafter = DraftModel::greedy(dgen, 0.0);
    let (s1, s2, st) = run(
        &mut gen,
        &target,
        &params,
        &prompt,
        &[3, 4],
        30,
        Some((&mut drafter, 3)),
    );
    assert_eq!((s1.generated, s2.generated), (p1.generated, p2.generated));
    assert!(st.drafted > 0, "{st:?}");
    println!("1-of-2-layer self-draft: {}/{} accepted", st.accepted, st.drafted);
}

/// Sampled drafts: a model sampling drafts for itself with the target's settings proposes from exactly the
/// distribution the target verifies with (the verification rows equal its one-token steps bit for bit), so the
/// acceptance test keeps every draft; another draft model (other weights, same vocabulary) is accepted in part,
/// and a seed reproduces the run.
#[test]
fn sampled_drafts_pass_the_acceptance_test() {
    let gpu = gpu();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
    // Heads of their own: with the embedding tied, a random tiny model all but repeats its last token.
    let untied = || Tiny {
        tied: false,
        ..Tiny::llama()
    };
    write_gguf_chat_as(&a, untied(), 4, GgmlType::Q8_0);
    write_gguf_chat_as(&b, untied(), 5, GgmlType::Q8_0);
    let (target, other) = (open(gpu, &a, 128), open(gpu, &b, 128));
    let params = SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: 3,
        ..Default::default()
    };
    let prompt = tokens(9, target.model.cfg.vocab, 14);
    let opts = GenOptions {
        max_tokens: 40,
        stop_strings: Vec::new(),
        stop_at_eos: false,
    };
    let mut results = Vec::new();
    for (label, draft) in [("self", &target), ("other", &other), ("other", &other)] {
        let mut gen = Generator::new(gpu, &target.model, target.ctx, LOGITS_AND_ARGMAX).unwrap();
        let dgen = Generator::new(gpu, &draft.model, draft.ctx, LOGITS_AND_ARGMAX).unwrap();
        let draft_params = SamplingParams {
            seed: 99,
            ..params.clone()
        };
        let mut drafter = DraftModel::sampling(dgen, Sampler::new(draft_params));
        let mut spec = Speculator::new(
            &mut drafter,
            SpecOptions {
                max_draft: 3,
                min_accepted: 0.0,
                ..Default::default()
            },
        );
        let mut sampler = Sampler::new(params.clone());
        let (out, st) = generate_spec(
            &mut gen,
            &target.tokenizer,
            &mut sampler,
            &prompt,
            &opts,
            &mut spec,
            |_| true,
        )
        .unwrap();
        assert_eq!(out.generated.len(), 40);
        println!("{label} draft: {}/{} sampled drafts accepted", st.accepted, st.drafted);
        if label == "self" {
            assert!(st.drafted > 0 && st.accepted == st.drafted, "{label}: {st:?}");
        } else {
            assert!(
                st.accepted < st.drafted,
                "{label}: a different model should be rejected sometimes: {st:?}"
            );
        }
        results.push(out.generated);
    }
    assert_eq!(results[1], results[2], "the same seeds give the same run");
}

/// `StepOutputs::hidden` reads back the LM head's input: on a tiny tied f32 model, every row's logits equal its
/// hidden state times the embedding rows (written by the test, summed here in f64), for a prefill's last row, a
/// one-token step and every row of a verification step, and a verified row's hidden state equals the one-token
/// step's bit for bit.
#[test]
fn the_hidden_read_back_is_the_heads_input() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let t = Tiny::llama();
    write_gguf(&path, &t, 51, GgmlType::F32);
    let embed = tiny_weights(&t, 51)
        .into_iter()
        .find(|w| w.1 == "token_embd.weight")
        .expect("the embedding")
        .3;
    let model = weights(&path);
    let outputs = StepOutputs {
        hidden: true,
        ..LOGITS_AND_ARGMAX
    };
    let check = |hidden: &[f32], logits: &[f32], what: &str| {
        assert_eq!(hidden.len(), t.hidden, "{what}");
        for (v, &got) in logits.iter().enumerate() {
            let row = &embed[v * t.hidden..(v + 1) * t.hidden];
            let want: f64 = row.iter().zip(hidden).map(|(&e, &h)| e as f64 * h as f64).sum();
            assert!(
                (got as f64 - want).abs() < 1e-4 * (1.0 + want.abs()),
                "{what}: logit {v}: {got} vs {want}"
            );
        }
    };
    let (vocab, hd) = (t.vocab, t.hidden);
    let mut one = Generator::new(gpu(), &model, 64, outputs).unwrap();
    one.feed(&tokens(7, vocab, 1)).unwrap();
    // A prefill step reads back every row's hidden state; the logits are the last row's.
    assert_eq!(one.result.hidden.len(), 7 * hd, "prefill rows");
    check(&one.result.hidden[6 * hd..], &one.result.logits, "prefill");
    let cont = tokens(4, vocab, 2);
    let mut want = Vec::new();
    for &id in &cont {
        one.feed(&[id]).unwrap();
        check(&one.result.hidden, &one.result.logits, "decode");
        want.push(bits(&one.result.hidden));
    }
    let mut spec = Generator::new(gpu(), &model, 64, outputs).unwrap();
    spec.feed(&tokens(7, vocab, 1)).unwrap();
    spec.verify(&cont).unwrap();
    assert_eq!(spec.result.hidden.len(), cont.len() * hd);
    for (r, want) in want.iter().enumerate() {
        let hidden = &spec.result.hidden[r * hd..(r + 1) * hd];
        check(hidden, &spec.result.logits[r * vocab..(r + 1) * vocab], "verified row");
        assert!(
            bits(hidden) == *want,
            "verified row {r}'s hidden state differs from the one-token step's"
        );
    }
}

/// A random EAGLE-1 head for `t` as SafeAILab publishes one: a Llama `config.json` of one layer, and
/// `model.safetensors` with `fc.weight` `[hidden, 2 hidden]`, `fc.bias` and `layers.0.*` (no input norm).
fn write_eagle_head(dir: &Path, t: &Tiny, seed: u64) {
    std::fs::create_dir_all(dir).unwrap();
    let one = Tiny {
        arch: "llama",
        layers: 1,
        tied: true,
        ..*t
    };
    write_hf(dir, &one, seed, false);
    let h = t.hidden;
    let mut ws: Vec<(String, Vec<usize>, Vec<f32>)> = stored(&one, seed)
        .into_iter()
        .filter(|w| w.0.starts_with("model.layers.0.") && !w.0.contains("input_layernorm"))
        .map(|(hf, _, shape, v)| (hf["model.".len()..].to_string(), shape, v))
        .collect();
    ws.push(("fc.weight".into(), vec![h, 2 * h], random(seed + 1, 2 * h * h, 0.2)));
    ws.push(("fc.bias".into(), vec![h], random(seed + 2, h, 0.1)));
    write_safetensors(&dir.join("model.safetensors"), &ws, false);
}

/// An EAGLE drafter that records every proposal.
struct Recording<'a> {
    inner: EagleDraft<'a>,
    log: Vec<Vec<u32>>,
}

impl Drafter for Recording<'_> {
    fn propose(&mut self, history: &[u32], max: usize, out: &mut Vec<u32>) -> shaderlm::Result<()> {
        self.inner.propose(history, max, out)?;
        self.log.push(out.clone());
        Ok(())
    }
    fn propose_verified(
        &mut self,
        target: &mut Generator<'_>,
        history: &[u32],
        max: usize,
        out: &mut Vec<u32>,
    ) -> shaderlm::Result<bool> {
        let verified = self.inner.propose_verified(target, history, max, out)?;
        if verified {
            self.log.push(out.clone());
        }
        Ok(verified)
    }
    fn name(&self) -> &'static str {
        "recorded eagle"
    }
    fn observe(&mut self, pos: usize, result: &shaderlm::generate::StepResult) {
        self.inner.observe(pos, result);
    }
    fn needs_hidden(&self) -> bool {
        self.inner.needs_hidden()
    }
}

/// EAGLE-1 drafting (a random head in the published layout, for a tiny chat model): greedy output equal to plain
/// decoding with 1, 3 and 7 drafts per step, and the same follow-up turn, the head's chain verified in the target's
/// submission and drafting what one head step per submission drafts; the same with FR-Spec on the head, and
/// seeded sampling; a head that does not fit is refused by name.
#[test]
fn eagle_heads_draft_losslessly_and_bad_heads_are_refused() {
    let gpu = gpu();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("target.gguf");
    let t = write_gguf_chat(&path, 3, GgmlType::Q8_0);
    let loaded = open(gpu, &path, 128);
    let head_dir = dir.path().join("eagle");
    write_eagle_head(&head_dir, &t, 9);
    let head = Llama::load_eagle(gpu, &head_dir, &loaded.model).unwrap();
    let outputs = StepOutputs {
        hidden: true,
        ..LOGITS_AND_ARGMAX
    };
    let mut target = Generator::new(gpu, &loaded.model, 128, outputs).unwrap();
    let prompt = loaded
        .tokenizer
        .encode("hello world, hello world, hello", false)
        .unwrap();
    let follow = loaded.tokenizer.encode(" and again", false).unwrap();
    let greedy = SamplingParams::greedy();
    let (p1, p2, _) = run(&mut target, &loaded, &greedy, &prompt, &follow, 24, None);
    for k in [1, 3, 7] {
        let mut draft = EagleDraft::new(gpu, &head, 128).unwrap();
        target.truncate(0);
        let (s1, s2, st) = run(
            &mut target,
            &loaded,
            &greedy,
            &prompt,
            &follow,
            24,
            Some((&mut draft, k)),
        );
        assert_eq!(s1.generated, p1.generated, "eagle k={k}: first turn");
        assert_eq!(s2.generated, p2.generated, "eagle k={k}: follow-up turn");
        assert!(st.drafted >= 10, "eagle k={k}: only {} drafts", st.drafted);
        // After the first step (whose catch-up is the whole prompt), the head's chain and the verification ran in
        // one submission.
        assert!(
            st.one_submission > 0 && st.one_submission + 1 >= st.verify_steps,
            "eagle k={k}: {} of {} verification steps in one submission",
            st.one_submission,
            st.verify_steps
        );
        println!("eagle k={k}: {}/{} drafts accepted", st.accepted, st.drafted);
        // The chained head drafts what one head step per submission drafts, proposal by proposal.
        let logs: Vec<Vec<Vec<u32>>> = [true, false]
            .into_iter()
            .map(|chained| {
                let mut inner = EagleDraft::new(gpu, &head, 128).unwrap();
                inner.chained = chained;
                let mut rec = Recording { inner, log: Vec::new() };
                target.truncate(0);
                let (s1, ..) = run(&mut target, &loaded, &greedy, &prompt, &follow, 24, Some((&mut rec, k)));
                assert_eq!(s1.generated, p1.generated, "eagle k={k}, chained {chained}");
                rec.log
            })
            .collect();
        assert!(logs[0].len() >= 4, "eagle k={k}: {} proposals", logs[0].len());
        assert_eq!(
            logs[0], logs[1],
            "eagle k={k}: chained drafts against one head step per submission"
        );
    }
    // The head's chain step by step: a chain of k head steps (the first catching up with 3 entries from the
    // target's features, the later ones on the feature the step before predicted, on the device) chooses what k
    // separate steps choose with those features read back and written again, and leaves the same cache: one more
    // step on both gives the same logits bit for bit.
    let h = t.hidden;
    let feats = Rng::new(77).vec(5 * h, 2.0);
    let head_outputs = StepOutputs {
        hidden: true,
        ..LOGITS_AND_ARGMAX
    };
    for k in [1, 3, 6] {
        let (mut a, mut b) = (
            Generator::new(gpu, &head, 64, head_outputs).unwrap(),
            Generator::new(gpu, &head, 64, head_outputs).unwrap(),
        );
        for g in [&mut a, &mut b] {
            g.feed_with(&prompt[1..3], &feats[..2 * h]).unwrap();
        }
        a.feed_chain_with(&prompt[3..6], Some(&feats[2 * h..5 * h]), k).unwrap();
        b.feed_with(&prompt[3..6], &feats[2 * h..5 * h]).unwrap();
        let mut want = Vec::new();
        let mut feature = b.result.hidden[2 * h..].to_vec();
        for j in 0..k {
            want.push(b.result.argmax.unwrap());
            if j + 1 < k {
                b.feed_with(&[*want.last().unwrap()], &feature).unwrap();
                feature = b.result.hidden.clone();
            }
        }
        assert_eq!(a.result.row_argmax, want, "eagle chain k={k}: the drafts");
        assert_eq!(a.tokens, b.tokens, "eagle chain k={k}: the tokens cached");
        for g in [&mut a, &mut b] {
            g.feed_with(&[*want.last().unwrap()], &feature).unwrap();
        }
        assert!(
            bits(&a.result.logits) == bits(&b.result.logits),
            "eagle chain k={k}: the cache the chain wrote"
        );
    }
    // FR-Spec on the head: its LM head restricted to 40 tokens (and the stop tokens), still lossless.
    let ids = frspec::subset_ids(None, 40, t.vocab, &loaded.tokenizer).unwrap();
    let subset = frspec::subset_of(gpu, &loaded, ids).unwrap();
    let narrow = Llama::load_eagle(gpu, &head_dir, &loaded.model)
        .unwrap()
        .with_head_subset(subset);
    let mut draft = EagleDraft::new(gpu, &narrow, 128).unwrap();
    target.truncate(0);
    let (s1, _, st) = run(
        &mut target,
        &loaded,
        &greedy,
        &prompt,
        &follow,
        24,
        Some((&mut draft, 3)),
    );
    assert_eq!(s1.generated, p1.generated, "eagle with FR-Spec 40");
    assert!(st.drafted >= 10, "eagle with FR-Spec: only {} drafts", st.drafted);
    // Seeded sampling: the head's greedy drafts are kept where they equal the target's samples (sample-and-match).
    let seeded = SamplingParams {
        temperature: 0.9,
        seed: 5,
        ..Default::default()
    };
    target.truncate(0);
    let (q1, q2, _) = run(&mut target, &loaded, &seeded, &prompt, &follow, 24, None);
    let mut draft = EagleDraft::new(gpu, &head, 128).unwrap();
    target.truncate(0);
    let (r1, r2, _) = run(
        &mut target,
        &loaded,
        &seeded,
        &prompt,
        &follow,
        24,
        Some((&mut draft, 3)),
    );
    assert_eq!(
        (r1.generated, r2.generated),
        (q1.generated, q2.generated),
        "eagle, seeded"
    );
    // A target session without hidden states cannot feed the head.
    let mut plain = Generator::new(gpu, &loaded.model, 128, LOGITS_AND_ARGMAX).unwrap();
    let mut draft = EagleDraft::new(gpu, &head, 128).unwrap();
    let mut spec = Speculator::new(&mut draft, SpecOptions::default());
    let opts = GenOptions {
        max_tokens: 4,
        stop_strings: Vec::new(),
        stop_at_eos: false,
    };
    let e = generate_spec(
        &mut plain,
        &loaded.tokenizer,
        &mut Sampler::new(greedy),
        &prompt,
        &opts,
        &mut spec,
        |_| true,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("hidden states"), "{e}");
    // Heads that do not fit: fc of the wrong shape, another hidden size, a pytorch_model.bin that is no torch file.
    let bad = dir.path().join("bad");
    write_eagle_head(&bad, &t, 10);
    let st = bad.join("model.safetensors");
    let h = t.hidden;
    write_safetensors(&st, &[("fc.weight".into(), vec![h, h], random(1, h * h, 0.1))], false);
    let e = Llama::load_eagle(gpu, &bad, &loaded.model)
        .err()
        .expect("fc [h, h]")
        .to_string();
    assert!(
        e.contains("fc.weight") && e.contains(&format!("[{h}, {}]", 2 * h)),
        "{e}"
    );
    let wide = dir.path().join("wide");
    write_eagle_head(&wide, &Tiny { hidden: 2 * h, ..t }, 11);
    let e = Llama::load_eagle(gpu, &wide, &loaded.model)
        .err()
        .expect("another hidden size")
        .to_string();
    assert!(e.contains("hidden_size") && e.contains("target"), "{e}");
    let pickle = dir.path().join("pickle");
    write_eagle_head(&pickle, &t, 12);
    std::fs::rename(pickle.join("model.safetensors"), pickle.join("pytorch_model.bin")).unwrap();
    let e = Llama::load_eagle(gpu, &pickle, &loaded.model)
        .err()
        .expect("a pickle")
        .to_string();
    assert!(e.contains("pytorch_model.bin") && e.contains("zip"), "{e}");
}

/// A chained draft step (`Generator::feed_chain`, k steps in one submission, each taking the last one's argmax; the
/// first may catch up with several tokens) chooses what k separate steps choose, and leaves the cache as they do:
/// the next step's logits are the same bit for bit. Llama in three formats (the fused step on CPU adapters), Gemma 3's windows, Phi-3's longrope.
#[test]
fn a_chained_draft_equals_one_step_at_a_time() {
    let gpu = gpu();
    let mut models = Vec::new();
    let dir = tempfile::tempdir().unwrap();
    for (i, ty) in [GgmlType::F16, GgmlType::Q4_1, GgmlType::Q8_0].into_iter().enumerate() {
        let path = dir.path().join(format!("llama{i}.gguf"));
        write_gguf(&path, &Tiny::llama(), 61 + i as u64, ty);
        models.push((format!("llama {ty}"), weights(&path)));
    }
    for (label, t) in [("gemma3", Tiny::gemma3()), ("phi3", phi3())] {
        let path = dir.path().join(label);
        std::fs::create_dir(&path).unwrap();
        write_hf(&path, &t, 64, false);
        models.push((label.to_string(), weights(&path)));
    }
    for (label, model) in &models {
        for k in [1, 3, 6] {
            let prompt = tokens(9, 101, k as u32);
            let mut one = Generator::new(gpu, model, 64, LOGITS_AND_ARGMAX).unwrap();
            one.feed(&prompt[..6]).unwrap();
            one.feed(&prompt[6..]).unwrap();
            let first = one.result.argmax.unwrap();
            let mut want = Vec::new();
            let mut t = first;
            for _ in 0..k {
                one.feed(&[t]).unwrap();
                t = one.result.argmax.unwrap();
                want.push(t);
            }
            // A chain from one token, and one whose first link catches up with 3 tokens (a draft model's case).
            let mut chained = Generator::new(gpu, model, 64, LOGITS_AND_ARGMAX).unwrap();
            chained.feed(&prompt[..6]).unwrap();
            chained.feed(&prompt[6..]).unwrap();
            chained.feed_chain(&[first], k).unwrap();
            assert_eq!(chained.result.row_argmax, want, "{label} k={k}: the chain's choices");
            let mut caught_up = Generator::new(gpu, model, 64, LOGITS_AND_ARGMAX).unwrap();
            caught_up.feed(&prompt[..6]).unwrap();
            caught_up.feed_chain(&prompt[6..], k + 1).unwrap();
            assert_eq!(
                caught_up.result.row_argmax[0], first,
                "{label} k={k}: the catch-up link"
            );
            assert_eq!(
                caught_up.result.row_argmax[1..],
                want,
                "{label} k={k}: the chain after a catch-up"
            );
            assert_eq!(
                caught_up.tokens, one.tokens,
                "{label} k={k}: the tokens a catch-up chain caches"
            );
            assert_eq!(
                chained.tokens, one.tokens,
                "{label} k={k}: the chain caches the k tokens it ran"
            );
            // Drafted and verified in one submission (`verify_chain`, another session of the model as the target):
            // the drafts, the verification's outputs and what both caches hold are the two separate steps', bit
            // for bit.
            let (mut target_a, mut draft_a, mut target_b, mut draft_b) = (
                Generator::new(gpu, model, 64, LOGITS_AND_ARGMAX).unwrap(),
                Generator::new(gpu, model, 64, LOGITS_AND_ARGMAX).unwrap(),
                Generator::new(gpu, model, 64, LOGITS_AND_ARGMAX).unwrap(),
                Generator::new(gpu, model, 64, LOGITS_AND_ARGMAX).unwrap(),
            );
            for (t, d) in [(&mut target_a, &mut draft_a), (&mut target_b, &mut draft_b)] {
                t.feed(&prompt[..8]).unwrap();
                d.feed(&prompt[..6]).unwrap();
            }
            target_a.verify_chain(&mut draft_a, &prompt[6..], k).unwrap();
            draft_b.feed_chain(&prompt[6..], k).unwrap();
            let mut ids = vec![prompt[8]];
            ids.extend_from_slice(&draft_b.result.row_argmax);
            target_b.verify(&ids).unwrap();
            assert_eq!(
                draft_a.result.row_argmax, draft_b.result.row_argmax,
                "{label} k={k}: one submission's drafts"
            );
            assert!(
                bits(&target_a.result.logits) == bits(&target_b.result.logits)
                    && target_a.result.row_argmax == target_b.result.row_argmax,
                "{label} k={k}: the verification in the draft's submission"
            );
            assert_eq!(
                (&target_a.tokens, &draft_a.tokens),
                (&target_b.tokens, &draft_b.tokens),
                "{label} k={k}"
            );
            // The last choice was not run by the chain: run it on both and compare (the caches the chain wrote).
            let last = *chained.result.row_argmax.last().unwrap();
            chained.feed(&[last]).unwrap();
            one.feed(&[last]).unwrap();
            assert!(
                bits(&chained.result.logits) == bits(&one.result.logits),
                "{label} k={k}: the step after"
            );
        }
    }
}
