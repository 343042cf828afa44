//! Dense layer `y[.., N] = x[.., K] · W[N, K]^T (+ bias[N])` (PyTorch `Linear` layout), W in f32 or f16:
//! a GEMV for one token (CPU-adapter or GPU flavour) and a register-blocked GEMM for more; one dispatch per row part
//! of W, so weights larger than one binding (an LM head) work. With a GLU epilogue (`matmul_glu`) W's rows are
//! (gate, up) pairs and the kernels write `act(gate) * up`.

use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{fits_uniform_array, grid, Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};
use crate::ops::silu_mul::{epilogue_flags, reference_paired, Glu};

/// The kernel a matmul runs. `Auto` picks a GEMV per row of x for up to [`GEMV_MAX_M`] rows (the CPU-adapter
/// flavour on software adapters such as lavapipe, the GPU flavour elsewhere) and the GEMM for more; the others
/// force one, on any adapter. The GEMV and the GEMM sum in different orders, so a verification step (at most
/// `attention_decode::MAX_TOKENS` rows) runs the GEMV on every row: each row then equals the one-row result bit for
/// bit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MatmulPath {
    #[default]
    Auto,
    /// Each invocation streams 4 whole rows of W; x in a uniform buffer when it fits (`matmul_gemv_cpu`).
    GemvCpu,
    /// A workgroup per 4 rows, lanes striding K, workgroup reduction (`matmul_gemv_gpu`).
    GemvGpu,
    /// Register-blocked 8 x 4 tiles, no workgroup memory (`matmul_gemm`).
    Gemm,
    /// The adapter's GEMV (CPU or GPU flavour) for any number of rows: what `Auto` picks in a graph whose rows must
    /// equal one-row results ([`Graph::set_invariant_rows`]).
    Gemv,
}

/// Most rows of x that `Auto` sends to the GEMV (one row per grid z): a speculative verification step.
pub const GEMV_MAX_M: usize = crate::ops::attention_decode::MAX_TOKENS;

/// Rows of W per invocation (GEMV CPU, GEMM) or per workgroup (GEMV GPU); the shaders hard-code these.
const ROWS_PER_THREAD: usize = 4;
const ROWS_PER_GROUP_GPU: usize = 4;
/// Workgroup size of the CPU-adapter GEMV.
const GEMV_CPU_WORKGROUP: usize = 16;
/// Rows of x per GEMM invocation.
const GEMM_BM: usize = 8;
/// GEMM workgroup size: one 8-lane SIMD chunk on CPU adapters (see matmul_gemm.wgsl), 64 on GPUs.
fn gemm_workgroup(caps: &Caps) -> usize {
    if caps.cpu_adapter {
        8
    } else {
        64
    }
}

/// WebGPU's guaranteed minimum of `max_compute_workgroups_per_dimension`: the grid dims that are not folded (GEMV:
/// rows of x; GEMM: blocks of x and of W) stay under it.
const MAX_GROUPS: usize = 65535;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct MatmulParams {
    m: u32,
    k: u32,
    n: u32,
    row0: u32,
    rows: u32,
    /// W row stride in elements of the shader's `w` array.
    kv: u32,
    /// x row stride in elements of the shader's `x` array.
    xv: u32,
    _pad: u32,
}

#[derive(Debug)]
pub struct Matmul {
    m: usize,
    k: usize,
    n: usize,
    wdtype: DType,
    bias: bool,
    /// (first row, rows) of each part of W.
    parts: Vec<(usize, usize)>,
    path: MatmulPath,
    /// GLU epilogue: W's rows are (gate, up) pairs and y `[M, N / 2]` is `act(gate) * up`.
    glu: Option<Glu>,
}

impl Matmul {
    /// Rows of W and x can be read as 16-byte vectors (4 f32 or 8 f16 per row step).
    fn vec(&self) -> bool {
        match self.wdtype {
            DType::F16 => self.k.is_multiple_of(8),
            _ => self.k.is_multiple_of(4),
        }
    }

    fn path(&self, caps: &Caps) -> MatmulPath {
        match self.path {
            MatmulPath::Auto if self.m > GEMV_MAX_M => MatmulPath::Gemm,
            MatmulPath::Auto | MatmulPath::Gemv if caps.cpu_adapter => MatmulPath::GemvCpu,
            MatmulPath::Auto | MatmulPath::Gemv => MatmulPath::GemvGpu,
            p => p,
        }
    }

    /// x goes in a uniform buffer (GEMV CPU only): all of it fits the fixed-size uniform array and rows are whole
    /// vec4s.
    fn x_uniform(&self, caps: &Caps) -> bool {
        self.path(caps) == MatmulPath::GemvCpu && self.vec() && fits_uniform_array(caps, (self.m * self.k * 4) as u64)
    }

    fn key(&self, caps: &Caps) -> ShaderKey {
        let (name, subgroups) = match self.path(caps) {
            MatmulPath::GemvGpu => ("matmul_gemv_gpu", caps.subgroups),
            MatmulPath::Gemm => ("matmul_gemm", false),
            _ => ("matmul_gemv_cpu", false),
        };
        let mut key = variant(name, self.wdtype == DType::F16, self.vec(), self.bias);
        if name == "matmul_gemm" {
            key = key.def("WG", format!("{}u", gemm_workgroup(caps)));
        }
        epilogue_flags(
            key.flag("SUBGROUPS", subgroups).flag("XU", self.x_uniform(caps)),
            self.glu,
        )
    }

    /// Columns of y: N, or N / 2 with the GLU epilogue.
    fn y_cols(&self) -> usize {
        if self.glu.is_some() {
            self.n / 2
        } else {
            self.n
        }
    }

    /// Elements of the shader's `w` array per row, and of `x` per row.
    fn strides(&self) -> (usize, usize) {
        let kv = match (self.wdtype, self.vec()) {
            (DType::F16, true) => self.k / 8,
            (DType::F16, false) => self.k.div_ceil(2),
            (_, true) => self.k / 4,
            (_, false) => self.k,
        };
        (kv, if self.vec() { self.k / 4 } else { self.k })
    }
}

impl Kernel for Matmul {
    fn name(&self) -> &'static str {
        "matmul"
    }
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        let shader = self.key(caps);
        let path = self.path(caps);
        let out = if self.bias { 3 } else { 2 };
        self.parts
            .iter()
            .enumerate()
            .map(|(i, &(_, rows))| {
                let x = if self.x_uniform(caps) { Bind::Uniform(0) } else { Bind::Tensor(0) };
                let mut bindings = vec![x, Bind::Part(1, i)];
                if self.bias {
                    bindings.push(Bind::Tensor(2));
                }
                bindings.push(Bind::Tensor(out));
                let workgroups = match path {
                    MatmulPath::Gemm => [
                        self.m.div_ceil(GEMM_BM) as u32,
                        rows.div_ceil(ROWS_PER_THREAD * gemm_workgroup(caps)) as u32,
                        1,
                    ],
                    _ => {
                        let per = match path {
                            MatmulPath::GemvGpu => ROWS_PER_GROUP_GPU,
                            _ => ROWS_PER_THREAD * GEMV_CPU_WORKGROUP,
                        };
                        let [x, y, _] = grid(rows, per, caps.max_workgroups_per_dim);
                        [x, y, self.m as u32]
                    }
                };
                Dispatch {
                    shader: shader.clone(),
                    bindings,
                    workgroups,
                }
            })
            .collect()
    }
    fn params(&self, i: usize, _: &StepVars) -> Params {
        let (row0, rows) = self.parts[i];
        let (kv, xv) = self.strides();
        Params::of(&MatmulParams {
            m: self.m as u32,
            k: self.k as u32,
            n: self.n as u32,
            row0: row0 as u32,
            rows: rows as u32,
            kv: kv as u32,
            xv: xv as u32,
            _pad: 0,
        })
    }
    /// Compulsory traffic: W once, x once, bias once, y once (the GEMM re-reads W once per 8 rows of x from cache).
    fn cost(&self) -> Cost {
        let w = self.wdtype.bytes(self.k) * self.n as u64;
        let (m, k, n, cols) = (self.m as u64, self.k as u64, self.n as u64, self.y_cols() as u64);
        Cost {
            bytes_read: w + 4 * m * k + if self.bias { 4 * n } else { 0 },
            bytes_written: 4 * m * cols,
            flops: 2 * m * n * k + if self.bias { m * n } else { 0 } + if self.glu.is_some() { 5 * m * cols } else { 0 },
        }
    }
    /// Node tensors: x, W (row parts), (bias), y. An f16 W is exact in f32; the bound is f32's.
    fn reference(&self, io: &[HostIo], _: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| {
            let bias = if self.bias { Some(io[2].f32()?) } else { None };
            let mut y = reference(&io[0].f32()?, &io[1].f32()?, bias.as_deref(), self.m, self.k, self.n);
            if let Some(act) = self.glu {
                y = reference_paired(&y, act);
            }
            Ok(vec![Expected::at(2 + usize::from(self.bias), y)])
        })
    }
    /// The default bound (f32 sums in another order); the GLU multiplies the two sums' relative errors into one
    /// output (about twice the NMSE) and adds exp's few ulp.
    fn check_bound(&self, _: &Caps) -> f64 {
        if self.glu.is_some() {
            4e-8
        } else {
            1e-8
        }
    }
}

impl Graph {
    /// `x[.., K] · W[N, K]^T (+ bias[N])` → `[.., N]`: x f32, W f32 or f16 (possibly split by rows), bias f32.
    pub fn matmul(&mut self, x: TensorId, w: TensorId, bias: Option<TensorId>) -> Result<TensorId> {
        self.matmul_with(x, w, bias, MatmulPath::Auto)
    }

    /// [`Graph::matmul`] with the kernel chosen by the caller (tests and benches cover each path this way).
    pub fn matmul_with(
        &mut self,
        x: TensorId,
        w: TensorId,
        bias: Option<TensorId>,
        path: MatmulPath,
    ) -> Result<TensorId> {
        self.matmul_node(x, w, bias, path, None)
    }

    /// `act(x · W_gate^T) * (x · W_up^T)` → `[.., N / 2]` in one dispatch per part: W's rows are (gate, up) pairs
    /// (row 2i the gate of output i, row 2i + 1 its up: [`crate::model::weights::Linear::load_paired`]).
    pub fn matmul_glu(&mut self, x: TensorId, w: TensorId, act: Glu) -> Result<TensorId> {
        self.matmul_node(x, w, None, MatmulPath::Auto, Some(act))
    }

    /// [`Graph::matmul_glu`] with the kernel chosen by the caller.
    pub fn matmul_glu_with(&mut self, x: TensorId, w: TensorId, path: MatmulPath, act: Glu) -> Result<TensorId> {
        self.matmul_node(x, w, None, path, Some(act))
    }

    fn matmul_node(
        &mut self,
        x: TensorId,
        w: TensorId,
        bias: Option<TensorId>,
        path: MatmulPath,
        glu: Option<Glu>,
    ) -> Result<TensorId> {
        let xs = self.shape(x).to_vec();
        let ws = self.shape(w).to_vec();
        let bs = bias.map(|b| self.shape(b).to_vec());
        let bad = |why: &str| Error::shape("matmul", format!("x {xs:?} · W {ws:?}^T + bias {bs:?}: {why}"));
        let (Some(&k), [n, wk]) = (xs.last(), ws.as_slice()) else {
            return Err(bad("x needs a last dim, W must be [N, K]"));
        };
        let (n, m) = (*n, xs[..xs.len() - 1].iter().product::<usize>());
        if *wk != k {
            return Err(bad("K differs"));
        }
        if m == 0 || k == 0 || n == 0 {
            return Err(bad("empty"));
        }
        if self.dtype(x) != DType::F32 || !matches!(self.dtype(w), DType::F32 | DType::F16) {
            return Err(bad("x must be f32, W f32 or f16"));
        }
        if let Some(b) = bias {
            if self.shape(b) != [n] || self.dtype(b) != DType::F32 {
                return Err(bad("bias must be f32 [N]"));
            }
        }
        // Rows that must each equal the one-row result take the GEMV however many there are.
        let path = match path {
            MatmulPath::Auto if m > GEMV_MAX_M && m <= self.invariant_rows() => MatmulPath::Gemv,
            p => p,
        };
        // Grid dims that are not folded: GEMV rows of x (z); GEMM blocks of x (x) and of W rows (y, smallest WG).
        let grid_ok = match path {
            MatmulPath::Gemm | MatmulPath::Auto => {
                m.div_ceil(GEMM_BM) <= MAX_GROUPS && n.div_ceil(ROWS_PER_THREAD * 8) <= MAX_GROUPS
            }
            _ => m <= MAX_GROUPS,
        };
        if !grid_ok || m * k > u32::MAX as usize || m * n > u32::MAX as usize {
            return Err(bad("too large for one dispatch grid"));
        }
        let parts = self.desc(w).parts();
        if parts.iter().map(|p| p.1).sum::<usize>() != n || parts.iter().any(|p| p.1 == 0) {
            return Err(bad("W's row parts do not cover its rows"));
        }
        if glu.is_some() && (bias.is_some() || !n.is_multiple_of(2) || parts.iter().any(|p| p.0 % 2 == 1)) {
            return Err(bad("a GLU epilogue needs (gate, up) row pairs: N even, parts at even rows, no bias"));
        }
        let kernel = Matmul {
            m,
            k,
            n,
            wdtype: self.dtype(w),
            bias: bias.is_some(),
            parts,
            path,
            glu,
        };
        let mut out = xs.clone();
        *out.last_mut().expect("x has a last dim") = kernel.y_cols();
        let inputs: Vec<TensorId> = [x, w].into_iter().chain(bias).collect();
        Ok(self.add_node(kernel, &inputs, &[("matmul", &out, DType::F32)])?[0])
    }
}

/// CPU reference with f64 accumulation: `x` [m, k], `w` [n, k] (already rounded to f16 when testing f16), `bias` [n].
pub fn reference(x: &[f32], w: &[f32], bias: Option<&[f32]>, m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut y = vec![0f32; m * n];
    for i in 0..m {
        let xr = &x[i * k..(i + 1) * k];
        for j in 0..n {
            let wr = &w[j * k..(j + 1) * k];
            let s: f64 = xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
            y[i * n + j] = (s + bias.map_or(0.0, |b| b[j] as f64)) as f32;
        }
    }
    y
}

/// Every variant: the three kernels by weight type, row alignment, bias or a GLU epilogue, subgroups and (GEMV CPU)
/// x in a uniform.
pub fn variants() -> Vec<ShaderKey> {
    let mut v = Vec::new();
    let epilogues = [(false, None), (true, None), (false, Some(Glu::Silu)), (false, Some(Glu::GeluTanh))];
    for wh in [false, true] {
        for vec in [false, true] {
            for (bias, glu) in epilogues {
                let mut keys = Vec::new();
                for wg in ["8u", "64u"] {
                    keys.push(variant("matmul_gemm", wh, vec, bias).def("WG", wg));
                }
                keys.push(variant("matmul_gemv_gpu", wh, vec, bias));
                keys.push(variant("matmul_gemv_gpu", wh, vec, bias).flag("SUBGROUPS", true));
                keys.push(variant("matmul_gemv_cpu", wh, vec, bias));
                if vec {
                    keys.push(variant("matmul_gemv_cpu", wh, vec, bias).flag("XU", true));
                }
                v.extend(keys.into_iter().map(|k| epilogue_flags(k, glu)));
            }
        }
    }
    v
}

fn variant(name: &'static str, wh: bool, vec: bool, bias: bool) -> ShaderKey {
    ShaderKey::new(name).flag("WH", wh).flag("VEC", vec).flag("BIAS", bias)
}
