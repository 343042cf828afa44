// matmul_q_tiled_mm: y[m, row0 + r] = x[m, :] . W[r, :] (+ bias[row0 + r]) for block-quantized W (Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0, IQ4_NL, and super-block types repacked to 32-weight blocks) in the chunk-tiled layout (src/quant/pack.rs, Layout::Tiled),
// over one row part of W: the prefill (M > 1) path for CPU adapters. Like matmul_q_tiled (4 rows per invocation,
// 8 invocations streaming one 32-row tile, one 32-weight block per loop step) but each invocation also owns TM rows
// of x, so every quant word loaded and dequantized serves TM tokens (register blocking; the dequantized values are
// shared across the token loop).
// Q4_0's offset, the minimums and Q6_K's second scale are applied per block as in matmul_q_tiled.
// x (in storage, or from a uniform buffer when XU: the M rows of a verification step fit one): with SUBGROUPS each
// lane loads one vec4 of a token's block and the 8 are broadcast; else uniform loads.
// Bindings: 0 x [M, K] f32 (a uniform array of 4096 vec4s when XU, else storage) | 1 wq [tiles, G, WB, 8] vec4<u32> quant words | 2 ws [tiles, G, 8] vec2<u32> f16
//   scales (vec4<u32> d, d, m, m for PAIR; SUPER: 16-bit sub-block codes) | 3 wd [tiles, G/8, 8] super-block
//   factors (FACT only: vec4<u32> Q2K, K4, vec2<u32> Q3K) (1..3: lib/quant_tiled_w.wgsl) | then bias [N] f32 (BIAS only) | then y [M, N] f32
//   (written: columns row0..row0+rows).
// Defs: TM (rows of x per invocation: 2 with T2, 4 with T2 and T4, or 8 with T2, T4 and T8; lib/tiled_tokens.wgsl), Q8, HB1, HB2, NL,
//   MIN, S16, PAIR, XSUM, XSUM2, SUPER, Q2K, Q3K, QC (as in matmul_q_tiled), XU, SUBGROUPS, BIAS, GLU, GELU, WG (workgroup size,
//   a multiple of 8), ROPE (W is q|k|v or some of its projections, rows m of x a chain of tokens at positions pos + m:
//   rope_kv's epilogue, lib/rope_store.wgsl, bindings from KC_AT as in matmul_q_tiled).
// Grid: ceil(tiles * 8 / WG) workgroups of WG (folded into y past the per-dimension limit) x 1 x ceil(M / TM).

#include "lib/quant_params.wgsl"

#if XU
@group(0) @binding(0) var<uniform> x: array<vec4<f32>, 4096>;   // [M, K/4], padded to 64 KiB
#else
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;   // [M, K/4]
#endif
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

#include "lib/store_rows.wgsl"
#if ROPE
#include "lib/rope_store.wgsl"
#endif

#include "lib/quant_tiled.wgsl"
#include "lib/tiled_tokens.wgsl"

fn write4(m: u32, r0: u32, acc: vec4<f32>) {
#if ROPE
    if (m < p.m && r0 < p.rows) {
        rope_store4(m, r0, biased(acc, r0));
    }
#else
    if (m < p.m) {
        store4(m, r0, acc);
    }
#endif
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
#if SUBGROUPS
    let xl = sl & 7u;
#else
    let xl = 0u;
    let sl = 0u;
#endif
    // Tokens past M re-read the last one; their sums are not written.
    var toks = toks_new(m0, p.m - 1u, p.xv, xl);
    for (var g = 0u; g < p.groups; g++) {
        toks_add(&toks, w_block(wi, si), g * 8u, sl);
        wi += wstep;
        si += 8u;
    }
    let r0 = c * 4u;
    for (var n = 0u; n < TM; n++) {
        write4(m0 + n, r0, toks_acc(toks, n));
    }
}
