//! kv_write vs CPU reference (placeholder: being written).

use crate::common::Case;

pub fn cases() -> Vec<Case> {
    Vec::new()
}
