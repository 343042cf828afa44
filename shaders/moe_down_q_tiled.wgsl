// moe_down_q_tiled: BlockFFN's sparse down projection (Song et al. 2025, arXiv 2507.08771) with block-quantized
// weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, and super-block types repacked to 32-weight blocks) in the chunk-tiled
// layout for CPU adapters (src/quant/pack.rs, Layout::Tiled):
//   y[m, o] = sum over the experts ex in the active list of Wdown[o, ex*de .. +de] . h[m, ex*de .. +de]
// W is [hidden, E*de] (PyTorch `block_linear` down_proj; `block` [E, hidden, de] permuted to [hidden, E, de]) packed
// as one matrix with K = E*de; an expert's columns are de/32 consecutive blocks of every row, contiguous in a tile.
// As matmul_q_tiled(_mm): a workgroup of 8 invocations streams one tile of 32 output rows (4 per invocation), one
// block per loop step, TM tokens per invocation; the block loop runs over the listed experts' blocks only.
// With SUBGROUPS (subgroup size >= 8) each lane loads one vec4 of a token's block of h and the 8 are broadcast.
// Bindings: 0 h [M, E*de] f32 | 1 wq [tiles, G, WB, 8] vec4<u32> | 2 ws [tiles, G, 8] vec2<u32> f16 scales
//   (vec4<u32> d, d, m, m for PAIR; K4: 16-bit codes) | 3 wd [tiles, G/8, 8] vec4<u32> super-block factors (FACT:
//   Q4_K only) (lib/quant_tiled_w.wgsl) | then alist [1 + E] u32 | then y [M, hidden] f32 (written).
// Defs: the format's flags (Q8, HB1, HB2, NL, MIN, S16, PAIR, XSUM, QC: Format::shader_flags), SUBGROUPS, TM tokens per
// invocation (1, 4 with T4, 8 with T4 and T8: lib/tiled_tokens.wgsl). Workgroup size 8.
// Grid: ceil(M / TM) x ceil(hidden / 32) workgroups (the second folded into z past the per-dimension limit): token
//   blocks vary fastest, so workgroups that run together share their tile of W.

#include "lib/moe_common.wgsl"

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;   // [M, E*de/4] (h)
#include "lib/quant_tiled_w.wgsl"
#if FACT
@group(0) @binding(4) var<storage, read> alist: array<u32>;     // [1 + E]
@group(0) @binding(5) var<storage, read_write> y: array<f32>;   // [M, hidden]
#else
@group(0) @binding(3) var<storage, read> alist: array<u32>;     // [1 + E]
@group(0) @binding(4) var<storage, read_write> y: array<f32>;   // [M, hidden]
#endif

#include "lib/quant_tiled.wgsl"
#include "lib/tiled_tokens.wgsl"

// Rows r0..r0+4 of token m, for tokens inside the chunk and rows inside hidden.
fn put(m: u32, r0: u32, acc: vec4<f32>) {
    if (m < p.m) {
        let yb = m * p.rows;
        for (var j = 0u; j < 4u; j++) {
            if (r0 + j < p.rows) {
                y[yb + r0 + j] = acc[j];
            }
        }
    }
}

@compute @workgroup_size(8)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
#if SUBGROUPS
    @builtin(subgroup_invocation_id) sl: u32,
#endif
) {
    let tile = wg.y + wg.z * nwg.y;
    if (tile >= p.tiles) {
        return;  // uniform across the workgroup
    }
    let wstep = WB * 8u;
    let m0 = wg.x * TM;
#if SUBGROUPS
    let xl = sl & 7u;
#else
    let xl = 0u;
    let sl = 0u;
#endif
    // Tokens past M re-read the last one; their sums are not written.
    var toks = toks_new(m0, p.m - 1u, p.xv, xl);
    let count = alist[0];
    for (var s = 0u; s < count; s++) {
        let g0 = alist[1u + s] * p.per_expert;  // first block of the expert in every row
        var wi = (tile * p.groups + g0) * wstep + lane;
        var si = (tile * p.groups + g0) * 8u + lane;
        var xo = g0 * 8u;  // vec4 offset of the block in a row of h
        for (var g = 0u; g < p.per_expert; g++) {
            toks_add(&toks, w_block(wi, si), xo, sl);
            wi += wstep;
            si += 8u;
            xo += 8u;
        }
    }
    let r0 = tile * 32u + lane * 4u;
    for (var n = 0u; n < TM; n++) {
        put(m0 + n, r0, toks_acc(toks, n));
    }
}
