//! An in-tree mutation fuzzer on stable Rust: valid tiny seeds (a GGUF with a vocabulary and template, a Hugging
//! Face directory) are mutated, bytes and JSON alike, and fed to the library's entry points that read files: the
//! GGUF parser, configs from GGUF and config.json, tokenizers and templates from both, safetensors headers, the
//! quantization config, `info`'s summary, PyTorch files (`torch_pickle::read`: a zip and a pickle). Every case must return (Ok or an error), never panic, never ask for one
//! allocation over [`ALLOC_BUDGET`] and never take over [`CASE_SECS`].
//!
//! The command line gets its own corpus (`fuzz/command_lines.rs`): every subcommand and flag, run through the
//! binary.
//!
//! `SHADERLM_FUZZ_SECS` sets the run time (default 20 s for files and 20 s for command lines, which run alongside),
//! `SHADERLM_FUZZ_SEED` the seed (default fixed, so CI runs are reproducible). A failing case prints its seed and
//! case number (or its command line); regressions found this way are named cases in `fuzz_regressions` below and in
//! `tests/cli.rs`.

#[path = "fuzz/command_lines.rs"]
mod command_lines;
mod common;

use common::rng::Rng;
use common::tiny::{rewrite_gguf, write_gguf_chat, write_hf_chat};
use shaderlm::loader::gguf::{GgufFile, Value};
use shaderlm::loader::quant_config::QuantConfig;
use shaderlm::loader::safetensors::SafetensorsModel;
use shaderlm::model::load::{describe, tokenizer_from_gguf};
use shaderlm::model::LlamaConfig;
use shaderlm::quant::GgmlType;
use shaderlm::tokenizer::chat::{hf_eos_ids, render, Message};
use shaderlm::tokenizer::Tokenizer;
use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Largest single allocation a case may ask for: far above what the tiny seeds need, far below what a header
/// count or a crafted hyper-parameter can reach.
const ALLOC_BUDGET: usize = 1 << 30;
/// Longest a case may take.
const CASE_SECS: u64 = 10;

/// The case being run, for the allocator's report.
static CASE: AtomicU64 = AtomicU64::new(0);

/// The system allocator, refusing (and reporting, without allocating) any request over the budget.
struct Budget;

unsafe impl GlobalAlloc for Budget {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOC_BUDGET {
            over_budget(layout.size());
            return std::ptr::null_mut();
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > ALLOC_BUDGET {
            over_budget(new_size);
            return std::ptr::null_mut();
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Budget = Budget;

/// Writes "fuzz case N asked for B bytes" to stderr with no allocation (the process then aborts).
fn over_budget(bytes: usize) {
    fn digits(mut v: u64, out: &mut [u8; 20]) -> &[u8] {
        let mut i = out.len();
        loop {
            i -= 1;
            out[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                return &out[i..];
            }
        }
    }
    let (mut a, mut b) = ([0u8; 20], [0u8; 20]);
    let mut err = std::io::stderr();
    let _ = err.write_all(b"\nfuzz case ");
    let _ = err.write_all(digits(CASE.load(Ordering::Relaxed), &mut a));
    let _ = err.write_all(b" asked for one allocation of ");
    let _ = err.write_all(digits(bytes as u64, &mut b));
    let _ = err.write_all(b" bytes, over the budget\n");
}

/// Integers that break sizes: zero, one, sign and width edges, huge powers of two.
const EDGES: [u64; 12] = [
    0,
    1,
    2,
    255,
    65535,
    0x7fff_ffff,
    0xffff_ffff,
    1 << 32,
    1 << 50,
    1 << 62,
    i64::MAX as u64,
    u64::MAX,
];

/// A few byte-level mutations of `b`: flips, edge integers written over 4 or 8 bytes, cut ranges, duplicated
/// ranges, truncation.
fn mutate_bytes(rng: &mut Rng, b: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(4) {
        if b.is_empty() {
            b.push(0);
        }
        let at = rng.index(b.len());
        match rng.below(6) {
            0 => b[at] ^= 1 << rng.below(8),
            1 => b[at] = rng.next_u64() as u8,
            2 => {
                let v = rng.pick(&EDGES).to_le_bytes();
                let n = if rng.below(2) == 0 { 4 } else { 8 };
                for (i, x) in v[..n].iter().enumerate() {
                    if at + i < b.len() {
                        b[at + i] = *x;
                    }
                }
            }
            3 => {
                let end = (at + 1 + rng.index(64)).min(b.len());
                b.drain(at..end);
            }
            4 => {
                let end = (at + 1 + rng.index(64)).min(b.len());
                let piece: Vec<u8> = b[at..end].to_vec();
                let to = rng.index(b.len());
                b.splice(to..to, piece);
            }
            _ => b.truncate(at),
        }
    }
}

/// The GGUF seed with one of its numbers (a metadata value, a count, a dimension) replaced by an edge value: the
/// header fields every reader trusts are found by their little-endian bytes.
fn mutate_gguf_number(rng: &mut Rng, b: &mut [u8]) {
    let width = if rng.below(2) == 0 { 4 } else { 8 };
    // Aim at small values (counts, dimensions, hyper-parameters): find a position holding a value below 2^20.
    for _ in 0..64 {
        let at = rng.index(b.len().saturating_sub(width));
        let mut v = [0u8; 8];
        v[..width].copy_from_slice(&b[at..at + width]);
        let x = u64::from_le_bytes(v);
        if x > 0 && x < 1 << 20 {
            let e = rng.pick(&EDGES).to_le_bytes();
            b[at..at + width].copy_from_slice(&e[..width]);
            return;
        }
    }
}

/// Values a JSON field may be replaced by.
fn json_edge(rng: &mut Rng) -> serde_json::Value {
    use serde_json::json;
    match rng.below(12) {
        0 => json!(null),
        1 => json!(-1),
        2 => json!(0),
        3 => json!(rng.pick(&EDGES)),
        4 => json!(1e308),
        5 => json!(-1e-300),
        6 => json!("x".repeat(rng.index(100))),
        7 => json!([]),
        8 => json!({}),
        9 => json!(true),
        10 => json!([1, 2, 3]),
        _ => json!(0.5),
    }
}

/// Replace, drop or duplicate one field somewhere in `v` (depth-first, at random).
fn mutate_json(rng: &mut Rng, v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::Object(m) if !m.is_empty() => {
            let keys: Vec<String> = m.keys().cloned().collect();
            let k = &keys[rng.index(keys.len())];
            match rng.below(5) {
                0 => {
                    m.remove(k);
                }
                1 => {
                    m.insert(k.clone(), json_edge(rng));
                }
                _ => mutate_json(rng, m.get_mut(k).expect("key")),
            }
        }
        Value::Array(a) if !a.is_empty() => {
            let i = rng.index(a.len());
            match rng.below(4) {
                0 => {
                    a.remove(i);
                }
                1 => a[i] = json_edge(rng),
                _ => mutate_json(rng, &mut a[i]),
            }
        }
        _ => *v = json_edge(rng),
    }
}

/// Jinja fragments spliced into templates.
const JINJA: [&str; 10] = [
    "{% for m in messages %}",
    "{% endfor %}",
    "{{ messages[0]['content'] * 1000 }}",
    "{% if x %}",
    "{% endif %}",
    "{{ raise_exception('no') }}",
    "{% set n = namespace(v='a') %}{% for i in range(40) %}{% set n.v = n.v ~ n.v %}{% endfor %}",
    "{{ range(99999999) | list | length }}",
    "{{ (messages | map(attribute='content') | join('')) }}",
    "{{",
];

/// Everything a reader of a GGUF does with the bytes: parse, config, tokenizer, tensors, summary.
fn run_gguf(bytes: Vec<u8>, dir: &Path) {
    let Ok(f) = GgufFile::from_bytes("fuzz.gguf", bytes.clone()) else {
        return;
    };
    if let Ok(cfg) = LlamaConfig::from_gguf(&f) {
        let _ = cfg.n_params();
    }
    for t in f.tensors() {
        let _ = f.tensor_data(t);
    }
    if let Ok(tok) = tokenizer_from_gguf(&f) {
        use_tokenizer(&tok);
    }
    let path = dir.join("case.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let _ = describe(&path);
}

/// Encode, decode and template use of a tokenizer that loaded.
fn use_tokenizer(tok: &Tokenizer) {
    for text in ["hello world", "  x\n\n<|im_start|>", "日本語 🙂", ""] {
        if let Ok(ids) = tok.encode(text, true) {
            let _ = tok.decode(&ids, false);
        }
    }
    let _ = tok.decode(&[0, 1, u32::MAX, tok.vocab_size as u32], true);
    let msgs = [Message::new("system", "be brief"), Message::new("user", "hi")];
    let _ = tok.encode_chat(&msgs, true);
}

/// Everything a reader of a Hugging Face directory does with it.
fn run_hf(dir: &Path) {
    if let Ok(cfg) = LlamaConfig::from_hf(dir) {
        let _ = cfg.n_params();
    }
    if let Ok(tok) = Tokenizer::from_hf_dir(dir) {
        use_tokenizer(&tok);
    }
    let _ = hf_eos_ids(dir);
    let _ = QuantConfig::from_dir(dir);
    if let Ok(st) = SafetensorsModel::open(dir) {
        let names: Vec<String> = st.names().map(str::to_string).collect();
        for n in names {
            if let Some((dtype, shape, data, _)) = st.get(&n) {
                let _ = shaderlm::loader::safetensors::to_f32(dtype, data);
                let _ = shape.iter().product::<usize>();
            }
        }
    }
    let _ = describe(dir);
}

/// The seeds: a GGUF (vocabulary, merges, template) and a Hugging Face directory's files.
struct Seeds {
    gguf: Vec<u8>,
    hf: Vec<(String, Vec<u8>)>,
    template: String,
    /// A torch.save state dict of two tensors (one sharing the other's storage type through the memo).
    torch: Vec<u8>,
}

fn seeds(dir: &Path) -> Seeds {
    let gguf = dir.join("seed.gguf");
    write_gguf_chat(&gguf, 1, GgmlType::Q8_0);
    let hf = dir.join("seed-hf");
    std::fs::create_dir_all(&hf).unwrap();
    write_hf_chat(&hf, 1, true);
    let mut files = Vec::new();
    for e in std::fs::read_dir(&hf).unwrap() {
        let e = e.unwrap();
        files.push((
            e.file_name().to_string_lossy().into_owned(),
            std::fs::read(e.path()).unwrap(),
        ));
    }
    files.sort();
    let template = String::from_utf8(std::fs::read(hf.join("chat_template.jinja")).unwrap()).unwrap();
    let mut p = common::torch::Pickle::default();
    p.b.extend([0x80, 2, b'}']);
    p.put();
    p.b.push(b'(');
    p.str("ids");
    p.tensor("0", "LongStorage", &[4]);
    p.str("w");
    p.tensor("1", "FloatStorage", &[2, 3]);
    p.b.extend([b'u', b'.']);
    let storages = vec![
        bytemuck::cast_slice(&[3i64, 1, 4, 1]).to_vec(),
        bytemuck::cast_slice(&[0.5f32; 6]).to_vec(),
    ];
    Seeds {
        gguf: std::fs::read(gguf).unwrap(),
        hf: files,
        template,
        torch: common::torch::torch_file("archive", p.b, storages),
    }
}

/// One case: which entry point, from the case's own generator.
fn run_case(rng: &mut Rng, s: &Seeds, dir: &Path) {
    match rng.below(11) {
        10 => {
            let mut b = s.torch.clone();
            for _ in 0..1 + rng.below(3) {
                mutate_bytes(rng, &mut b);
            }
            let path = dir.join("model.pt");
            std::fs::write(&path, b).unwrap();
            let _ = shaderlm::loader::torch_pickle::read(&path);
        }
        0..=3 => {
            let mut b = s.gguf.clone();
            if rng.below(2) == 0 {
                mutate_gguf_number(rng, &mut b);
            } else {
                mutate_bytes(rng, &mut b);
            }
            run_gguf(b, dir);
        }
        4..=8 => {
            let hf = dir.join("hf");
            let _ = std::fs::remove_dir_all(&hf);
            std::fs::create_dir_all(&hf).unwrap();
            let victim = rng.index(s.hf.len());
            for (i, (name, bytes)) in s.hf.iter().enumerate() {
                let mut b = bytes.clone();
                if i == victim {
                    match serde_json::from_slice::<serde_json::Value>(&b) {
                        Ok(mut v) if rng.below(4) != 0 => {
                            for _ in 0..1 + rng.below(3) {
                                mutate_json(rng, &mut v);
                            }
                            b = serde_json::to_vec(&v).unwrap();
                        }
                        _ => mutate_bytes(rng, &mut b),
                    }
                }
                std::fs::write(hf.join(name), b).unwrap();
            }
            run_hf(&hf);
        }
        _ => {
            let mut t = s.template.clone();
            for _ in 0..1 + rng.below(3) {
                let mut at = rng.index(t.len() + 1);
                while !t.is_char_boundary(at) {
                    at -= 1;
                }
                t.insert_str(at, rng.pick(&JINJA));
            }
            let msgs = [Message::new("user", "hi"), Message::new("assistant", "hello")];
            let _ = render(&t, &msgs, true, "<s>", "</s>");
        }
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn mutated_files_never_panic_over_allocate_or_hang() {
    let secs = env_u64("SHADERLM_FUZZ_SECS", 20);
    let seed = env_u64("SHADERLM_FUZZ_SEED", 0x5eed);
    let dir = tempfile::tempdir().unwrap();
    let s = seeds(dir.path());
    // Panics are caught and reported by case; keep the default hook's message for the log.
    let start = Instant::now();
    let (mut n, mut slowest) = (0u64, (Duration::ZERO, 0u64));
    let mut failures = Vec::new();
    while start.elapsed() < Duration::from_secs(secs) {
        CASE.store(n, Ordering::Relaxed);
        let mut rng = Rng::new(seed ^ n.wrapping_mul(0x2545_f491_4f6c_dd1d));
        let t = Instant::now();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_case(&mut rng, &s, dir.path())));
        let took = t.elapsed();
        if took > slowest.0 {
            slowest = (took, n);
        }
        if r.is_err() {
            failures.push(format!("case {n} (seed {seed:#x}) panicked"));
        }
        if took > Duration::from_secs(CASE_SECS) {
            failures.push(format!("case {n} (seed {seed:#x}) took {took:?}"));
        }
        n += 1;
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    println!(
        "{n} cases in {:?} ({rate:.0}/s); slowest: case {} in {:?}",
        start.elapsed(),
        slowest.1,
        slowest.0
    );
    assert!(n > 100, "only {n} cases ran");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The crashes the fuzzer found, each kept as a named case.
#[test]
fn fuzz_regressions() {
    let dir = tempfile::tempdir().unwrap();
    let s = seeds(dir.path());
    // 1. A feed-forward length of 2^50 overflowed the parameter count (config.rs n_params): now a size error.
    let seed = dir.path().join("seed.gguf");
    let path = dir.path().join("ffn.gguf");
    let huge_ffn = |k: &str, v: &Value| {
        let v = if k.ends_with(".feed_forward_length") {
            Value::U64(1 << 50)
        } else {
            v.clone()
        };
        (k.into(), v)
    };
    rewrite_gguf(&seed, &path, huge_ffn, |_| {});
    let e = LlamaConfig::from_gguf(&GgufFile::open(&path).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("ffn") && e.contains("ffn.gguf"), "{e}");
    // 2. A tokenizer.json whose decoder is not an object panicked inside the tokenizers crate: now an error
    //    naming the file.
    let hf = dir.path().join("hf");
    std::fs::create_dir_all(&hf).unwrap();
    for (name, bytes) in &s.hf {
        std::fs::write(hf.join(name), bytes).unwrap();
    }
    let mut tok: serde_json::Value =
        serde_json::from_slice(&std::fs::read(hf.join("tokenizer.json")).unwrap()).unwrap();
    tok["decoder"] = serde_json::json!(5);
    std::fs::write(hf.join("tokenizer.json"), tok.to_string()).unwrap();
    let e = Tokenizer::from_hf_dir(&hf)
        .err()
        .expect("a bad decoder is an error")
        .to_string();
    assert!(e.contains("tokenizer.json"), "{e}");
}

/// The command line: every subcommand and flag, mutated (see `fuzz/command_lines.rs`). Each run must end (within a
/// minute) with an exit code, not a signal, and without a panic. `SHADERLM_FUZZ_CLI_SECS` sets its time, else
/// `SHADERLM_FUZZ_SECS`, else 20 s.
#[test]
fn mutated_command_lines_never_panic_or_abort() {
    let secs = std::env::var("SHADERLM_FUZZ_CLI_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| env_u64("SHADERLM_FUZZ_SECS", 20));
    let seed = env_u64("SHADERLM_FUZZ_SEED", 0x5eed);
    let dir = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let (outcomes, failures) = command_lines::run(seed, secs, dir.path());
    let n: u64 = outcomes.values().map(|o| o.ok + o.usage + o.error).sum::<u64>() + failures.len() as u64;
    let rate = n as f64 / start.elapsed().as_secs_f64();
    println!(
        "{n} command lines in {:?} ({rate:.1}/s); ok / usage error / other error:",
        start.elapsed()
    );
    for (cmd, o) in &outcomes {
        println!("  {cmd}: {} / {} / {}", o.ok, o.usage, o.error);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
