//! Per-op throughput on the default adapter: `cargo bench --bench ops [-- FILTER]`.
//!
//! Each op file contributes `benches()`: a plan over a realistic shape (SmolLM2-135M, a 0.5B and an 8B model).
//! A run is timed from submit to the end of the wait (synchronized inside the timed region), after warm-up runs
//! that also pay the pipelines' first-dispatch compile. GFLOP/s and GB/s come from each kernel's cost model.

mod common;

mod infllm;
mod moe_ffn;
mod overhead;

use common::Bench;

/// One `mod` per registered op (`shaderlm::for_each_op!`), each with its `benches()`; then the dispatch overhead,
/// InfLLM-v2's whole selection pipeline and the BlockFFN FFN, which compose several ops.
macro_rules! op_benches {
    ($($op:ident),*) => {
        $(mod $op;)*

        fn all() -> Vec<Bench> {
            let mut v = overhead::benches();
            $(v.extend($op::benches());)*
            v.extend(infllm::benches());
            v.extend(moe_ffn::benches());
            v
        }
    };
}

shaderlm::for_each_op!(op_benches);

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
