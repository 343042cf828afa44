//! Per-op throughput on the default adapter: `cargo bench --bench ops [-- FILTER]`.
//!
//! Each op file contributes `benches()`: a plan over a realistic shape (SmolLM2-135M, a 0.5B and an 8B model).
//! A run is timed from submit to the end of the wait (synchronized inside the timed region), after warm-up runs
//! that also pay the pipelines' first-dispatch compile. GFLOP/s and GB/s come from each kernel's cost model.

mod common;

mod add;
mod attention_decode;
mod attention_prefill;
mod attention_sparse;
mod block_score;
mod block_topk;
mod embedding;
mod embedding_q;
mod gather_cols;
mod infllm;
mod kv_compress;
mod kv_write;
mod matmul;
mod matmul_q;
mod moe_ffn;
mod overhead;
mod read_sum;
mod rms_norm;
mod rope;
mod silu_mul;
mod softmax;
mod topk;

use common::Bench;

fn all() -> Vec<Bench> {
    let mut v = Vec::new();
    v.extend(overhead::benches());
    v.extend(add::benches());
    v.extend(matmul::benches());
    v.extend(rms_norm::benches());
    v.extend(rope::benches());
    v.extend(silu_mul::benches());
    v.extend(softmax::benches());
    v.extend(embedding::benches());
    v.extend(topk::benches());
    v.extend(attention_prefill::benches());
    v.extend(attention_decode::benches());
    v.extend(kv_write::benches());
    v.extend(kv_compress::benches());
    v.extend(block_score::benches());
    v.extend(matmul_q::benches());
    v.extend(moe_ffn::benches());
    v.extend(embedding_q::benches());
    v.extend(block_topk::benches());
    v.extend(attention_sparse::benches());
    v.extend(infllm::benches());
    v.extend(gather_cols::benches());
    v.extend(read_sum::benches());
    v
}

fn main() {
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let gpu =
        shaderlm::gpu::Gpu::new(&Default::default()).unwrap_or_else(|e| panic!("benchmarks need an adapter: {e}"));
    println!("adapter: {}", gpu.describe());
    println!(
        "| {:<44} | {:>10} | {:>9} | {:>9} | {:>10} |",
        "bench", "ms/run", "GFLOP/s", "GB/s", "dispatches"
    );
    println!("|{:-<46}|{:->12}|{:->11}|{:->11}|{:->12}|", "", "", "", "", "");
    for b in all() {
        if !filter.is_empty() && !filter.iter().any(|f| b.name.contains(f.as_str())) {
            continue;
        }
        match common::measure(&gpu, &b) {
            Ok(m) => println!(
                "| {:<44} | {:>10.3} | {:>9.2} | {:>9.2} | {:>10} |",
                b.name, m.ms, m.gflops, m.gbps, m.dispatches
            ),
            Err(e) => println!("| {:<44} | error: {e}", b.name),
        }
    }
}
