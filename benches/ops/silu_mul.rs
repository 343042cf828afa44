//! silu_mul throughput (placeholder: being written).

use crate::common::Bench;

pub fn benches() -> Vec<Bench> {
    Vec::new()
}
