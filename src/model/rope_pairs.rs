//! Checkpoints with rotate-half (NeoX) RoPE pairs, served with each head's q/k rows in interleaved order (the order
//! llama.cpp's converter gives Llama): dims j and j + rot / 2 become rows 2j and 2j + 1, so every model rotates
//! interleaved pairs, and the fused decode step's q|k|v GEMV, whose invocations hold 4 consecutive rows, can rotate
//! them in its epilogue. q and k move alike (their biases and q/k norm weights too), so attention scores are the same
//! sums in another order; v, o and everything else pass through.

use super::config::LlamaConfig;
use super::names::{Names, Role};
use super::weights::{HostData, HostTensor, WeightSource};
use crate::error::{Error, Result};
use crate::ops::rope::RopeStyle;
use std::collections::HashMap;

/// A weight source whose q/k rows (and biases, q/k norm weights) are permuted to interleaved RoPE pairs.
pub struct Interleaved<'s> {
    src: &'s dyn WeightSource,
    /// Every permuted tensor's name and its heads (1 for the q/k norm weights, one head's vector).
    moved: HashMap<String, usize>,
    head_dim: usize,
    rot: usize,
}

impl<'s> Interleaved<'s> {
    /// `src` (as `cfg` with `names` reads it) served in interleaved order, where that applies: rotate-half pairs
    /// and block-quantized q and k in layer 0 (the weights the fused step's rope epilogue runs; float checkpoints
    /// keep their order and their f16). None otherwise. (A later layer's float q or k is served permuted, as f32.)
    pub fn of(src: &'s dyn WeightSource, cfg: &LlamaConfig, names: Names) -> Result<Option<Interleaved<'s>>> {
        let rot = cfg.rope_dim;
        if cfg.rope_style != RopeStyle::RotateHalf || rot < 2 || !rot.is_multiple_of(2) || rot > cfg.head_dim {
            return Ok(None);
        }
        let n = |i, role| names.layer(cfg.arch, i, role);
        for role in [Role::Q, Role::K] {
            let quantized = match src.tensor(&n(0, role))? {
                Some(t) => matches!(t.data, HostData::Quant(..) | HostData::Repacked { .. }),
                None => false,
            };
            if !quantized {
                return Ok(None);
            }
        }
        let mut moved = HashMap::new();
        for i in 0..cfg.n_layers {
            for (role, heads) in [
                (Role::Q, cfg.n_heads),
                (Role::K, cfg.n_kv_heads),
                (Role::QBias, cfg.n_heads),
                (Role::KBias, cfg.n_kv_heads),
                (Role::QNorm, 1),
                (Role::KNorm, 1),
            ] {
                moved.insert(n(i, role), heads);
            }
        }
        Ok(Some(Interleaved {
            src,
            moved,
            head_dim: cfg.head_dim,
            rot,
        }))
    }
}

/// For each of `rows` q/k rows (heads of `head_dim`) in interleaved order, its row in rotate-half order: within a
/// head, row 2j is dim j and row 2j + 1 dim j + rot / 2 for j < rot / 2 (the rotated dims); the rest stay. With
/// `rot == head_dim`, llama.cpp's converter's order (a head reshaped to `[2, head_dim / 2]`, the axes swapped).
pub fn interleaved_order(rows: usize, head_dim: usize, rot: usize) -> Vec<usize> {
    let source = |d: usize| match d < rot {
        true if d.is_multiple_of(2) => d / 2,
        true => d / 2 + rot / 2,
        false => d,
    };
    (0..rows)
        .map(|r| (r / head_dim) * head_dim + source(r % head_dim))
        .collect()
}

impl WeightSource for Interleaved<'_> {
    fn describe(&self) -> String {
        self.src.describe()
    }
    fn tensor(&self, name: &str) -> Result<Option<HostTensor<'_>>> {
        let Some(t) = self.src.tensor(name)? else {
            return Ok(None);
        };
        let Some(&heads) = self.moved.get(name) else {
            return Ok(Some(t));
        };
        let rows = t.shape.first().copied().unwrap_or(0);
        if rows != heads * self.head_dim {
            return Err(Error::shape(
                "load",
                format!(
                    "{}: {:?}, expected {heads} heads of {} rows",
                    t.name, t.shape, self.head_dim
                ),
            ));
        }
        // Row r of the result is row order[r] of the file's.
        let order = interleaved_order(rows, self.head_dim, self.rot);
        let data = match &t.data {
            HostData::Quant(ty, b) => HostData::Repacked {
                ty: *ty,
                raw: gather_rows(b, &order),
                perm: None,
            },
            HostData::Repacked { ty, raw, perm } => HostData::Repacked {
                ty: *ty,
                raw: gather_rows(raw, &order),
                perm: perm.clone(),
            },
            HostData::F32(_) | HostData::F16(_) => HostData::F32(gather_rows(&t.to_f32()?, &order)),
        };
        Ok(Some(HostTensor {
            name: t.name,
            shape: t.shape,
            data,
        }))
    }
}

/// The rows `order` of `v` (`order.len()` rows of equal length), in that order.
fn gather_rows<T: Copy>(v: &[T], order: &[usize]) -> Vec<T> {
    let len = v.len() / order.len().max(1);
    order
        .iter()
        .flat_map(|&r| &v[r * len..(r + 1) * len])
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_pair_dims_j_and_j_plus_half_the_rotation() {
        // Pairs (0, 2) and (1, 3) of the rotated 4 dims, then the 4 unrotated ones in place; each head alike.
        assert_eq!(
            interleaved_order(16, 8, 4),
            [0, 2, 1, 3, 4, 5, 6, 7, 8, 10, 9, 11, 12, 13, 14, 15]
        );
    }
}
