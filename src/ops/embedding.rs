//! Token embedding: gather rows of a `[vocab, d]` table (f32 or f16) into f32, one dispatch per row part of the
//! table (a table over the storage binding limit is split by rows).

use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{grid, Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct EmbeddingParams {
    m: u32,
    d: u32,
    row0: u32,
    rows: u32,
    v: u32,
    last: u32,
}

#[derive(Debug)]
pub struct Embedding {
    m: usize,
    d: usize,
    v: usize,
    dtype: DType,
    /// (first row, row count) of each table part.
    parts: Vec<(usize, usize)>,
}

fn key(half: bool) -> ShaderKey {
    ShaderKey::new("embedding").flag("HALF", half)
}

impl Kernel for Embedding {
    fn name(&self) -> &'static str {
        "embedding"
    }
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        (0..self.parts.len())
            .map(|p| Dispatch {
                shader: key(self.dtype == DType::F16),
                bindings: vec![Bind::Tensor(0), Bind::Part(1, p), Bind::Tensor(2)],
                workgroups: grid(self.m, 1, caps.max_workgroups_per_dim),
            })
            .collect()
    }
    fn params(&self, i: usize, _: &StepVars) -> Params {
        let (row0, rows) = self.parts[i];
        Params::of(&EmbeddingParams {
            m: self.m as u32,
            d: self.d as u32,
            row0: row0 as u32,
            rows: rows as u32,
            v: self.v as u32,
            last: u32::from(i + 1 == self.parts.len()),
        })
    }
    fn cost(&self) -> Cost {
        let m = self.m as u64;
        Cost {
            bytes_read: 4 * m + m * self.dtype.bytes(self.d),
            bytes_written: 4 * m * self.d as u64,
            flops: 0,
        }
    }
    fn reference(&self, io: &[HostIo], _: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| Ok(vec![Expected::at(2, reference(&io[0].u32(), &io[1].f32()?, self.d))]))
    }
    fn check_bound(&self, _: &Caps) -> f64 {
        0.0
    }
}

impl Graph {
    /// Rows `ids` [m] (u32) of `table` [vocab, d] (f32 or f16) as f32 [m, d]. Ids >= vocab give zero rows; callers
    /// should reject them before (the shader only guarantees it never reads out of bounds).
    pub fn embedding(&mut self, ids: TensorId, table: TensorId) -> Result<TensorId> {
        let (id_shape, t_shape) = (self.shape(ids).to_vec(), self.shape(table).to_vec());
        let dtype = self.dtype(table);
        let (&[m], &[v, d]) = (&id_shape[..], &t_shape[..]) else {
            return Err(Error::shape(
                "embedding",
                format!("ids {id_shape:?}, table {t_shape:?}: want [m], [vocab, d]"),
            ));
        };
        if m == 0 || v == 0 || d == 0 || v > u32::MAX as usize || self.dtype(ids) != DType::U32 || dtype == DType::U32 {
            return Err(Error::shape(
                "embedding",
                format!(
                    "ids {id_shape:?} {:?}, table {t_shape:?} {dtype:?}: want u32 ids, an f32 or f16 table, no empty dim",
                    self.dtype(ids)
                ),
            ));
        }
        let k = Embedding {
            m,
            d,
            v,
            dtype,
            parts: self.desc(table).parts(),
        };
        Ok(self.add_node(k, &[ids, table], &[("embedding", &[m, d], DType::F32)])?[0])
    }
}

/// CPU reference: `table` holds f32 values (for an f16 table, the values already rounded to f16); ids >= vocab
/// give zero rows.
pub fn reference(ids: &[u32], table: &[f32], d: usize) -> Vec<f32> {
    let v = table.len() / d;
    ids.iter()
        .flat_map(|&id| match (id as usize) < v {
            true => table[id as usize * d..(id as usize + 1) * d].to_vec(),
            false => vec![0.0; d],
        })
        .collect()
}

pub fn variants() -> Vec<ShaderKey> {
    vec![key(false), key(true)]
}
