// Shared by moe_up_q_rows and moe_down_q_rows (the GPU kernels over the row-major quantized layout,
// src/quant/pack.rs, Layout::Rows): one quant word of 4 rows dequantized in registers, its dot with a token's x,
// and the workgroup sum of the 4 rows' partials. As in matmul_q_rows.
// The including shader declares x (array<vec4<f32>>), wq (array<u32>), ws (array<u32>) and, with PAIR, wm.
// Per word: Q4_0: d * (sum q x - 8 sum x); MIN (Q4_1, Q4_K; Q5_K with Q8): d * sum q x + m * sum x; Q8_0:
// d * sum q x; Q8 + S16 (Q6_K): words 4..8 of a block take the second scale instead of d.

#include "lib/quant_rows.wgsl"

#if Q8
const WB = 8u;  // quant words per block
#else
const WB = 4u;
#endif

const WG = 64u;

var<workgroup> red: array<vec4<f32>, WG>;  // [WG] partial sums of the 4 rows (one token at a time)

// Quant word `wd` (of block wd / WB) of 4 rows, with the block's constants.
struct Word {
    q: vec4<u32>,
    d: vec4<f32>,
#if PAIR
    mn: vec4<f32>,  // the min, or with S16 the second scale
#endif
    xo: u32,  // vec4 index in a row of x of the word's first weights
}

// rq[j]: first quant word of row j; rs[j]: first scale (and min) word of row j.
fn load_word(rq: vec4<u32>, rs: vec4<u32>, wd: u32) -> Word {
    var w: Word;
    let b = wd / WB;
    let sw = b / 2u;
    let high = (b & 1u) == 1u;
    for (var j = 0u; j < 4u; j++) {
        w.q[j] = wq[rq[j] + wd];
        w.d[j] = half_of(ws[rs[j] + sw], high);
#if PAIR
        w.mn[j] = half_of(wm[rs[j] + sw], high);
#endif
    }
#if S16
    w.d = select(w.d, w.mn, wd % WB >= 4u);  // weights 16..32 of the block take the second scale
#endif
    w.xo = 8u * b + wd % WB;
    return w;
}

// The word's contribution to the 4 rows for the token whose x row starts at vec4 index xb.
fn word_dot(w: Word, xb: u32) -> vec4<f32> {
#if Q8
    let xa = x[xb + w.xo];
    let s = vec4<f32>(dot(q8_bytes(w.q.x), xa), dot(q8_bytes(w.q.y), xa), dot(q8_bytes(w.q.z), xa),
        dot(q8_bytes(w.q.w), xa));
#if MIN
    return w.d * s + w.mn * dot(xa, vec4<f32>(1.0));
#else
    return w.d * s;
#endif
#else
    let xa = x[xb + w.xo];
    let xc = x[xb + w.xo + 4u];
    let s = vec4<f32>(dot(q4_lo(w.q.x), xa) + dot(q4_hi(w.q.x), xc), dot(q4_lo(w.q.y), xa) + dot(q4_hi(w.q.y), xc),
        dot(q4_lo(w.q.z), xa) + dot(q4_hi(w.q.z), xc), dot(q4_lo(w.q.w), xa) + dot(q4_hi(w.q.w), xc));
    let xs = dot(xa + xc, vec4<f32>(1.0));
#if MIN
    return w.d * s + w.mn * xs;
#else
    return w.d * (s - 8.0 * xs);
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
