// The epilogue of the matmul kernels whose invocation (or workgroup) ends with the sums of 4 consecutive rows
// r0 .. r0 + 4 of W's part for one row m of x: matmul_gemv_cpu, matmul_gemv_gpu, matmul_gemm, matmul_q_tiled,
// matmul_q_tiled_mm, matmul_q_rows. Rows at or past p.rows are not written.
//   plain: y[m, row0 + r] = sum_r (+ bias[row0 + r] with BIAS)
//   GLU: W's rows are (gate, up) pairs (row 2i the gate of output i, row 2i + 1 its up; row0 even), so the 4 rows
//   are the gates and ups of outputs (row0 + r0) / 2 and the next: y [M, N / 2], y[m, (row0 + r) / 2] =
//   act(gate) * up (lib/glu.wgsl; GELU picks the activation). Removes the [M, N] intermediate and a dispatch.
// The including shader declares y (array<f32>), bias (BIAS) and p with fields n (W's rows, all parts), row0 and rows.

// ADD (tiled GEMV only): y[m, row0 + r] = res[m, row0 + r] + alpha * sum_r, the residual add of the layer's
// output projections (the arithmetic of add and of rms_norm's RESIDUAL form); res is bound at RES_AT.
#if ADD
@group(0) @binding(RES_AT) var<storage, read> res: array<f32>;  // [M, N]
#endif

alias GV = vec2<f32>;
#include "lib/glu.wgsl"

fn store4(m: u32, r0: u32, sums: vec4<f32>) {
    var s = sums;
#if BIAS
    for (var j = 0u; j < 4u; j++) {
        s[j] += bias[p.row0 + min(r0 + j, p.rows - 1u)];
    }
#endif
#if GLU
    // rows is even, so r0 < rows implies r0 + 1 < rows.
    let yb = m * (p.n / 2u) + (p.row0 + r0) / 2u;
    let o = glu(s.xz, s.yw);
    if (r0 < p.rows) {
        y[yb] = o.x;
    }
    if (r0 + 2u < p.rows) {
        y[yb + 1u] = o.y;
    }
#else
    let yb = m * p.n + p.row0;
    for (var j = 0u; j < 4u; j++) {
        let r = r0 + j;
        if (r < p.rows) {
#if ADD
            y[yb + r] = res[yb + r] + p.alpha * s[j];
#else
            y[yb + r] = s[j];
#endif
        }
    }
#endif
}
