//! A decode step's q|k|v GEMV over two weights in different formats (Q4_K_M files keep v in Q6_K or Q8_0 on half
//! the layers) in one dispatch of matmul_q_tiled (`TWO`): the second weight's workgroups run the GEMV loop
//! instantiated for its format (namespace B, `lib/tiled_gemv.wgsl`), both with the norm prologue, and either
//! rope_kv's epilogue or y written with b's rows after a's (then the prologue may be the post-norm's, Gemma's).
//! Each tile runs its own weight's loop, so the result equals one fused GEMV per weight bit for bit.

use super::{
    dequantize_io, fused_flags, norm_wg, reference, rope_reference, subgroups8, tiled_key_wg, Fused, FusedRope,
    MatmulQParams, NORM_TILE_COUNTS, QK, TILE, WG_TILED,
};
use crate::error::Result;
use crate::gpu::{Caps, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{grid, Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::ops::rope_kv::RopeFields;
use crate::quant::pack::{kernel_formats, Format, Layout};

/// One weight of the pair: format, rows (in one part) and device bytes.
#[derive(Clone, Copy, Debug)]
pub(super) struct Half {
    pub format: Format,
    pub n: usize,
    pub wbytes: u64,
}

impl Half {
    fn tiles(&self) -> usize {
        self.n.div_ceil(TILE)
    }
    /// Its device buffers: quants, scales (and factors).
    fn buffers(&self) -> usize {
        2 + usize::from(self.format.third_buffer(Layout::Tiled))
    }
}

/// What the pair's dispatch writes: rope_kv's epilogue (a holds rows `rope.qkv0 ..` of q|k|v, b the rows after
/// a's), or y `[1, a.n + b.n]` with the post-norm's prologue (and h) when `post` (its alpha).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Tail {
    Rope(FusedRope),
    Y { post: Option<f32> },
}

impl Tail {
    /// Node inputs after the norm weight and before b's buffers: the caches, factors and q_out; or r and rw.
    fn inputs(&self) -> usize {
        match self {
            Tail::Rope(r) => r.inputs() + 1,
            Tail::Y { post } => 2 * usize::from(post.is_some()),
        }
    }
    fn fused(&self) -> Fused {
        match *self {
            Tail::Rope(r) => Fused {
                norm: Some(0.0),
                rope: Some(r),
                ..Default::default()
            },
            Tail::Y { post } => Fused {
                norm: Some(0.0),
                post,
                ..Default::default()
            },
        }
    }
}

/// Node tensors: x `[1, K]`; a's buffers; (bias_a `[a.n]`); the norm weight `[K]`; then k_cache, v_cache,
/// (factors) and q_out (written) for the rope epilogue, or r `[1, K]` and rw `[K]` for the post-norm; b's buffers;
/// (bias_b `[b.n]`); without the rope epilogue the outputs y `[1, a.n + b.n]` and (post) h `[1, K]`.
#[derive(Debug)]
pub(super) struct MatmulQTwo {
    pub k: usize,
    pub a: Half,
    pub b: Half,
    pub bias: bool,
    pub eps: f32,
    pub tail: Tail,
}

/// The TWO kernel's variant: the first weight's fused GEMV (norm prologue, rope epilogue or y) with the second's
/// loop in namespace B, its buffers bound after every other binding and then its bias. x stays in storage: the norm
/// prologue reads it once and the loops read the normed copy in workgroup memory.
fn key(a: Format, b: Format, bias: bool, subgroups: bool, wg: usize, tail: Tail) -> ShaderKey {
    let y_at = 3 + usize::from(a.third_buffer(Layout::Tiled)) + usize::from(bias);
    let key = fused_flags(tiled_key_wg(a, bias, false, subgroups, None, wg), tail.fused(), y_at).flag("TWO", true);
    // After y: the norm weight, then the caches and the factors, or r, rw and h.
    let w_at = y_at
        + 2
        + match tail {
            Tail::Rope(r) => r.inputs(),
            Tail::Y { post } => 3 * usize::from(post.is_some()),
        };
    let sub = b
        .shader_flags(ShaderKey::new("matmul_q_tiled"))
        .def("W_AT", format!("{w_at}u"))
        .flag("SUBGROUPS", subgroups)
        .flag("NORM", true);
    let bias_at = w_at + 2 + usize::from(b.third_buffer(Layout::Tiled));
    let key = if bias { key.def("BIAS_B_AT", format!("{bias_at}u")) } else { key };
    key.with_b(&sub)
}

impl MatmulQTwo {
    /// Node tensor of the norm weight, after x, a's buffers and bias.
    fn norm_at(&self) -> usize {
        1 + self.a.buffers() + usize::from(self.bias)
    }
    /// Node tensor of b's first buffer.
    fn b_at(&self) -> usize {
        self.norm_at() + 1 + self.tail.inputs()
    }
    fn wg(&self) -> usize {
        norm_wg(self.a.tiles() + self.b.tiles())
    }
    /// Workgroups of a weight's tiles.
    fn groups(&self, h: &Half) -> usize {
        h.tiles().div_ceil(self.wg() / WG_TILED)
    }
}

impl Kernel for MatmulQTwo {
    fn name(&self) -> &'static str {
        "matmul_q"
    }
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        let shader = key(self.a.format, self.b.format, self.bias, subgroups8(caps), self.wg(), self.tail);
        let (nb, bias) = (self.b.buffers(), usize::from(self.bias));
        let norm = self.norm_at();
        let mut bindings: Vec<Bind> = (0..norm).map(Bind::Tensor).collect();
        match self.tail {
            Tail::Rope(r) => {
                // y's binding holds q_out (the input after the norm weight, the caches and the factors).
                let q = norm + 1 + r.inputs();
                bindings.push(Bind::Tensor(q));
                bindings.extend((norm..q).map(Bind::Tensor));
                bindings.extend((q + 1..=q + nb + bias).map(Bind::Tensor));
            }
            Tail::Y { post } => {
                // y (the first output), the norm weight, (r, rw, then h), b's buffers and bias.
                let b0 = self.b_at();
                let y = b0 + nb + bias;
                bindings.push(Bind::Tensor(y));
                bindings.extend((norm..b0).map(Bind::Tensor));
                if post.is_some() {
                    bindings.push(Bind::Tensor(y + 1));
                }
                bindings.extend((b0..y).map(Bind::Tensor));
            }
        }
        let groups = self.groups(&self.a) + self.groups(&self.b);
        let [x, y, _] = grid(groups * self.wg(), self.wg(), caps.max_workgroups_per_dim);
        vec![Dispatch {
            shader,
            bindings,
            workgroups: [x, y, 1],
        }]
    }
    fn params(&self, _i: usize, vars: &StepVars) -> Params {
        let (a, b) = (&self.a, &self.b);
        let (n, alpha, rope, qkv0) = match self.tail {
            Tail::Rope(r) => (a.n, 1.0, RopeFields::new(r.dims, &r.cfg, vars.pos), r.qkv0),
            Tail::Y { post } => (a.n + b.n, post.unwrap_or(1.0), RopeFields::default(), 0),
        };
        Params::of(&MatmulQParams {
            m: 1,
            k: self.k as u32,
            n: n as u32,
            row0: 0,
            rows: a.n as u32,
            groups: (self.k / QK) as u32,
            xv: (self.k / 4) as u32,
            tiles: a.tiles() as u32,
            alpha,
            eps: self.eps,
            rope,
            qkv0: qkv0 as u32,
            wg_b: self.groups(a) as u32,
            tiles_b: b.tiles() as u32,
            rows_b: b.n as u32,
        })
    }
    fn cost(&self) -> Cost {
        let (k, n) = (self.k as u64, (self.a.n + self.b.n) as u64);
        let post = if matches!(self.tail, Tail::Y { post: Some(_) }) { 4 * k } else { 0 };
        Cost {
            bytes_read: self.a.wbytes + self.b.wbytes + 4 * k + if self.bias { 4 * n } else { 0 } + 2 * post,
            bytes_written: 4 * n + post,
            flops: 2 * n * k,
        }
    }
    /// rms_norm's reference (after the post-norm's add), then [`reference`] over both weights' rows (the CPU
    /// dequantization of their words), then rope_kv's.
    fn reference(&self, io: &[HostIo], vars: &StepVars) -> Option<Result<Vec<Expected>>> {
        let (a, b) = (&self.a, &self.b);
        expect(|| {
            let mut w = dequantize_io(a.format, Layout::Tiled, a.n, self.k, &[(0, a.n)], &io[1..=a.buffers()])?;
            let (norm, b0) = (self.norm_at(), self.b_at());
            w.extend(dequantize_io(b.format, Layout::Tiled, b.n, self.k, &[(0, b.n)], &io[b0..b0 + b.buffers()])?);
            let bias = match self.bias {
                true => Some([io[a.buffers() + 1].f32()?, io[b0 + b.buffers()].f32()?].concat()),
                false => None,
            };
            let mut x = io[0].f32()?;
            if let Tail::Y { post: Some(alpha) } = self.tail {
                let r = crate::ops::rms_norm::reference(&io[norm + 1].f32()?, &io[norm + 2].f32()?, self.eps);
                x = crate::ops::add::reference(&x, &r, alpha);
            }
            let h = x.clone();
            let x = crate::ops::rms_norm::reference(&x, &io[norm].f32()?, self.eps);
            let y = reference(&x, &w, bias.as_deref(), 1, self.k, a.n + b.n);
            match self.tail {
                Tail::Rope(r) => rope_reference(&r, &y, &io[norm + 1..], vars.pos, norm + 1),
                Tail::Y { post } => {
                    let at = b0 + b.buffers() + usize::from(self.bias);
                    let mut out = vec![Expected::at(at, y)];
                    out.extend(post.map(|_| Expected::at(at + 1, h)));
                    Ok(out)
                }
            }
        })
    }
    fn check_bound(&self, _caps: &Caps) -> f64 {
        // As the single-weight rope epilogue: an f16 cache may round a key the other way.
        if matches!(self.tail, Tail::Rope(r) if r.kv_f16) {
            1e-6
        } else {
            1e-9
        }
    }
}

/// Every TWO variant: pairs of distinct formats, with and without biases, with the rope epilogue (f16 or f32
/// caches, with and without frequency divisors) or y (with and without the post-norm), at each workgroup size the
/// norm prologue takes.
pub(super) fn variants() -> Vec<ShaderKey> {
    let mut v = Vec::new();
    for a in kernel_formats() {
        for b in kernel_formats().filter(|b| *b != a) {
            for bias in [false, true] {
                let ropes = [(false, false), (true, false), (false, true), (true, true)]
                    .map(|(kv_f16, factors)| Tail::Rope(FusedRope::variant(kv_f16, factors)));
                for tail in ropes.into_iter().chain([Tail::Y { post: None }, Tail::Y { post: Some(1.0) }]) {
                    for per in NORM_TILE_COUNTS {
                        v.push(key(a, b, bias, true, WG_TILED * per, tail));
                    }
                }
            }
        }
    }
    v
}
