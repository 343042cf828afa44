// Dequantization in registers for the chunk-tiled layout (src/quant/pack.rs, Layout::Tiled): a vec4<u32> holds
// the same quant word of 4 consecutive output rows, so every helper works on 4 outputs at once.
// Nibble word i of a 32-block: byte b holds weight 4i+b (low nibble) and weight 16+4i+b (high nibble); with HB1
// (HB2) one (two) high-bit words follow the 4 nibble words, bit 8b+i holding bit 4 (5) of weight 4i+b's quant and
// bit 8b+4+i that of weight 16+4i+b. NL: the nibbles index the IQ4_NL codebook (lib/quant_nl.wgsl).
// Q8 word i of a 32-block: byte b holds weight 4i+b as i8.
// The including shader declares x (uniform or storage array<vec4<f32>>), wq (array<vec4<u32>>) and ws
// (array<vec2<u32>>, or array<vec4<u32>> with PAIR: two constants per block, a min (MIN) or with S16 the scale of
// weights 16..32, the high nibbles). XSUM: the block sum of x is needed (the offset QC, mins; with XSUM2 the sums of
// each half).
// SUPER (Q2_K, Q3_K): 2 quant words of 2-bit fields (word t, bits 8b+2i: weight 16t+4i+b), Q3K a high-bit word after
// them (bit 8b+4t+i: bit 2 of weight 16t+4i+b's quant); ws holds the 4 rows' 16-bit sub-block codes (as the f16
// scales of other formats: vec2<u32>), and the including shader also declares wd, the super-block factors of the 4
// rows at (tile * G/8 + g/8) * 8 + lane: vec4<u32> (d01, d23, dmin01, dmin23) with Q2K, vec2<u32> (d01, d23) with Q3K.
//
// Quants are masked in place, not shifted down: the nibble at bits 4j..4j+3 converts to q * 16^j exactly (4
// significant bits), so x is pre-scaled by 16^-j instead (a power-of-two scaling, exact unless |x| < 2^-102), once
// per block and shared by all rows. Q8 bytes are moved to the top byte (sign in place) and convert to q * 2^24.
// 5- and 6-bit quants are assembled in bytes (nibble | high bits << 4) and masked in place at 8b (scale 2^-8b; the
// top byte is shifted down instead), and so are the 2- and 3-bit quants of SUPER (field i shifted down to bit 0 of
// each byte). Codebook nibbles are shifted down (the polynomial needs the index itself).

#include "lib/quant_half.wgsl"

// Scales of x for the 4 low-nibble k (xa, bits 0, 8, 16, 24) and the 4 high-nibble k (xb, bits 4, 12, 20, 28; the
// top nibble is shifted down instead of masked, so it keeps scale 1).
const Q4_XA_SCALE = vec4<f32>(1.0, 0.00390625, 1.52587890625e-05, 5.9604644775390625e-08);
const Q4_XB_SCALE = vec4<f32>(0.0625, 0.000244140625, 9.5367431640625e-07, 1.0);
const Q8_X_SCALE = 5.9604644775390625e-08;  // 2^-24
// Byte quants of HB1 / HB2 (bits 0, 8, 16 masked in place, the top byte shifted down).
const HB_X_SCALE = vec4<f32>(1.0, 0.00390625, 1.52587890625e-05, 1.0);

// The pre-scales of x for this format: XA_SCALE for weights 0..16 of a block (x vectors 0..4), XB_SCALE for 16..32.
#if Q8
const XA_SCALE = vec4<f32>(Q8_X_SCALE);
const XB_SCALE = vec4<f32>(Q8_X_SCALE);
#else
#if HB1
const XA_SCALE = HB_X_SCALE;
const XB_SCALE = HB_X_SCALE;
#else
#if SUPER
const XA_SCALE = HB_X_SCALE;
const XB_SCALE = HB_X_SCALE;
#else
#if NL
const XA_SCALE = vec4<f32>(1.0);
const XB_SCALE = vec4<f32>(1.0);
#else
const XA_SCALE = Q4_XA_SCALE;
const XB_SCALE = Q4_XB_SCALE;
#endif
#endif
#endif
#endif

#include "lib/quant_nl.wgsl"

// sum_b q[b] * xa[b] + q[b+16] * xb[b] over one Q4 word of 4 rows, with xa = x[4i..4i+4] * Q4_XA_SCALE and
// xb = x[16+4i..16+4i+4] * Q4_XB_SCALE. Two partial chains halve the FMA dependency chain.
fn q4_word(q: vec4<u32>, xa: vec4<f32>, xb: vec4<f32>) -> vec4<f32> {
    var lo = vec4<f32>(bitcast<vec4<i32>>(q & vec4<u32>(0xfu))) * xa.x;
    var hi = vec4<f32>(bitcast<vec4<i32>>(q & vec4<u32>(0xf0u))) * xb.x;
    lo += vec4<f32>(bitcast<vec4<i32>>(q & vec4<u32>(0xf00u))) * xa.y;
    hi += vec4<f32>(bitcast<vec4<i32>>(q & vec4<u32>(0xf000u))) * xb.y;
    lo += vec4<f32>(bitcast<vec4<i32>>(q & vec4<u32>(0xf0000u))) * xa.z;
    hi += vec4<f32>(bitcast<vec4<i32>>(q & vec4<u32>(0xf00000u))) * xb.z;
    lo += vec4<f32>(bitcast<vec4<i32>>(q & vec4<u32>(0xf000000u))) * xa.w;
    hi += vec4<f32>(bitcast<vec4<i32>>(q >> vec4<u32>(28u))) * xb.w;
    return lo + hi;
}

// sum_b q[b] * x[b] over one Q8 word of 4 rows (signed bytes), with x = x[4i..4i+4] * Q8_X_SCALE.
fn q8_word(q: vec4<u32>, xa: vec4<f32>) -> vec4<f32> {
    let top = vec4<u32>(0xff000000u);
    let a = vec4<f32>(bitcast<vec4<i32>>(q << vec4<u32>(24u))) * xa.x
        + vec4<f32>(bitcast<vec4<i32>>((q << vec4<u32>(16u)) & top)) * xa.y;
    let b = vec4<f32>(bitcast<vec4<i32>>((q << vec4<u32>(8u)) & top)) * xa.z
        + vec4<f32>(bitcast<vec4<i32>>(q & top)) * xa.w;
    return a + b;
}

// The byte quants (below 64) of nibble word i of 4 rows with its high bits: weights 4i..4i+4 (hb_lo) and
// 16+4i..16+4i+4 (hb_hi). h: bit 4 of each quant (HB1), h2: bit 5 (HB2; ignored without it).
fn hb_lo(q: vec4<u32>, h: vec4<u32>, h2: vec4<u32>, i: u32) -> vec4<u32> {
    var v = (q & vec4<u32>(0x0f0f0f0fu)) | ((h << vec4<u32>(4u - i)) & vec4<u32>(0x10101010u));
#if HB2
    v |= (h2 << vec4<u32>(5u - i)) & vec4<u32>(0x20202020u);
#endif
    return v;
}
fn hb_hi(q: vec4<u32>, h: vec4<u32>, h2: vec4<u32>, i: u32) -> vec4<u32> {
    var v = ((q >> vec4<u32>(4u)) & vec4<u32>(0x0f0f0f0fu)) | ((h >> vec4<u32>(i)) & vec4<u32>(0x10101010u));
#if HB2
    v |= ((h2 >> vec4<u32>(i)) & vec4<u32>(0x10101010u)) << vec4<u32>(1u);
#endif
    return v;
}

// sum_b v[b] * xs[b] over the 4 byte quants (below 128) of 4 rows, with xs = x * HB_X_SCALE.
fn u8_dot(v: vec4<u32>, xs: vec4<f32>) -> vec4<f32> {
    let a = vec4<f32>(bitcast<vec4<i32>>(v & vec4<u32>(0xffu))) * xs.x
        + vec4<f32>(bitcast<vec4<i32>>(v & vec4<u32>(0xff00u))) * xs.y;
    let b = vec4<f32>(bitcast<vec4<i32>>(v & vec4<u32>(0xff0000u))) * xs.z
        + vec4<f32>(bitcast<vec4<i32>>(v >> vec4<u32>(24u))) * xs.w;
    return a + b;
}

// sum_b T[q[b]] * xa[b] + T[q[b+16]] * xb[b] over one codebook nibble word of 4 rows (x not pre-scaled). The
// indices convert from i32 (a signed conversion is one instruction on x86; unsigned ones are emulated).
fn nl_word(q: vec4<u32>, xa: vec4<f32>, xb: vec4<f32>) -> vec4<f32> {
    let m = vec4<u32>(15u);
    var lo = nl4(vec4<f32>(bitcast<vec4<i32>>(q & m))) * xa.x;
    var hi = nl4(vec4<f32>(bitcast<vec4<i32>>((q >> vec4<u32>(4u)) & m))) * xb.x;
    lo += nl4(vec4<f32>(bitcast<vec4<i32>>((q >> vec4<u32>(8u)) & m))) * xa.y;
    hi += nl4(vec4<f32>(bitcast<vec4<i32>>((q >> vec4<u32>(12u)) & m))) * xb.y;
    lo += nl4(vec4<f32>(bitcast<vec4<i32>>((q >> vec4<u32>(16u)) & m))) * xa.z;
    hi += nl4(vec4<f32>(bitcast<vec4<i32>>((q >> vec4<u32>(20u)) & m))) * xb.z;
    lo += nl4(vec4<f32>(bitcast<vec4<i32>>((q >> vec4<u32>(24u)) & m))) * xa.w;
    hi += nl4(vec4<f32>(bitcast<vec4<i32>>(q >> vec4<u32>(28u)))) * xb.w;
    return lo + hi;
}

#include "lib/quant_words.wgsl"

// One token's 8 x vectors of a block, pre-scaled for the quant helpers, and (Q4) their sum.
struct XBlock {
    v0: vec4<f32>,
    v1: vec4<f32>,
    v2: vec4<f32>,
    v3: vec4<f32>,
    v4: vec4<f32>,
    v5: vec4<f32>,
    v6: vec4<f32>,
    v7: vec4<f32>,
    sum: f32,   // with XSUM2 the sum of weights 0..16's x only
    sum2: f32,  // XSUM2: the sum of weights 16..32's x
}

#if SUBGROUPS
// From `xr`, this lane's vector (lane l holds x[8 l..8 l + 4] of the block), by broadcasts.
fn x_block(xr: vec4<f32>, sl: u32) -> XBlock {
    var b: XBlock;
    let xl = xr * select(XA_SCALE, XB_SCALE, (sl & 4u) != 0u);
#if XSUM
    let xd = dot(xr, vec4<f32>(1.0));
    let s0 = (subgroupBroadcast(xd, 0u) + subgroupBroadcast(xd, 1u))
        + (subgroupBroadcast(xd, 2u) + subgroupBroadcast(xd, 3u));
    let s1 = (subgroupBroadcast(xd, 4u) + subgroupBroadcast(xd, 5u))
        + (subgroupBroadcast(xd, 6u) + subgroupBroadcast(xd, 7u));
#if XSUM2
    b.sum = s0;
    b.sum2 = s1;
#else
    b.sum = s0 + s1;
#endif
#endif
    b.v0 = subgroupBroadcast(xl, 0u);
    b.v1 = subgroupBroadcast(xl, 1u);
    b.v2 = subgroupBroadcast(xl, 2u);
    b.v3 = subgroupBroadcast(xl, 3u);
    b.v4 = subgroupBroadcast(xl, 4u);
    b.v5 = subgroupBroadcast(xl, 5u);
    b.v6 = subgroupBroadcast(xl, 6u);
    b.v7 = subgroupBroadcast(xl, 7u);
    return b;
}
#else
// By uniform loads of the block's vectors at `at`.
fn x_block(at: u32) -> XBlock {
    var b: XBlock;
    let r0 = x[at];
    let r1 = x[at + 1u];
    let r2 = x[at + 2u];
    let r3 = x[at + 3u];
    let r4 = x[at + 4u];
    let r5 = x[at + 5u];
    let r6 = x[at + 6u];
    let r7 = x[at + 7u];
    let sa = XA_SCALE;
    let sb = XB_SCALE;
#if XSUM
#if XSUM2
    b.sum = dot((r0 + r1) + (r2 + r3), vec4<f32>(1.0));
    b.sum2 = dot((r4 + r5) + (r6 + r7), vec4<f32>(1.0));
#else
    b.sum = dot((r0 + r1) + (r2 + r3) + ((r4 + r5) + (r6 + r7)), vec4<f32>(1.0));
#endif
#endif
    b.v0 = r0 * sa;
    b.v1 = r1 * sa;
    b.v2 = r2 * sa;
    b.v3 = r3 * sa;
    b.v4 = r4 * sb;
    b.v5 = r5 * sb;
    b.v6 = r6 * sb;
    b.v7 = r7 * sb;
    return b;
}
#endif

#if SUPER
// The 4 byte quants of field i (weights 16t+4i..16t+4i+4) of a 2-bit word of 4 rows, Q3K with their bit 2 from the
// high-bit word h (its bits 8b+4t+i moved to 8b+2: left 2 - i for t = 0, right 2 + i for t = 1).
fn q2_bytes(q: vec4<u32>, i: u32) -> vec4<u32> {
    return (q >> vec4<u32>(2u * i)) & vec4<u32>(0x03030303u);
}
fn q3_lo(q: vec4<u32>, h: vec4<u32>, i: u32) -> vec4<u32> {
    return q2_bytes(q, i) | (((h << vec4<u32>(2u)) >> vec4<u32>(i)) & vec4<u32>(0x04040404u));
}
fn q3_hi(q: vec4<u32>, h: vec4<u32>, i: u32) -> vec4<u32> {
    return q2_bytes(q, i) | ((h >> vec4<u32>(2u + i)) & vec4<u32>(0x04040404u));
}

// One block of 4 rows: its 2-bit words (and high-bit word), and the sub-block constants formed from the codes and the
// super-block factors in f32 (exact: an f16 times an integer below 64), once per block and shared by the tokens.
struct WBlock {
    q0: vec4<u32>,
    q1: vec4<u32>,
#if Q3K
    h: vec4<u32>,
#endif
    a0: vec4<f32>,  // scale of weights 0..16: d * sc (Q2K), d * (sc - 32) (Q3K)
    a1: vec4<f32>,  // of weights 16..32
#if Q2K
    n0: vec4<f32>,  // min of weights 0..16: dmin * m
    n1: vec4<f32>,
#endif
}

fn w_block(wi: u32, si: u32) -> WBlock {
    var w: WBlock;
    w.q0 = wq[wi];
    w.q1 = wq[wi + 8u];
#if Q3K
    w.h = wq[wi + 16u];
#endif
    let c = ws[si];
    let code = vec4<u32>(c.x & 0xffffu, c.x >> 16u, c.y & 0xffffu, c.y >> 16u);
    // si = (tile * G + g) * 8 + lane and G is a multiple of 8: the super-block's index is (si / 64) * 8 + lane.
    let di = ((si >> 6u) << 3u) | (si & 7u);
#if Q2K
    let f = wd[di];
    let d = halves4(f.xy);
    let dm = halves4(f.zw);
    w.a0 = d * vec4<f32>(bitcast<vec4<i32>>(code & vec4<u32>(15u)));
    w.n0 = dm * vec4<f32>(bitcast<vec4<i32>>((code >> vec4<u32>(4u)) & vec4<u32>(15u)));
    w.a1 = d * vec4<f32>(bitcast<vec4<i32>>((code >> vec4<u32>(8u)) & vec4<u32>(15u)));
    w.n1 = dm * vec4<f32>(bitcast<vec4<i32>>(code >> vec4<u32>(12u)));
#else
    let d = halves4(wd[di]);
    w.a0 = d * vec4<f32>(bitcast<vec4<i32>>(code & vec4<u32>(63u)) - vec4<i32>(32));
    w.a1 = d * vec4<f32>(bitcast<vec4<i32>>((code >> vec4<u32>(8u)) & vec4<u32>(63u)) - vec4<i32>(32));
#endif
    return w;
}

// One token's contribution of a block to the 4 rows: per half, scale * (sum q x) minus the min (Q2K: dmin m sum x)
// or the offset (Q3K: scale * 4 sum x).
fn block_dot(w: WBlock, b: XBlock) -> vec4<f32> {
#if Q3K
    let lo = u8_dot(q3_lo(w.q0, w.h, 0u), b.v0) + u8_dot(q3_lo(w.q0, w.h, 1u), b.v1)
        + u8_dot(q3_lo(w.q0, w.h, 2u), b.v2) + u8_dot(q3_lo(w.q0, w.h, 3u), b.v3);
    let hi = u8_dot(q3_hi(w.q1, w.h, 0u), b.v4) + u8_dot(q3_hi(w.q1, w.h, 1u), b.v5)
        + u8_dot(q3_hi(w.q1, w.h, 2u), b.v6) + u8_dot(q3_hi(w.q1, w.h, 3u), b.v7);
    return w.a0 * (lo - QC * b.sum) + w.a1 * (hi - QC * b.sum2);
#else
    let lo = u8_dot(q2_bytes(w.q0, 0u), b.v0) + u8_dot(q2_bytes(w.q0, 1u), b.v1)
        + u8_dot(q2_bytes(w.q0, 2u), b.v2) + u8_dot(q2_bytes(w.q0, 3u), b.v3);
    let hi = u8_dot(q2_bytes(w.q1, 0u), b.v4) + u8_dot(q2_bytes(w.q1, 1u), b.v5)
        + u8_dot(q2_bytes(w.q1, 2u), b.v6) + u8_dot(q2_bytes(w.q1, 3u), b.v7);
    return (w.a0 * lo + w.a1 * hi) - (w.n0 * b.sum + w.n1 * b.sum2);
#endif
}
#else
// The quant words of one block of 4 rows (at vec4 index `wi` of wq; the next word of the same rows is 8 vectors
// further), its high-bit words, and its constants (at index `si` of ws).
struct WBlock {
    q0: vec4<u32>,
    q1: vec4<u32>,
    q2: vec4<u32>,
    q3: vec4<u32>,
#if Q8
    q4: vec4<u32>,
    q5: vec4<u32>,
    q6: vec4<u32>,
    q7: vec4<u32>,
#endif
#if HB1
    h: vec4<u32>,
    h2: vec4<u32>,  // HB2 only (a copy of h without it)
#endif
    d: vec4<f32>,
#if PAIR
    m: vec4<f32>,  // the min, or with S16 the scale of weights 16..32
#endif
}

#if K4
// Q4_K's constants of a block of 4 rows: d * sc and -dmin * m in f32 (exact: an f16 times an integer below 64) from
// the 16-bit codes (sc | m << 8) at index `si` of ws and the super-block factors (d01, d23, dmin01, dmin23) in wd.
struct K4C {
    d: vec4<f32>,
    m: vec4<f32>,
}
fn k4_consts(si: u32) -> K4C {
    let c = ws[si];
    let code = vec4<u32>(c.x & 0xffffu, c.x >> 16u, c.y & 0xffffu, c.y >> 16u);
    // si = (tile * G + g) * 8 + lane and G is a multiple of 8: the super-block's index is (si / 64) * 8 + lane.
    let f = wd[((si >> 6u) << 3u) | (si & 7u)];
    var k: K4C;
    k.d = halves4(f.xy) * vec4<f32>(bitcast<vec4<i32>>(code & vec4<u32>(255u)));
    k.m = -(halves4(f.zw) * vec4<f32>(bitcast<vec4<i32>>(code >> vec4<u32>(8u))));
    return k;
}
#endif

fn w_block(wi: u32, si: u32) -> WBlock {
    var w: WBlock;
    w.q0 = wq[wi];
    w.q1 = wq[wi + 8u];
    w.q2 = wq[wi + 16u];
    w.q3 = wq[wi + 24u];
#if Q8
    w.q4 = wq[wi + 32u];
    w.q5 = wq[wi + 40u];
    w.q6 = wq[wi + 48u];
    w.q7 = wq[wi + 56u];
#endif
#if HB1
    w.h = wq[wi + 32u];
#if HB2
    w.h2 = wq[wi + 40u];
#else
    w.h2 = w.h;
#endif
#endif
#if K4
    let kc = k4_consts(si);
    w.d = kc.d;
    w.m = kc.m;
#else
#if PAIR
    let sc = ws[si];
    w.d = halves4(sc.xy);
    w.m = halves4(sc.zw);
#else
    w.d = halves4(ws[si]);
#endif
#endif
    return w;
}

// One token's contribution of a block to the 4 rows. Inlined for every token with the same WBlock, so the
// dequantization (mask and convert) is computed once and shared by the tokens.
fn block_dot(w: WBlock, b: XBlock) -> vec4<f32> {
#if Q8
    let s = q8_word(w.q0, b.v0) + q8_word(w.q1, b.v1) + q8_word(w.q2, b.v2) + q8_word(w.q3, b.v3)
        + q8_word(w.q4, b.v4) + q8_word(w.q5, b.v5) + q8_word(w.q6, b.v6) + q8_word(w.q7, b.v7);
    return w.d * s;
#else
#if HB1
    let lo = u8_dot(hb_lo(w.q0, w.h, w.h2, 0u), b.v0) + u8_dot(hb_lo(w.q1, w.h, w.h2, 1u), b.v1)
        + u8_dot(hb_lo(w.q2, w.h, w.h2, 2u), b.v2) + u8_dot(hb_lo(w.q3, w.h, w.h2, 3u), b.v3);
    let hi = u8_dot(hb_hi(w.q0, w.h, w.h2, 0u), b.v4) + u8_dot(hb_hi(w.q1, w.h, w.h2, 1u), b.v5)
        + u8_dot(hb_hi(w.q2, w.h, w.h2, 2u), b.v6) + u8_dot(hb_hi(w.q3, w.h, w.h2, 3u), b.v7);
#if S16
    return w.d * (lo - QC * b.sum) + w.m * (hi - QC * b.sum2);
#else
    let s = lo + hi;
#endif
#else
#if NL
    let s = nl_word(w.q0, b.v0, b.v4) + nl_word(w.q1, b.v1, b.v5) + nl_word(w.q2, b.v2, b.v6)
        + nl_word(w.q3, b.v3, b.v7);
#else
    let s = q4_word(w.q0, b.v0, b.v4) + q4_word(w.q1, b.v1, b.v5) + q4_word(w.q2, b.v2, b.v6)
        + q4_word(w.q3, b.v3, b.v7);
#endif
#endif
#if S16
#else
#if MIN
    return w.d * s + w.m * b.sum;
#else
#if XSUM
    return w.d * (s - QC * b.sum);
#else
    return w.d * s;
#endif
#endif
#endif
#endif
}
#endif
