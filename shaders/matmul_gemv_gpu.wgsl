// matmul_gemv_gpu: y[m, row0 + r] = x[m, :] . W[r, :] (+ bias[row0 + r]) over one row part of W (PyTorch Linear
// layout, W rows are outputs). The decode (M = 1) path for real GPUs: a workgroup of 64 owns 4 rows; its lanes
// stride K together (adjacent lanes read adjacent 16-byte vectors: coalesced), each keeping the 4 rows' partial
// sums, then reduce across the workgroup: subgroupAdd plus a few shared slots when SUBGROUPS, else a shared-memory
// tree. Same weights and bindings as matmul_gemv_cpu.
// Bindings: 0 x [M, K] f32 | 1 w [rows, K] f32, or f16 pairs (see lib/matmul_w.wgsl) | 2 bias [N] f32 (BIAS only)
//   | 2 or 3 y [M, N] f32 (written: columns row0..row0+rows).
// Defs: WH f16 weights, VEC rows vector-aligned (K % 4 == 0 for f32, K % 8 == 0 for f16), BIAS, SUBGROUPS,
//   GLU with GELU (act(gate) * up over row pairs, y [M, N/2]: lib/store_rows.wgsl).
// Grid: ceil(rows / 4) workgroups of 64 (folded into y past the per-dimension limit) x 1 x M.

#include "lib/matmul_io.wgsl"

#include "lib/matmul_w.wgsl"
#include "lib/store_rows.wgsl"

const WG = 64u;

// Partial sums of the workgroup's 4 rows: one per lane (tree), or one per subgroup (SUBGROUPS; subgroups >= 4 lanes).
var<workgroup> red: array<vec4<f32>, WG>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
#if SUBGROUPS
    @builtin(subgroup_invocation_id) sgi: u32,
    @builtin(subgroup_size) sgs: u32,
#endif
) {
    let r0 = (wg.x + wg.y * nwg.x) * 4u;
    let m = wg.z;
    let last = p.rows - 1u;
    // Rows past the part's end re-read its last row; their sums are not written. No early return: barriers follow.
    let b0 = min(r0, last) * p.kv;
    let b1 = min(r0 + 1u, last) * p.kv;
    let b2 = min(r0 + 2u, last) * p.kv;
    let b3 = min(r0 + 3u, last) * p.kv;
    let xb = m * p.xv;
#if VEC
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    for (var i = li; i < p.kv; i += WG) {
#if WH
        let xa = x[xb + 2u * i];
        let xc = x[xb + 2u * i + 1u];
        let q0 = w[b0 + i];
        let q1 = w[b1 + i];
        let q2 = w[b2 + i];
        let q3 = w[b3 + i];
        a0 += half_lo(q0) * xa + half_hi(q0) * xc;
        a1 += half_lo(q1) * xa + half_hi(q1) * xc;
        a2 += half_lo(q2) * xa + half_hi(q2) * xc;
        a3 += half_lo(q3) * xa + half_hi(q3) * xc;
#else
        let xa = x[xb + i];
        a0 += w[b0 + i] * xa;
        a1 += w[b1 + i] * xa;
        a2 += w[b2 + i] * xa;
        a3 += w[b3 + i] * xa;
#endif
    }
    let one = vec4<f32>(1.0);
    let s = vec4<f32>(dot(a0, one), dot(a1, one), dot(a2, one), dot(a3, one));
#else
    var s = vec4<f32>(0.0);
    for (var k = li; k < p.k; k += WG) {
        s += vec4<f32>(w_at(b0, k), w_at(b1, k), w_at(b2, k), w_at(b3, k)) * x[xb + k];
    }
#endif
#if SUBGROUPS
    let t = subgroupAdd(s);
    if (sgi == 0u) {
        red[li / sgs] = t;
    }
    workgroupBarrier();
#else
    red[li] = s;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (li < stride) {
            red[li] += red[li + stride];
        }
        workgroupBarrier();
    }
#endif
    if (li == 0u) {
#if SUBGROUPS
        var total = vec4<f32>(0.0);
        for (var g = 0u; g < (WG + sgs - 1u) / sgs; g++) {
            total += red[g];
        }
#else
        let total = red[0];
#endif
        store4(m, r0, total);
    }
}
