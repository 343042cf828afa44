//! `bench --profile`: one decode step timed per op (GPU timestamps inside the pass), each op's bandwidth against
//! the adapter's read ceiling measured in the same run (`read_sum`), and the gap between the kernels' time and the
//! step's wall time (barriers, launches, the submit and the read-back).

use shaderlm::generate::Generator;
use shaderlm::gpu::{DType, Gpu};
use shaderlm::graph::{Graph, NodeProfile, Plan, StepVars};
use std::collections::BTreeMap;
use std::time::Instant;

/// Bytes `read_sum` streams for the ceiling: the largest storage binding up to 1 GiB, so that it is several times
/// any last-level cache.
const CEILING_BYTES: u64 = 1 << 30;

/// Profile one step of `rows` tokens at the generator's position (a decode step, or a speculative verification
/// step of `rows` > 1) and print the tables.
pub fn print(gpu: &Gpu, gen: &mut Generator<'_>, rows: usize) -> anyhow::Result<()> {
    let pos = gen.tokens.len();
    let prof = if rows == 1 {
        gen.profile_decode()?
    } else {
        gen.profile_verify(rows)?
    };
    let wall = step_wall_ms(gen, rows)?;
    let ceiling = read_ceiling(gpu)?;
    print_table(&prof, pos, rows, ceiling);
    print_sizes(&prof, ceiling);
    let kernels: f64 = prof.iter().map(|p| p.micros).sum::<f64>() / 1e3;
    println!();
    println!(
        "step wall time {wall:.2} ms (median of 9 unprofiled steps); kernels {kernels:.2} ms (one profiled step); \
         gap {:.2} ms (barriers, launches, submit, read-back; negative where the timestamps between dispatches cost \
         more than they measure)",
        wall - kernels
    );
    let weights = gen.model().weight_bytes_per_token() as f64;
    let gbps = weights / (wall * 1e6).max(1e-9);
    println!(
        "weights read per step {:.1} MiB: {gbps:.2} GB/s at the step's wall time, {:.0}% of the read ceiling",
        weights / f64::from(1 << 20),
        100.0 * gbps / ceiling.max(1e-9)
    );
    Ok(())
}

/// Median wall time of a step of `rows` tokens at the current position, as [`print`] profiles it (each step
/// rolled back).
fn step_wall_ms(gen: &mut Generator<'_>, rows: usize) -> anyhow::Result<f64> {
    let pos = gen.tokens.len();
    let ids = vec![1; rows];
    let mut times = Vec::new();
    for i in 0..10 {
        let t = Instant::now();
        if rows == 1 {
            gen.feed(&ids)?;
        } else {
            gen.verify(&ids)?;
        }
        if i > 0 {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        gen.truncate(pos);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// GB/s of `read_sum` over `CEILING_BYTES` (or the largest binding): the best of 5 runs after a warm-up.
fn read_ceiling(gpu: &Gpu) -> anyhow::Result<f64> {
    let bytes = CEILING_BYTES.min(gpu.caps.max_binding) / (4 << 20) * (4 << 20);
    let n = (bytes / 4) as usize;
    let mut g = Graph::new();
    let x = g.input("x", &[n], DType::F32);
    g.read_sum(x, 4096)?;
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, x, &vec![0u8; bytes as usize])?;
    let vars = StepVars::default();
    plan.run(gpu, &vars)?;
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        plan.run(gpu, &vars)?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(bytes as f64 / best / 1e9)
}

/// The per-op table: nodes, dispatches, time, share, bandwidth and its share of the read ceiling.
fn print_table(prof: &[NodeProfile], pos: usize, rows: usize, ceiling: f64) {
    let mut by_op: BTreeMap<String, (usize, usize, f64, u64)> = BTreeMap::new();
    for p in prof {
        let e = by_op.entry(op_of(p).to_string()).or_default();
        e.0 += 1;
        e.1 += p.dispatches;
        e.2 += p.micros;
        e.3 += p.cost.bytes_read + p.cost.bytes_written;
    }
    let total: f64 = prof.iter().map(|p| p.micros).sum();
    let clock = if prof.first().is_some_and(|p| p.timed_on_gpu) {
        "GPU timestamps"
    } else {
        "wall clock per node"
    };
    let dispatches: usize = prof.iter().map(|p| p.dispatches).sum();
    println!();
    let step = match rows {
        1 => "decode step".to_string(),
        n => format!("verification step of {n} rows"),
    };
    println!(
        "{step} at position {pos}, {clock}: {:.2} ms in {} nodes, {dispatches} dispatches",
        total / 1e3,
        prof.len()
    );
    println!("read ceiling (read_sum, same run): {ceiling:.2} GB/s");
    println!("| op | nodes | dispatches | ms | share | GB/s | of ceiling |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let mut ops: Vec<_> = by_op.into_iter().collect();
    ops.sort_by(|a, b| b.1 .2.total_cmp(&a.1 .2));
    for (op, (nodes, d, us, bytes)) in ops {
        let gbps = bytes as f64 / (us * 1e3).max(1e-9);
        println!(
            "| {op} | {nodes} | {d} | {:.3} | {:.1}% | {gbps:.2} | {:.0}% |",
            us / 1e3,
            100.0 * us / total.max(1e-9),
            100.0 * gbps / ceiling.max(1e-9)
        );
    }
}

/// The weight-reading ops split by bytes per node (one row per projection shape: in a decode step each matrix's
/// GEMV moves its own byte count), so that the big GEMVs' bandwidth shows apart from the small ones'.
fn print_sizes(prof: &[NodeProfile], ceiling: f64) {
    let mut by_size: BTreeMap<(String, u64), (usize, f64)> = BTreeMap::new();
    for p in prof.iter().filter(|p| matches!(op_of(p), "matmul_q" | "matmul")) {
        let e = by_size
            .entry((op_of(p).to_string(), p.cost.bytes_read + p.cost.bytes_written))
            .or_default();
        e.0 += 1;
        e.1 += p.micros;
    }
    println!();
    println!("| matmul node | nodes | MB each | us each | GB/s | of ceiling |");
    println!("|---|---:|---:|---:|---:|---:|");
    let mut rows: Vec<_> = by_size.into_iter().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.0 .1));
    for ((op, bytes), (nodes, us)) in rows {
        let each = us / nodes as f64;
        let gbps = bytes as f64 / (each * 1e3).max(1e-9);
        println!(
            "| {op} | {nodes} | {:.2} | {each:.1} | {gbps:.2} | {:.0}% |",
            bytes as f64 / 1e6,
            100.0 * gbps / ceiling.max(1e-9)
        );
    }
}

/// The op of a profiled node: its label's last part (`blk.3.matmul_q` -> `matmul_q`).
fn op_of(p: &NodeProfile) -> &str {
    p.label.rsplit('.').next().unwrap_or(&p.label)
}
