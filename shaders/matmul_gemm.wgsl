// matmul_gemm: y[m, row0 + r] = x[m, :] . W[r, :] (+ bias[row0 + r]) over one row part of W (PyTorch Linear
// layout, W rows are outputs). The prefill (M > 1) path: register-blocked, no workgroup memory (LAVAPIPE.md §4,
// the best measured layout on lavapipe). Each invocation computes a block of 8 rows of x by 4 rows of W, reading
// 4 (f32) or 8 (f16) k per step: 8 x vectors and 4 W vectors feed an 8 x 4 outer-product update per k. The 8 x rows
// come from the workgroup index, so every lane of a workgroup reads the same x (uniform loads); adjacent lanes own
// adjacent 4-row blocks of W.
// Bindings: 0 x [M, K] f32 | 1 w [rows, K] f32, or f16 pairs (see lib/matmul_w.wgsl) | 2 bias [N] f32 (BIAS only)
//   | 2 or 3 y [M, N] f32 (written: columns row0..row0+rows).
// Defs: WG workgroup size (8 on CPU adapters: one SIMD chunk, so a workgroup's 32 rows of W stay in cache while
//   consecutive workgroups walk M; 64 on GPUs), WH f16 weights, VEC rows vector-aligned (K % 4 == 0 for f32,
//   K % 8 == 0 for f16), BIAS.
// Grid: ceil(M / 8) x ceil(rows / (4 * WG)) x 1 workgroups: blocks of x vary fastest, so workgroups that run
// together share their rows of W.

#include "lib/matmul_io.wgsl"

#include "lib/matmul_w.wgsl"

const BM = 8u;  // rows of x per invocation (4 and 16 are slower on lavapipe)

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
    let m0 = wg.x * BM;
    let last = p.rows - 1u;
    // Rows of W past the part's end and rows of x past M re-read the last one; their sums are not written.
    let b0 = r0 * p.kv;
    let b1 = min(r0 + 1u, last) * p.kv;
    let b2 = min(r0 + 2u, last) * p.kv;
    let b3 = min(r0 + 3u, last) * p.kv;
    var xr: array<u32, BM>;
    for (var i = 0u; i < BM; i++) {
        xr[i] = min(m0 + i, p.m - 1u) * p.xv;
    }
    // acc[i][j]: x row m0 + i times W row r0 + j.
    var acc: array<vec4<f32>, BM>;
#if VEC
#if WH
    for (var c = 0u; c < p.kv; c++) {
        let q0 = w[b0 + c];
        let q1 = w[b1 + c];
        let q2 = w[b2 + c];
        let q3 = w[b3 + c];
        let l0 = half_lo(q0);
        let l1 = half_lo(q1);
        let l2 = half_lo(q2);
        let l3 = half_lo(q3);
        let h0 = half_hi(q0);
        let h1 = half_hi(q1);
        let h2 = half_hi(q2);
        let h3 = half_hi(q3);
        // Columns of the 4 x 8 block of W (a register transpose: free on SIMD-per-lane hardware).
        let c0 = vec4<f32>(l0.x, l1.x, l2.x, l3.x);
        let c1 = vec4<f32>(l0.y, l1.y, l2.y, l3.y);
        let c2 = vec4<f32>(l0.z, l1.z, l2.z, l3.z);
        let c3 = vec4<f32>(l0.w, l1.w, l2.w, l3.w);
        let c4 = vec4<f32>(h0.x, h1.x, h2.x, h3.x);
        let c5 = vec4<f32>(h0.y, h1.y, h2.y, h3.y);
        let c6 = vec4<f32>(h0.z, h1.z, h2.z, h3.z);
        let c7 = vec4<f32>(h0.w, h1.w, h2.w, h3.w);
        for (var i = 0u; i < BM; i++) {
            let xa = x[xr[i] + 2u * c];
            let xc = x[xr[i] + 2u * c + 1u];
            acc[i] += c0 * xa.x + c1 * xa.y + c2 * xa.z + c3 * xa.w + c4 * xc.x + c5 * xc.y + c6 * xc.z + c7 * xc.w;
        }
    }
#else
    for (var c = 0u; c < p.kv; c++) {
        let w0 = w[b0 + c];
        let w1 = w[b1 + c];
        let w2 = w[b2 + c];
        let w3 = w[b3 + c];
        // Columns of the 4 x 4 block of W (a register transpose: free on SIMD-per-lane hardware).
        let c0 = vec4<f32>(w0.x, w1.x, w2.x, w3.x);
        let c1 = vec4<f32>(w0.y, w1.y, w2.y, w3.y);
        let c2 = vec4<f32>(w0.z, w1.z, w2.z, w3.z);
        let c3 = vec4<f32>(w0.w, w1.w, w2.w, w3.w);
        for (var i = 0u; i < BM; i++) {
            let xa = x[xr[i] + c];
            acc[i] += c0 * xa.x + c1 * xa.y + c2 * xa.z + c3 * xa.w;
        }
    }
#endif
#else
    // Unaligned rows: one k at a time.
    for (var k = 0u; k < p.k; k++) {
        let wk = vec4<f32>(w_at(b0, k), w_at(b1, k), w_at(b2, k), w_at(b3, k));
        for (var i = 0u; i < BM; i++) {
            acc[i] += x[xr[i] + k] * wk;
        }
    }
#endif
    for (var i = 0u; i < BM; i++) {
        let m = m0 + i;
        if (m < p.m) {
            let yb = m * p.n + p.row0;
            for (var j = 0u; j < 4u; j++) {
                let r = r0 + j;
                if (r < p.rows) {
#if BIAS
                    y[yb + r] = acc[i][j] + bias[p.row0 + r];
#else
                    y[yb + r] = acc[i][j];
#endif
                }
            }
        }
    }
}
