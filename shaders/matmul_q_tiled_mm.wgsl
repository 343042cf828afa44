// matmul_q_tiled_mm: y[m, row0 + r] = x[m, :] . W[r, :] (+ bias[row0 + r]) for block-quantized W (Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0, IQ4_NL, and super-block types repacked to 32-weight blocks) in the chunk-tiled layout (src/quant/pack.rs, Layout::Tiled),
// over one row part of W: the prefill (M > 1) path for CPU adapters. Like matmul_q_tiled (4 rows per invocation,
// 8 invocations streaming one 32-row tile, one 32-weight block per loop step) but each invocation also owns TM rows
// of x, so every quant word loaded and dequantized serves TM tokens (register blocking; the dequantized values are
// shared across the token loop).
// Q4_0's offset, the minimums and Q6_K's second scale are applied per block as in matmul_q_tiled.
// x (in storage: M rows of it rarely fit one uniform binding): with SUBGROUPS each lane loads one vec4 of a token's
// block and the 8 are broadcast; else uniform loads.
// Bindings: 0 x [M, K] f32 | 1 wq [tiles, G, WB, 8] vec4<u32> quant words | 2 ws [tiles, G, 8] vec2<u32> f16
//   scales (vec4<u32> d, d, m, m for PAIR; SUPER: 16-bit sub-block codes) | 3 wd [tiles, G/8, 8] super-block
//   factors (FACT only: vec4<u32> Q2K, K4, vec2<u32> Q3K) (1..3: lib/quant_tiled_w.wgsl) | then bias [N] f32 (BIAS only) | then y [M, N] f32
//   (written: columns row0..row0+rows).
// Defs: TM (rows of x per invocation: 4, or 8 with TM8), Q8, HB1, HB2, NL, MIN, S16, PAIR, XSUM, XSUM2, SUPER, Q2K,
//   Q3K, QC (as in matmul_q_tiled),
//   SUBGROUPS, BIAS, WG (workgroup size, a multiple of 8).
// Grid: ceil(tiles * 8 / WG) workgroups of WG (folded into y past the per-dimension limit) x 1 x ceil(M / TM).

#include "lib/quant_params.wgsl"

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;   // [M, K/4]
#include "lib/quant_tiled_w.wgsl"
#if FACT
#if BIAS
@group(0) @binding(4) var<storage, read> bias: array<f32>;      // [N]
@group(0) @binding(5) var<storage, read_write> y: array<f32>;   // [M, N]
#else
@group(0) @binding(4) var<storage, read_write> y: array<f32>;   // [M, N]
#endif
#else
#if BIAS
@group(0) @binding(3) var<storage, read> bias: array<f32>;      // [N]
@group(0) @binding(4) var<storage, read_write> y: array<f32>;   // [M, N]
#else
@group(0) @binding(3) var<storage, read_write> y: array<f32>;   // [M, N]
#endif
#endif
@group(1) @binding(0) var<uniform> p: Params;

#include "lib/quant_tiled.wgsl"

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
        let w = w_block(wi, si);
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
