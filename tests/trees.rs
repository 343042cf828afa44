//! Draft trees verified in one step are lossless. (1) Every row of a tree step equals plain decoding along that
//! row's path, bit for bit, for every architecture (and with an f16 KV cache), and so does the step after an
//! accepted path (its K/V moved into place). (2) Generation with trees (EAGLE-2's dynamic tree from a draft model
//! and an EAGLE head, prompt lookup's merged matches) gives plain decoding's tokens on the SmolLM2 golden prompts,
//! greedy and seeded, and the same follow-up turn.

mod common;

use common::blockffn::write_blockffn;
use common::gpu::gpu;
use common::minicpm::write_minicpm;
use common::spec_runs::{run, run_with, Plain, Smol};
use common::steps::{bits, tokens, weights, LOGITS_AND_ARGMAX};
use common::tiny::{phi3, write_gguf, write_hf, Tiny};
use shaderlm::generate::draft::{Drafter, Lookup};
use shaderlm::generate::eagle::EagleDraft;
use shaderlm::generate::spec::SpecOptions;
use shaderlm::generate::tree::{top_log_probs, DraftTree, TreeShape};
use shaderlm::generate::Generator;
use shaderlm::model::load::LoadedModel;
use shaderlm::model::{KvType, Llama, LoadOptions, StepOutputs};
use shaderlm::quant::GgmlType;
use shaderlm::sampling::SamplingParams;

/// A draft tree of 23 nodes (random parents, at most 6 deep; more rows than a verification step's 8, so every
/// kernel must keep its rows invariant up to a tree's size) after `prompt`, run as one tree step: every row's logits
/// and argmax equal the one-token steps of plain decoding along that row's path, bit for bit; then the deepest
/// path is accepted (its K/V moved into place) and the next token's logits equal plain decoding's after it.
fn tree_rows_equal_decode_steps(label: &str, model: &Llama, prompt: &[u32], seed: u32) {
    tree_rows_then(label, model, prompt, seed, &[]);
}

/// [`tree_rows_equal_decode_steps`], then `after` fed to both sessions in one step: its logits equal too (an
/// InfLLM-v2 model crossing its dense length there attends sparsely over the compressed keys the accepted path
/// left).
fn tree_rows_then(label: &str, model: &Llama, prompt: &[u32], seed: u32, after: &[u32]) {
    let gpu = gpu();
    let (ctx, vocab) = (128, model.cfg.vocab);
    let toks = tokens(23, vocab, seed);
    let mut tree = shaderlm::generate::tree::DraftTree::default();
    tree.reset(toks[0]);
    for (i, &t) in toks.iter().enumerate().skip(1) {
        let mut parent = (i * 7 + seed as usize) % i;
        while tree.depth(parent) >= 6 {
            parent = tree.parents[parent];
        }
        tree.push(parent, t);
    }
    let mut plain = Generator::new(gpu, model, ctx, LOGITS_AND_ARGMAX).unwrap();
    let mut spec = Generator::new(gpu, model, ctx, LOGITS_AND_ARGMAX).unwrap();
    spec.feed(prompt).unwrap();
    let base = prompt.len();
    spec.feed_tree(base, &tree.tokens, &tree.table().unwrap(), None)
        .unwrap();
    let path_tokens = |node: usize| -> Vec<u32> { tree.path(node).iter().map(|&i| tree.tokens[i as usize]).collect() };
    for node in 0..tree.len() {
        plain.truncate(0);
        plain.feed(prompt).unwrap();
        for t in path_tokens(node) {
            plain.feed(&[t]).unwrap();
        }
        let got = bits(&spec.result.logits[node * vocab..(node + 1) * vocab]);
        assert!(
            got == bits(&plain.result.logits),
            "{label}: tree row {node} (depth {}) differs",
            tree.depth(node)
        );
        assert_eq!(
            spec.result.row_argmax[node],
            plain.result.argmax.unwrap(),
            "{label}: argmax of row {node}"
        );
    }
    // Accept the deepest path (nodes side by side in the cache until moved), then one more token.
    let deepest = (0..tree.len()).max_by_key(|&n| (tree.depth(n), n)).unwrap();
    let (path, toks) = (tree.path(deepest), path_tokens(deepest));
    spec.accept_path(base, &toks, &path).unwrap();
    spec.feed(&[5]).unwrap();
    plain.truncate(0);
    plain.feed(prompt).unwrap();
    for &t in toks.iter().chain(&[5]) {
        plain.feed(&[t]).unwrap();
    }
    assert!(
        bits(&spec.result.logits) == bits(&plain.result.logits),
        "{label}: the step after the accepted path"
    );
    // InfLLM-v2's compressed keys (the tree step left them alone; the accepted path's update made them).
    let (got, want) = (spec.compressed_keys().unwrap(), plain.compressed_keys().unwrap());
    assert!(
        got.as_deref().map(bits) == want.as_deref().map(bits),
        "{label}: compressed keys after the accepted path"
    );
    if spec.can_accept_on_device() {
        device_acceptance_equals_plain(label, model, prompt, toks[0]);
    }
    if !after.is_empty() {
        spec.feed(after).unwrap();
        plain.feed(after).unwrap();
        assert!(
            bits(&spec.result.logits) == bits(&plain.result.logits),
            "{label}: {} tokens after the accepted path",
            after.len()
        );
    }
}

/// A greedy tree step that accepts on the device (`Generator::feed_tree_accepting`): a tree after `prompt` and
/// `root` whose greedy path runs 4 deep through later siblings (decoy nodes before each of its rows, so every row
/// of the path moves) must report that path, and after keeping it the next step's logits, every cached K/V and
/// InfLLM-v2's compressed keys equal plain decoding's along it, bit for bit, and so do 30 steps after it.
fn device_acceptance_equals_plain(label: &str, model: &Llama, prompt: &[u32], root: u32) {
    let gpu = gpu();
    let (ctx, vocab) = (128, model.cfg.vocab as u32);
    let mut plain = Generator::new(gpu, model, ctx, LOGITS_AND_ARGMAX).unwrap();
    plain.feed(prompt).unwrap();
    plain.feed(&[root]).unwrap();
    let mut greedy = Vec::new();
    for _ in 0..4 {
        let a = plain.result.argmax.unwrap();
        greedy.push(a);
        plain.feed(&[a]).unwrap();
    }
    let mut tree = shaderlm::generate::tree::DraftTree::default();
    tree.reset(root);
    let (mut node, mut want) = (0, vec![0u32]);
    for &a in &greedy {
        let decoy = tree.push(node, (a + 1) % vocab);
        tree.push(decoy, a);
        node = tree.push(node, a);
        want.push(node as u32);
    }
    let mut spec = Generator::new(gpu, model, ctx, LOGITS_AND_ARGMAX).unwrap();
    spec.feed(prompt).unwrap();
    let base = prompt.len();
    spec.feed_tree_accepting(base, &tree.tokens, &tree.table().unwrap())
        .unwrap();
    assert_eq!(spec.result.tree_path, want, "{label}: the path accepted on the device");
    let kept: Vec<u32> = want.iter().map(|&r| tree.tokens[r as usize]).collect();
    spec.keep_moved_path(base, &kept).unwrap();
    let next = plain.result.argmax.unwrap();
    spec.feed(&[next]).unwrap();
    plain.feed(&[next]).unwrap();
    assert!(
        bits(&spec.result.logits) == bits(&plain.result.logits),
        "{label}: the step after the path accepted on the device"
    );
    assert!(
        bits(&spec.cache_prefix().unwrap()) == bits(&plain.cache_prefix().unwrap()),
        "{label}: the K/V cache after the path accepted on the device"
    );
    // InfLLM-v2: the step updated the compressed keys as the longest path would; the windows within the kept
    // tokens equal plain decoding's, and those past them are rewritten before any query sees them (30 more
    // one-token steps, across dense_len for the sparse model).
    let same_keys = |spec: &Generator<'_>, plain: &Generator<'_>| {
        let (got, want) = (spec.compressed_keys().unwrap(), plain.compressed_keys().unwrap());
        got.as_deref().map(bits) == want.as_deref().map(bits)
    };
    assert!(
        same_keys(&spec, &plain),
        "{label}: compressed keys after the path accepted on the device"
    );
    for t in tokens(30, vocab as usize, 3) {
        spec.feed(&[t]).unwrap();
        plain.feed(&[t]).unwrap();
    }
    assert!(
        bits(&spec.result.logits) == bits(&plain.result.logits) && same_keys(&spec, &plain),
        "{label}: 30 steps after the path accepted on the device"
    );
}

/// A tree step's log-probabilities from the device (each row's top-k and log-sum-exp, what a draft tree grows
/// from without reading the logits back) equal the host's from the full logits: the same ids in the same order
/// and log-probabilities within 1e-5 (an f32 sum against the host's f64).
fn device_log_probs_equal_host(label: &str, model: &Llama, prompt: &[u32]) {
    let k = 8;
    let out = StepOutputs {
        logits: true,
        topk: k,
        lse: true,
        ..Default::default()
    };
    let mut gen = Generator::new(gpu(), model, 128, out).unwrap();
    gen.feed(prompt).unwrap();
    let mut tree = shaderlm::generate::tree::DraftTree::default();
    tree.reset(3);
    for (i, &t) in tokens(12, model.cfg.vocab, 2).iter().enumerate() {
        tree.push(i / 3, t);
    }
    gen.feed_tree(prompt.len(), &tree.tokens, &tree.table().unwrap(), None)
        .unwrap();
    let (vocab, r) = (model.cfg.vocab, &gen.result);
    assert_eq!(r.lse.len(), tree.len(), "{label}: a log-sum-exp per row");
    for row in 0..tree.len() {
        let host = top_log_probs(&r.logits[row * vocab..(row + 1) * vocab], k, None);
        for (j, &(id, lp)) in host.iter().enumerate() {
            let (got_id, got_lp) = (
                r.topk_ids[row * k + j],
                r.topk_logits[row * k + j] as f64 - r.lse[row] as f64,
            );
            assert_eq!(got_id, id, "{label}: row {row}, rank {j}");
            assert!(
                (got_lp - lp).abs() < 1e-5,
                "{label}: row {row}, rank {j}: {got_lp} against {lp}"
            );
        }
    }
}

#[test]
fn tree_rows_equal_decode_steps_along_their_paths() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_gguf(&path, &Tiny::llama(), 31, GgmlType::Q4_1);
    tree_rows_equal_decode_steps("llama Q4_1", &weights(&path), &tokens(9, 101, 1), 3);
    device_log_probs_equal_host("llama Q4_1", &weights(&path), &tokens(9, 101, 1));
    // An f16 KV cache: tree rows written as halves, the accepted path's halves moved.
    let f16 = weights(&path).with_kv_type(KvType::F16);
    tree_rows_equal_decode_steps("llama Q4_1, f16 KV", &f16, &tokens(9, 101, 1), 3);
    let mut qwen3 = Tiny::llama();
    qwen3.arch = "qwen3";
    qwen3.kv_heads = 1;
    // Gemma 3's windows of 5 keys (crossed by the deeper paths), Qwen3's q/k norms, Phi-3's partial rotation, all
    // with dense f32 weights (the dense matmul's GEMV on every row).
    for (label, t) in [("qwen3", qwen3), ("gemma3", Tiny::gemma3()), ("phi3", phi3())] {
        let dir = tempfile::tempdir().unwrap();
        write_hf(dir.path(), &t, 33, false);
        tree_rows_equal_decode_steps(label, &weights(dir.path()), &tokens(11, 101, 5), 7);
    }
    // MiniCPM's muP scales, and BlockFFN's experts routed per row (their union over the tree's rows).
    let dir = tempfile::tempdir().unwrap();
    let t = write_minicpm(dir.path(), 34, None);
    tree_rows_equal_decode_steps("minicpm", &weights(dir.path()), &tokens(9, t.vocab, 7), 9);
    // InfLLM-v2 (dense_len 48): the tree step attends densely and leaves the compressed keys to the accepted path's
    // update; 96 more tokens then cross dense_len and attend sparsely, selecting 4 of 8 blocks by scores that
    // include the windows the path completed (in block 1: neither the initial block nor a local one).
    let dir = tempfile::tempdir().unwrap();
    let sparse = serde_json::json!({"kernel_size": 8, "kernel_stride": 4, "block_size": 16, "init_blocks": 1,
        "window_size": 32, "topk": 2, "use_nope": false, "dense_len": 48});
    let t = write_minicpm(dir.path(), 37, Some(sparse));
    let model = weights(dir.path());
    assert!(model.cfg.sparse.is_some());
    let after = tokens(96, t.vocab, 15);
    tree_rows_then("minicpm sparse", &model, &tokens(20, t.vocab, 7), 9, &after);
    let dir = tempfile::tempdir().unwrap();
    let t = write_blockffn(dir.path(), 36, "block", "rms");
    tree_rows_equal_decode_steps("blockffn", &weights(dir.path()), &tokens(9, t.vocab, 11), 13);
}

/// Draft trees (EAGLE-2's dynamic tree grown by SmolLM2 drafting for itself and by an EAGLE head, and prompt
/// lookup's merged matches), verified in one tree step each, with the tree shapes (depth, top-k, size): the
/// same tokens as plain decoding, greedy and seeded, and the same follow-up turn (the accepted path's K/V were
/// moved where plain decoding writes them).
#[test]
fn draft_trees_equal_plain_on_smollm2() {
    let smol = Smol::new();
    let (gpu, loaded, follow, seeded) = (&smol.gpu, &smol.loaded, &smol.follow, smol.seeded.clone());
    let mut target = smol.target();
    let mut draft = smol.self_draft(StepOutputs {
        logits: true, // a tree grows from the draft's log-probabilities
        ..Default::default()
    });
    let mut lookup = Lookup::default();
    let head = smol.head();
    let mut eagle = EagleDraft::for_trees(gpu, &head, loaded.ctx, 10).unwrap();
    let shapes = [(2, 10, 12), (6, 10, 60), (3, 4, 16)].map(|(depth, topk, size)| TreeShape { depth, topk, size });
    let runs = [
        ("chat_capital", SamplingParams::greedy(), &shapes[..]),
        ("code_python", SamplingParams::greedy(), &shapes[2..]),
        ("chat_capital", seeded, &shapes[..1]),
    ];
    for (name, params, shapes) in runs {
        let fx = common::golden::fixture("smollm2", name);
        let prompt = &fx.prompt_tokens;
        let label = format!("{name} at temperature {}", params.temperature);
        target.truncate(0);
        let plain = Plain::run(&mut target, loaded, &params, (prompt, follow), 16);
        for &shape in shapes {
            let sources: [(&str, &mut dyn Drafter); 3] = [
                ("lookup", &mut lookup),
                ("self-draft", &mut draft),
                ("eagle", &mut eagle),
            ];
            for (source, drafter) in sources {
                target.truncate(0);
                let opts = SpecOptions {
                    min_accepted: 0.0,
                    tree: Some(shape),
                    ..Default::default()
                };
                let (s1, s2, st) = run_with(
                    &mut target,
                    loaded,
                    &params,
                    (prompt, follow),
                    16,
                    Some((drafter, opts)),
                );
                let tag = format!("{label}, {source} tree {shape:?}");
                plain.assert_reproduced(&target, (&s1, &s2), &tag);
                println!(
                    "{tag}: {} tree steps, {} tokens per step, {}/{} nodes accepted",
                    st.verify_steps,
                    st.mean_accepted_len(),
                    st.accepted,
                    st.drafted
                );
                // Greedy tree steps accept on the device (the path's K/V moved in the same submission); seeded
                // ones on the host.
                let tree_steps = st.verify_steps - st.steps_by_drafts.iter().sum::<usize>();
                let want = if params.temperature == 0.0 { tree_steps } else { 0 };
                assert_eq!(st.tree_on_device, want, "{tag}: tree steps accepted on the device");
                // The EAGLE head's trees grow on the device in one submission each; the self-draft's (its steps
                // read logits) round by round; lookup's come from no model.
                let grown = if source == "eagle" { tree_steps } else { 0 };
                assert_eq!(
                    st.trees_grown_on_device, grown,
                    "{tag}: draft trees grown on the device"
                );
                // Greedy, the head's trees are verified in their draft's submission (drafting, rerank and the
                // target's tree step with its acceptance: one submission per step).
                let verified = if params.temperature == 0.0 { grown } else { 0 };
                assert_eq!(
                    st.one_submission, verified,
                    "{tag}: trees verified in their draft's submission"
                );
                if source == "self-draft" {
                    assert!(
                        st.verify_steps > 0 && st.accepted > 0,
                        "{tag}: nothing drafted or accepted"
                    );
                    if params.temperature == 0.0 {
                        // The draft's own greedy path is its best-scored one at depth 1, so each step keeps at
                        // least one draft.
                        assert!(st.accepted >= st.verify_steps, "{tag}: {st:?}");
                        assert!(st.tree_on_device > 0, "{tag}: no tree step accepted on the device");
                    }
                }
            }
        }
    }
}

/// Draft trees grown on the device in one submission (`Llama::tree_draft`: the catch-up step, `tree_frontier` and
/// every round's tree step chained) are the trees grown step by step from the same sessions, node for node:
/// SmolLM2 drafting for itself (its steps reading top-k and log-sum-exp), an EAGLE head (each row fed its parent's
/// predicted feature on the device) and the head restricted to 2048 ids (FR-Spec: ids mapped on the device), for
/// the shapes after histories of several lengths (so the catch-up runs 1 to many tokens). Grown with the
/// target's verification in the same submission (`Generator::verify_tree_draft`: the tree reranked on the device
/// feeds the target's tree step), the trees are the same and the target's choices and accepted path are those of
/// its own tree step over them.
#[test]
fn draft_trees_grown_on_the_device_equal_step_by_step() {
    let smol = Smol::new();
    let (gpu, loaded) = (&smol.gpu, &smol.loaded);
    let prompt = common::golden::fixture("smollm2", "code_python").prompt_tokens;
    let mut target = smol.target();
    target.feed(&prompt).unwrap();
    assert_eq!(
        target.result.hidden.len(),
        prompt.len() * loaded.model.cfg.hidden,
        "one prefill chunk"
    );
    let outputs = StepOutputs {
        topk: 10,
        lse: true,
        ..Default::default()
    };
    let (head, narrow) = (smol.head(), smol.head());
    let ids = shaderlm::model::frspec::subset_ids(None, 2048, loaded.model.cfg.vocab, &loaded.tokenizer).unwrap();
    let narrow = narrow.with_head_subset(shaderlm::model::frspec::subset_of(gpu, loaded, ids).unwrap());
    let shapes = [(2, 10, 12), (6, 10, 60), (3, 4, 16)].map(|(depth, topk, size)| TreeShape { depth, topk, size });
    let lengths = [prompt.len() - 9, prompt.len() - 8, prompt.len() - 2, prompt.len()];
    // Each tree grown both ways from the same history: node for node the same. Then grown again with the target's
    // verification in the same submission: the same tree, and the target's rows and accepted path those of its
    // tree step run after it.
    let mut compare = |source: &str, device: &mut dyn Drafter, host: &mut dyn Drafter| {
        target.truncate(0);
        target.feed(&prompt).unwrap();
        device.observe(0, &target.result);
        host.observe(0, &target.result);
        for shape in shapes {
            for &len in &lengths {
                let history = &prompt[..len];
                let root = *history.last().unwrap();
                let (mut a, mut b, mut c) = (DraftTree::default(), DraftTree::default(), DraftTree::default());
                a.reset(root);
                b.reset(root);
                c.reset(root);
                let on_device = device.propose_tree(history, shape, 64, &mut a).unwrap();
                let by_rounds = !host.propose_tree(history, shape, 64, &mut b).unwrap();
                let tag = format!("{source} {shape:?} after {len} tokens");
                assert!(
                    on_device && by_rounds,
                    "{tag}: grown on the device, then round by round"
                );
                assert!(a.len() > 1, "{tag}: an empty tree");
                assert_eq!((&a.tokens, &a.parents), (&b.tokens, &b.parents), "{tag}");
                target.truncate(len - 1);
                let verified = device
                    .propose_tree_verified(&mut target, history, shape, 64, &mut c)
                    .unwrap();
                assert_eq!(verified, (true, true), "{tag}: grown and verified in one submission");
                assert_eq!((&c.tokens, &c.parents), (&a.tokens, &a.parents), "{tag}: verified");
                let (path, rows) = (target.result.tree_path.clone(), target.result.row_argmax.clone());
                if source == "self-draft" {
                    assert!(path.len() > 1, "{tag}: the target's own draft keeps a path");
                }
                target
                    .feed_tree_accepting(len - 1, &c.tokens, &c.table().unwrap())
                    .unwrap();
                assert_eq!(path, target.result.tree_path, "{tag}: the accepted path");
                assert_eq!(
                    rows[..c.len()],
                    target.result.row_argmax[..],
                    "{tag}: the rows' choices"
                );
                // The tree steps wrote past the history: the prompt's K/V back for the next one.
                target.truncate(len - 1);
                target.feed(&prompt[len - 1..]).unwrap();
            }
        }
        // Room for the root alone: no tree, and no error.
        let mut root_only = DraftTree::default();
        root_only.reset(*prompt.last().unwrap());
        device.propose_tree(&prompt, shapes[0], 1, &mut root_only).unwrap();
        assert_eq!(root_only.len(), 1, "{source}: a tree of one node");
    };
    let (mut device, mut host) = (smol.self_draft(outputs), smol.self_draft(outputs));
    host.one_submission = false;
    compare("self-draft", &mut device, &mut host);
    for (source, model) in [("eagle", &head), ("eagle frspec", &narrow)] {
        let mut device = EagleDraft::for_trees(gpu, model, loaded.ctx, 10).unwrap();
        let mut host = EagleDraft::for_trees(gpu, model, loaded.ctx, 10).unwrap();
        host.chained = false;
        compare(source, &mut device, &mut host);
    }
}

/// Draft trees on an InfLLM-v2 model (dense_len 48): tree steps below its dense length, where they attend densely as
/// plain decoding does, and chains past it (`generate_spec` stops growing trees there); the output and the
/// follow-up turn are plain decoding's.
#[test]
fn draft_trees_on_a_sparse_model_cross_its_dense_length() {
    let gpu = gpu();
    let dir = tempfile::tempdir().unwrap();
    let sparse = serde_json::json!({"kernel_size": 8, "kernel_stride": 4, "block_size": 16, "init_blocks": 1,
        "window_size": 32, "topk": 2, "use_nope": false, "dense_len": 48});
    let t = write_minicpm(dir.path(), 38, Some(sparse));
    let loaded = LoadedModel::open(gpu, dir.path(), &LoadOptions::with_ctx(256), |_, _| {}).unwrap();
    assert!(loaded.model.cfg.sparse.is_some());
    // A prompt that repeats itself, so that prompt lookup finds matches.
    let prompt: Vec<u32> = tokens(12, t.vocab, 21).repeat(3);
    let st = lookup_trees_equal_plain(&loaded, &prompt, &tokens(5, t.vocab, 22));
    assert!(prompt.len() + 40 > 48, "the generation crosses dense_len");
    assert!(st.verify_steps > 0, "nothing was drafted: {st:?}");
    // Below dense_len the greedy tree steps accepted on the device (compressed keys updated in the same submission).
    assert!(st.tree_on_device > 0, "no tree step accepted on the device: {st:?}");
    println!(
        "{} verification steps ({} tree steps accepted on the device), {}/{} drafts accepted",
        st.verify_steps, st.tree_on_device, st.accepted, st.drafted
    );
}

/// Draft trees past an InfLLM-v2 model's dense length (C1 windows of 16 every 8 keys, C2 of 64 every 32, blocks of
/// 16, 3 of them selected): the tree step attends sparsely (block scores, selection and attention at each row's own
/// position, its path's keys through the tree table, its own copy of a window its path completes) and every row
/// equals plain decoding along its path, bit for bit, as do the steps after the accepted path: with no window
/// completing at its nodes past the root, a window completing at the root, a C1 window completing 3 deep, and a C1
/// and a C2 window completing 3 deep (the last two also on a model without local blocks, where that C1 window scores
/// a block chosen by score); where two windows of a kind complete within it the step is refused (a chain verifies
/// instead); prompt lookup's trees from a prompt already past the dense length give plain decoding's
/// tokens and follow-up turn.
#[test]
fn draft_trees_past_the_dense_length_attend_sparsely() {
    let gpu = gpu();
    let dir = tempfile::tempdir().unwrap();
    let sparse = serde_json::json!({"kernel_size": 16, "kernel_stride": 8, "block_size": 16, "init_blocks": 1,
        "window_size": 16, "topk": 3, "use_nope": false, "dense_len": 48});
    let t = write_minicpm(dir.path(), 39, Some(sparse));
    let model = weights(dir.path());
    assert!(model.cfg.sparse.is_some());
    // (root position, prompt seed, tree seed, tokens fed after, their seed, what happens there). Windows of 16 every
    // 8 complete at positions 15, 23, 31, ... (7 mod 8), windows of 64 every 32 at 63, 95, ...
    let cases = [
        // A tree at 64 (6 deep: positions 64 ..= 70) sees none complete; its 65 to 71 keys are more than the 48 the
        // selection keeps.
        (64, 8, 9, 20, 16, "minicpm sparse past dense_len"),
        // At 63 the root completes the first C2 window, the normalizer of every score after it (the tree step
        // updates the compressed keys for its root); 64 ..= 69 complete none.
        (63, 10, 11, 12, 17, "minicpm sparse, a window at the root"),
        // At 68 the tree's nodes past the root hold 71, where a C1 window completes: each row 3 deep or more scores
        // with its own copy of it.
        (68, 12, 13, 12, 18, "minicpm sparse, a C1 window within the tree"),
        // At 92 the nodes hold 95, where a C1 and a C2 window complete (the C2 window normalizes every score after
        // it).
        (92, 14, 15, 6, 19, "minicpm sparse, C1 and C2 windows within the tree"),
    ];
    for (at, seed, tree_seed, after, after_seed, label) in cases {
        let prompt = tokens(at, t.vocab, seed);
        tree_rows_then(label, &model, &prompt, tree_seed, &tokens(after, t.vocab, after_seed));
    }
    // With no local blocks (window_size 0) the block before the query's own is chosen by score, and the C1 window a
    // path completes 3 deep scores it (at 68: window 56..71 scores block 3 for the rows in block 4, at 92: 80..95
    // block 5 for those in block 6).
    let dir0 = tempfile::tempdir().unwrap();
    let no_local = serde_json::json!({"kernel_size": 16, "kernel_stride": 8, "block_size": 16, "init_blocks": 1,
        "window_size": 0, "topk": 3, "use_nope": false, "dense_len": 48});
    let t0 = write_minicpm(dir0.path(), 40, Some(no_local));
    let model0 = weights(dir0.path());
    for (at, seed) in [(68, 23), (92, 24)] {
        let label = format!("minicpm sparse without local blocks, a tree at {at}");
        tree_rows_then(
            &label,
            &model0,
            &tokens(at, t0.vocab, seed),
            seed,
            &tokens(4, t0.vocab, 25),
        );
    }
    // At 68 a path 11 deep holds 71 and 79, two C1 windows.
    let mut gen = Generator::new(gpu, &model, 128, LOGITS_AND_ARGMAX).unwrap();
    gen.feed(&tokens(68, t.vocab, 8)).unwrap();
    let mut tree = DraftTree::default();
    tree.reset(3);
    let mut node = 0;
    for t in 4..15 {
        node = tree.push(node, t);
    }
    let e = gen
        .feed_tree(68, &tree.tokens, &tree.table().unwrap(), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("verify a chain instead"), "{e}");
    // Generation with prompt lookup trees, every step past dense_len.
    let loaded = LoadedModel::open(gpu, dir.path(), &LoadOptions::with_ctx(256), |_, _| {}).unwrap();
    let prompt: Vec<u32> = tokens(12, t.vocab, 21).repeat(5);
    let st = lookup_trees_equal_plain(&loaded, &prompt, &tokens(5, t.vocab, 22));
    let tree_steps = st.verify_steps - st.steps_by_drafts.iter().sum::<usize>();
    assert!(tree_steps > 0, "no tree step past dense_len: {st:?}");
    println!(
        "{} verification steps, {tree_steps} of them tree steps past dense_len, {}/{} drafts accepted",
        st.verify_steps, st.accepted, st.drafted
    );
}

/// Greedy generation of 40 tokens after `prompt`, then `follow`, with prompt lookup's (3,4,16) trees: both turns
/// equal plain decoding's. Returns the speculation's counts.
fn lookup_trees_equal_plain(
    loaded: &LoadedModel,
    prompt: &[u32],
    follow: &[u32],
) -> shaderlm::generate::spec::SpecStats {
    let params = SamplingParams::greedy();
    let mut target = Generator::new(gpu(), &loaded.model, 256, LOGITS_AND_ARGMAX).unwrap();
    let (p1, p2, _) = run(&mut target, loaded, &params, prompt, follow, 40, None);
    target.truncate(0);
    let opts = SpecOptions {
        min_accepted: 0.0,
        tree: Some(TreeShape {
            depth: 3,
            topk: 4,
            size: 16,
        }),
        ..Default::default()
    };
    let mut lookup = Lookup::default();
    let (s1, s2, st) = run_with(
        &mut target,
        loaded,
        &params,
        (prompt, follow),
        40,
        Some((&mut lookup, opts)),
    );
    assert_eq!(s1.generated, p1.generated, "first turn");
    assert_eq!(s2.generated, p2.generated, "follow-up turn");
    st
}
