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
// invocation (1, 4 with T4, 8 with T4 and T8: lib/tiled_tokens.wgsl). Workgroup size 8.
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
#include "lib/tiled_tokens.wgsl"

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
    // Tokens past M re-read the last one; their sums are not written.
    var toks = toks_new(m0, p.m - 1u, p.xv, xl);
    for (var g = 0u; g < p.groups; g++) {
        toks_add(&toks, w_block(wi, si), g * 8u, sl);
        wi += wstep;
        si += 8u;
    }
    let r0 = tile * 32u + lane * 4u;
    for (var n = 0u; n < TM; n++) {
        put(m0 + n, ex, r0, toks_acc(toks, n));
    }
}
