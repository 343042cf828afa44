//! Every op against its CPU reference over a grid of shapes. `OPS=add,rms_norm cargo test --test ops` filters.
//!
//! Each op file below contributes `cases()`: a name, the op it tests, and a function that runs the GPU kernel and
//! returns the error metric with its bound. The bound's reason is written beside each case family.

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
mod kv_compress;
mod kv_write;
mod matmul;
mod matmul_q;
mod moe_common;
mod moe_down;
mod moe_ffn;
mod moe_router;
mod moe_up;
mod read_sum;
mod rms_norm;
mod rope;
mod rows;
mod silu_mul;
mod softmax;
mod topk;

use common::{gpu, Case};

fn all_cases() -> Vec<Case> {
    let mut v = Vec::new();
    v.extend(add::cases());
    v.extend(matmul::cases());
    v.extend(rms_norm::cases());
    v.extend(rope::cases());
    v.extend(rows::cases());
    v.extend(silu_mul::cases());
    v.extend(softmax::cases());
    v.extend(embedding::cases());
    v.extend(topk::cases());
    v.extend(attention_prefill::cases());
    v.extend(attention_decode::cases());
    v.extend(kv_write::cases());
    v.extend(kv_compress::cases());
    v.extend(block_score::cases());
    v.extend(matmul_q::cases());
    v.extend(moe_router::cases());
    v.extend(moe_up::cases());
    v.extend(moe_down::cases());
    v.extend(moe_ffn::cases());
    v.extend(embedding_q::cases());
    v.extend(block_topk::cases());
    v.extend(attention_sparse::cases());
    v.extend(gather_cols::cases());
    v.extend(read_sum::cases());
    v
}

#[test]
fn ops_match_cpu_reference() {
    let filter: Option<Vec<String>> = std::env::var("OPS")
        .ok()
        .filter(|s| !s.is_empty())
        .map(|s| s.split(',').map(|x| x.trim().to_string()).collect());
    let cases: Vec<Case> = all_cases()
        .into_iter()
        .filter(|c| filter.as_ref().is_none_or(|f| f.iter().any(|o| o == c.op)))
        .collect();
    assert!(!cases.is_empty(), "OPS={filter:?} selects no case");
    let gpu = gpu();
    let mut failures = Vec::new();
    for case in &cases {
        match (case.run)(gpu) {
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
    assert!(failures.is_empty(), "failed cases:\n{}", failures.join("\n"));
}
