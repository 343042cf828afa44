// matmul_gemv_cpu: y[m, row0 + r] = x[m, :] . W[r, :] (+ bias[row0 + r]) over one row part of W (PyTorch Linear
// layout, W rows are outputs). The decode (M = 1) path for CPU adapters such as lavapipe (LAVAPIPE.md §4, §8):
// each invocation owns 4 consecutive rows of W and streams them along K with 16-byte loads, 8 k per loop step;
// x is read at uniform indices, from a uniform buffer when XU; no workgroup memory, no reduction.
// Bindings: 0 x [M, K] f32 (a uniform array of 4096 vec4s when XU, else storage) | 1 w [rows, K] f32, or f16 pairs
//   (see lib/matmul_w.wgsl) | 2 bias [N] f32 (BIAS only) | 2 or 3 y [M, N] f32 (written: columns row0..row0+rows).
// Defs: WH f16 weights, VEC rows vector-aligned (K % 4 == 0 for f32, K % 8 == 0 for f16), XU x in a uniform buffer
//   (M*K/4 <= 4096 vec4s), BIAS,
//   GLU with GELU (act(gate) * up over row pairs, y [M, N/2]: lib/store_rows.wgsl).
// Grid: ceil(rows / 64) workgroups of 16 (folded into y past the per-dimension limit) x 1 x M. Small workgroups
// keep llvmpipe's threads evenly loaded at small N (576 rows are 9 workgroups, not 3).

struct Params {
    m: u32,     // rows of x
    k: u32,     // reduction length
    n: u32,     // columns of y (all parts)
    row0: u32,  // first output column of this part
    rows: u32,  // rows of W in this part
    kv: u32,    // W row stride in elements of `w`
    xv: u32,    // x row stride in elements of `x`
}

#if XU
@group(0) @binding(0) var<uniform> x: array<vec4<f32>, 4096>;   // [M, K/4], padded to 64 KiB
#else
#if VEC
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;   // [M, K/4]
#else
@group(0) @binding(0) var<storage, read> x: array<f32>;         // [M, K]
#endif
#endif
#if WH
#if VEC
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;   // [rows, K/8] f16 x 8
#else
@group(0) @binding(1) var<storage, read> w: array<u32>;         // [rows, ceil(K/2)] f16 x 2
#endif
#else
#if VEC
@group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;   // [rows, K/4]
#else
@group(0) @binding(1) var<storage, read> w: array<f32>;         // [rows, K]
#endif
#endif
#if BIAS
@group(0) @binding(2) var<storage, read> bias: array<f32>;      // [N]
@group(0) @binding(3) var<storage, read_write> y: array<f32>;   // [M, N]
#else
@group(0) @binding(2) var<storage, read_write> y: array<f32>;   // [M, N]
#endif
@group(1) @binding(0) var<uniform> p: Params;

#include "lib/store_rows.wgsl"

#include "lib/matmul_w.wgsl"

const R = 4u;  // rows of W per invocation (2 is as fast, 8 slower on lavapipe)

@compute @workgroup_size(16)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let r0 = ((wg.x + wg.y * nwg.x) * 16u + li) * R;
    if (r0 >= p.rows) {
        return;
    }
    let m = wg.z;
    let last = p.rows - 1u;
    // Rows past the part's end re-read its last row; their sums are not written.
    var b: array<u32, R>;
    for (var j = 0u; j < R; j++) {
        b[j] = min(r0 + j, last) * p.kv;
    }
    let xb = m * p.xv;
    var sum: array<f32, R>;
#if VEC
    var a: array<vec4<f32>, R>;
#if WH
    // One vec4<u32> = 8 halves of k per row; two of them per step.
    let steps = p.kv / 2u;
    for (var s = 0u; s < steps; s++) {
        let i = 2u * s;
        let xa = x[xb + 2u * i];
        let xc = x[xb + 2u * i + 1u];
        let xd = x[xb + 2u * i + 2u];
        let xe = x[xb + 2u * i + 3u];
        for (var j = 0u; j < R; j++) {
            let q = w[b[j] + i];
            let u = w[b[j] + i + 1u];
            a[j] += half_lo(q) * xa + half_hi(q) * xc + half_lo(u) * xd + half_hi(u) * xe;
        }
    }
    if ((p.kv & 1u) == 1u) {
        let i = p.kv - 1u;
        let xa = x[xb + 2u * i];
        let xc = x[xb + 2u * i + 1u];
        for (var j = 0u; j < R; j++) {
            let q = w[b[j] + i];
            a[j] += half_lo(q) * xa + half_hi(q) * xc;
        }
    }
#else
    // One vec4<f32> = 4 k per row; two of them per step.
    let steps = p.kv / 2u;
    for (var s = 0u; s < steps; s++) {
        let i = 2u * s;
        let xa = x[xb + i];
        let xc = x[xb + i + 1u];
        for (var j = 0u; j < R; j++) {
            a[j] += w[b[j] + i] * xa + w[b[j] + i + 1u] * xc;
        }
    }
    if ((p.kv & 1u) == 1u) {
        let i = p.kv - 1u;
        let xa = x[xb + i];
        for (var j = 0u; j < R; j++) {
            a[j] += w[b[j] + i] * xa;
        }
    }
#endif
    for (var j = 0u; j < R; j++) {
        sum[j] = dot(a[j], vec4<f32>(1.0));
    }
#else
    // Unaligned rows: one k at a time.
    for (var k = 0u; k < p.k; k++) {
        let xs = x[xb + k];
        for (var j = 0u; j < R; j++) {
            sum[j] += w_at(b[j], k) * xs;
        }
    }
#endif
    store4(m, r0, vec4<f32>(sum[0], sum[1], sum[2], sum[3]));
}
