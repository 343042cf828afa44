// moe_up_q_tiled: BlockFFN's sparse up projection (Song et al. 2025, arXiv 2507.08771) with block-quantized
// weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, and super-block types repacked to 32-weight blocks) in the chunk-tiled
// layout for CPU adapters (src/quant/pack.rs, Layout::Tiled):
//   h[m, ex*de + j] = silu(x[m, :] . Wup[ex*de + j, :]) * r[m, ex]      for each active expert ex, j < de
// W is [E*de, K] (PyTorch `block_linear` up_proj) packed as one matrix; an expert is de/32 whole tiles of 32 rows.
// As matmul_q_tiled(_mm): a workgroup of 8 invocations streams one tile (4 rows per invocation, one 32-weight
// block per loop step) and each invocation keeps TM tokens, so a dequantized block serves TM tokens. Workgroups
// whose expert slot is past the active count return at once (uniformly).
// With SUBGROUPS (subgroup size >= 8) each lane loads one vec4 of a token's block of x and the 8 are broadcast.
// Bindings: 0 x [M, K] f32 | 1 wq [tiles, G, WB, 8] vec4<u32> | 2 ws [tiles, G, 8] vec2<u32> f16 scales (vec4<u32>
//   d, d, m, m for PAIR; K4: 16-bit codes) | 3 wd [tiles, G/8, 8] vec4<u32> super-block factors (FACT: Q4_K only)
//   (lib/quant_tiled_w.wgsl) | then r [M, E] f32 | then alist [1 + E] u32 | then h [M, E*de] f32 (written: active
//   experts' columns).
// Defs: the format's flags (Q8, HB1, HB2, NL, MIN, S16, PAIR, XSUM, QC: Format::shader_flags), SUBGROUPS, TM tokens per
// invocation (1, 4 with T4, 8 with T4 and T8). Workgroup size 8.
// Grid: ceil(M / TM) x E * de / 32 workgroups (the second folded into z past the per-dimension limit): token blocks
//   vary fastest, so workgroups that run together share their tile of W.

#include "lib/moe_common.wgsl"

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;   // [M, K/4]
#include "lib/quant_tiled_w.wgsl"
#if FACT
@group(0) @binding(4) var<storage, read> r: array<f32>;         // [M, E]
@group(0) @binding(5) var<storage, read> alist: array<u32>;     // [1 + E]
@group(0) @binding(6) var<storage, read_write> h: array<f32>;   // [M, E*de]
#else
@group(0) @binding(3) var<storage, read> r: array<f32>;         // [M, E]
@group(0) @binding(4) var<storage, read> alist: array<u32>;     // [1 + E]
@group(0) @binding(5) var<storage, read_write> h: array<f32>;   // [M, E*de]
#endif

#include "lib/quant_tiled.wgsl"

// One token's contribution of a block: its x block starts at vec4 index `at` (plus this lane's vector with
// SUBGROUPS, already in `at`).
fn tok(w: WBlock, at: u32, sl: u32) -> vec4<f32> {
#if SUBGROUPS
    return block_dot(w, x_block(x[at], sl));
#else
    return block_dot(w, x_block(at));
#endif
}

// Row r0..r0+4 of token m: silu(acc) * r[m, ex], for tokens inside the chunk.
fn put(m: u32, ex: u32, r0: u32, acc: vec4<f32>) {
    if (m < p.m) {
        let v = silu4(acc) * r[m * p.experts + ex];
        let hb = m * p.rows + r0;
        h[hb] = v.x;
        h[hb + 1u] = v.y;
        h[hb + 2u] = v.z;
        h[hb + 3u] = v.w;
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
    let flat = wg.y + wg.z * nwg.y;
    let slot = flat / p.per_expert;
    if (slot >= alist[0]) {
        return;  // uniform across the workgroup
    }
    let ex = alist[1u + slot];
    let tile = ex * p.per_expert + flat % p.per_expert;
    let wstep = WB * 8u;
    var wi = tile * p.groups * wstep + lane;
    var si = tile * p.groups * 8u + lane;
    let m0 = wg.x * TM;
#if SUBGROUPS
    let xl = sl & 7u;
#else
    let xl = 0u;
    let sl = 0u;
#endif
    // First x vector of each token (tokens past M re-read the last one; their sums are not written). The token
    // blocks are written out (not arrays in loops) so that each dequantized block is shared by the tokens.
    let last = p.m - 1u;
    var x0 = min(m0, last) * p.xv + xl;
    var a0 = vec4<f32>(0.0);
#if T4
    var x1 = min(m0 + 1u, last) * p.xv + xl;
    var x2 = min(m0 + 2u, last) * p.xv + xl;
    var x3 = min(m0 + 3u, last) * p.xv + xl;
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
#endif
#if T8
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
        a0 += tok(w, x0, sl);
        x0 += 8u;
#if T4
        a1 += tok(w, x1, sl);
        a2 += tok(w, x2, sl);
        a3 += tok(w, x3, sl);
        x1 += 8u;
        x2 += 8u;
        x3 += 8u;
#endif
#if T8
        a4 += tok(w, x4, sl);
        a5 += tok(w, x5, sl);
        a6 += tok(w, x6, sl);
        a7 += tok(w, x7, sl);
        x4 += 8u;
        x5 += 8u;
        x6 += 8u;
        x7 += 8u;
#endif
        wi += wstep;
        si += 8u;
    }
    let r0 = tile * 32u + lane * 4u;
    put(m0, ex, r0, a0);
#if T4
    put(m0 + 1u, ex, r0, a1);
    put(m0 + 2u, ex, r0, a2);
    put(m0 + 3u, ex, r0, a3);
#endif
#if T8
    put(m0 + 4u, ex, r0, a4);
    put(m0 + 5u, ex, r0, a5);
    put(m0 + 6u, ex, r0, a6);
    put(m0 + 7u, ex, r0, a7);
#endif
}
