// matmul_q_tiled_mm: y[m, row0 + r] = x[m, :] . W[r, :] (+ bias[row0 + r]) for block-quantized W (Q4_0, Q4_1,
// Q8_0) in the chunk-tiled layout (src/quant/pack.rs, Layout::Tiled), over one row part of W: the prefill (M > 1)
// path for CPU adapters. Like matmul_q_tiled (4 rows per invocation, 8 invocations streaming one 32-row tile, one
// 32-weight block per loop step) but each invocation also owns TM rows of x, so every quant word loaded and
// dequantized serves TM tokens (register blocking; the dequantized values are shared across the token loop).
// Q4_0's offset and Q4_1's minimum are folded out per block as in matmul_q_tiled.
// x: with SUBGROUPS each lane loads one vec4 of a token's block and the 8 are broadcast; else uniform loads.
// Bindings: 0 x [M, K] f32 (uniform array<vec4<f32>, XN> when XU, else storage) | 1 wq [tiles, G, WB, 8]
//   vec4<u32> quant words | 2 ws [tiles, G, 8] vec2<u32> f16 scales (vec4<u32> d, d, m, m for MIN) | 3 bias [N]
//   f32 (BIAS only) | 3 or 4 y [M, N] f32 (written: columns row0..row0+rows).
// Defs: TM (rows of x per invocation: 4, or 8 with TM8), Q8, MIN, XU + XN, SUBGROUPS, BIAS, WG (workgroup size, a multiple of 8).
// Grid: ceil(tiles * 8 / WG) workgroups of WG (folded into y past the per-dimension limit) x 1 x ceil(M / TM).

struct Params {
    m: u32,       // rows of x
    k: u32,       // reduction length (a multiple of 32)
    n: u32,       // columns of y (all parts)
    row0: u32,    // first output column of this part
    rows: u32,    // rows of W in this part
    groups: u32,  // blocks per row, K / 32
    xv: u32,      // x row stride in vec4s, K / 4
    tiles: u32,   // tiles of 32 rows in this part
}

#if XU
@group(0) @binding(0) var<uniform> x: array<vec4<f32>, XN>;     // [M, K/4]
#else
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;   // [M, K/4]
#endif
@group(0) @binding(1) var<storage, read> wq: array<vec4<u32>>;  // [tiles, G, WB, 8] 4 rows' words
#if MIN
@group(0) @binding(2) var<storage, read> ws: array<vec4<u32>>;  // [tiles, G, 8] (d01, d23, m01, m23) f16 pairs
#else
@group(0) @binding(2) var<storage, read> ws: array<vec2<u32>>;  // [tiles, G, 8] (d01, d23) f16 pairs
#endif
#if BIAS
@group(0) @binding(3) var<storage, read> bias: array<f32>;      // [N]
@group(0) @binding(4) var<storage, read_write> y: array<f32>;   // [M, N]
#else
@group(0) @binding(3) var<storage, read_write> y: array<f32>;   // [M, N]
#endif
@group(1) @binding(0) var<uniform> p: Params;

#include "lib/quant_tiled.wgsl"

#if Q8
const WB = 8u;  // quant words per block per row
#else
const WB = 4u;
#endif

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
    sum: f32,
}

#if SUBGROUPS
// From `xr`, this lane's vector (lane l holds x[8 l..8 l + 4] of the block), by broadcasts.
fn x_block(xr: vec4<f32>, sl: u32) -> XBlock {
    var b: XBlock;
#if Q8
    let xl = xr * Q8_X_SCALE;
#else
    let xl = xr * select(Q4_XA_SCALE, Q4_XB_SCALE, (sl & 4u) != 0u);
    let xd = dot(xr, vec4<f32>(1.0));
    b.sum = ((subgroupBroadcast(xd, 0u) + subgroupBroadcast(xd, 1u))
        + (subgroupBroadcast(xd, 2u) + subgroupBroadcast(xd, 3u)))
        + ((subgroupBroadcast(xd, 4u) + subgroupBroadcast(xd, 5u))
        + (subgroupBroadcast(xd, 6u) + subgroupBroadcast(xd, 7u)));
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
#if Q8
    let sa = vec4<f32>(Q8_X_SCALE);
    let sb = sa;
#else
    let sa = Q4_XA_SCALE;
    let sb = Q4_XB_SCALE;
    b.sum = dot((r0 + r1) + (r2 + r3) + ((r4 + r5) + (r6 + r7)), vec4<f32>(1.0));
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

// The quant words of one block of 4 rows, and its constants.
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
    d: vec4<f32>,
#if MIN
    m: vec4<f32>,
#endif
}

// One token's contribution of a block to the 4 rows. Inlined for every token with the same WBlock, so the
// dequantization (mask and convert) is computed once and shared by the tokens.
fn block_dot(w: WBlock, b: XBlock) -> vec4<f32> {
#if Q8
    let s = (q8_word(w.q0, b.v0) + q8_word(w.q1, b.v1)) + (q8_word(w.q2, b.v2) + q8_word(w.q3, b.v3))
        + ((q8_word(w.q4, b.v4) + q8_word(w.q5, b.v5)) + (q8_word(w.q6, b.v6) + q8_word(w.q7, b.v7)));
    return w.d * s;
#else
    let s = (q4_word(w.q0, b.v0, b.v4) + q4_word(w.q1, b.v1, b.v5))
        + (q4_word(w.q2, b.v2, b.v6) + q4_word(w.q3, b.v3, b.v7));
#if MIN
    return w.d * s + w.m * b.sum;
#else
    return w.d * (s - 8.0 * b.sum);
#endif
#endif
}

fn write4(m: u32, r0: u32, acc: vec4<f32>) {
    if (m >= p.m) {
        return;
    }
    let yb = m * p.n + p.row0;
    for (var j = 0u; j < 4u; j++) {
        let r = r0 + j;
        if (r < p.rows) {
#if BIAS
            y[yb + r] = acc[j] + bias[p.row0 + r];
#else
            y[yb + r] = acc[j];
#endif
        }
    }
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
#if SUBGROUPS
    @builtin(subgroup_invocation_id) sl: u32,
#endif
) {
    let c = (wg.x + wg.y * nwg.x) * WG + li;  // group of 4 rows in the part
    // Invocations past the last tile recompute it (no early return: subgroup operations need every lane).
    let tile = min(c / 8u, p.tiles - 1u);
    let lane = c % 8u;
    let wstep = WB * 8u;
    var wi = tile * p.groups * wstep + lane;
    var si = tile * p.groups * 8u + lane;
    let m0 = wg.z * TM;
    // First x vector of each token (tokens past M re-read the last one; their sums are not written).
    let last = p.m - 1u;
#if SUBGROUPS
    let xl = sl & 7u;
#else
    let xl = 0u;
#endif
    var x0 = min(m0, last) * p.xv + xl;
    var x1 = min(m0 + 1u, last) * p.xv + xl;
    var x2 = min(m0 + 2u, last) * p.xv + xl;
    var x3 = min(m0 + 3u, last) * p.xv + xl;
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
#if TM8
    var x4 = min(m0 + 4u, last) * p.xv + xl;
    var x5 = min(m0 + 5u, last) * p.xv + xl;
    var x6 = min(m0 + 6u, last) * p.xv + xl;
    var x7 = min(m0 + 7u, last) * p.xv + xl;
    var a4 = vec4<f32>(0.0);
    var a5 = vec4<f32>(0.0);
    var a6 = vec4<f32>(0.0);
    var a7 = vec4<f32>(0.0);
#endif
    for (var g = 0u; g < p.groups; g++) {
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
        w.d = halves4(ws[si]);
#else
#if MIN
        let sc = ws[si];
        w.d = halves4(sc.xy);
        w.m = halves4(sc.zw);
#else
        w.d = halves4(ws[si]);
#endif
#endif
#if SUBGROUPS
        a0 += block_dot(w, x_block(x[x0], sl));
        a1 += block_dot(w, x_block(x[x1], sl));
        a2 += block_dot(w, x_block(x[x2], sl));
        a3 += block_dot(w, x_block(x[x3], sl));
#if TM8
        a4 += block_dot(w, x_block(x[x4], sl));
        a5 += block_dot(w, x_block(x[x5], sl));
        a6 += block_dot(w, x_block(x[x6], sl));
        a7 += block_dot(w, x_block(x[x7], sl));
#endif
#else
        a0 += block_dot(w, x_block(x0));
        a1 += block_dot(w, x_block(x1));
        a2 += block_dot(w, x_block(x2));
        a3 += block_dot(w, x_block(x3));
#if TM8
        a4 += block_dot(w, x_block(x4));
        a5 += block_dot(w, x_block(x5));
        a6 += block_dot(w, x_block(x6));
        a7 += block_dot(w, x_block(x7));
#endif
#endif
        wi += wstep;
        si += 8u;
        x0 += 8u;
        x1 += 8u;
        x2 += 8u;
        x3 += 8u;
#if TM8
        x4 += 8u;
        x5 += 8u;
        x6 += 8u;
        x7 += 8u;
#endif
    }
    let r0 = c * 4u;
    write4(m0, r0, a0);
    write4(m0 + 1u, r0, a1);
    write4(m0 + 2u, r0, a2);
    write4(m0 + 3u, r0, a3);
#if TM8
    write4(m0 + 4u, r0, a4);
    write4(m0 + 5u, r0, a5);
    write4(m0 + 6u, r0, a6);
    write4(m0 + 7u, r0, a7);
#endif
}
