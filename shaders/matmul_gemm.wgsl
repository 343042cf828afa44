// matmul_gemm: y[m, row0 + r] = x[m, :] . W[r, :] (+ bias[row0 + r]) over one row part of W (PyTorch Linear
// layout, W rows are outputs). The prefill (M > 1) path: register-blocked, no workgroup memory (LAVAPIPE.md §4,
// the best measured layout on lavapipe). Each invocation computes a block of 8 rows of x by 4 rows of W, reading
// 4 (f32) or 8 (f16) k per step: 8 x vectors and 4 W vectors feed an 8 x 4 outer-product update per k. The 8 x rows
// come from the workgroup index, so every lane of a workgroup reads the same x (uniform loads); adjacent lanes own
// adjacent 4-row blocks of W. The k-step is lib/matmul_kstep.wgsl's, shared with the MoE dense kernels.
// Bindings: 0 x [M, K] f32 | 1 w [rows, K] f32, or f16 pairs (see lib/matmul_w.wgsl) | 2 bias [N] f32 (BIAS only)
//   | 2 or 3 y [M, N] f32 (written: columns row0..row0+rows).
// Defs: WG workgroup size (8 on CPU adapters: one SIMD chunk, so a workgroup's 32 rows of W stay in cache while
//   consecutive workgroups walk M; 64 on GPUs), WH f16 weights, VEC rows vector-aligned (K % 4 == 0 for f32,
//   K % 8 == 0 for f16), BIAS,
//   GLU with GELU (act(gate) * up over row pairs, y [M, N/2]: lib/store_rows.wgsl).
// Grid: ceil(M / 8) x ceil(rows / (4 * WG)) x 1 workgroups: blocks of x vary fastest, so workgroups that run
// together share their rows of W.

#include "lib/matmul_io.wgsl"

#include "lib/matmul_w.wgsl"
#include "lib/store_rows.wgsl"

const TM = 8u;  // rows of x per invocation (4 and 16 are slower on lavapipe)

#include "lib/matmul_kstep.wgsl"

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let r0 = (wg.y * WG + li) * 4u;
    if (r0 >= p.rows) {
        return;
    }
    let m0 = wg.x * TM;
    let last = p.rows - 1u;
    // Rows of W past the part's end and rows of x past M re-read the last one; their sums are not written.
    let b0 = r0 * p.kv;
    let b1 = min(r0 + 1u, last) * p.kv;
    let b2 = min(r0 + 2u, last) * p.kv;
    let b3 = min(r0 + 3u, last) * p.kv;
    var xr: array<u32, TM>;
    for (var i = 0u; i < TM; i++) {
        xr[i] = min(m0 + i, p.m - 1u) * p.xv;
    }
    // acc[i][j]: x row m0 + i times W row r0 + j.
    var acc: array<vec4<f32>, TM>;
#if VEC
    let b = vec4<u32>(b0, b1, b2, b3);
    for (var c = 0u; c < p.kv; c++) {
        kstep(&acc, &xr, b, c);
    }
#else
    // Unaligned rows: one k at a time.
    for (var k = 0u; k < p.k; k++) {
        let wk = vec4<f32>(w_at(b0, k), w_at(b1, k), w_at(b2, k), w_at(b3, k));
        for (var i = 0u; i < TM; i++) {
            acc[i] += x[xr[i] + k] * wk;
        }
    }
#endif
    for (var i = 0u; i < TM; i++) {
        let m = m0 + i;
        if (m < p.m) {
            store4(m, r0, acc[i]);
        }
    }
}
