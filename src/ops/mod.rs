//! Ops: each is `shaders/<op>.wgsl` + `src/ops/<op>.rs` (params, kernel, graph-builder method, CPU reference).

use crate::gpu::ShaderKey;
pub use crate::graph::StepVars;

pub mod add;
pub mod attention_decode;
pub mod attention_prefill;
pub mod attention_sparse;
pub mod block_score;
pub mod block_topk;
pub mod embedding;
pub mod embedding_q;
pub mod gather_cols;
pub mod kv_compress;
pub mod kv_write;
pub mod matmul;
pub mod matmul_q;
pub mod moe_act;
pub mod moe_common;
pub mod moe_down;
pub mod moe_ffn;
pub mod moe_router;
pub mod moe_up;
pub mod read_sum;
pub mod rms_norm;
pub mod rope;
pub mod rows;
pub mod silu_mul;
pub mod softmax;
pub mod topk;

/// Every shader variant the ops can ask for: the naga portability test validates and translates each.
pub fn all_variants() -> Vec<ShaderKey> {
    let mut v = Vec::new();
    v.extend(add::variants());
    v.extend(matmul::variants());
    v.extend(rms_norm::variants());
    v.extend(rope::variants());
    v.extend(rows::variants());
    v.extend(silu_mul::variants());
    v.extend(softmax::variants());
    v.extend(embedding::variants());
    v.extend(topk::variants());
    v.extend(attention_prefill::variants());
    v.extend(attention_decode::variants());
    v.extend(kv_write::variants());
    v.extend(kv_compress::variants());
    v.extend(block_score::variants());
    v.extend(matmul_q::variants());
    v.extend(moe_router::variants());
    v.extend(moe_up::variants());
    v.extend(moe_down::variants());
    v.extend(moe_act::variants());
    v.extend(embedding_q::variants());
    v.extend(gather_cols::variants());
    v.extend(read_sum::variants());
    v.extend(block_topk::variants());
    v.extend(attention_sparse::variants());
    v
}
