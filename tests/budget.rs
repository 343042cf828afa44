//! The memory budget's estimates against what the device really allocates: tiny models of every layout and the
//! real SmolLM2 are loaded on their own device, a session runs a full prefill chunk, a shorter one and a decode
//! step, and the allocator's report (Vulkan and DX12 give one) after each stage must stay within the estimate of
//! that part (weights, KV cache, scratch), which [`LoadedModel::memory`] carries.

mod common;

use common::blockffn::write_blockffn;
use common::minicpm::write_minicpm;
use common::tiny::{write_gguf_chat, write_gguf_chat_as, write_hf, write_hf_chat, Tiny};
use shaderlm::generate::Generator;
use shaderlm::gpu::{Gpu, GpuOptions};
use shaderlm::model::{LoadOptions, LoadedModel, StepOutputs};
use shaderlm::quant::GgmlType;
use std::path::Path;

/// Bytes the device's allocator holds now (after finishing queued work, so staging copies and dropped buffers are
/// gone).
fn allocated(gpu: &Gpu) -> u64 {
    gpu.queue.submit([]);
    gpu.wait("allocator report").unwrap();
    gpu.device
        .generate_allocator_report()
        .unwrap_or_else(|| {
            panic!(
                "the budget test needs an adapter whose allocator reports its allocations (Vulkan or DX12; on \
                 Linux without a GPU install lavapipe: `apt-get install mesa-vulkan-drivers`); {} has none",
                gpu.describe()
            )
        })
        .total_allocated_bytes
}

/// Loads `path` on a fresh device, runs a session (a `chunk`-token prefill, a shorter one, decode steps) and checks
/// each part of the estimate against the allocations it stands for; returns (estimated, allocated) totals.
fn check(path: &Path, opts: &LoadOptions) -> (u64, u64) {
    let gpu = Gpu::new(&GpuOptions::default()).unwrap_or_else(|e| panic!("the budget test needs an adapter: {e}"));
    let before = allocated(&gpu);
    let loaded = LoadedModel::open(&gpu, path, opts, |_, _| {}).unwrap();
    let need = loaded.memory;
    let weights = allocated(&gpu) - before;
    let outputs = StepOutputs {
        logits: true,
        topk: 10,
        ..Default::default()
    };
    let mut gen = Generator::new(&gpu, &loaded.model, loaded.ctx, outputs).unwrap();
    gen.chunk = opts.chunk;
    let kv = allocated(&gpu) - before - weights;
    let vocab = loaded.model.cfg.vocab as u32;
    let prompt: Vec<u32> = (0..opts.chunk as u32 + opts.chunk as u32 / 2)
        .map(|i| (i * 7 + 3) % vocab)
        .collect();
    gen.feed(&prompt).unwrap();
    for t in 0..3 {
        gen.feed(&[t]).unwrap();
    }
    let scratch = allocated(&gpu) - before - weights - kv;
    let name = path.display();
    println!("{name}: estimated {need:?}; allocated weights {weights}, KV cache {kv}, scratch {scratch}");
    for (part, est, got) in [
        ("weights", need.weights, weights),
        ("KV cache", need.kv, kv),
        ("scratch", need.scratch, scratch),
    ] {
        assert!(
            got <= est,
            "{name}: {part} allocated {got} bytes, over the estimate of {est}"
        );
    }
    (need.total(), weights + kv + scratch)
}

#[test]
fn estimates_bound_the_allocations_of_every_layout() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let opts = |ctx, chunk| LoadOptions {
        chunk,
        ..LoadOptions::with_ctx(ctx)
    };
    let mut paths = Vec::new();
    for (i, ty) in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_K]
        .into_iter()
        .enumerate()
    {
        let p = d.join(format!("tiny{i}.gguf"));
        let t = Tiny {
            hidden: 256,
            ffn: 512,
            heads: 8, // q rows of 256: whole Q4_K super-blocks for the output projection
            ..Tiny::llama()
        };
        write_gguf_chat_as(&p, t, 1, ty);
        paths.push(p);
    }
    let gemma = d.join("gemma.gguf");
    write_gguf_chat_as(&gemma, Tiny::gemma3(), 2, GgmlType::Q8_0);
    paths.push(gemma);
    let chat = d.join("chat.gguf");
    write_gguf_chat(&chat, 3, GgmlType::Q4_0);
    paths.push(chat);
    let hf = d.join("hf");
    std::fs::create_dir_all(&hf).unwrap();
    let t = write_hf_chat(&hf, 4, true);
    write_hf(&hf, &t, 4, true); // f16 weights
    paths.push(hf);
    for p in &paths {
        check(p, &opts(256, 16));
    }
    // Sparse attention past its dense length (compressed keys, block scores), and BlockFFN experts.
    let minicpm = d.join("minicpm");
    std::fs::create_dir_all(&minicpm).unwrap();
    let sparse = serde_json::json!({"kernel_size": 8, "kernel_stride": 4, "block_size": 16, "init_blocks": 1,
        "window_size": 32, "topk": 4, "use_nope": false, "dense_len": 48});
    write_minicpm(&minicpm, 5, Some(sparse));
    check(&minicpm, &opts(256, 40));
    let blockffn = d.join("blockffn");
    std::fs::create_dir_all(&blockffn).unwrap();
    write_blockffn(&blockffn, 6, "block", "rms");
    check(&blockffn, &opts(128, 16));
}

/// On a real model the estimate is an upper bound and a close one: within 1.5x of what is allocated.
#[test]
fn smollm2_estimate_is_close_to_its_allocations() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "this test needs the real model {}: run `bash models/fetch.sh` (or `bash setup.sh --test`)",
        path.display()
    );
    let opts = LoadOptions {
        chunk: 64,
        ..LoadOptions::with_ctx(1024)
    };
    let (est, got) = check(&path, &opts);
    assert!(est as f64 <= 1.5 * got as f64, "estimate {est} vs {got} allocated");
}
