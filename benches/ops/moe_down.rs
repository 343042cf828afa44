//! BlockFFN's down kernel (all experts active) against the matmul op on the same matrix; see moe_ffn.rs.

use crate::common::Bench;

pub fn benches() -> Vec<Bench> {
    crate::moe_ffn::kernel_benches(true)
}
