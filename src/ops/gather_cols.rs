//! Column gather: `y[.., j] = x[.., perm[j]]` (f32 or u32 rows, u32 column indices), the activation side of GPTQ
//! act-order weights whose input columns were reordered at load, and (u32) the map from an FR-Spec head's argmax to
//! its token id.

use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{grid, Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct GatherColsParams {
    units: u32,
    row_units: u32,
    k: u32,
}

fn key(vec4: bool, u32s: bool) -> ShaderKey {
    ShaderKey::new("gather_cols").flag("VEC4", vec4).flag("U32", u32s)
}

#[derive(Debug)]
pub struct GatherCols {
    /// Rows of x (all leading dims).
    rows: usize,
    /// Columns of x.
    k: usize,
    /// Columns of y (length of perm).
    n: usize,
    /// x and y hold u32 (else f32).
    u32s: bool,
}

impl GatherCols {
    /// vec4 units of y (and perm) when a row of y is whole vec4s: a quarter of the invocations.
    fn vec4(&self) -> bool {
        self.n.is_multiple_of(4)
    }
    fn row_units(&self) -> usize {
        if self.vec4() {
            self.n / 4
        } else {
            self.n
        }
    }
}

impl Kernel for GatherCols {
    fn name(&self) -> &'static str {
        "gather_cols"
    }
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        vec![Dispatch {
            shader: key(self.vec4(), self.u32s),
            bindings: vec![Bind::Tensor(0), Bind::Tensor(1), Bind::Tensor(2)],
            workgroups: grid(self.rows * self.row_units(), 256, caps.max_workgroups_per_dim),
        }]
    }
    fn params(&self, _: usize, _: &StepVars) -> Params {
        Params::of(&GatherColsParams {
            units: (self.rows * self.row_units()) as u32,
            row_units: self.row_units() as u32,
            k: self.k as u32,
        })
    }
    /// The gathered x values, the indices once, y once.
    fn cost(&self) -> Cost {
        let (rows, n) = (self.rows as u64, self.n as u64);
        Cost {
            bytes_read: 4 * rows * n + 4 * n,
            bytes_written: 4 * rows * n,
            flops: 0,
        }
    }
    fn reference(&self, io: &[HostIo], _: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| {
            let y = if self.u32s {
                let ids = reference(&io[0].u32(), self.k, &io[1].u32());
                ids.into_iter().map(f32::from_bits).collect()
            } else {
                reference(&io[0].f32()?, self.k, &io[1].u32())
            };
            Ok(vec![Expected::at(2, y)])
        })
    }
    fn check_bound(&self, _: &Caps) -> f64 {
        0.0
    }
}

impl Graph {
    /// `x[.., k]` (f32 or u32) gathered by columns: `y[.., j] = x[.., perm[j]]` for `perm` `[n]` (u32), giving
    /// `[.., n]` of x's type. Indices `>= k` give 0; callers pass permutations checked on the host.
    pub fn gather_cols(&mut self, x: TensorId, perm: TensorId) -> Result<TensorId> {
        let (xs, ps) = (self.shape(x).to_vec(), self.shape(perm).to_vec());
        let k = xs.last().copied().unwrap_or(0);
        let rows: usize = xs.iter().rev().skip(1).product();
        let n = match ps[..] {
            [n] => n,
            _ => 0,
        };
        let single = self.desc(perm).parts().len() <= 1 && self.desc(x).parts().len() <= 1;
        if k == 0
            || n == 0
            || rows == 0
            || !matches!(self.dtype(x), DType::F32 | DType::U32)
            || self.dtype(perm) != DType::U32
            || !single
            || rows * n > u32::MAX as usize
            || rows * k > u32::MAX as usize
        {
            return Err(Error::shape(
                "gather_cols",
                format!(
                    "x {xs:?} {:?}, perm {ps:?} {:?}: want f32 or u32 x [.., k], u32 perm [n], nothing empty or split",
                    self.dtype(x),
                    self.dtype(perm)
                ),
            ));
        }
        let mut out = xs.clone();
        *out.last_mut().expect("x has a last dim") = n;
        let dtype = self.dtype(x);
        let u32s = dtype == DType::U32;
        Ok(self.add_node(
            GatherCols { rows, k, n, u32s },
            &[x, perm],
            &[("gather_cols", &out, dtype)],
        )?[0])
    }
}

/// CPU reference: `x` rows of `k`, indices `>= k` give 0.
pub fn reference<T: Copy + Default>(x: &[T], k: usize, perm: &[u32]) -> Vec<T> {
    x.chunks_exact(k)
        .flat_map(|row| perm.iter().map(|&c| row.get(c as usize).copied().unwrap_or_default()))
        .collect()
}

pub fn variants() -> Vec<ShaderKey> {
    [(false, false), (true, false), (false, true), (true, true)]
        .map(|(v, u)| key(v, u))
        .to_vec()
}
