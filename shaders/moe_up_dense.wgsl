// moe_up_dense: BlockFFN's sparse up projection with dense f32 or f16 weights (Song et al. 2025, arXiv 2507.08771):
// for each expert ex in the active list and each token m,
//   h[m, ex*de + j] = silu(x[m, :] . Wup[ex*de + j, :]) * r[m, ex]        (j < de)
// W is the PyTorch `block_linear` up_proj, [E*de, K] rows (the `block` form [E, de, K] is the same memory).
// Columns of h for experts outside the list are not written (moe_down never reads them).
// Register-blocked for CPU adapters (as matmul_gemm, LAVAPIPE.md §4): each invocation owns 4 consecutive rows of
// one expert and TM tokens, streams its rows along K with 16-byte loads and reads x at uniform indices; no
// workgroup memory. A workgroup (WG lanes, 4*WG rows) lies within one expert: de % (4*WG) == 0.
// Bindings: 0 x [M, K] f32 | 1 w [E*de, K] f32, or f16 pairs (lib/matmul_w.wgsl; K % 8 == 0) | 2 r [M, E] f32 |
//   3 alist [1 + E] u32 | 4 h [M, E*de] f32 (written: active experts' columns).
// Defs: WH f16 weights, VEC (always: rows are whole vectors), TM tokens per invocation, WG workgroup size, K2 two
//   k-steps per loop iteration (for TM = 1: faster there; with 8 tokens one step is, measured on lavapipe).
// Grid: ceil(M / TM) x E * de / (4*WG) workgroups (the second folded into z past the per-dimension limit; expert
//   slot = index / per_expert). Token blocks vary fastest, so workgroups that run together share their rows of W.

#include "lib/moe_common.wgsl"

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;        // [M, K/4]
#if WH
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;        // [E*de, K/8] f16 x 8
#else
@group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;        // [E*de, K/4]
#endif
@group(0) @binding(2) var<storage, read> r: array<f32>;              // [M, E]
@group(0) @binding(3) var<storage, read> alist: array<u32>;         // [1 + E]
@group(0) @binding(4) var<storage, read_write> h: array<f32>;        // [M, E*de]

#include "lib/matmul_w.wgsl"
#include "lib/matmul_kstep.wgsl"

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let flat = wg.y + wg.z * nwg.y;
    let per_expert = p.de / (4u * WG);  // workgroups per expert
    let slot = flat / per_expert;
    if (slot >= alist[0]) {
        return;
    }
    let ex = alist[1u + slot];
    let r0 = ex * p.de + ((flat % per_expert) * WG + li) * 4u;
    let b = vec4<u32>(r0, r0 + 1u, r0 + 2u, r0 + 3u) * p.kv;
    let m0 = wg.x * TM;
    // Tokens past M re-read the last one; their sums are not written.
    var xr: array<u32, TM>;
    for (var t = 0u; t < TM; t++) {
        xr[t] = min(m0 + t, p.m - 1u) * p.xv;
    }
    // acc[t][j]: token m0 + t times row r0 + j. With K2 two k-steps per iteration, then the odd one.
    var acc: array<vec4<f32>, TM>;
#if K2
    for (var c = 0u; c + 1u < p.kv; c += 2u) {
        kstep(&acc, &xr, b, c);
        kstep(&acc, &xr, b, c + 1u);
    }
    if ((p.kv & 1u) == 1u) {
        kstep(&acc, &xr, b, p.kv - 1u);
    }
#else
    for (var c = 0u; c < p.kv; c++) {
        kstep(&acc, &xr, b, c);
    }
#endif
    for (var t = 0u; t < TM; t++) {
        let m = m0 + t;
        if (m < p.m) {
            let v = silu4(acc[t]) * r[m * p.experts + ex];
            let hb = m * p.rows + r0;
            h[hb] = v.x;
            h[hb + 1u] = v.y;
            h[hb + 2u] = v.z;
            h[hb + 3u] = v.w;
        }
    }
}
