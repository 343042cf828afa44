//! GPU layouts of block-quantized weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q4_K, Q5_K, Q6_K, IQ4_XS, Q2_K,
//! Q3_K): raw GGUF blocks of a `[N, K]` tensor are repacked once at load into the layout the adapter's kernels
//! read, as `u32` words split into row parts that each fit one storage binding ([`crate::gpu::packed`] uploads them). Weights stay quantized
//! on the device; `matmul_q` and `embedding_q` dequantize in registers.
//!
//! The kernels read 32-weight blocks of 4-bit nibbles (plus 1 or 2 high-bit words for 5- and 6-bit quants) or 8-bit
//! quants, with one or two f16 constants. Super-blocks are first converted to such blocks ([`blocks32`]): Q4_K to
//! Q4_1 blocks, Q5_K to Q5_1 blocks, IQ4_XS to IQ4_NL blocks, Q6_K to 6-bit blocks with two scales (one per half of
//! 16 weights); see their modules. The per-block constants are the super-block factor times the sub-block code,
//! rounded once to f16 (relative error at most 2^-11); the quants are unchanged. Device bytes per 32 weights (file
//! bytes in brackets): Q4_0 18 (18), Q4_1 20 (20), Q5_0 22 (22), Q5_1 24 (24), Q8_0 34 (34), IQ4_NL 18 (18), Q4_K
//! 18.5 (18: 1.03x, below), Q5_K 24 (22: 1.09x), Q6_K 28 (26.25: 1.07x), IQ4_XS 18 (17: 1.06x).
//!
//! Both layouts keep ggml's nibble order inside a 32-weight block: quant word `i` (0..4 for 4-bit, 0..8 for Q8) of
//! a block is bytes `4i..4i+4` of its `qs`. A nibble word `i` holds weights `4i..4i+4` in the low nibbles of its
//! bytes and weights `16+4i..16+4i+4` in the high nibbles; a Q8 word holds weights `4i..4i+4` as i8. After the
//! quant words come the high-bit words (Q5_0, Q5_1, Q5_K: one, bit 4 of each quant; Q6_K: two, bits 4 and 5),
//! permuted from ggml's order (bit `j` = weight `j`) so that the kernels move them next to the nibbles with one
//! shift and mask per word ([`hb_to_device`]): device bit `8b + i` is weight `4i + b`'s and bit `8b + 4 + i` is
//! weight `16 + 4i + b`'s. With WB words per block (quant words plus high-bit words) the quants buffer holds as many
//! bytes as the file's quants.
//! The second constant of a block (where there is one) is a min added to every weight (Q4_1, Q5_1, Q4_K, Q5_K) or
//! the scale of weights 16..32, the high nibbles (Q6_K: the first scale applies to weights 0..16); it is stored
//! where Q4_1 stores its min.
//!
//! Q2_K and Q3_K ("super" formats, [`Format::super_block`]): their 16-weight sub-blocks would make two f16
//! constants per 32 weights (and two mins for Q2_K), 1.16x to 1.5x the file. Instead a block keeps its two
//! sub-block codes (16 bits: Q2_K's 4-bit scale and min pairs, Q3_K's two 6-bit scales) where the other formats keep
//! their f16 `d`, and the super-block factors (Q2_K: `d` and `dmin`, Q3_K: `d`, f16) are stored once per 256
//! weights in a third buffer (`mins`, in both layouts); the kernels multiply code and factor in f32, exactly. The
//! quants are 2 words of 2-bit fields (word t, bits `8b + 2i`: weight `16t + 4i + b`, so one shift and mask gives 4
//! byte quants), and Q3_K's high-bit word follows in the [`hb_to_device`] order (bit `8b + 4t + i`). Device bytes
//! per 32 weights: Q2_K 10.5 (10.5: 1.00x), Q3_K 14.25 (13.75: 1.04x).
//!
//! Q4_K takes the same form (shader flag `K4`): Q4_1's nibbles, a block's 6-bit scale and min codes (`sc | m << 8`)
//! where Q4_1 keeps `d`, and `d`, `dmin` per super-block in the third buffer laid out as Q2_K's; every Q4_K kernel
//! (GEMV, GEMM, the rows f16 variant, embedding, MoE) forms `d * sc` and `-dmin * m` in f32, ggml's exact values.
//! Device bytes per 32 weights: 18.5 (18: 1.03x).
//!
//! * [`Layout::Tiled`] (CPU adapters such as lavapipe; LAVAPIPE.md §4, "chunk-tiled"): rows come in tiles of
//!   [`TILE`] = 32 (8 SIMD lanes x 4 outputs; N is padded with zero rows). Words are `vec4<u32>` at index
//!   `((tile * G + g) * WB + i) * 8 + lane`, component `j` = word `i` of block `g` of row `32 tile + 4 lane + j`
//!   (G = K/32 blocks per row): the 8 lanes of a chunk read 128 contiguous bytes and the next word (then the next
//!   block) continues right after. Scales use the same tiling per block: at
//!   `(tile * G + g) * 8 + lane` a `vec2<u32>` of the 4 rows' `d` as f16 pairs (row `4 lane + 2h` in the low half of
//!   word `h`), or with a second constant a `vec4<u32>` (d01, d23, m01, m23). There is no `mins` buffer.
//! * [`Layout::Rows`] (GPUs): words row-major, `[N, G * WB]` (a row's blocks in order, coalesced along K);
//!   scales `[N, ceil(G/2)]` words of f16 pairs (block `2w` in the low half of word `w`); second constants (mins,
//!   Q6_K's second scales) likewise in a `mins` buffer.

use super::{iq4_nl, iq4_xs, q2_k, q3_k, q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0, GgmlType};
use crate::error::{Error, Result};
use std::borrow::Cow;

/// Weights per block, for every format here.
pub const QK: usize = 32;
/// Rows per tile of the tiled layout: 8 lanes of a SIMD chunk x 4 outputs per lane.
pub const TILE: usize = 32;
/// Lanes per tile.
pub const LANES: usize = 8;
/// Rows per part granule of the rows layout (the GPU kernel's rows per workgroup).
pub const ROWS_GRANULE: usize = 4;

/// Where the packed words go: chosen from the adapter type at load ([`Layout::for_caps`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Chunk-tiled, for CPU adapters (lavapipe).
    Tiled,
    /// Row-major quants with separate scale (and min) arrays, for GPUs.
    Rows,
}

impl Layout {
    pub fn for_caps(caps: &crate::gpu::Caps) -> Layout {
        if caps.cpu_adapter {
            Layout::Tiled
        } else {
            Layout::Rows
        }
    }

    /// Rows each part holds a whole number of.
    pub fn granule(self) -> usize {
        match self {
            Layout::Tiled => TILE,
            Layout::Rows => ROWS_GRANULE,
        }
    }
}

/// The packable GGUF types, in the order tests and variant lists use.
/// (New types go last: test grids that pair cases with positions keep their old cases.)
pub const PACKABLE: [GgmlType; 12] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
];

/// One format per distinct kernel block type (Q4_K, Q5_K and IQ4_XS read as Q4_1, Q5_1 and IQ4_NL and share their
/// shaders): the formats variant lists cover.
pub fn kernel_formats() -> impl Iterator<Item = Format> {
    PACKABLE
        .into_iter()
        .map(|ty| Format { ty })
        .filter(|f| f.kernel_ty() == f.ty)
}

/// A packable GGUF type with the geometry of the 32-weight blocks the kernels read for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Format {
    pub ty: GgmlType,
}

impl Format {
    /// One of [`PACKABLE`]; anything else is an error.
    pub fn new(ty: GgmlType) -> Result<Format> {
        if PACKABLE.contains(&ty) {
            return Ok(Format { ty });
        }
        let names: Vec<&str> = PACKABLE.iter().map(|t| t.name()).collect();
        Err(Error::Invalid(format!(
            "{ty} weights cannot be packed for matmul_q ({} only)",
            names.join(", ")
        )))
    }
    /// The type whose 32-weight blocks the kernels read: Q4_K reads as Q4_1, Q5_K as Q5_1, IQ4_XS as IQ4_NL (the
    /// other types as themselves; Q6_K's blocks are its own). Formats with the same kernel type share shaders.
    pub fn kernel_ty(self) -> GgmlType {
        match self.ty {
            GgmlType::Q5_K => GgmlType::Q5_1,
            GgmlType::IQ4_XS => GgmlType::IQ4_NL,
            t => t,
        }
    }
    /// 2-bit quant words, two sub-block codes per block and super-block factors in a third buffer (Q2_K, Q3_K).
    pub fn super_block(self) -> bool {
        matches!(self.ty, GgmlType::Q2_K | GgmlType::Q3_K)
    }
    /// Whether the packed weight has a third buffer (`mins`): second constants in the rows layout, or super-block
    /// factors.
    pub fn third_buffer(self, layout: Layout) -> bool {
        self.coded() || (layout == Layout::Rows && self.pair())
    }
    /// 16-bit sub-block codes in place of the f16 scale, with the super-block factors in the third buffer (Q2_K,
    /// Q3_K, Q4_K).
    pub fn coded(self) -> bool {
        self.super_block() || self.ty == GgmlType::Q4_K
    }
    /// Two super-block factors (`d` and `dmin`: Q2_K, Q4_K).
    pub fn two_factors(self) -> bool {
        matches!(self.ty, GgmlType::Q2_K | GgmlType::Q4_K)
    }
    /// Whether the rows-layout kernels have an f16 form for this format (not the super formats yet).
    pub fn f16_kernels(self) -> bool {
        !self.super_block()
    }
    /// 8-bit quants (Q8_0).
    pub fn q8(self) -> bool {
        self.ty == GgmlType::Q8_0
    }
    /// A per-block minimum, added to every weight (Q4_1, Q5_1, Q4_K, Q5_K).
    pub fn has_min(self) -> bool {
        matches!(self.kernel_ty(), GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K)
    }
    /// A second scale for weights 16..32 of a block, i.e. the high nibbles (Q6_K).
    pub fn split_scale(self) -> bool {
        self.ty == GgmlType::Q6_K
    }
    /// High-bit words per block: 1 for 5-bit quants (Q5_0, Q5_1, Q5_K) and Q3_K, 2 for 6-bit (Q6_K), else 0.
    pub fn high_bits(self) -> usize {
        match self.kernel_ty() {
            GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q3_K => 1,
            GgmlType::Q6_K => 2,
            _ => 0,
        }
    }
    /// Nibbles index the IQ4_NL codebook (IQ4_NL, IQ4_XS).
    pub fn codebook(self) -> bool {
        self.kernel_ty() == GgmlType::IQ4_NL
    }
    /// The offset `c` of formats whose weights are `d * (q - c)` (Q4_0 8, Q5_0 16, Q6_K 32, Q3_K 4); 0 for the
    /// others.
    pub fn centre(self) -> u32 {
        match self.kernel_ty() {
            GgmlType::Q3_K => 4,
            GgmlType::Q4_0 => 8,
            GgmlType::Q5_0 => 16,
            GgmlType::Q6_K => 32,
            _ => 0,
        }
    }
    /// Two f16 constants per block (a min or a second scale), stored alike (not Q4_K: its min is formed from its
    /// code).
    pub fn pair(self) -> bool {
        (self.has_min() && !self.coded()) || self.split_scale()
    }
    /// Whether the kernels need the sum of x over a block: the offsets and the mins are folded out with it (Q6_K
    /// needs the sums of each half).
    pub fn needs_x_sum(self) -> bool {
        self.centre() != 0 || self.has_min() || self.super_block()
    }
    /// Quant words per block (4 for 4-bit nibbles, 8 for Q8, 2 for the 2-bit words of the super formats), not
    /// counting the high-bit words.
    pub fn quant_words(self) -> usize {
        if self.q8() {
            8
        } else if self.super_block() {
            2
        } else {
            4
        }
    }
    /// Device words per block: the quant words and the high-bit words.
    pub fn words_per_block(self) -> usize {
        self.quant_words() + self.high_bits()
    }
    /// Bytes of one 32-weight block of [`blocks32`] (the GGUF block, or the repacked one; for the super formats the
    /// host form, which repeats the super-block factors in every block).
    pub fn block_bytes(self) -> usize {
        match self.ty {
            GgmlType::Q2_K => q2_k::BLOCK32_BYTES,
            GgmlType::Q3_K => q3_k::BLOCK32_BYTES,
            GgmlType::Q4_K => q4_k::BLOCK32_BYTES,
            _ => 2 + 2 * usize::from(self.pair()) + 4 * self.words_per_block(),
        }
    }
    /// Super-block factor bytes per row and super-block on the device (Q2_K: `d` and `dmin`, Q3_K: `d`), else 0.
    fn super_bytes(self) -> usize {
        match self.ty {
            GgmlType::Q2_K | GgmlType::Q4_K => 4,
            GgmlType::Q3_K => 2,
            _ => 0,
        }
    }
    /// Device bytes per 32 weights in either layout (without the padding of partial tiles or odd block counts):
    /// the words, the f16 constants or the 16-bit codes, and the super formats' factors over 8 blocks.
    pub fn device_bytes(self) -> f64 {
        (4 * self.words_per_block() + 2 + 2 * usize::from(self.pair())) as f64 + self.super_bytes() as f64 / 8.0
    }
    /// Byte offsets in a block of `qs` and of the high-bit words.
    fn offsets(self) -> (usize, usize) {
        match self.kernel_ty() {
            GgmlType::Q4_0 => (q4_0::QS_OFFSET, 0),
            GgmlType::Q4_1 => (q4_1::QS_OFFSET, 0),
            GgmlType::Q5_0 => (q5_0::QS_OFFSET, q5_0::QH_OFFSET),
            GgmlType::Q5_1 => (q5_1::QS_OFFSET, q5_1::QH_OFFSET),
            GgmlType::Q8_0 => (q8_0::QS_OFFSET, 0),
            GgmlType::IQ4_NL => (iq4_nl::QS_OFFSET, 0),
            GgmlType::Q2_K => (q2_k::BLOCK32_Q, 0),
            GgmlType::Q3_K => (q3_k::BLOCK32_Q, q3_k::BLOCK32_H),
            GgmlType::Q4_K => (q4_k::BLOCK32_Q, 0),
            _ => (q6_k::BLOCK32_QS, q6_k::BLOCK32_QH),
        }
    }
    /// Byte offset in a block of device word `i` (quant words first, then high-bit words).
    fn word_offset(self, i: usize) -> usize {
        let (qs, qh) = self.offsets();
        let wq = self.quant_words();
        if i < wq {
            qs + 4 * i
        } else {
            qh + 4 * (i - wq)
        }
    }
}

/// A high-bit word from ggml's order (bit `j` = weight `j`) to the device order of the module doc: bit `8b + i` =
/// weight `4i + b`, bit `8b + 4 + i` = weight `16 + 4i + b`, so nibble word `i` finds its 8 high bits at bit `i`
/// (low nibbles) and `4 + i` (high nibbles) of each byte: one shift and one mask put them at bit 4 of their quant's
/// byte.
pub fn hb_to_device(w: u32) -> u32 {
    let mut o = 0;
    for b in 0..4 {
        for i in 0..4 {
            o |= ((w >> (4 * i + b)) & 1) << (8 * b + i);
            o |= ((w >> (16 + 4 * i + b)) & 1) << (8 * b + 4 + i);
        }
    }
    o
}

/// Inverse of [`hb_to_device`].
pub fn hb_from_device(o: u32) -> u32 {
    let mut w = 0;
    for b in 0..4 {
        for i in 0..4 {
            w |= ((o >> (8 * b + i)) & 1) << (4 * i + b);
            w |= ((o >> (8 * b + 4 + i)) & 1) << (16 + 4 * i + b);
        }
    }
    w
}

/// The 32-weight blocks the kernels read, from raw GGUF data of a packable type: the data itself for the 32-weight
/// types; super-blocks repacked (an error when a block constant does not fit an f16).
pub fn blocks32(ty: GgmlType, raw: &[u8]) -> Result<Cow<'_, [u8]>> {
    Format::new(ty)?;
    Ok(match ty {
        GgmlType::Q4_K => Cow::Owned(q4_k::to_blocks32(raw)?),
        GgmlType::Q5_K => Cow::Owned(q5_k::to_q5_1(raw)?),
        GgmlType::Q6_K => Cow::Owned(q6_k::to_blocks32(raw)?),
        GgmlType::IQ4_XS => Cow::Owned(iq4_xs::to_iq4_nl(raw)?),
        GgmlType::Q2_K => Cow::Owned(q2_k::to_blocks32(raw)?),
        GgmlType::Q3_K => Cow::Owned(q3_k::to_blocks32(raw)?),
        _ => Cow::Borrowed(raw),
    })
}

/// The weights the kernels compute from raw GGUF data of a packable type: the CPU dequantization of [`blocks32`].
/// For the 32-weight types and the super formats (Q2_K, Q3_K: their constants are formed exactly in the kernels) this
/// is [`super::dequantize`]; for the other super-block types it differs from it only by the f16 rounding of the
/// block constants.
pub fn dequantize_packed(ty: GgmlType, raw: &[u8]) -> Result<Vec<f32>> {
    let format = Format::new(ty)?;
    if format.coded() {
        return super::dequantize(ty, raw);
    }
    let blocks = blocks32(ty, raw)?;
    let mut out = vec![0f32; blocks.len() / format.block_bytes() * QK];
    match ty {
        GgmlType::Q6_K => q6_k::dequantize_blocks32(&blocks, &mut out)?,
        _ => super::dequantize_into(format.kernel_ty(), &blocks, &mut out)?,
    }
    Ok(out)
}

/// Words of each buffer for `rows` rows (a multiple of the layout's granule) of a `K = 32 g` matrix (for the super
/// formats g is a multiple of 8: the third buffer holds `g / 8` super-blocks of factors a row).
fn words(format: Format, layout: Layout, rows: usize, g: usize) -> (usize, usize, usize) {
    let q = rows * g * format.words_per_block();
    let sb = g / 8;
    match layout {
        Layout::Tiled => {
            let m = rows * sb * format.super_bytes() / 4;
            (q, rows / 4 * g * if format.pair() { 4 } else { 2 }, m)
        }
        Layout::Rows => {
            let s = rows * g.div_ceil(2);
            let m = match format.ty {
                GgmlType::Q2_K | GgmlType::Q4_K => rows * sb,
                GgmlType::Q3_K => rows * sb.div_ceil(2),
                _ if format.pair() => s,
                _ => 0,
            };
            (q, s, m)
        }
    }
}

/// Host copy of one part: words of each buffer (mins empty unless two constants per block in the rows layout).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostPart {
    /// First output row and row count (padded rows of the tiled layout excluded).
    pub row0: usize,
    pub rows: usize,
    pub quants: Vec<u32>,
    pub scales: Vec<u32>,
    pub mins: Vec<u32>,
}

/// Checks that `raw` holds `n` rows of `k` weights of `format` in GGUF blocks, returns `G = k / 32`.
pub fn check_raw(format: Format, n: usize, k: usize, raw: &[u8]) -> Result<usize> {
    let bs = format.ty.block_size();
    if n == 0 || k == 0 || !k.is_multiple_of(bs) {
        return Err(Error::shape(
            "pack",
            format!(
                "{} weights [{n}, {k}]: N must be positive and K a positive multiple of {bs}",
                format.ty
            ),
        ));
    }
    let want = (n as u128) * (k / bs) as u128 * format.ty.type_size() as u128;
    if raw.len() as u128 != want {
        return Err(Error::shape(
            "pack",
            format!("{} weights [{n}, {k}] need {want} bytes, got {}", format.ty, raw.len()),
        ));
    }
    if n * k > u32::MAX as usize {
        return Err(Error::shape("pack", format!("[{n}, {k}] has over 2^32 weights")));
    }
    Ok(k / QK)
}

/// Rows per part: the most whole granules whose largest buffer fits `max_binding` bytes.
pub fn rows_per_part(format: Format, layout: Layout, n: usize, k: usize, max_binding: u64) -> Result<usize> {
    let gr = layout.granule();
    let (q, s, m) = words(format, layout, gr, k / QK);
    let granule_bytes = 4 * q.max(s).max(m) as u64;
    if granule_bytes > max_binding {
        return Err(Error::BindingTooLarge {
            name: format!("{} weights with K = {k}", format.ty),
            bytes: granule_bytes,
            limit: max_binding,
        });
    }
    let granules = (max_binding / granule_bytes) as usize;
    Ok((granules * gr).min(n.next_multiple_of(gr)))
}

/// Little-endian u32 at `b[at..at + 4]`.
fn word(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Device word `i` of the 32-weight block `blk` (high-bit words permuted, [`hb_to_device`]; the super formats' host
/// blocks hold them in that order already).
fn device_word(format: Format, blk: &[u8], i: usize) -> u32 {
    let w = word(blk, format.word_offset(i));
    if i < format.quant_words() || format.super_block() {
        w
    } else {
        hb_to_device(w)
    }
}

/// f16 bits at `b[at..at + 2]`.
fn half(b: &[u8], at: usize) -> u32 {
    u16::from_le_bytes([b[at], b[at + 1]]) as u32
}

/// Repack rows `row0..row0 + rows` of the `[n, k]` tensor in 32-weight blocks `raw` (rows past `n` are zero
/// padding).
fn pack_part(format: Format, layout: Layout, n: usize, k: usize, raw: &[u8], row0: usize, rows: usize) -> HostPart {
    let g = k / QK;
    let (bb, wb) = (format.block_bytes(), format.words_per_block());
    let padded = rows.next_multiple_of(layout.granule());
    let (qw, sw, mw) = words(format, layout, padded, g);
    let mut part = HostPart {
        row0,
        rows,
        quants: vec![0; qw],
        scales: vec![0; sw],
        mins: vec![0; mw],
    };
    let block = |r: usize, b: usize| -> Option<&[u8]> {
        let row = row0 + r;
        (r < rows && row < n).then(|| &raw[(row * g + b) * bb..(row * g + b + 1) * bb])
    };
    match layout {
        Layout::Tiled => {
            let per_s = if format.pair() { 4 } else { 2 };
            for tile in 0..padded / TILE {
                for b in 0..g {
                    for lane in 0..LANES {
                        for j in 0..4 {
                            let Some(blk) = block(tile * TILE + 4 * lane + j, b) else {
                                continue;
                            };
                            for i in 0..wb {
                                part.quants[(((tile * g + b) * wb + i) * LANES + lane) * 4 + j] =
                                    device_word(format, blk, i);
                            }
                            let s = ((tile * g + b) * LANES + lane) * per_s;
                            let shift = 16 * (j % 2);
                            part.scales[s + j / 2] |= half(blk, 0) << shift;
                            if format.pair() {
                                part.scales[s + 2 + j / 2] |= half(blk, 2) << shift;
                            }
                            if format.coded() && b % 8 == 0 {
                                // Factors like the scales, per super-block: (d01, d23, dmin01, dmin23) or (d01, d23).
                                let per_m = format.super_bytes(); // 4 rows' factor bytes, in words
                                let m = ((tile * (g / 8) + b / 8) * LANES + lane) * per_m;
                                part.mins[m + j / 2] |= half(blk, 2) << shift;
                                if format.two_factors() {
                                    part.mins[m + 2 + j / 2] |= half(blk, 4) << shift;
                                }
                            }
                        }
                    }
                }
            }
        }
        Layout::Rows => {
            let sw = g.div_ceil(2);
            for r in 0..rows {
                for b in 0..g {
                    let Some(blk) = block(r, b) else { continue };
                    for i in 0..wb {
                        part.quants[(r * g + b) * wb + i] = device_word(format, blk, i);
                    }
                    let shift = 16 * (b % 2);
                    part.scales[r * sw + b / 2] |= half(blk, 0) << shift;
                    if format.pair() {
                        part.mins[r * sw + b / 2] |= half(blk, 2) << shift;
                    }
                    if b % 8 == 0 {
                        // Super-block factors: Q2_K `d | dmin << 16` a word, Q3_K `d` f16 pairs.
                        let sb = b / 8;
                        match format.ty {
                            GgmlType::Q2_K | GgmlType::Q4_K => {
                                part.mins[r * (g / 8) + sb] = half(blk, 2) | half(blk, 4) << 16
                            }
                            GgmlType::Q3_K => {
                                part.mins[r * (g / 8).div_ceil(2) + sb / 2] |= half(blk, 2) << (16 * (sb % 2))
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
    }
    part
}

/// Repack a raw GGUF `[n, k]` tensor of `ty` into `layout`, split into parts of at most `max_binding` bytes each.
pub fn pack(ty: GgmlType, layout: Layout, n: usize, k: usize, raw: &[u8], max_binding: u64) -> Result<Vec<HostPart>> {
    let format = Format::new(ty)?;
    check_raw(format, n, k, raw)?;
    let per = rows_per_part(format, layout, n, k, max_binding)?;
    let blocks = blocks32(ty, raw)?;
    Ok((0..n)
        .step_by(per)
        .map(|row0| pack_part(format, layout, n, k, &blocks, row0, per.min(n - row0)))
        .collect())
}

/// Inverse of [`pack`]: the 32-weight blocks of the `[n, k]` tensor the parts were packed from ([`blocks32`] of
/// the raw GGUF bytes; those bytes themselves for the 32-weight types). For tests and tools.
pub fn unpack(ty: GgmlType, layout: Layout, n: usize, k: usize, parts: &[HostPart]) -> Result<Vec<u8>> {
    let format = Format::new(ty)?;
    let g = k / QK;
    let (bb, wb) = (format.block_bytes(), format.words_per_block());
    let mut raw = vec![0u8; n * g * bb];
    for p in parts {
        let padded = p.rows.next_multiple_of(layout.granule());
        let (qw, sw, mw) = words(format, layout, padded, g);
        if p.quants.len() != qw || p.scales.len() != sw || p.mins.len() != mw || p.row0 + p.rows > n {
            return Err(Error::Invalid(format!(
                "packed part at row {} does not match [{n}, {k}]",
                p.row0
            )));
        }
        for r in 0..p.rows {
            for b in 0..g {
                let at = ((p.row0 + r) * g + b) * bb;
                let blk = &mut raw[at..at + bb];
                // The super formats' factors (d, dmin) of this row's super-block.
                let (sd, sm) = match layout {
                    _ if !format.coded() => (0, 0),
                    Layout::Tiled => {
                        let (tile, lane, j) = (r / TILE, r % TILE / 4, r % 4);
                        let m = ((tile * (g / 8) + b / 8) * LANES + lane) * format.super_bytes();
                        let shift = 16 * (j % 2);
                        let dmin = if format.two_factors() {
                            p.mins[m + 2 + j / 2] >> shift
                        } else {
                            0
                        };
                        (p.mins[m + j / 2] >> shift, dmin)
                    }
                    Layout::Rows if format.two_factors() => {
                        let w = p.mins[r * (g / 8) + b / 8];
                        (w, w >> 16)
                    }
                    Layout::Rows => (p.mins[r * (g / 8).div_ceil(2) + b / 16] >> (16 * (b / 8 % 2)), 0),
                };
                let (d, m, q): (u32, u32, Vec<u32>) = match layout {
                    Layout::Tiled => {
                        let (tile, lane, j) = (r / TILE, r % TILE / 4, r % 4);
                        let per_s = if format.pair() { 4 } else { 2 };
                        let s = ((tile * g + b) * LANES + lane) * per_s;
                        let shift = 16 * (j % 2);
                        let m = if format.pair() {
                            p.scales[s + 2 + j / 2] >> shift
                        } else {
                            0
                        };
                        let q = (0..wb)
                            .map(|i| p.quants[(((tile * g + b) * wb + i) * LANES + lane) * 4 + j])
                            .collect();
                        (p.scales[s + j / 2] >> shift, m, q)
                    }
                    Layout::Rows => {
                        let (w, shift) = (r * g.div_ceil(2) + b / 2, 16 * (b % 2));
                        let m = if format.pair() { p.mins[w] >> shift } else { 0 };
                        (
                            p.scales[w] >> shift,
                            m,
                            (0..wb).map(|i| p.quants[(r * g + b) * wb + i]).collect(),
                        )
                    }
                };
                blk[0..2].copy_from_slice(&(d as u16).to_le_bytes());
                if format.pair() {
                    blk[2..4].copy_from_slice(&(m as u16).to_le_bytes());
                }
                if format.coded() {
                    blk[2..4].copy_from_slice(&(sd as u16).to_le_bytes());
                    blk[4..6].copy_from_slice(&(sm as u16).to_le_bytes());
                }
                for (i, &w) in q.iter().enumerate() {
                    let w = if i < format.quant_words() || format.super_block() {
                        w
                    } else {
                        hb_from_device(w)
                    };
                    let at = format.word_offset(i);
                    blk[at..at + 4].copy_from_slice(&w.to_le_bytes());
                }
            }
        }
    }
    Ok(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(ty: GgmlType, n: usize, k: usize, seed: u32) -> Vec<u8> {
        let x: Vec<f32> = (0..n * k)
            .map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32 / (1 << 24) as f32 - 0.5)
            .collect();
        crate::quant::quantize(ty, &x).unwrap()
    }

    #[test]
    fn pack_unpack_round_trips_every_format_layout_and_split() {
        for ty in PACKABLE {
            let kq = if ty.block_size() == 256 { 8 } else { 1 };
            for layout in [Layout::Tiled, Layout::Rows] {
                for (n, k) in [(1, 32), (7, 64), (33, 96), (100, 32)] {
                    let k = k * kq;
                    let r = raw(ty, n, k, 7);
                    for max in [1 << 30, 4096 * kq as u64] {
                        let parts = pack(ty, layout, n, k, &r, max).unwrap();
                        assert_eq!(parts.iter().map(|p| p.rows).sum::<usize>(), n);
                        for p in &parts {
                            let (q, s, m) = (p.quants.len(), p.scales.len(), p.mins.len());
                            assert!(
                                4 * q.max(s).max(m) as u64 <= max,
                                "{ty} {layout:?} {n}x{k} part over {max}"
                            );
                        }
                        assert_eq!(
                            unpack(ty, layout, n, k, &parts).unwrap(),
                            blocks32(ty, &r).unwrap().as_ref(),
                            "{ty} {layout:?} {n}x{k} {max}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn high_bit_words_move_next_to_their_nibbles() {
        // Weight 4i + b (low nibble of byte b of word i) -> bit 8b + i; weight 16 + 4i + b -> bit 8b + 4 + i.
        for j in 0..32 {
            let (half, i, b) = (j / 16, j % 16 / 4, j % 4);
            assert_eq!(hb_to_device(1 << j), 1 << (8 * b + 4 * half + i), "weight {j}");
            assert_eq!(hb_from_device(hb_to_device(1 << j)), 1 << j);
        }
        let w = 0x9e37_79b9;
        assert_eq!(hb_from_device(hb_to_device(w)), w);
    }

    #[test]
    fn device_bytes_stay_within_1_1x_of_the_file() {
        for ty in PACKABLE {
            let f = Format::new(ty).unwrap();
            let file = ty.type_size() as f64 * 32.0 / ty.block_size() as f64;
            let ratio = f.device_bytes() / file;
            assert!(
                ratio <= 1.1 + 1e-12,
                "{ty}: {} device bytes vs {file} in the file",
                f.device_bytes()
            );
        }
        // The super formats: Q2_K 8 + 2 + 4/8 = 10.5 (the file's 84 / 8), Q3_K 12 + 2 + 2/8 = 14.25 (110 / 8 = 13.75).
        assert_eq!(Format::new(GgmlType::Q2_K).unwrap().device_bytes(), 10.5);
        assert_eq!(Format::new(GgmlType::Q3_K).unwrap().device_bytes(), 14.25);
        // Q4_K: 16 + 2 + 4/8 = 18.5 (the file's 144 / 8 = 18).
        assert_eq!(Format::new(GgmlType::Q4_K).unwrap().device_bytes(), 18.5);
        // And what the packed buffers hold, tiled and rows, for 64 rows of 512 (whole tiles, an even number of
        // super-blocks): exactly those bytes.
        for ty in [GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K] {
            let f = Format::new(ty).unwrap();
            for layout in [Layout::Tiled, Layout::Rows] {
                let p = &pack(ty, layout, 64, 512, &raw(ty, 64, 512, 1), 1 << 30).unwrap()[0];
                let bytes = 4 * (p.quants.len() + p.scales.len() + p.mins.len());
                assert_eq!(bytes as f64, f.device_bytes() * 64.0 * 16.0, "{ty} {layout:?}");
            }
        }
    }

    #[test]
    fn tiled_layout_puts_a_chunk_on_contiguous_words() {
        // Row 4*lane + j, block b, word i sits at ((tile*G + b)*WB + i)*8 + lane, component j.
        let (n, k) = (64, 64);
        let r = raw(GgmlType::Q4_0, n, k, 1);
        let p = &pack(GgmlType::Q4_0, Layout::Tiled, n, k, &r, 1 << 30).unwrap()[0];
        let (row, b, i) = (32 + 4 * 5 + 2, 1, 3);
        let at = (row * 2 + b) * 18 + 2 + 4 * i;
        assert_eq!(p.quants[(((2 + b) * 4 + i) * 8 + 5) * 4 + 2], word(&r, at));
    }

    #[test]
    fn bad_shapes_and_lengths_are_errors() {
        let r = raw(GgmlType::Q8_0, 2, 64, 0);
        assert!(pack(GgmlType::Q8_0, Layout::Rows, 2, 48, &r, 1 << 20).is_err());
        assert!(pack(GgmlType::Q8_0, Layout::Rows, 3, 64, &r, 1 << 20).is_err());
        assert!(pack(GgmlType::Q8_0, Layout::Rows, 2, 64, &r[1..], 1 << 20).is_err());
        assert!(pack(GgmlType::F16, Layout::Rows, 2, 64, &r, 1 << 20).is_err());
        assert!(pack(GgmlType::Q8_0, Layout::Tiled, 2, 64, &r, 64).is_err());
        // k-quants: K a multiple of 256, whole super-blocks.
        let r = raw(GgmlType::Q4_K, 2, 512, 0);
        assert!(pack(GgmlType::Q4_K, Layout::Rows, 2, 512, &r, 1 << 20).is_ok());
        assert!(pack(GgmlType::Q4_K, Layout::Rows, 4, 256, &r, 1 << 20).is_ok());
        assert!(
            pack(GgmlType::Q4_K, Layout::Rows, 1, 288, &r[..162], 1 << 20).is_err(),
            "K = 288 = 9 x 32"
        );
        assert!(pack(GgmlType::Q4_K, Layout::Rows, 2, 512, &r[..500], 1 << 20).is_err());
        assert!(pack(GgmlType::Q6_K, Layout::Rows, 2, 512, &r, 1 << 20).is_err());
    }

    #[test]
    fn k_quant_blocks_keep_the_quants_and_round_the_constants_once() {
        // One Q6_K row of 512: block 9 (weights 288..320) is sub-blocks 18, 19 of super-block 1.
        let r = raw(GgmlType::Q6_K, 1, 512, 3);
        let b = blocks32(GgmlType::Q6_K, &r).unwrap();
        let want = crate::quant::dequantize(GgmlType::Q6_K, &r).unwrap();
        let got = dequantize_packed(GgmlType::Q6_K, &r).unwrap();
        let sb = &r[q6_k::BLOCK_BYTES..];
        let d = crate::quant::f16_to_f32(u16::from_le_bytes([sb[208], sb[209]]));
        for (j, half) in [(0, 2usize), (16, 3)] {
            let sc = sb[192 + half] as i8 as f32;
            let h = u16::from_le_bytes([b[9 * 28 + 2 * (j / 16)], b[9 * 28 + 2 * (j / 16) + 1]]);
            assert_eq!(h, crate::quant::f32_to_f16(d * sc), "block 9 scale {j}");
        }
        for (w, (a, e)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - e).abs() <= e.abs() * 2f32.powi(-11) * 1.0001,
                "weight {w}: {a} vs {e}"
            );
        }
    }
}
