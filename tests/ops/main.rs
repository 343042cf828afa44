//! Every op against its CPU reference over a grid of shapes. `OPS=add,rms_norm cargo test --test ops` filters by op,
//! `CASES=f16` by a part of the case name.
//!
//! Each op file below contributes `cases()`: a name, the op it tests, and a function that runs the GPU kernel and
//! returns the error metric with its bound. The bound's reason is written beside each case family.

mod common;

mod kv_f16;
mod moe_common;
mod moe_ffn;

use common::{gpu, Case, Check};
use shaderlm::gpu::{Gpu, GpuOptions};
use std::sync::Mutex;

/// One `mod` per registered op (`shaderlm::for_each_op!`), each with its `cases()`, and the composite BlockFFN FFN.
macro_rules! op_cases {
    ($($op:ident),*) => {
        $(mod $op;)*

        fn all_cases() -> Vec<Case> {
            let mut v = Vec::new();
            $(v.extend($op::cases());)*
            v.extend(moe_ffn::cases());
            v.extend(kv_f16::cases());
            v
        }
    };
}

shaderlm::for_each_op!(op_cases);

/// Runs the cases on as many threads as the host has cores, each thread on its own device after the first (lavapipe
/// compiles a pipeline at its first dispatch, on the device's queue thread, so one device serializes the compiles),
/// half of the threads taking cases from the front of the list and half from the back (neighbouring cases share
/// pipelines, which two devices would each compile). Returns the results in the cases' order and the extra devices.
fn run_all(cases: &[Case], gpu: &'static Gpu) -> (Vec<shaderlm::Result<Check>>, Vec<Gpu>) {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(cases.len());
    let extra: Vec<Gpu> = (1..threads).map(|_| common::new_gpu(&GpuOptions::default())).collect();
    let left = Mutex::new(0..cases.len());
    let mut results: Vec<(usize, shaderlm::Result<Check>)> = std::thread::scope(|s| {
        let workers: Vec<_> = std::iter::once(gpu)
            .chain(extra.iter())
            .enumerate()
            .map(|(t, g)| {
                let left = &left;
                s.spawn(move || {
                    let mut done = Vec::new();
                    loop {
                        let next = {
                            let mut left = left.lock().expect("case list");
                            if t % 2 == 0 {
                                left.next()
                            } else {
                                left.next_back()
                            }
                        };
                        let Some(i) = next else { break done };
                        done.push((i, (cases[i].run)(g)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("an op case panicked"))
            .collect()
    });
    results.sort_by_key(|r| r.0);
    (results.into_iter().map(|r| r.1).collect(), extra)
}

#[test]
fn ops_match_cpu_reference() {
    let filter: Option<Vec<String>> = std::env::var("OPS")
        .ok()
        .filter(|s| !s.is_empty())
        .map(|s| s.split(',').map(|x| x.trim().to_string()).collect());
    // CASES=part keeps only the cases whose name holds it.
    let part = std::env::var("CASES").unwrap_or_default();
    let cases: Vec<Case> = all_cases()
        .into_iter()
        .filter(|c| filter.as_ref().is_none_or(|f| f.iter().any(|o| o == c.op)))
        .filter(|c| c.name.contains(&part))
        .collect();
    assert!(!cases.is_empty(), "OPS={filter:?} selects no case");
    let gpu = gpu();
    let mut failures = Vec::new();
    let (results, extra) = run_all(&cases, gpu);
    for (case, result) in cases.iter().zip(results) {
        match result {
            Ok(check) => {
                let ok = check.passed();
                println!("{:<8} {:<44} {}", if ok { "ok" } else { "FAIL" }, case.name, check);
                if !ok {
                    failures.push(format!("{}: {check}", case.name));
                }
            }
            Err(e) => {
                println!("ERROR    {:<44} {e}", case.name);
                failures.push(format!("{}: {e}", case.name));
            }
        }
    }
    println!("{} cases, {} failed", cases.len(), failures.len());
    for g in [gpu, common::gpu_fallback()].into_iter().chain(extra.iter()) {
        let unknown: Vec<String> = shaderlm::ops::unlisted_pipelines(g)
            .iter()
            .map(|k| k.to_string())
            .collect();
        assert!(
            unknown.is_empty(),
            "pipelines missing from the ops' variants() (the naga test never sees them): {unknown:?}"
        );
    }
    assert!(failures.is_empty(), "failed cases:\n{}", failures.join("\n"));
}
