//! GPTQ and AWQ checkpoints as published on the Hugging Face hub: the on-disk tensors of a quantized linear layer,
//! a CPU dequantization written from the format description (the reference), the one-time repack into the ggml
//! 32-weight blocks that `matmul_q` reads (Q4_0 / Q4_1 / Q8_0, with a column permutation for act-order), and a
//! round-to-nearest packer that writes the exact on-disk tensors (tests, and a `quantize` command).
//!
//! A layer `X` computes `y = W x`, `W [N, K]` (N outputs, K inputs). Each i32 word packs `32 / bits` codes, code
//! `i` in bits `bits * i ..` (the lowest first); `G` groups of inputs share a scale and a zero per output.
//!
//! GPTQ (AutoGPTQ, GPTQModel, transformers; 4 or 8 bits):
//! ```text
//! X.qweight  i32 [K * bits / 32, N]  word (r, n): codes of inputs r * 32 / bits + i, column n   (packed along K)
//! X.qzeros   i32 [G, N * bits / 32]  word (g, c): zero codes of outputs c * 32 / bits + i    (packed along N)
//! X.scales   f16 [G, N]
//! X.g_idx    i32 [K]                 group of each input: k / group_size, or any order with act-order (desc_act)
//! w[n, k] = scales[g, n] * (q[k, n] - z[g, n]),  g = g_idx[k],  G = ceil(K / group_size) (1 for group_size -1)
//! ```
//! The zero offset: the v1 checkpoint format (`checkpoint_format: "gptq"`, the default and what AutoGPTQ and most
//! hub models write) stores `z - 1`, so a stored code `c` means `z = c + 1` (1..=2^bits, per code, as the v1
//! kernels compute it: no carry between codes). `"gptq_v2"` (GPTQModel) stores `z` itself. Symmetric GPTQ uses
//! `z = 2^(bits-1)` (8 for 4 bits, stored as 7 in v1).
//!
//! AWQ (AutoAWQ `version: "gemm"`; 4 bits):
//! ```text
//! X.qweight  i32 [K, N / 8]  word (k, c): output c * 8 + ORDER[i] in nibble i, ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
//! X.qzeros   i32 [G, N / 8]  the same packing
//! X.scales   f16 [G, N]
//! w[n, k] = scales[k / group_size, n] * (q[k, n] - z[k / group_size, n])
//! ```
//!
//! Repacking: every 32-input block of a row must lie in one group. Without act-order that holds when the group
//! size is a multiple of 32. With act-order the inputs are first sorted by group (stable), the blocks are made over
//! the sorted columns, and the permutation goes with the weight: column `j` of the blocks holds input `perm[j]`,
//! so the kernel computes `W' · x[perm]` (`gather_cols` before `matmul_q`). A group whose size is not a multiple
//! of 32 is an error. When every zero is `2^(bits-1)` the blocks are Q4_0 / Q8_0 with `d = scale`: exact. Otherwise
//! (4 bits) Q4_1 with `d = scale` (exact) and `m = -scale * z` rounded once to f16: `|Δw| <= 2^-11 |scale * z|`
//! (half an f16 ulp; at most `|scale| / 128` since `z <= 16`, a 1/128 of a quantization step), or `2^-25` where
//! `|scale * z| < 2^-14` (f16 subnormals). Asymmetric 8-bit weights have no ggml block with a minimum: an error.

use super::{f16_to_f32, f32_to_f16, q4_0, q4_1, q8_0, GgmlType};
use crate::error::{Error, Result};

/// Which tool's layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    Gptq,
    Awq,
}

/// AWQ's nibble order: nibble `i` of a word holds output `8c + AWQ_ORDER[i]`.
pub const AWQ_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

/// How one checkpoint's quantized layers are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Scheme {
    pub method: Method,
    /// Bits per code: 4 (GPTQ, AWQ) or 8 (GPTQ).
    pub bits: u32,
    /// Inputs per group; `None` is one group over all of K (`group_size: -1`).
    pub group_size: Option<usize>,
    /// GPTQ v1 checkpoint format: zero codes stored minus one.
    pub zeros_minus_one: bool,
}

impl Scheme {
    /// GPTQ in the v1 checkpoint format (what AutoGPTQ writes).
    pub fn gptq(bits: u32, group_size: Option<usize>) -> Scheme {
        Scheme {
            method: Method::Gptq,
            bits,
            group_size,
            zeros_minus_one: true,
        }
    }

    /// AWQ GEMM.
    pub fn awq(group_size: Option<usize>) -> Scheme {
        Scheme {
            method: Method::Awq,
            bits: 4,
            group_size,
            zeros_minus_one: false,
        }
    }

    /// Errors for what shaderlm cannot run: bits other than 4 (and 8 for GPTQ), groups that do not fill whole
    /// 32-weight blocks.
    pub fn check(&self) -> Result<()> {
        let bits_ok = match self.method {
            Method::Gptq => matches!(self.bits, 4 | 8),
            Method::Awq => self.bits == 4,
        };
        if !bits_ok {
            let which = if self.method == Method::Gptq { "4 and 8" } else { "4" };
            return Err(Error::Invalid(format!(
                "{} bits {}: shaderlm runs {which}-bit {} weights",
                self.name(),
                self.bits,
                self.name()
            )));
        }
        if let Some(gs) = self.group_size {
            if gs == 0 || !gs.is_multiple_of(32) {
                return Err(Error::Invalid(format!(
                    "{} group size {gs}: weights are repacked into 32-weight blocks, so the group size must be \
                     -1 or a multiple of 32",
                    self.name()
                )));
            }
        }
        Ok(())
    }

    fn name(&self) -> &'static str {
        match self.method {
            Method::Gptq => "GPTQ",
            Method::Awq => "AWQ",
        }
    }

    /// Codes per i32 word.
    pub fn per_word(&self) -> usize {
        32 / self.bits as usize
    }

    /// Largest code.
    pub fn max_code(&self) -> u32 {
        (1 << self.bits) - 1
    }

    /// Groups over `k` inputs.
    pub fn groups(&self, k: usize) -> usize {
        self.group_size.map_or(1, |gs| k.div_ceil(gs))
    }

    /// The group of input `k` when the file gives no `g_idx` (and always for AWQ).
    fn default_group(&self, k: usize) -> usize {
        self.group_size.map_or(0, |gs| k / gs)
    }
}

/// The on-disk tensors of one quantized linear layer `W [n, k]`, as their little-endian values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GptqTensors {
    pub n: usize,
    pub k: usize,
    /// GPTQ `[K * bits / 32, N]`, AWQ `[K, N / 8]` (i32 bits).
    pub qweight: Vec<u32>,
    /// `[G, N * bits / 32]` (i32 bits).
    pub qzeros: Vec<u32>,
    /// f16 bits `[G, N]`.
    pub scales: Vec<u16>,
    /// GPTQ: the group of each input `[K]`; `None` means `k / group_size` (files without g_idx, and AWQ).
    pub g_idx: Option<Vec<i32>>,
}

/// One tensor as its file holds it: row-major shape and little-endian bytes (the caller checked the dtype).
#[derive(Clone, Copy, Debug)]
pub struct RawTensor<'a> {
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
}

impl GptqTensors {
    /// Shape of `qweight`.
    pub fn qweight_shape(&self, s: &Scheme) -> [usize; 2] {
        match s.method {
            Method::Gptq => [self.k / s.per_word(), self.n],
            Method::Awq => [self.k, self.n / s.per_word()],
        }
    }
    /// Shape of `qzeros`.
    pub fn qzeros_shape(&self, s: &Scheme) -> [usize; 2] {
        [s.groups(self.k), self.n / s.per_word()]
    }
    /// Shape of `scales`.
    pub fn scales_shape(&self, s: &Scheme) -> [usize; 2] {
        [s.groups(self.k), self.n]
    }

    /// Read one layer's tensors (`prefix` names them in errors), checking every shape against the others.
    pub fn from_raw(
        s: &Scheme,
        prefix: &str,
        qweight: RawTensor<'_>,
        qzeros: RawTensor<'_>,
        scales: RawTensor<'_>,
        g_idx: Option<RawTensor<'_>>,
    ) -> Result<GptqTensors> {
        s.check()?;
        let bad = |t: &str, msg: String| Error::Invalid(format!("{prefix}.{t}: {msg}"));
        let two = |t: &str, r: &RawTensor| -> Result<[usize; 2]> {
            match r.shape {
                &[a, b] => Ok([a, b]),
                other => Err(bad(t, format!("shape {other:?} is not a matrix"))),
            }
        };
        let [g, n] = two("scales", &scales)?;
        let [qr, qc] = two("qweight", &qweight)?;
        let pw = s.per_word();
        let k = match s.method {
            Method::Gptq => qr * pw,
            Method::Awq => qr,
        };
        let t = GptqTensors {
            n,
            k,
            qweight: Vec::new(),
            qzeros: Vec::new(),
            scales: Vec::new(),
            g_idx: None,
        };
        let what = format!(
            "for {} {}-bit with N = {n} outputs (from scales) and K = {k} inputs",
            s.name(),
            s.bits
        );
        if n == 0 || k == 0 || !n.is_multiple_of(pw) || !k.is_multiple_of(32) {
            return Err(bad(
                "qweight",
                format!("[{qr}, {qc}] with scales [{g}, {n}]: N must be a multiple of {pw} and K of 32"),
            ));
        }
        if [qr, qc] != t.qweight_shape(s) {
            return Err(bad(
                "qweight",
                format!("shape [{qr}, {qc}], expected {:?} {what}", t.qweight_shape(s)),
            ));
        }
        if g != s.groups(k) {
            return Err(bad(
                "scales",
                format!(
                    "{g} groups, expected {} {what} and group size {:?}",
                    s.groups(k),
                    s.group_size
                ),
            ));
        }
        if qzeros.shape != t.qzeros_shape(s) {
            return Err(bad(
                "qzeros",
                format!("shape {:?}, expected {:?} {what}", qzeros.shape, t.qzeros_shape(s)),
            ));
        }
        let words = |name: &str, r: &RawTensor, count: usize| -> Result<Vec<u32>> {
            if r.bytes.len() != 4 * count {
                return Err(bad(name, format!("{} bytes for {count} i32 values", r.bytes.len())));
            }
            Ok(bytemuck::pod_collect_to_vec(r.bytes))
        };
        let qweight = words("qweight", &qweight, qr * qc)?;
        let qzeros = words("qzeros", &qzeros, g * n / pw)?;
        if scales.bytes.len() != 2 * g * n {
            return Err(bad(
                "scales",
                format!("{} bytes for {} f16 values", scales.bytes.len(), g * n),
            ));
        }
        let scales: Vec<u16> = bytemuck::pod_collect_to_vec(scales.bytes);
        let g_idx = match (s.method, g_idx) {
            (Method::Gptq, Some(r)) => {
                if r.shape != [k] {
                    return Err(bad("g_idx", format!("shape {:?}, expected [{k}] {what}", r.shape)));
                }
                let v: Vec<i32> = words("g_idx", &r, k)?.into_iter().map(|w| w as i32).collect();
                if let Some((i, x)) = v.iter().enumerate().find(|(_, &x)| x < 0 || x as usize >= g) {
                    return Err(bad("g_idx", format!("input {i} is in group {x}, outside 0..{g}")));
                }
                Some(v)
            }
            _ => None,
        };
        Ok(GptqTensors {
            qweight,
            qzeros,
            scales,
            g_idx,
            ..t
        })
    }

    /// Group of input `k`.
    pub fn group(&self, s: &Scheme, k: usize) -> usize {
        match &self.g_idx {
            Some(g) => g[k] as usize,
            None => s.default_group(k),
        }
    }

    /// Code of input `k`, output `n`.
    #[inline]
    pub fn code(&self, s: &Scheme, k: usize, n: usize) -> u32 {
        // Codes per word are 8 or 4: shifts instead of divisions (this runs once per weight at load).
        let (pw, mask) = (s.per_word(), s.max_code());
        match s.method {
            Method::Gptq => {
                let word = self.qweight[(k >> pw.trailing_zeros()) * self.n + n];
                (word >> (s.bits as usize * (k & (pw - 1)))) & mask
            }
            Method::Awq => (self.qweight[k * (self.n >> 3) + (n >> 3)] >> (4 * AWQ_NIBBLE[n & 7])) & mask,
        }
    }

    /// Zero point of group `g`, output `n`, with the v1 offset applied (1..=2^bits for v1).
    pub fn zero(&self, s: &Scheme, g: usize, n: usize) -> u32 {
        let (pw, mask) = (s.per_word(), s.max_code());
        let word = self.qzeros[g * (self.n / pw) + n / pw];
        let shift = match s.method {
            Method::Gptq => s.bits as usize * (n % pw),
            Method::Awq => 4 * AWQ_NIBBLE[n % pw],
        };
        ((word >> shift) & mask) + u32::from(s.zeros_minus_one)
    }

    /// Scale of group `g`, output `n`, as f16 bits.
    pub fn scale_bits(&self, g: usize, n: usize) -> u16 {
        self.scales[g * self.n + n]
    }
}

/// Nibble of an AWQ word that holds output `j` (0..8) of its 8: the inverse of [`AWQ_ORDER`] (checked in a test).
const AWQ_NIBBLE: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// CPU reference: `W [n, k]` row-major in f32, element by element `scale * (q - z)` (the product of an f16 and a
/// small integer, exact in f32).
pub fn dequantize(s: &Scheme, t: &GptqTensors) -> Vec<f32> {
    let mut w = vec![0f32; t.n * t.k];
    for k in 0..t.k {
        let g = t.group(s, k);
        for n in 0..t.n {
            let d = f16_to_f32(t.scale_bits(g, n));
            w[n * t.k + k] = d * (t.code(s, k, n) as f32 - t.zero(s, g, n) as f32);
        }
    }
    w
}

/// A layer in ggml blocks: `n` rows of `k / 32` blocks of `ty`, over the columns in `perm` order when present.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repacked {
    pub ty: GgmlType,
    pub raw: Vec<u8>,
    /// Column `j` of the blocks holds input `perm[j]` (act-order); `None` is the natural order.
    pub perm: Option<Vec<u32>>,
}

/// Repack one layer into ggml blocks (see the module doc for the formats and the rounding bound). `prefix` names
/// the layer in errors.
pub fn repack(s: &Scheme, t: &GptqTensors, prefix: &str) -> Result<Repacked> {
    s.check()?;
    let (n, k) = (t.n, t.k);
    let groups: Vec<usize> = (0..k).map(|i| t.group(s, i)).collect();
    let mut order: Vec<usize> = (0..k).collect();
    order.sort_by_key(|&i| groups[i]); // stable: inputs of one group keep their order
    let nb = k / 32;
    for b in 0..nb {
        let g = groups[order[32 * b]];
        if let Some(j) = (1..32).find(|&j| groups[order[32 * b + j]] != g) {
            return Err(Error::Invalid(format!(
                "{prefix}: inputs {} and {} of a 32-input block fall in groups {g} and {}: group sizes must be \
                 multiples of 32 to repack into 32-weight blocks",
                order[32 * b],
                order[32 * b + j],
                groups[order[32 * b + j]]
            )));
        }
    }
    let half = 1u32 << (s.bits - 1);
    let mut symmetric = true;
    for g in 0..s.groups(k) {
        for o in 0..n {
            let z = t.zero(s, g, o);
            symmetric &= z == half;
            let m = f16_to_f32(t.scale_bits(g, o)) * z as f32;
            if !f16_to_f32(f32_to_f16(m)).is_finite() {
                return Err(Error::Invalid(format!(
                    "{prefix}: scale {} times zero {z} (group {g}, output {o}) overflows an f16 minimum",
                    f16_to_f32(t.scale_bits(g, o))
                )));
            }
        }
    }
    let ty = match (s.bits, symmetric) {
        (4, true) => GgmlType::Q4_0,
        (4, false) => GgmlType::Q4_1,
        (8, true) => GgmlType::Q8_0,
        _ => {
            return Err(Error::Invalid(format!(
                "{prefix}: 8-bit weights with zero points other than 128 (asymmetric) have no ggml block format \
                 here (Q8_0 has no minimum)"
            )))
        }
    };
    let blocks = Blocks {
        s,
        t,
        ty,
        order: &order,
        groups: &groups,
    };
    // Rows split over the CPU's threads (a 7B model repacks ~6.5e9 weights at load).
    let row_bytes = nb * ty.type_size();
    let mut raw = vec![0u8; n * row_bytes];
    let threads = std::thread::available_parallelism()
        .map_or(1, |t| t.get())
        .min(n.div_ceil(64));
    let rows_per = n.div_ceil(threads.max(1));
    std::thread::scope(|scope| {
        for (i, chunk) in raw.chunks_mut(rows_per * row_bytes).enumerate() {
            let blocks = &blocks;
            scope.spawn(move || blocks.fill(i * rows_per, chunk));
        }
    });
    let identity = order.iter().enumerate().all(|(j, &i)| i == j);
    Ok(Repacked {
        ty,
        raw,
        perm: (!identity).then(|| order.iter().map(|&i| i as u32).collect()),
    })
}

/// What [`repack`] writes blocks from: a checked layer, its block type, and its columns in block order.
struct Blocks<'a> {
    s: &'a Scheme,
    t: &'a GptqTensors,
    ty: GgmlType,
    /// Input of each column of the blocks `[K]`.
    order: &'a [usize],
    /// Group of each input `[K]`.
    groups: &'a [usize],
}

/// The 8 nibbles of `w` in the low nibbles of 8 bytes (nibble `j` in byte `j`).
fn spread_nibbles(w: u32) -> u64 {
    let mut x = w as u64;
    x = (x | x << 16) & 0x0000_ffff_0000_ffff;
    x = (x | x << 8) & 0x00ff_00ff_00ff_00ff;
    (x | x << 4) & 0x0f0f_0f0f_0f0f_0f0f
}

impl Blocks<'_> {
    /// Blocks of rows `o0 ..` into `out` (whole rows of `K / 32` blocks).
    fn fill(&self, o0: usize, out: &mut [u8]) {
        let (s, t, ty) = (self.s, self.t, self.ty);
        let (nb, bb) = (t.k / 32, ty.type_size());
        let mut codes = [0u32; 32];
        for b in 0..nb {
            let cols = &self.order[32 * b..32 * b + 32];
            let g = self.groups[cols[0]];
            // 4-bit GPTQ over 32 aligned consecutive inputs: the block's codes are 4 whole qweight words.
            let words_row = (s.method == Method::Gptq && s.bits == 4 && cols[0].is_multiple_of(32))
                .then_some(cols[0] / 8)
                .filter(|_| cols.iter().enumerate().all(|(j, &c)| c == cols[0] + j));
            for (r, blk) in out.chunks_exact_mut(nb * bb).enumerate() {
                let o = o0 + r;
                let blk = &mut blk[b * bb..(b + 1) * bb];
                let d = t.scale_bits(g, o);
                blk[0..2].copy_from_slice(&d.to_le_bytes());
                let qs = match ty {
                    GgmlType::Q4_0 => q4_0::QS_OFFSET,
                    GgmlType::Q4_1 => {
                        let m = -f16_to_f32(d) * t.zero(s, g, o) as f32; // exact in f32: 11 bits times 5 bits
                        blk[q4_1::M_OFFSET..q4_1::M_OFFSET + 2].copy_from_slice(&f32_to_f16(m).to_le_bytes());
                        q4_1::QS_OFFSET
                    }
                    _ => q8_0::QS_OFFSET,
                };
                if let Some(row) = words_row {
                    // Byte j: input j low, input j + 16 high; words hold inputs 0..8, 8..16, 16..24, 24..32.
                    let w = |i: usize| t.qweight[(row + i) * t.n + o];
                    let lo = spread_nibbles(w(0)) | spread_nibbles(w(2)) << 4;
                    let hi = spread_nibbles(w(1)) | spread_nibbles(w(3)) << 4;
                    blk[qs..qs + 8].copy_from_slice(&lo.to_le_bytes());
                    blk[qs + 8..qs + 16].copy_from_slice(&hi.to_le_bytes());
                    continue;
                }
                for (c, &col) in codes.iter_mut().zip(cols) {
                    *c = t.code(s, col, o);
                }
                if ty == GgmlType::Q8_0 {
                    for j in 0..32 {
                        blk[qs + j] = (codes[j] as i32 - 128) as i8 as u8;
                    }
                } else {
                    for j in 0..16 {
                        blk[qs + j] = (codes[j] | (codes[j + 16] << 4)) as u8;
                    }
                }
            }
        }
    }
}

/// Round-to-nearest quantization of `w [n, k]` (row-major f32) into the exact on-disk tensors of `s`, one scale
/// and zero per (group, output) from the group's range (GPTQ's quantizer without the Hessian update):
/// symmetric: `scale = 2 max|x| / (2^bits - 1)`, `z = 2^(bits-1)`; asymmetric: the range widened to include 0,
/// `scale = (max - min) / (2^bits - 1)`, `z = round(-min / scale)`. Scales are rounded to f16 before the codes are
/// computed, so the codes fit the stored scale. In the GPTQ v1 format a zero of 0 cannot be stored (it would read
/// back as 2^bits), so such a group takes `z = 1` and `scale = range / (2^bits - 2)`.
///
/// `g_idx` (GPTQ only) gives each input's group (act-order checkpoints); `None` uses `k / group_size`. GPTQ
/// tensors always carry `g_idx`, as AutoGPTQ writes them.
pub fn quantize(s: &Scheme, w: &[f32], n: usize, k: usize, sym: bool, g_idx: Option<&[i32]>) -> Result<GptqTensors> {
    s.check()?;
    let pw = s.per_word();
    if n == 0 || k == 0 || !n.is_multiple_of(pw) || !k.is_multiple_of(32) || w.len() != n * k {
        return Err(Error::Invalid(format!(
            "quantize [{n}, {k}] from {} values: N must be a multiple of {pw} and K of 32",
            w.len()
        )));
    }
    let ng = s.groups(k);
    let groups: Vec<usize> = match g_idx {
        Some(_) if s.method == Method::Awq => return Err(Error::Invalid("AWQ has no g_idx".into())),
        Some(gi) if gi.len() != k || gi.iter().any(|&x| x < 0 || x as usize >= ng) => {
            return Err(Error::Invalid(format!("g_idx: want {k} groups in 0..{ng}")))
        }
        Some(gi) => gi.iter().map(|&x| x as usize).collect(),
        None => (0..k).map(|i| s.default_group(i)).collect(),
    };
    let maxq = s.max_code() as f32;
    let mut t = GptqTensors {
        n,
        k,
        qweight: Vec::new(),
        qzeros: Vec::new(),
        scales: vec![0; ng * n],
        g_idx: (s.method == Method::Gptq).then(|| groups.iter().map(|&x| x as i32).collect()),
    };
    t.qweight = vec![0; t.qweight_shape(s).iter().product()];
    t.qzeros = vec![0; ng * n / pw];
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); ng];
    for (i, &g) in groups.iter().enumerate() {
        members[g].push(i);
    }
    for (g, ks) in members.iter().enumerate() {
        for o in 0..n {
            let xs = ks.iter().map(|&i| w[o * k + i]);
            let (lo, hi) = xs.fold((0f32, 0f32), |(a, b), x| (a.min(x), b.max(x)));
            let (scale, z) = if sym {
                let amax = lo.abs().max(hi);
                (2.0 * amax / maxq, (maxq + 1.0) / 2.0)
            } else {
                let scale = (hi - lo) / maxq;
                let z = if scale > 0.0 { (-lo / scale).round() } else { 0.0 };
                if z == 0.0 && s.zeros_minus_one {
                    ((hi - lo) / (maxq - 1.0), 1.0)
                } else {
                    (scale, z)
                }
            };
            let mut d = f32_to_f16(scale);
            if !f16_to_f32(d).is_finite() {
                return Err(Error::Invalid(format!(
                    "group {g} of output {o}: scale {scale} overflows f16"
                )));
            }
            if f16_to_f32(d) == 0.0 {
                d = f32_to_f16(1.0); // an all-zero group (or one below f16's range): every code is z
            }
            let df = f16_to_f32(d);
            t.scales[g * n + o] = d;
            let stored = z as u32 - u32::from(s.zeros_minus_one);
            let (zw, zshift) = match s.method {
                Method::Gptq => (g * (n / pw) + o / pw, s.bits as usize * (o % pw)),
                Method::Awq => (g * (n / pw) + o / pw, 4 * AWQ_NIBBLE[o % pw]),
            };
            t.qzeros[zw] |= stored << zshift;
            for &i in ks {
                let q = ((w[o * k + i] / df).round() + z).clamp(0.0, maxq) as u32;
                let (at, shift) = match s.method {
                    Method::Gptq => ((i / pw) * n + o, s.bits as usize * (i % pw)),
                    Method::Awq => (i * (n / pw) + o / pw, 4 * AWQ_NIBBLE[o % pw]),
                };
                t.qweight[at] |= q << shift;
            }
        }
    }
    Ok(t)
}

/// [`quantize`] into 4-bit GPTQ v1 tensors (what AutoGPTQ writes); `group_size` -1 is one group over K.
pub fn quantize_rtn(w: &[f32], n: usize, k: usize, group_size: i64, sym: bool) -> Result<GptqTensors> {
    let gs = match group_size {
        -1 => None,
        g if g > 0 => Some(g as usize),
        g => return Err(Error::Invalid(format!("group size {g}"))),
    };
    quantize(&Scheme::gptq(4, gs), w, n, k, sym, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weights(n: usize, k: usize, seed: u32) -> Vec<f32> {
        (0..n * k)
            .map(|i| {
                let h = (i as u32)
                    .wrapping_mul(2654435761)
                    .wrapping_add(seed.wrapping_mul(40503))
                    >> 8;
                h as f32 / (1 << 24) as f32 - 0.4 + 0.05 * (i % 7) as f32
            })
            .collect()
    }

    /// A shuffled act-order assignment: each group keeps `gs` members, scattered over K.
    fn shuffled_groups(k: usize, gs: usize, seed: u64) -> Vec<i32> {
        let mut p: Vec<usize> = (0..k).collect();
        let mut st = seed;
        for i in (1..k).rev() {
            st = st.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            p.swap(i, (st >> 33) as usize % (i + 1));
        }
        let mut g = vec![0; k];
        for (rank, &i) in p.iter().enumerate() {
            g[i] = (rank / gs) as i32;
        }
        g
    }

    /// Dequantize the repacked blocks and undo the column permutation.
    fn blocks_to_f32(r: &Repacked, n: usize, k: usize) -> Vec<f32> {
        let wp = crate::quant::dequantize(r.ty, &r.raw).unwrap();
        let mut w = vec![0f32; n * k];
        for o in 0..n {
            for j in 0..k {
                let i = r.perm.as_ref().map_or(j, |p| p[j] as usize);
                w[o * k + i] = wp[o * k + j];
            }
        }
        w
    }

    #[test]
    fn gptq_repack_matches_the_format_dequantization() {
        for (sym, gs, act, minus_one) in [
            (true, Some(32), false, true),
            (false, Some(64), false, true),
            (false, None, false, false),
            (true, Some(32), true, true),
            (false, Some(64), true, false),
        ] {
            let (n, k) = (136, 256); // over 64 rows: split over threads where there are several
            let mut s = Scheme::gptq(4, gs);
            s.zeros_minus_one = minus_one;
            let gi = act.then(|| shuffled_groups(k, gs.unwrap(), 5));
            let t = quantize(&s, &weights(n, k, 3), n, k, sym, gi.as_deref()).unwrap();
            let r = repack(&s, &t, "x").unwrap();
            assert_eq!(r.ty, if sym { GgmlType::Q4_0 } else { GgmlType::Q4_1 });
            assert_eq!(r.perm.is_some(), act);
            let want = dequantize(&s, &t);
            let got = blocks_to_f32(&r, n, k);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                let (o, kk) = (i / k, i % k);
                let g = t.group(&s, kk);
                let sz = (f16_to_f32(t.scale_bits(g, o)) * t.zero(&s, g, o) as f32).abs();
                // m = -scale * z rounded to f16 (half an ulp), then d * q + m rounded in f32.
                let bound = if sym { 0.0 } else { sz / 2048.0 + 1e-6 * (1.0 + b.abs()) };
                assert!(
                    (a - b).abs() <= bound,
                    "sym {sym} gs {gs:?} act {act}: {a} vs {b} at {i}"
                );
            }
        }
    }

    #[test]
    fn gptq_quantize_is_close_to_the_weights() {
        // RTN error is at most half a step (scale / 2) inside the range; the f16 rounding of the scale can push the
        // clamped ends a little past it (15 steps x 2^-11).
        let (n, k) = (16, 128);
        let w = weights(n, k, 9);
        for sym in [true, false] {
            let s = Scheme::gptq(4, Some(32));
            let t = quantize(&s, &w, n, k, sym, None).unwrap();
            let d = dequantize(&s, &t);
            for (i, (a, b)) in d.iter().zip(&w).enumerate() {
                let step = f16_to_f32(t.scale_bits(i % k / 32, i / k));
                assert!((a - b).abs() <= 0.51 * step + 1e-6, "sym {sym}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn gptq_v1_zero_of_zero_stays_representable() {
        // A group of non-negative weights has min 0, hence z = 0, which v1 cannot store: z = 1 instead.
        let (n, k) = (8, 32);
        let w: Vec<f32> = (0..n * k).map(|i| (i % 32) as f32 * 0.01).collect();
        let s = Scheme::gptq(4, Some(32));
        let t = quantize(&s, &w, n, k, false, None).unwrap();
        assert!((0..n).all(|o| t.zero(&s, 0, o) == 1));
        let d = dequantize(&s, &t);
        let worst = d.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        // Half a step of 0.31 / 14, plus the f16 rounding of the scale over 14 steps.
        assert!(worst <= 0.31 / 14.0 / 2.0 + 2e-4, "worst {worst}");
    }

    #[test]
    fn gptq_8bit_sym_repacks_to_q8_0_exactly() {
        let (n, k) = (8, 64);
        let s = Scheme::gptq(8, Some(32));
        let t = quantize(&s, &weights(n, k, 1), n, k, true, None).unwrap();
        let r = repack(&s, &t, "x").unwrap();
        assert_eq!(r.ty, GgmlType::Q8_0);
        assert_eq!(blocks_to_f32(&r, n, k), dequantize(&s, &t));
        let asym = quantize(&s, &weights(n, k, 1), n, k, false, None).unwrap();
        assert!(repack(&s, &asym, "x").is_err());
    }

    #[test]
    fn awq_nibble_order_and_repack() {
        for (i, &o) in AWQ_ORDER.iter().enumerate() {
            assert_eq!(AWQ_NIBBLE[o], i);
        }
        let (n, k) = (16, 64);
        let s = Scheme::awq(Some(32));
        let t = quantize(&s, &weights(n, k, 4), n, k, false, None).unwrap();
        // Output 1 of a word sits in nibble 4 (bits 16..20), output 2 in nibble 1.
        assert_eq!(t.code(&s, 5, 1), (t.qweight[5 * 2] >> 16) & 15);
        assert_eq!(t.code(&s, 5, 2), (t.qweight[5 * 2] >> 4) & 15);
        let r = repack(&s, &t, "x").unwrap();
        let want = dequantize(&s, &t);
        for (i, (a, b)) in blocks_to_f32(&r, n, k).iter().zip(&want).enumerate() {
            let (o, g) = (i / k, i % k / 32);
            // m = -scale * z rounded to f16 (half an ulp), then d * q + m rounded in f32.
            let sz = (f16_to_f32(t.scale_bits(g, o)) * t.zero(&s, g, o) as f32).abs();
            assert!(
                (a - b).abs() <= sz / 2048.0 + 1e-6 * (1.0 + b.abs()),
                "{a} vs {b} at {i}"
            );
        }
    }

    #[test]
    fn gptq_groups_off_the_32_grid_are_errors() {
        assert!(Scheme::gptq(4, Some(48)).check().is_err());
        assert!(Scheme::gptq(3, Some(128)).check().is_err());
        assert!(Scheme::awq(Some(16)).check().is_err());
        // An act-order g_idx whose group 0 has 16 inputs and group 1 has 48: the first sorted block straddles two
        // groups, which the block check rejects, naming the layer.
        let (n, k) = (8, 64);
        let s = Scheme::gptq(4, Some(32));
        let mut bad = quantize(&s, &weights(n, k, 2), n, k, true, None).unwrap();
        bad.g_idx = Some((0..k as i32).map(|i| i32::from(i % 4 != 0)).collect());
        let e = repack(&s, &bad, "layer.q").unwrap_err().to_string();
        assert!(e.contains("layer.q") && e.contains("multiples of 32"), "{e}");
    }
}
