// The dequant-dot body of the row-major quantized kernels (matmul_q_rows, moe_up_q_rows, moe_down_q_rows; the GPU
// layout, src/quant/pack.rs, Layout::Rows): provides Word / load_word (one quant word of 4 rows dequantized in
// registers, once for all tokens), word_dot (its dot with one token's x) and wg_sum / Lanes (the workgroup sum of
// the 4 rows' partials), with WG = 64 and the workgroup array red. Not for SUPER (Q2_K, Q3_K: matmul_q_rows keeps
// their 2-bit words itself); wg_sum serves it too.
// The including shader declares x (array<vec4<f32>>), wq (array<u32>), ws (array<u32>) and, with PAIR, wm.
// Per word: Q4_0, Q5_0, NL (QC 0): d * (sum q x - QC sum x); MIN (Q4_1, Q5_1, Q4_K, Q5_K): d * sum q x + m * sum x;
// Q8_0: d * sum q x; S16 (Q6_K): the high nibbles (weights 16..32) take the second scale. F16 (matmul_q_rows only):
// the quants in f16 and each word's products summed in f16, as described in lib/quant_rows.wgsl and matmul_q_rows.

#include "lib/quant_rows.wgsl"

const WG = 64u;

var<workgroup> red: array<vec4<f32>, WG>;  // [WG] partial sums of the 4 rows (one token at a time)

#if SUPER
#else
// The dequantized quants: f32, or with F16 the centred f16 forms of lib/quant_rows.wgsl.
#if F16
alias QV = vec4<f16>;
#else
alias QV = vec4<f32>;
#endif
// The quants of weights 4i..4i+4 (lo) and 16+4i..16+4i+4 (hi) of one row's nibble word i.
struct QPair {
    lo: QV,
    hi: QV,
}
fn qv_word(q: u32, h: u32, h2: u32, i: u32) -> QPair {
#if F16
    return QPair(q_lo_h(q, h, h2, i), q_hi_h(q, h, h2, i));
#else
    return QPair(q_lo(q, h, h2, i), q_hi(q, h, h2, i));
#endif
}
fn qv8(q: u32) -> QV {
#if F16
    return q8_bytes_h(q);
#else
    return q8_bytes(q);
#endif
}

// Quant word `wd` (of block wd / WQ; the high-bit words are not counted) of 4 rows, dequantized with its block's
// high-bit words (HB1, HB2), and the block's constants.
struct Word {
    a0: QV,  // row j's quants of weights 4i..4i+4 (Q8: the word's 4 bytes), i the word's index in its block
    a1: QV,
    a2: QV,
    a3: QV,
#if Q8
#else
    b0: QV,  // row j's quants of weights 16+4i..16+4i+4
    b1: QV,
    b2: QV,
    b3: QV,
#endif
    d: vec4<f32>,   // the scales (F16: times QH_S, Q8 times 8, for the f16 quants)
#if PAIR
    mn: vec4<f32>,  // the min (F16: plus QH_C d, centring the quants), or with S16 the second scale (F16: times QH_S)
#endif
    xo: u32,  // vec4 index in a row of x of the word's first weights
}

// rq[j]: first quant word of row j; rs[j]: first scale (and min) word of row j.
fn load_word(rq: vec4<u32>, rs: vec4<u32>, wd: u32) -> Word {
    var w: Word;
    let b = wd / WQ;
    let i = wd % WQ;
    let pw = b * WB + i;  // the word's index in the row
    let sw = b / 2u;
    let high = (b & 1u) == 1u;
    var q: vec4<u32>;
    var hq = vec4<u32>(0u);
    var hq2 = vec4<u32>(0u);
    var d: vec4<f32>;
#if PAIR
    var mn: vec4<f32>;
#endif
    for (var j = 0u; j < 4u; j++) {
        q[j] = wq[rq[j] + pw];
#if HB1
        hq[j] = wq[rq[j] + b * WB + WQ];
#endif
#if HB2
        hq2[j] = wq[rq[j] + b * WB + WQ + 1u];
#endif
#if K4
        // rs[j] = row * G/2 (G a multiple of 8): the row's factor words (G/8 of them) start at rs[j] / 4.
        let kc = k4_consts(ws[rs[j] + sw], high, wm[(rs[j] >> 2u) + (b >> 3u)]);
        d[j] = kc.x;
        mn[j] = kc.y;
#else
        d[j] = half_of(ws[rs[j] + sw], high);
#if PAIR
        mn[j] = half_of(wm[rs[j] + sw], high);
#endif
#endif
    }
    w.d = d;
#if PAIR
    w.mn = mn;
#endif
#if F16
    // Centred f16 quants (lib/quant_rows.wgsl): MIN blocks hold d q + m = QH_S d (q - QH_C) / QH_S + (m + QH_C d).
#if Q8
    w.d = 8.0 * d;  // q8_bytes_h gives q / 8
#else
    w.d = QH_S * d;
#if MIN
    w.mn = mn + QH_C * d;
#endif
#if S16
    w.mn = QH_S * mn;
#endif
#endif
#endif
#if Q8
    w.a0 = qv8(q.x);
    w.a1 = qv8(q.y);
    w.a2 = qv8(q.z);
    w.a3 = qv8(q.w);
#else
    let p0 = qv_word(q.x, hq.x, hq2.x, i);
    let p1 = qv_word(q.y, hq.y, hq2.y, i);
    let p2 = qv_word(q.z, hq.z, hq2.z, i);
    let p3 = qv_word(q.w, hq.w, hq2.w, i);
    w.a0 = p0.lo;
    w.a1 = p1.lo;
    w.a2 = p2.lo;
    w.a3 = p3.lo;
    w.b0 = p0.hi;
    w.b1 = p1.hi;
    w.b2 = p2.hi;
    w.b3 = p3.hi;
#endif
    w.xo = 8u * b + i;
    return w;
}

// The word's contribution to the 4 rows for the token whose x row starts at vec4 index xb. With F16 the products
// and each row's sum of them are f16 unless a value of x reaches X16_MAX (then f32, for this token).
fn word_dot(w: Word, xb: u32) -> vec4<f32> {
#if Q8
    let xa = x[xb + w.xo];
#if F16
    var s: vec4<f32>;
    if (all(abs(xa) < vec4<f32>(X16_MAX))) {
        let ha = vec4<f16>(xa);
        s = vec4<f32>(vec4<f16>(dot(w.a0, ha), dot(w.a1, ha), dot(w.a2, ha), dot(w.a3, ha)));
    } else {
        s = vec4<f32>(dot(vec4<f32>(w.a0), xa), dot(vec4<f32>(w.a1), xa), dot(vec4<f32>(w.a2), xa),
            dot(vec4<f32>(w.a3), xa));
    }
    return w.d * s;
#else
    let s = vec4<f32>(dot(w.a0, xa), dot(w.a1, xa), dot(w.a2, xa), dot(w.a3, xa));
    return w.d * s;
#endif
#else
    let xa = x[xb + w.xo];
    let xc = x[xb + w.xo + 4u];
#if F16
    var sa: vec4<f32>;
    var sc: vec4<f32>;
    if (all(max(abs(xa), abs(xc)) < vec4<f32>(X16_MAX))) {
        let ha = vec4<f16>(xa);
        let hc = vec4<f16>(xc);
#if S16
        sa = vec4<f32>(vec4<f16>(dot(w.a0, ha), dot(w.a1, ha), dot(w.a2, ha), dot(w.a3, ha)));
        sc = vec4<f32>(vec4<f16>(dot(w.b0, hc), dot(w.b1, hc), dot(w.b2, hc), dot(w.b3, hc)));
#else
        sa = vec4<f32>(vec4<f16>(dot(w.a0, ha) + dot(w.b0, hc), dot(w.a1, ha) + dot(w.b1, hc),
            dot(w.a2, ha) + dot(w.b2, hc), dot(w.a3, ha) + dot(w.b3, hc)));
        sc = vec4<f32>(0.0);
#endif
    } else {
        sa = vec4<f32>(dot(vec4<f32>(w.a0), xa), dot(vec4<f32>(w.a1), xa), dot(vec4<f32>(w.a2), xa),
            dot(vec4<f32>(w.a3), xa));
        sc = vec4<f32>(dot(vec4<f32>(w.b0), xc), dot(vec4<f32>(w.b1), xc), dot(vec4<f32>(w.b2), xc),
            dot(vec4<f32>(w.b3), xc));
    }
#if S16
    return w.d * sa + w.mn * sc;
#else
#if MIN
    return w.d * (sa + sc) + w.mn * dot(xa + xc, vec4<f32>(1.0));
#else
    return w.d * (sa + sc);
#endif
#endif
#else
    let sa = vec4<f32>(dot(w.a0, xa), dot(w.a1, xa), dot(w.a2, xa), dot(w.a3, xa));
    let sc = vec4<f32>(dot(w.b0, xc), dot(w.b1, xc), dot(w.b2, xc), dot(w.b3, xc));
#if S16
    return w.d * (sa - QC * dot(xa, vec4<f32>(1.0))) + w.mn * (sc - QC * dot(xc, vec4<f32>(1.0)));
#else
#if MIN
    return w.d * (sa + sc) + w.mn * dot(xa + xc, vec4<f32>(1.0));
#else
    return w.d * (sa + sc - QC * dot(xa + xc, vec4<f32>(1.0)));
#endif
#endif
#endif
#endif
}
#endif

// Subgroup ids for wg_sum (zeros without SUBGROUPS).
struct Lanes {
    li: u32,     // local_invocation_index
    sl: u32,     // subgroup_invocation_id
    sg_id: u32,  // subgroup_id
    n_sg: u32,   // num_subgroups
}

// Workgroup sum of `v`, valid in invocation 0. Call from uniform control flow (barriers inside; `red` is free again
// on return).
fn wg_sum(v: vec4<f32>, l: Lanes) -> vec4<f32> {
#if SUBGROUPS
    let s = subgroupAdd(v);
    if (l.sl == 0u) {
        red[l.sg_id] = s;
    }
    workgroupBarrier();
    var total = vec4<f32>(0.0);
    if (l.li == 0u) {
        for (var k = 0u; k < l.n_sg; k++) {
            total += red[k];
        }
    }
#else
    red[l.li] = v;
    workgroupBarrier();
    for (var h = WG / 2u; h > 0u; h /= 2u) {
        if (l.li < h) {
            red[l.li] += red[l.li + h];
        }
        workgroupBarrier();
    }
    let total = red[0];
#endif
    workgroupBarrier();
    return total;
}
