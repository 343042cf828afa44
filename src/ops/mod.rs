//! Ops: each is `shaders/<op>.wgsl` + `src/ops/<op>.rs` (params, kernel, graph-builder method, CPU reference).

use crate::gpu::ShaderKey;

/// The one registration of the ops (each a shader, an op file, test cases and a bench row): expands `$m!(add,
/// attention_decode, ..)`. It declares the op modules here, and the op test table (tests/ops) and the bench table
/// (benches/ops) are made from it, so the naga test, the tests and the benches see every op.
#[macro_export]
macro_rules! for_each_op {
    ($m:ident) => {
        $m!(
            add,
            attention_decode,
            attention_prefill,
            attention_sparse,
            block_score,
            block_topk,
            embedding,
            embedding_q,
            gather_cols,
            kv_compress,
            kv_move,
            kv_write,
            matmul,
            matmul_q,
            moe_act,
            moe_down,
            moe_router,
            moe_up,
            read_sum,
            rms_norm,
            rope,
            rope_kv,
            rows,
            silu_mul,
            softmax,
            topk,
            tree_accept,
            tree_frontier,
            tree_select
        );
    };
}

macro_rules! declare_ops {
    ($($op:ident),*) => {
        $(pub mod $op;)*

        /// The registered ops' names: each is the stem of its Rust file, and of its shader (`<op>.wgsl`) or the
        /// prefix of its shaders (`<op>_<form>.wgsl`).
        pub const NAMES: &[&str] = &[$(stringify!($op)),*];

        /// Every shader variant the ops can ask for: the naga portability test validates and translates each.
        pub fn all_variants() -> Vec<ShaderKey> {
            let mut v = Vec::new();
            $(v.extend($op::variants());)*
            v
        }
    };
}

for_each_op!(declare_ops);

/// The pipelines `gpu` has compiled that are not in [`all_variants`], so the naga portability test never saw them.
pub fn unlisted_pipelines(gpu: &crate::gpu::Gpu) -> Vec<ShaderKey> {
    let all = all_variants();
    gpu.pipelines.keys().into_iter().filter(|k| !all.contains(k)).collect()
}

/// Shared by the MoE kernels: weights, formats and the expert-list layout (no kernel of its own).
pub mod moe_common;
/// BlockFFN's FFN composed of moe_router, moe_up, moe_act and moe_down (no kernel of its own).
pub mod moe_ffn;
