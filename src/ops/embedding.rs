//! embedding (placeholder: being written).

use crate::gpu::ShaderKey;

pub fn variants() -> Vec<ShaderKey> {
    Vec::new()
}
