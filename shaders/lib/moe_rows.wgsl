// Shared by moe_up_q_rows and moe_down_q_rows (the GPU kernels over the row-major quantized layout,
// src/quant/pack.rs, Layout::Rows): one quant word of 4 rows dequantized in registers, its dot with a token's x,
// and the workgroup sum of the 4 rows' partials. As in matmul_q_rows.
// The including shader declares x (array<vec4<f32>>), wq (array<u32>), ws (array<u32>) and, with PAIR, wm.
// Per word: Q4_0, Q5_0, NL (QC 0): d * (sum q x - QC sum x); MIN (Q4_1, Q5_1, Q4_K, Q5_K): d * sum q x + m * sum x;
// Q8_0: d * sum q x; S16 (Q6_K): the high nibbles (weights 16..32) take the second scale.

#include "lib/quant_rows.wgsl"

const WG = 64u;

var<workgroup> red: array<vec4<f32>, WG>;  // [WG] partial sums of the 4 rows (one token at a time)

// Quant word `wd` (of block wd / WQ; the high-bit words are not counted) of 4 rows, with the block's high-bit
// words (HB1, HB2) and constants.
struct Word {
    q: vec4<u32>,
    h: vec4<u32>,
    h2: vec4<u32>,
    d: vec4<f32>,
#if PAIR
    mn: vec4<f32>,  // the min, or with S16 the second scale
#endif
    i: u32,   // the word's index in its block
    xo: u32,  // vec4 index in a row of x of the word's first weights
}

// rq[j]: first quant word of row j; rs[j]: first scale (and min) word of row j.
fn load_word(rq: vec4<u32>, rs: vec4<u32>, wd: u32) -> Word {
    var w: Word;
    let b = wd / WQ;
    let sw = b / 2u;
    let high = (b & 1u) == 1u;
    w.i = wd % WQ;
    for (var j = 0u; j < 4u; j++) {
        w.q[j] = wq[rq[j] + b * WB + w.i];
#if HB1
        w.h[j] = wq[rq[j] + b * WB + WQ];
#endif
#if HB2
        w.h2[j] = wq[rq[j] + b * WB + WQ + 1u];
#endif
#if K4
        // rs[j] = row * G/2 (G a multiple of 8): the row's factor words (G/8 of them) start at rs[j] / 4.
        let kc = k4_consts(ws[rs[j] + sw], high, wm[(rs[j] >> 2u) + (b >> 3u)]);
        w.d[j] = kc.x;
        w.mn[j] = kc.y;
#else
        w.d[j] = half_of(ws[rs[j] + sw], high);
#if PAIR
        w.mn[j] = half_of(wm[rs[j] + sw], high);
#endif
#endif
    }
    w.xo = 8u * b + w.i;
    return w;
}

// The word's contribution to the 4 rows for the token whose x row starts at vec4 index xb.
fn word_dot(w: Word, xb: u32) -> vec4<f32> {
#if Q8
    let xa = x[xb + w.xo];
    let s = vec4<f32>(dot(q8_bytes(w.q.x), xa), dot(q8_bytes(w.q.y), xa), dot(q8_bytes(w.q.z), xa),
        dot(q8_bytes(w.q.w), xa));
    return w.d * s;
#else
    let xa = x[xb + w.xo];
    let xc = x[xb + w.xo + 4u];
    let sa = vec4<f32>(dot(q_lo(w.q.x, w.h.x, w.h2.x, w.i), xa), dot(q_lo(w.q.y, w.h.y, w.h2.y, w.i), xa),
        dot(q_lo(w.q.z, w.h.z, w.h2.z, w.i), xa), dot(q_lo(w.q.w, w.h.w, w.h2.w, w.i), xa));
    let sc = vec4<f32>(dot(q_hi(w.q.x, w.h.x, w.h2.x, w.i), xc), dot(q_hi(w.q.y, w.h.y, w.h2.y, w.i), xc),
        dot(q_hi(w.q.z, w.h.z, w.h2.z, w.i), xc), dot(q_hi(w.q.w, w.h.w, w.h2.w, w.i), xc));
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
}

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
