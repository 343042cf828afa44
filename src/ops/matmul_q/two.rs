//! A decode step's q|k|v GEMV over two weights in different formats (Q4_K_M files keep v in Q6_K or Q8_0 on half
//! the layers) in one dispatch of matmul_q_tiled (`TWO`): the second weight's workgroups run the GEMV loop
//! instantiated for its format (namespace B, `lib/tiled_gemv.wgsl`), both with the norm prologue and rope_kv's
//! epilogue. Each tile runs its own weight's loop, so the result equals one fused GEMV per weight bit for bit.

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

/// Node tensors: x `[1, K]`; a's buffers; (bias_a `[a.n]`); the norm weight `[K]`; k_cache, v_cache, (factors);
/// q_out (written); b's buffers; (bias_b `[b.n]`). a holds rows `rope.qkv0 ..` of q|k|v, b the rows after a's.
#[derive(Debug)]
pub(super) struct MatmulQTwo {
    pub k: usize,
    pub a: Half,
    pub b: Half,
    pub bias: bool,
    pub eps: f32,
    pub rope: FusedRope,
}

/// The TWO kernel's variant: the first weight's fused GEMV (norm prologue, rope epilogue) with the second's loop in
/// namespace B, its buffers bound after every other binding and then its bias. x stays in storage: the norm
/// prologue reads it once and the loops read the normed copy in workgroup memory.
fn key(a: Format, b: Format, bias: bool, subgroups: bool, wg: usize, rope: FusedRope) -> ShaderKey {
    let y_at = 3 + usize::from(a.third_buffer(Layout::Tiled)) + usize::from(bias);
    let fused = Fused {
        norm: Some(0.0),
        rope: Some(rope),
        ..Default::default()
    };
    let key = fused_flags(tiled_key_wg(a, bias, false, subgroups, None, wg), fused, y_at).flag("TWO", true);
    // After y: the norm weight, the caches and the factors.
    let w_at = y_at + 2 + rope.inputs();
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
        let shader = key(self.a.format, self.b.format, self.bias, subgroups8(caps), self.wg(), self.rope);
        let (na, nb, bias) = (self.a.buffers(), self.b.buffers(), usize::from(self.bias));
        let mut bindings: Vec<Bind> = (0..=na + bias).map(Bind::Tensor).collect();
        // The norm weight, the caches, (factors), then q_out.
        let extra = 1 + self.rope.inputs();
        let q = na + bias + extra + 1;
        bindings.push(Bind::Tensor(q));
        bindings.extend((q - extra..q).map(Bind::Tensor));
        bindings.extend((q + 1..=q + nb + bias).map(Bind::Tensor));
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
        Params::of(&MatmulQParams {
            m: 1,
            k: self.k as u32,
            n: a.n as u32,
            row0: 0,
            rows: a.n as u32,
            groups: (self.k / QK) as u32,
            xv: (self.k / 4) as u32,
            tiles: a.tiles() as u32,
            alpha: 1.0,
            eps: self.eps,
            rope: RopeFields::new(self.rope.dims, &self.rope.cfg, vars.pos),
            qkv0: self.rope.qkv0 as u32,
            wg_b: self.groups(a) as u32,
            tiles_b: b.tiles() as u32,
            rows_b: b.n as u32,
        })
    }
    fn cost(&self) -> Cost {
        let (k, n) = (self.k as u64, (self.a.n + self.b.n) as u64);
        Cost {
            bytes_read: self.a.wbytes + self.b.wbytes + 4 * k + if self.bias { 4 * n } else { 0 },
            bytes_written: 4 * n,
            flops: 2 * n * k,
        }
    }
    /// rms_norm's reference, then [`reference`] over both weights' rows (the CPU dequantization of their words),
    /// then rope_kv's.
    fn reference(&self, io: &[HostIo], vars: &StepVars) -> Option<Result<Vec<Expected>>> {
        let (a, b, bias) = (&self.a, &self.b, usize::from(self.bias));
        expect(|| {
            let mut w = dequantize_io(a.format, Layout::Tiled, a.n, self.k, &[(0, a.n)], &io[1..=a.buffers()])?;
            let norm = a.buffers() + bias + 1;
            let q = norm + 1 + self.rope.inputs();
            let wb = &io[q + 1..=q + b.buffers()];
            w.extend(dequantize_io(b.format, Layout::Tiled, b.n, self.k, &[(0, b.n)], wb)?);
            let bias = match self.bias {
                true => Some([io[a.buffers() + 1].f32()?, io[q + b.buffers() + 1].f32()?].concat()),
                false => None,
            };
            let x = crate::ops::rms_norm::reference(&io[0].f32()?, &io[norm].f32()?, self.eps);
            let y = reference(&x, &w, bias.as_deref(), 1, self.k, a.n + b.n);
            rope_reference(&self.rope, &y, &io[norm + 1..], vars.pos, norm + 1)
        })
    }
    fn check_bound(&self, _caps: &Caps) -> f64 {
        // As the single-weight rope epilogue: an f16 cache may round a key the other way.
        if self.rope.kv_f16 {
            1e-6
        } else {
            1e-9
        }
    }
}

/// Every TWO variant: pairs of distinct formats, with and without biases, f16 or f32
/// caches, with and without frequency divisors, at each workgroup size the norm prologue takes.
pub(super) fn variants() -> Vec<ShaderKey> {
    let mut v = Vec::new();
    for a in kernel_formats() {
        for b in kernel_formats().filter(|b| *b != a) {
            for bias in [false, true] {
                for (kv_f16, factors) in [(false, false), (true, false), (false, true), (true, true)] {
                    let rope = FusedRope::variant(kv_f16, factors);
                    for per in NORM_TILE_COUNTS {
                        v.push(key(a, b, bias, true, WG_TILED * per, rope));
                    }
                }
            }
        }
    }
    v
}
