// moe_down_dense: BlockFFN's sparse down projection with dense f32 or f16 weights (Song et al. 2025,
// arXiv 2507.08771): y[m, o] = sum over the experts ex in the active list of Wdown[o, ex*de .. ex*de + de] .
// h[m, ex*de .. ex*de + de], i.e. a GEMV / GEMM whose K runs only over the active experts' column blocks.
// W is the PyTorch `block_linear` down_proj, [hidden, E*de] rows (the `block` form [E, hidden, de] must be
// permuted to [hidden, E, de] at load). Each output row reads de contiguous weights per active expert.
// Register-blocked for CPU adapters (as matmul_gemm): each invocation owns 4 consecutive output rows and TM tokens,
// streams its rows' active blocks with 16-byte loads and reads h at uniform indices; no workgroup memory.
// Bindings: 0 h [M, E*de] f32 | 1 w [hidden, E*de] f32, or f16 pairs (lib/matmul_w.wgsl) | 2 alist [1 + E] u32 |
//   3 y [M, hidden] f32 (written).
// Defs: WH f16 weights, VEC (always), TM tokens per invocation, WG workgroup size, K2 two k-steps per loop
//   iteration (for TM = 1: faster there; with 8 tokens one step is, measured on lavapipe). de % 32 == 0.
// Grid: ceil(M / TM) x ceil(hidden / (4*WG)) workgroups (the second folded into z past the per-dimension limit):
//   token blocks vary fastest, so workgroups that run together share their rows of W.

#include "lib/moe_common.wgsl"

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;        // [M, E*de/4] (h)
#if WH
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;        // [hidden, E*de/8] f16 x 8
#else
@group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;        // [hidden, E*de/4]
#endif
@group(0) @binding(2) var<storage, read> alist: array<u32>;         // [1 + E]
@group(0) @binding(3) var<storage, read_write> y: array<f32>;        // [M, hidden]

#include "lib/matmul_w.wgsl"
#include "lib/matmul_kstep.wgsl"

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let r0 = ((wg.y + wg.z * nwg.y) * WG + li) * 4u;
    if (r0 >= p.rows) {
        return;
    }
    let last = p.rows - 1u;
    // Rows past hidden re-read the last one; their sums are not written.
    let b = min(vec4<u32>(r0, r0 + 1u, r0 + 2u, r0 + 3u), vec4<u32>(last)) * p.kv;
    let m0 = wg.x * TM;
    var xr: array<u32, TM>;
    for (var t = 0u; t < TM; t++) {
        xr[t] = min(m0 + t, p.m - 1u) * p.xv;
    }
    var acc: array<vec4<f32>, TM>;
#if WH
    let steps = p.de / 8u;  // vec4<u32> of 8 halves per expert and row
#else
    let steps = p.de / 4u;
#endif
    let count = alist[0];
    for (var s = 0u; s < count; s++) {
        // The expert's k-steps, two per iteration with K2 (de % 32 == 0: the count is even).
        let c0 = alist[1u + s] * steps;
#if K2
        for (var c = c0; c < c0 + steps; c += 2u) {
            kstep(&acc, &xr, b, c);
            kstep(&acc, &xr, b, c + 1u);
        }
#else
        for (var c = c0; c < c0 + steps; c++) {
            kstep(&acc, &xr, b, c);
        }
#endif
    }
    for (var t = 0u; t < TM; t++) {
        let m = m0 + t;
        if (m < p.m) {
            let yb = m * p.rows;
            for (var j = 0u; j < 4u; j++) {
                let o = r0 + j;
                if (o < p.rows) {
                    y[yb + o] = acc[t][j];
                }
            }
        }
    }
}
