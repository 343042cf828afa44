//! The command line end to end on tiny generated models: greedy output equals the CPU reference, and bad input
//! (truncated or corrupt files, unknown architectures, missing tokenizer, over-long or empty prompts) gives a clear
//! error that names the problem, a non-zero exit, and no panic.

mod common;

use common::tiny::{rewrite_gguf, write_gguf, write_gguf_chat, write_gguf_chat_as, write_hf, write_hf_chat, Tiny};
use shaderlm::loader::gguf::{GgufFile, Value};
use shaderlm::model::{reference, LlamaConfig, Names};
use shaderlm::quant::GgmlType;
use std::path::Path;
use std::process::{Command, Output};

fn shaderlm(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shaderlm"))
        .args(args)
        .current_dir(cwd)
        .env_remove("SHADERLM_MODEL")
        .output()
        .expect("run shaderlm")
}

/// The command failed cleanly: non-zero exit, no panic, and stderr mentions every `needle`.
fn fails_with(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, got success; stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}: {err}");
    }
}

#[test]
fn greedy_generate_json_matches_the_cpu_reference() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_gguf_chat(&path, 7, GgmlType::F32);
    let p = path.to_str().unwrap();
    let out = shaderlm(
        &[
            "generate",
            "-m",
            p,
            "--prompt",
            "hello world",
            "-n",
            "6",
            "--temp",
            "0",
            "--json",
            "--ignore-eos",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let prompt: Vec<u32> = serde_json::from_value(v["prompt_ids"].clone()).unwrap();
    let generated: Vec<u32> = serde_json::from_value(v["generated_ids"].clone()).unwrap();
    assert_eq!(generated.len(), 6);
    let topk = v["topk"].as_array().unwrap();
    assert_eq!(topk.len(), 6);
    // Greedy: each generated id is the first of its step's top-10.
    for (j, t) in topk.iter().enumerate() {
        assert_eq!(t["ids"].as_array().unwrap().len(), 10);
        assert_eq!(t["ids"][0].as_u64().unwrap() as u32, generated[j]);
    }
    // The CPU reference forward, fed its own greedy choices, picks the same tokens.
    let f = GgufFile::open(&path).unwrap();
    let cfg = LlamaConfig::from_gguf(&f).unwrap();
    let mut seq = prompt.clone();
    for &g in &generated {
        let logits = reference::logits(&f, &cfg, Names::Gguf, &seq).unwrap();
        let want = shaderlm::sampling::argmax(logits.last().unwrap());
        assert_eq!(g, want, "after {} tokens", seq.len());
        seq.push(g);
    }
}

#[test]
fn chat_template_prompt_and_prompt_ids_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_gguf_chat(&path, 8, GgmlType::F32);
    let p = path.to_str().unwrap();
    let out = shaderlm(
        &[
            "generate", "-m", p, "--chat", "--system", "be brief", "--prompt", "hi", "-n", "3", "--temp", "0", "--json",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<u32> = serde_json::from_value(v["prompt_ids"].clone()).unwrap();
    let start = 256 + 6 + 1; // <|im_start|> in the tiny vocabulary
    assert_eq!(ids[0], start, "the template's first special token is one id");
    assert_eq!(
        ids.iter().filter(|&&i| i == start).count(),
        3,
        "system, user, assistant turns: {ids:?}"
    );
    let sampled = [
        "generate",
        "-m",
        p,
        "--prompt-ids",
        "5,6,7",
        "-n",
        "2",
        "--temp",
        "0.7",
        "--seed",
        "3",
        "--json",
    ];
    let out = shaderlm(&sampled, dir.path());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let again = shaderlm(&sampled, dir.path());
    assert_eq!(out.stdout, again.stdout, "a seed reproduces a sampled run");
}

#[test]
fn truncated_and_corrupt_model_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_gguf_chat(&path, 9, GgmlType::F32);
    let bytes = std::fs::read(&path).unwrap();
    for (name, data) in [
        ("truncated.gguf", bytes[..bytes.len() * 2 / 3].to_vec()),
        ("header-only.gguf", bytes[..20].to_vec()),
        ("garbage.gguf", vec![0x5a; 4096]),
    ] {
        let p = dir.path().join(name);
        std::fs::write(&p, data).unwrap();
        let out = shaderlm(
            &["generate", "-m", p.to_str().unwrap(), "--prompt", "hi", "-n", "1"],
            dir.path(),
        );
        fails_with(&out, &[name]);
        let out = shaderlm(&["info", p.to_str().unwrap()], dir.path());
        fails_with(&out, &[name]);
    }
    // A Hugging Face directory whose tokenizer.json is not a tokenizer.
    let hf = dir.path().join("hf");
    std::fs::create_dir(&hf).unwrap();
    write_hf(&hf, &Tiny::llama(), 1, false);
    std::fs::write(hf.join("tokenizer.json"), "{}").unwrap();
    let out = shaderlm(
        &["generate", "-m", hf.to_str().unwrap(), "--prompt", "hi", "-n", "1"],
        dir.path(),
    );
    fails_with(&out, &["tokenizer.json"]);
    // A complete Hugging Face directory whose weights are garbage, then truncated.
    let hf = dir.path().join("hf2");
    std::fs::create_dir(&hf).unwrap();
    common::tiny::write_hf_chat(&hf, 3, true);
    let weights = std::fs::read(hf.join("model.safetensors")).unwrap();
    let garbage = b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage".to_vec();
    for bad in [garbage, weights[..weights.len() / 2].to_vec()] {
        std::fs::write(hf.join("model.safetensors"), bad).unwrap();
        let out = shaderlm(
            &["generate", "-m", hf.to_str().unwrap(), "--prompt", "hi", "-n", "1"],
            dir.path(),
        );
        fails_with(&out, &["model.safetensors"]);
    }
}

#[test]
fn messages_file_and_stop_strings() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_gguf_chat(&path, 12, GgmlType::F32);
    let p = path.to_str().unwrap();
    let msgs = dir.path().join("msgs.json");
    let list = r#"[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]"#;
    std::fs::write(&msgs, list).unwrap();
    let m = msgs.to_str().unwrap();
    let out = shaderlm(
        &["generate", "-m", p, "--messages", m, "-n", "3", "--temp", "0", "--json"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<u32> = serde_json::from_value(v["prompt_ids"].clone()).unwrap();
    assert_eq!(
        ids.iter().filter(|&&i| i == 256 + 6 + 1).count(),
        3,
        "system, user and assistant turns: {ids:?}"
    );
    std::fs::write(&msgs, "not json").unwrap();
    let out = shaderlm(&["generate", "-m", p, "--messages", m, "-n", "3"], dir.path());
    fails_with(&out, &["msgs.json"]);
    // Greedy text of 12 tokens, then the same run stopped at a string taken from it: the text ends before it.
    let args = [
        "generate",
        "-m",
        p,
        "--prompt",
        "hello",
        "-n",
        "12",
        "--temp",
        "0",
        "--json",
        "--ignore-eos",
    ];
    let full = shaderlm(&args, dir.path());
    let v: serde_json::Value = serde_json::from_slice(&full.stdout).unwrap();
    let text = v["text"].as_str().unwrap().to_string();
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() >= 4, "12 tokens should give some text: {text:?}");
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let mut with_stop = args.to_vec();
    with_stop.extend(["--stop", stop.as_str()]);
    let out = shaderlm(&with_stop, dir.path());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cut = v["text"].as_str().unwrap();
    assert!(
        text.starts_with(cut) && !cut.contains(&stop) && cut.len() < text.len(),
        "{cut:?} / {text:?} / {stop:?}"
    );
}

#[test]
fn unknown_architecture_and_missing_tokenizer_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_gguf(&path, &Tiny::llama(), 1, GgmlType::F32);
    // No tokenizer metadata in this one.
    let out = shaderlm(
        &["generate", "-m", path.to_str().unwrap(), "--prompt", "hi", "-n", "1"],
        dir.path(),
    );
    fails_with(&out, &["tokenizer"]);
    // The same file claiming an architecture this build does not run.
    let odd = dir.path().join("odd.gguf");
    let rename = |k: &str, v: &Value| match k {
        "general.architecture" => (k.into(), Value::String("mamba9".into())),
        _ => (k.replace("llama.", "mamba9."), v.clone()),
    };
    rewrite_gguf(&path, &odd, rename, |_| {});
    let out = shaderlm(
        &["generate", "-m", odd.to_str().unwrap(), "--prompt", "hi", "-n", "1"],
        dir.path(),
    );
    fails_with(&out, &["unknown architecture", "mamba9"]);
    // A Hugging Face directory without tokenizer.json.
    let hf = dir.path().join("hf");
    std::fs::create_dir(&hf).unwrap();
    write_hf(&hf, &Tiny::llama(), 1, false);
    let out = shaderlm(
        &["generate", "-m", hf.to_str().unwrap(), "--prompt", "hi", "-n", "1"],
        dir.path(),
    );
    fails_with(&out, &["tokenizer.json"]);
}

#[test]
fn prompts_past_the_context_or_empty_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_gguf_chat(&path, 10, GgmlType::F32);
    let p = path.to_str().unwrap();
    let long = "word ".repeat(100);
    let out = shaderlm(
        &["generate", "-m", p, "--ctx", "16", "--prompt", &long, "-n", "1"],
        dir.path(),
    );
    fails_with(&out, &["context"]);
    let out = shaderlm(&["generate", "-m", p, "--prompt", "", "-n", "1"], dir.path());
    fails_with(&out, &["prompt is empty"]);
    let out = shaderlm(
        &["generate", "-m", p, "--prompt-ids", "5,999999", "-n", "1"],
        dir.path(),
    );
    fails_with(&out, &["outside the vocabulary"]);
}

/// A file whose head counts ask for a huge KV cache (4096 KV heads of 1024 dims, a context of 65536: 4 TiB in two
/// layers) is refused by the memory budget with the default limit (what the adapter reports), before anything is
/// allocated, saying what the KV cache needs and that --ctx lowers it.
#[test]
fn crafted_kv_head_counts_are_refused_by_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_gguf_chat(&path, 12, GgmlType::F32);
    let crafted = dir.path().join("crafted.gguf");
    let craft = |k: &str, v: &Value| {
        let v = match k {
            "llama.attention.head_count" | "llama.attention.head_count_kv" => Value::U32(4096),
            "llama.attention.key_length" | "llama.rope.dimension_count" => Value::U32(1024),
            "llama.context_length" => Value::U32(65536),
            _ => v.clone(),
        };
        (k.into(), v)
    };
    rewrite_gguf(&path, &crafted, craft, |_| {});
    let c = crafted.to_str().unwrap();
    let args = [
        "generate",
        "-m",
        c,
        "--prompt",
        "hi",
        "--ctx",
        "65536",
        "--kv-type",
        "f32",
    ];
    fails_with(
        &shaderlm(&args, dir.path()),
        &[
            "crafted.gguf",
            "KV cache 4.0 TiB for 65536 positions",
            "allowed by",
            "--ctx",
        ],
    );
}

/// The `--ctx N fits` advice of a budget message.
fn advised_ctx(text: &str) -> usize {
    let rest = text
        .split("--ctx ")
        .find(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        .unwrap_or_else(|| panic!("no --ctx advice: {text}"));
    let n: String = rest.chars().take_while(char::is_ascii_digit).collect();
    assert!(rest[n.len()..].starts_with(" fits"), "{text}");
    n.parse().unwrap()
}

/// `dir/tiny.gguf`, a model whose KV cache outweighs it: 32 KiB per position (4 layers x K and V x 8 heads x 128
/// dims x 4 bytes), 8 MiB at the trained 256 positions, against about 5 MiB of weights and scratch.
fn write_kv_heavy(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("tiny.gguf");
    let t = Tiny {
        layers: 4,
        heads: 8,
        kv_heads: 8,
        head_dim: 128,
        ..Tiny::llama()
    };
    write_gguf_chat_as(&path, t, 11, GgmlType::Q8_0);
    path
}

/// A context whose KV cache does not fit `--max-memory` is refused before anything is allocated, by generate,
/// chat and bench alike, with a message giving the need (weights, KV cache, scratch), the budget and the largest
/// `--ctx` that fits; that context then runs and one more does not; `info` says whether each fits.
#[test]
fn a_context_over_the_memory_budget_is_refused_with_the_one_that_fits() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_kv_heavy(dir.path());
    let p = path.to_str().unwrap();
    let budget = ["--max-memory", "8M", "--kv-type", "f32"];
    let run = |cmd: &[&str], ctx: usize| {
        let ctx = ctx.to_string();
        let mut args = cmd.to_vec();
        args.extend(["-m", p, "--ctx", &ctx]);
        args.extend(budget);
        shaderlm(&args, dir.path())
    };
    let generate = ["generate", "--prompt", "hi", "-n", "2", "--temp", "0"];
    let out = run(&generate, 256);
    fails_with(
        &out,
        &[
            "tiny.gguf",
            "KV cache",
            "for 256 positions",
            "8.0 MiB allowed by --max-memory",
            "--ctx",
        ],
    );
    let fit = advised_ctx(&String::from_utf8_lossy(&out.stderr));
    assert!((8..256).contains(&fit), "{fit}");
    for cmd in [&["chat"][..], &["bench", "-p", "4", "-n", "2", "-r", "1"]] {
        let out = run(cmd, 256);
        fails_with(&out, &["KV cache", "--max-memory", &format!("--ctx {fit} fits")]);
    }
    let out = run(&generate, fit);
    assert!(
        out.status.success(),
        "--ctx {fit}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    fails_with(&run(&generate, fit + 1), &["over the 8.0 MiB allowed by --max-memory"]);
    let info = run(&["info"], 256);
    assert!(info.status.success(), "{}", String::from_utf8_lossy(&info.stderr));
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(
        text.contains("does NOT fit the 8.0 MiB allowed by --max-memory"),
        "{text}"
    );
    assert_eq!(advised_ctx(&text), fit);
    let info = run(&["info"], fit);
    assert!(String::from_utf8_lossy(&info.stdout).contains("; fits the 8.0 MiB allowed by --max-memory"));
    let out = shaderlm(
        &["generate", "-m", p, "--max-memory", "4Q", "--prompt", "hi"],
        dir.path(),
    );
    fails_with(&out, &["--max-memory", "expected a size such as 4G"]);
}

/// `serve --parallel N` and `bench -b B` hold N (B + 1) KV caches at once: the budget counts each, so a number of
/// sessions over it is refused at load with the need and the advice, where one session fits; `-b` past 1024 is
/// refused outright.
#[test]
fn sessions_over_the_memory_budget_are_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_kv_heavy(dir.path());
    let p = path.to_str().unwrap();
    let common = ["-m", p, "--ctx", "256", "--kv-type", "f32", "--max-memory", "64M"];
    let run = |cmd: &[&str]| shaderlm(&[cmd, &common[..]].concat(), dir.path());
    let bench = ["bench", "-p", "4", "-n", "2", "-r", "1"];
    let out = run(&bench);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run(&[&bench[..], &["-b", "2"]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let over = [
        "KV cache 128.0 MiB for 256 positions x 16 sessions",
        "64.0 MiB allowed by --max-memory",
        "fewer sessions",
    ];
    fails_with(&run(&[&bench[..], &["-b", "15"]].concat()), &over);
    fails_with(&run(&["serve", "--port", "0", "--parallel", "16"]), &over);
    fails_with(
        &run(&[&bench[..], &["-b", "100000"]].concat()),
        &["-b 100000: at most 1024 sessions"],
    );
    // A draft model gets the room its target leaves: the file drafting for itself fits 64 MiB, not 24.
    let gen = [
        "generate",
        "--prompt",
        "hi",
        "-n",
        "2",
        "--temp",
        "0",
        "--draft-model",
        p,
    ];
    let with = |budget: &str| {
        let mut args = [&gen[..], &common[..]].concat();
        *args.last_mut().unwrap() = budget;
        shaderlm(&args, dir.path())
    };
    let out = with("64M");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    fails_with(
        &with("24M"),
        &[
            "loading the draft model",
            "allowed by --max-memory less the",
            "that the target model takes",
        ],
    );
}

/// `--kv-type f16` halves the KV cache the budget counts and generates; a type the engine lacks is refused.
#[test]
fn kv_type_sets_the_cache_size_and_unknown_types_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_gguf_chat(&path, 13, GgmlType::Q8_0);
    let p = path.to_str().unwrap();
    let info = |kv: &str| {
        let out = shaderlm(&["info", "-m", p, "--ctx", "256", "--kv-type", kv], dir.path());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let kv = text
            .split("KV cache ")
            .nth(1)
            .and_then(|t| t.split(" for 256 positions").next());
        kv.unwrap_or_else(|| panic!("no KV cache size: {text}")).to_string()
    };
    let (f32s, f16s) = (info("f32"), info("f16"));
    let kib = |s: &str| match s.split_once(' ') {
        Some((n, "KiB")) => n.parse::<f64>().unwrap(),
        Some((n, "MiB")) => n.parse::<f64>().unwrap() * 1024.0,
        _ => panic!("a KV cache size {s:?}"),
    };
    let ratio = kib(&f32s) / kib(&f16s);
    assert!((1.95..2.05).contains(&ratio), "{f32s} vs {f16s}");
    let generate = [
        "generate",
        "-m",
        p,
        "--prompt",
        "hi",
        "-n",
        "3",
        "--temp",
        "0",
        "--kv-type",
        "f16",
    ];
    let out = shaderlm(&generate, dir.path());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = shaderlm(&["generate", "-m", p, "--prompt", "hi", "--kv-type", "q8"], dir.path());
    fails_with(&out, &["--kv-type", "\"q8\"", "want f32 or f16"]);
}

#[test]
fn chat_without_a_model_says_how_to_fetch_one() {
    let dir = tempfile::tempdir().unwrap();
    let out = shaderlm(&["chat"], dir.path());
    fails_with(&out, &["models/fetch.sh"]);
}

#[test]
fn hugging_face_directories_old_and_new_layouts_chat() {
    for template_file in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        common::tiny::write_hf_chat(dir.path(), 11, template_file);
        let p = dir.path().to_str().unwrap();
        let out = shaderlm(
            &[
                "generate", "-m", p, "--chat", "--prompt", "hello", "-n", "4", "--temp", "0", "--json",
            ],
            dir.path(),
        );
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let ids: Vec<u32> = serde_json::from_value(v["prompt_ids"].clone()).unwrap();
        // <|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n: the specials are single ids, "hello" merged.
        let start = 256 + 6 + 1;
        assert_eq!(ids[0], start);
        assert_eq!(ids.iter().filter(|&&i| i == start).count(), 2, "{ids:?}");
        assert!(ids.contains(&(256 + 3)), "'hello' should be one merged token: {ids:?}");
        let info = shaderlm(&["info", p], dir.path());
        assert!(info.status.success());
        assert!(String::from_utf8_lossy(&info.stdout).contains("chat template: yes"));
    }
}

#[test]
fn bench_runs_a_synthetic_model_and_names_unknown_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["bench", "--synthetic", "smollm2-135m", "--synthetic-type", "q4_1"];
    let out = shaderlm(
        &[&args[..], &["-p", "16", "-n", "3", "-r", "1", "-o", "json"]].concat(),
        dir.path(),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let text = v.to_string();
    for needle in ["pp16", "tg3", "Q4_1"] {
        assert!(text.contains(needle), "bench JSON lacks {needle}: {text}");
    }
    fails_with(
        &shaderlm(&["bench", "--synthetic", "gpt-5"], dir.path()),
        &["unknown synthetic model", "llama-8b"],
    );
    fails_with(
        &shaderlm(
            &["bench", "--synthetic", "llama-1b", "--synthetic-type", "q9"],
            dir.path(),
        ),
        &["unknown weight type"],
    );
}

/// Cells of the markdown table rows whose first cell is `first`.
fn table_rows<'a>(text: &'a str, first: &str) -> Vec<Vec<&'a str>> {
    text.lines()
        .filter_map(|l| l.strip_prefix('|'))
        .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>())
        .filter(|cells| cells[0] == first)
        .collect()
}

#[test]
fn bench_profile_splits_the_step_by_op_and_by_matrix_size() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["bench", "--synthetic", "smollm2-135m", "--synthetic-type", "q4_1"];
    let out = shaderlm(
        &[&args[..], &["-p", "0", "-n", "1", "-r", "1", "--profile"]].concat(),
        dir.path(),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("read ceiling (read_sum, same run)"), "{text}");
    assert!(
        text.contains("weights read per step") && text.contains("% of the read ceiling"),
        "{text}"
    );
    // The op table: | op | nodes | dispatches | ms | share | GB/s | of ceiling |; the size table:
    // | matmul node | nodes | MB each | us each | GB/s | of ceiling |, both with a matmul_q row first cell.
    let rows = table_rows(&text, "matmul_q");
    let (ops, sizes): (Vec<_>, Vec<_>) = rows.iter().partition(|r| r.len() == 8);
    assert_eq!(ops.len(), 1, "{text}");
    let nodes: usize = ops[0][1].parse().unwrap();
    // 30 layers of q|k|v, o, gate|up and down, and the LM head.
    assert_eq!(nodes, 30 * 4 + 1, "{text}");
    let count = |r: &Vec<&str>| r[1].parse::<usize>().unwrap();
    assert_eq!(sizes.iter().map(|r| count(r)).sum::<usize>(), nodes, "{text}");
    // Largest first: the head (49152 x 576, one node) reads the most bytes.
    assert_eq!(count(sizes[0]), 1, "{text}");
    let mb = |r: &Vec<&str>| r[2].parse::<f64>().unwrap();
    assert!(sizes.windows(2).all(|w| mb(w[0]) > mb(w[1])), "{text}");

    // A speculative verification step of 4 rows: the same matmuls (now GEMMs), named as such; 9 rows are refused.
    let verify = [
        &args[..],
        &["-p", "0", "-n", "0", "-r", "1", "--profile", "--profile-rows", "4"],
    ]
    .concat();
    let out = shaderlm(&verify, dir.path());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("verification step of 4 rows at position 64"), "{text}");
    let ops: Vec<_> = table_rows(&text, "matmul_q")
        .into_iter()
        .filter(|r| r.len() == 8)
        .collect();
    assert_eq!(ops.len(), 1, "{text}");
    assert_eq!(ops[0][1].parse::<usize>().unwrap(), 30 * 4 + 1, "{text}");
    // The head's node moves 4 rows of logits (+0.59 MB against one row's).
    let head = table_rows(&text, "matmul_q")
        .into_iter()
        .find(|r| r.len() == 7)
        .unwrap();
    assert!(mb(&head) > mb(sizes[0]) + 0.5, "{text}");
    let too_many = [&args[..], &["-n", "0", "--profile", "--profile-rows", "9"]].concat();
    fails_with(&shaderlm(&too_many, dir.path()), &["--profile-rows", "9"]);
}

#[test]
fn sparse_attention_flags_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_gguf_chat(&path, 3, GgmlType::F32);
    let p = path.to_str().unwrap();
    let gen = |extra: &[&str]| {
        let args = [
            &["generate", "-m", p, "--prompt", "hello", "-n", "2", "--temp", "0"][..],
            extra,
        ]
        .concat();
        shaderlm(&args, dir.path())
    };
    fails_with(&gen(&["--sparse-topk", "4"]), &["--sparse-attention"]);
    fails_with(
        &gen(&["--sparse-attention", "--sparse-window", "100"]),
        &["sparse attention settings do not fit together"],
    );
    fails_with(
        &gen(&["--sparse-attention", "--dense-attention"]),
        &["cannot be used with"],
    );
    // A context too short for one compressed window stays dense: the run succeeds.
    let out = gen(&["--sparse-attention", "--sparse-dense-len", "4", "--ctx", "64"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Past dense_len with small blocks: the sparse kernels run through the command line.
    let long = "hello world ".repeat(20);
    let sparse = [
        "--sparse-attention",
        "--sparse-dense-len",
        "32",
        "--sparse-block-size",
        "16",
        "--sparse-window",
        "32",
        "--sparse-topk",
        "2",
    ];
    let args = [
        &["generate", "-m", p, "--prompt", &long, "-n", "4", "--temp", "0"][..],
        &sparse[..],
    ]
    .concat();
    let out = shaderlm(&args, dir.path());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn generate_check_passes_every_node_of_a_prefill_and_a_decode_step() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_gguf_chat(&path, 7, GgmlType::Q8_0);
    let p = path.to_str().unwrap();
    let out = shaderlm(&["generate", "-m", p, "--prompt", "hello world", "--check"], dir.path());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for needle in [
        "check: prefill step",
        "check: decode step",
        "| matmul_q",
        "| attention_decode",
    ] {
        assert!(text.contains(needle), "stdout lacks {needle:?}: {text}");
    }
    assert_eq!(text.matches("checked nodes within their bounds").count(), 2, "{text}");
}

/// Runs the binary but kills it after `secs` (a hang fails the test instead of stalling the suite).
fn shaderlm_within(args: &[&str], cwd: &Path, secs: u64) -> Output {
    common::cli::run_within(args, cwd, secs).unwrap_or_else(|| panic!("shaderlm {args:?} still running after {secs} s"))
}

/// A FIFO where a model file, config.json or tokenizer.json should be would block a reader forever: each is
/// refused as "not a regular file", naming it, before anything opens it.
#[cfg(unix)]
#[test]
fn fifos_in_place_of_model_files_are_refused_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let mkfifo = |p: &Path| {
        let _ = std::fs::remove_file(p);
        let ok = Command::new("mkfifo").arg(p).status().expect("mkfifo").success();
        assert!(ok, "mkfifo {}", p.display());
    };
    let gguf = dir.path().join("model.gguf");
    mkfifo(&gguf);
    let mut cases = vec![(gguf.clone(), gguf)];
    for name in ["config.json", "tokenizer.json"] {
        let hf = dir.path().join(format!("hf-{name}"));
        std::fs::create_dir(&hf).unwrap();
        write_hf_chat(&hf, 1, false);
        mkfifo(&hf.join(name));
        cases.push((hf.clone(), hf.join(name)));
    }
    for (model, fifo) in cases {
        for args in [
            vec!["info", model.to_str().unwrap()],
            vec!["generate", "-m", model.to_str().unwrap(), "--prompt", "hi", "-n", "1"],
        ] {
            let out = shaderlm_within(&args, dir.path(), 60);
            fails_with(&out, &[fifo.to_str().unwrap(), "not a regular file"]);
        }
    }
}

/// Found by the command-line fuzzer: `generate --messages FIFO` and `quantize --eval-text FIFO` (or
/// `--calib-text`) waited forever for a writer; text files given by flags are now refused unless regular, naming
/// the flag's file, like model files.
#[cfg(unix)]
#[test]
fn fifos_given_as_text_files_are_refused_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    write_gguf_chat(&model, 13, GgmlType::Q8_0);
    let (m, out) = (model.to_str().unwrap(), dir.path().join("out.gguf"));
    let fifo = dir.path().join("text.fifo");
    let ok = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo").success();
    assert!(ok, "mkfifo {}", fifo.display());
    let (f, o) = (fifo.to_str().unwrap(), out.to_str().unwrap());
    for args in [
        vec!["generate", "-m", m, "--messages", f, "-n", "1"],
        vec!["quantize", "-m", m, "-o", o, "-f", "q8_0", "--eval-text", f],
        vec![
            "quantize",
            "-m",
            m,
            "-o",
            o,
            "-f",
            "q8_0",
            "--method",
            "gptq",
            "--calib-text",
            f,
        ],
    ] {
        let out = shaderlm_within(&args, dir.path(), 60);
        fails_with(&out, &[f, "not a regular file"]);
    }
}

/// A chat template that renders nothing, or runs away, is a clear error from `generate --chat` and `chat`.
#[test]
fn empty_and_runaway_chat_templates_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("hf");
    std::fs::create_dir(&hf).unwrap();
    write_hf_chat(&hf, 2, true);
    let m = hf.to_str().unwrap();
    for (template, needle) in [
        ("{# nothing #}", "empty prompt"),
        (
            "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}",
            "fuel",
        ),
    ] {
        std::fs::write(hf.join("chat_template.jinja"), template).unwrap();
        let out = shaderlm_within(
            &["generate", "-m", m, "--chat", "--prompt", "hi", "-n", "1"],
            dir.path(),
            120,
        );
        fails_with(&out, &["chat template", needle]);
    }
}

/// EAGLE from the command line: `eagle-fit` writes a head for a tiny chat model from a text, `generate --eagle` drafts
/// with it and prints plain decoding's text; the flags are checked.
#[test]
fn eagle_fit_then_generate_with_the_head() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_gguf_chat(&path, 3, GgmlType::F32);
    let p = path.to_str().unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(
        &text,
        "hello world, the quick brown fox jumps over the lazy dog. ".repeat(8),
    )
    .unwrap();
    let head = dir.path().join("head");
    let fit = [
        "eagle-fit",
        "-m",
        p,
        "--text",
        text.to_str().unwrap(),
        "-o",
        head.to_str().unwrap(),
    ];
    let out = shaderlm(&fit, dir.path());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(head.join("config.json").exists() && head.join("model.safetensors").exists());
    let gen = |extra: &[&str]| {
        let args = [
            &[
                "generate",
                "-m",
                p,
                "--prompt",
                "hello world",
                "-n",
                "12",
                "--temp",
                "0",
            ][..],
            extra,
        ]
        .concat();
        shaderlm(&args, dir.path())
    };
    let plain = gen(&[]);
    assert!(plain.status.success(), "{}", String::from_utf8_lossy(&plain.stderr));
    let spec = gen(&["--eagle", head.to_str().unwrap(), "--spec-min-accepted", "0"]);
    assert!(spec.status.success(), "{}", String::from_utf8_lossy(&spec.stderr));
    assert_eq!(
        String::from_utf8_lossy(&spec.stdout),
        String::from_utf8_lossy(&plain.stdout)
    );
    // The model drafting for itself: the chain and its verification in one submission, or (--draft-apart) two.
    for extra in [&["--draft-model", p][..], &["--draft-model", p, "--draft-apart"]] {
        let out = gen(&[extra, &["--spec-min-accepted", "0", "--stats"]].concat());
        assert!(
            out.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&plain.stdout),
            "{extra:?}"
        );
        let one = String::from_utf8_lossy(&out.stderr).contains("in the verification's submission");
        assert_eq!(
            one,
            extra.len() == 2,
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Draft trees: from the head, from prompt lookup, from the model drafting for itself (grown, reranked and
    // verified in one submission) and from its first layer alone (--draft-layers without --draft-model: the
    // target's own file, cut), print the same text; a tree needs a draft source and a shape of three numbers, and
    // takes no sampled drafts.
    let h = head.to_str().unwrap();
    for extra in [
        &["--eagle", h, "--spec-tree", "2,4,6"][..],
        &["--spec", "lookup", "--spec-tree", "3,4,16"],
        &["--draft-model", p, "--spec-tree", "2,4,6"],
        &["--draft-layers", "1", "--spec-tree", "2,4,6"],
    ] {
        let tree = gen(&[extra, &["--spec-min-accepted", "0", "--stats"]].concat());
        let one = String::from_utf8_lossy(&tree.stderr).contains("in the verification's submission");
        assert!(
            one || extra[0] != "--draft-model",
            "{extra:?}: the self-draft's trees verify in their submission: {}",
            String::from_utf8_lossy(&tree.stderr)
        );
        assert!(
            tree.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&tree.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&tree.stdout),
            String::from_utf8_lossy(&plain.stdout),
            "{extra:?}"
        );
    }
    fails_with(&gen(&["--spec-tree", "6,10,60"]), &["--spec-tree", "draft source"]);
    fails_with(&gen(&["--spec", "lookup", "--spec-tree", "6,10"]), &["DEPTH,TOPK,SIZE"]);
    fails_with(
        &gen(&["--draft-model", p, "--draft-sample", "--spec-tree", "2,2,2"]),
        &["--draft-sample"],
    );
    fails_with(&gen(&["--spec", "eagle"]), &["--spec eagle needs --eagle DIR"]);
    fails_with(&gen(&["--spec", "lookup", "--eagle", "x"]), &["use --spec eagle"]);
    fails_with(
        &gen(&["--eagle", dir.path().join("nowhere").to_str().unwrap()]),
        &["nowhere"],
    );
}
