// matmul_q_rows: y[m, row0 + r] = x[m, :] . W[r, :] (+ bias[row0 + r]) for block-quantized W (Q4_0, Q4_1, Q8_0,
// and k-quants repacked to 32-weight blocks) in the row-major layout (src/quant/pack.rs, Layout::Rows), over one
// row part of W: the GPU path. A workgroup owns 4 rows of W and TM rows of x; its lanes stride along K one u32
// quant word at a time (consecutive lanes read consecutive words: coalesced), dequantize in registers with f32
// accumulation, then reduce across the workgroup (subgroupAdd plus workgroup memory with SUBGROUPS, a
// workgroup-memory tree otherwise). TM = 1 is the GEMV; TM > 1 reuses each weight word for TM tokens (prefill).
// Q4_0: d * (sum q x - 8 sum x); MIN (Q4_1, Q4_K; Q5_K with Q8): d * sum q x + m * sum x; Q8_0: d * sum q x;
// Q8 + S16 (Q6_K): words 4..8 of a block take the second scale instead of d (per word).
// F16 (adapters with SHADER_F16): the quants are dequantized to f16 once per word (Q4 as q - 8, Q8 as q / 8, mins
// adjusted to match); the products with x rounded to f16 and each word's sum of them (8 products per row for Q4,
// 4 for Q8) are f16, then scaled and accumulated in f32, so the error does not grow with K. A word whose x has a
// value of magnitude X16_MAX or more is summed in f32 for that token (f16 range; lib/quant_rows.wgsl).
// Bindings: 0 x [M, K] f32 | 1 wq [rows, G * WB] u32 quant words | 2 ws [rows, ceil(G/2)] u32 f16 scale pairs |
//   3 wm [rows, ceil(G/2)] u32 f16 pairs of second constants (mins, or S16 scales; PAIR only) | then bias [N] f32
//   (BIAS only) | then y [M, N] f32 (written: columns row0..row0+rows).
// Defs: TM, Q8, MIN, S16, PAIR (MIN or S16), XSUM (unused here), SUBGROUPS, BIAS, F16. Workgroup size 64.
// Grid: ceil(rows / 4) workgroups (folded into y past the per-dimension limit) x 1 x ceil(M / TM).

#include "lib/quant_params.wgsl"

const WG = 64u;
const NR = 4u;  // rows of W per workgroup

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;  // [M, K/4]
@group(0) @binding(1) var<storage, read> wq: array<u32>;       // [rows, G * WB]
@group(0) @binding(2) var<storage, read> ws: array<u32>;       // [rows, ceil(G/2)] f16 pairs
#if PAIR
@group(0) @binding(3) var<storage, read> wm: array<u32>;       // [rows, ceil(G/2)] f16 pairs
#if BIAS
@group(0) @binding(4) var<storage, read> bias: array<f32>;     // [N]
@group(0) @binding(5) var<storage, read_write> y: array<f32>;  // [M, N]
#else
@group(0) @binding(4) var<storage, read_write> y: array<f32>;  // [M, N]
#endif
#else
#if BIAS
@group(0) @binding(3) var<storage, read> bias: array<f32>;     // [N]
@group(0) @binding(4) var<storage, read_write> y: array<f32>;  // [M, N]
#else
@group(0) @binding(3) var<storage, read_write> y: array<f32>;  // [M, N]
#endif
#endif
@group(1) @binding(0) var<uniform> p: Params;

#include "lib/quant_rows.wgsl"

#if Q8
const WB = 8u;  // quant words per block
#else
const WB = 4u;
#endif

var<workgroup> red: array<vec4<f32>, WG>;  // [WG] partial sums of the 4 rows (one token at a time)

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
#if SUBGROUPS
    @builtin(subgroup_invocation_id) sl: u32,
    @builtin(subgroup_id) sg_id: u32,
    @builtin(num_subgroups) n_sg: u32,
#endif
) {
    let r0 = (wg.x + wg.y * nwg.x) * NR;  // first row of this workgroup in the part
    if (r0 >= p.rows) {
        return;  // uniform across the workgroup
    }
    let m0 = wg.z * TM;
    let wpr = p.groups * WB;       // quant words per row
    let spr = (p.groups + 1u) / 2u;  // scale words per row
    // Rows past the part's end re-read its last row; their sums are not written.
    var rq: vec4<u32>;
    var rs: vec4<u32>;
    for (var j = 0u; j < NR; j++) {
        let r = min(r0 + j, p.rows - 1u);
        rq[j] = r * wpr;
        rs[j] = r * spr;
    }
    var xt: array<u32, TM>;
    for (var t = 0u; t < TM; t++) {
        xt[t] = min(m0 + t, p.m - 1u) * p.xv;
    }
    var acc: array<vec4<f32>, TM>;
    for (var w = li; w < wpr; w += WG) {
        let b = w / WB;
        let i = w % WB;
        let sw = b / 2u;
        let high = (b & 1u) == 1u;
        var q: vec4<u32>;
        var d: vec4<f32>;
#if PAIR
        var mn: vec4<f32>;
#endif
        for (var j = 0u; j < NR; j++) {
            q[j] = wq[rq[j] + w];
            d[j] = half_of(ws[rs[j] + sw], high);
#if PAIR
            mn[j] = half_of(wm[rs[j] + sw], high);
#endif
        }
#if S16
        d = select(d, mn, i >= 4u);  // weights 16..32 of the block take the second scale
#endif
#if F16
        // The 4 rows' quants in f16, dequantized once for the TM tokens (lib/quant_rows.wgsl), centred where there
        // is a min: MIN blocks hold d q + m = d (q - c) + (m + c d).
#if Q8
        let d8 = 8.0 * d;  // q8_bytes_h gives q / 8
#if MIN
        let mc = mn + 16.0 * d;  // Q5_K: q in 0..32, centred on 16
        let h0 = q8_bytes_h(q.x) - 2.0h;
        let h1 = q8_bytes_h(q.y) - 2.0h;
        let h2 = q8_bytes_h(q.z) - 2.0h;
        let h3 = q8_bytes_h(q.w) - 2.0h;
#else
        let h0 = q8_bytes_h(q.x);
        let h1 = q8_bytes_h(q.y);
        let h2 = q8_bytes_h(q.z);
        let h3 = q8_bytes_h(q.w);
#endif
#else
#if MIN
        let mc = mn + 8.0 * d;
#endif
        let a0 = q4_lo_h(q.x);
        let a1 = q4_lo_h(q.y);
        let a2 = q4_lo_h(q.z);
        let a3 = q4_lo_h(q.w);
        let b0 = q4_hi_h(q.x);
        let b1 = q4_hi_h(q.y);
        let b2 = q4_hi_h(q.z);
        let b3 = q4_hi_h(q.w);
#endif
#endif
        for (var t = 0u; t < TM; t++) {
#if F16
#if Q8
            let xa = x[xt[t] + 8u * b + i];
            var s: vec4<f32>;
            if (all(abs(xa) < vec4<f32>(X16_MAX))) {
                let ha = vec4<f16>(xa);
                s = vec4<f32>(vec4<f16>(dot(h0, ha), dot(h1, ha), dot(h2, ha), dot(h3, ha)));
            } else {
                s = vec4<f32>(dot(vec4<f32>(h0), xa), dot(vec4<f32>(h1), xa), dot(vec4<f32>(h2), xa),
                    dot(vec4<f32>(h3), xa));
            }
#if MIN
            acc[t] += d8 * s + mc * dot(xa, vec4<f32>(1.0));
#else
            acc[t] += d8 * s;
#endif
#else
            let xa = x[xt[t] + 8u * b + i];
            let xb = x[xt[t] + 8u * b + 4u + i];
            var s: vec4<f32>;
            if (all(max(abs(xa), abs(xb)) < vec4<f32>(X16_MAX))) {
                let ha = vec4<f16>(xa);
                let hb = vec4<f16>(xb);
                s = vec4<f32>(vec4<f16>(dot(a0, ha) + dot(b0, hb), dot(a1, ha) + dot(b1, hb),
                    dot(a2, ha) + dot(b2, hb), dot(a3, ha) + dot(b3, hb)));
            } else {
                s = vec4<f32>(dot(vec4<f32>(a0), xa) + dot(vec4<f32>(b0), xb),
                    dot(vec4<f32>(a1), xa) + dot(vec4<f32>(b1), xb), dot(vec4<f32>(a2), xa) + dot(vec4<f32>(b2), xb),
                    dot(vec4<f32>(a3), xa) + dot(vec4<f32>(b3), xb));
            }
#if MIN
            acc[t] += d * s + mc * dot(xa + xb, vec4<f32>(1.0));
#else
            acc[t] += d * s;
#endif
#endif
#else
#if Q8
            let xa = x[xt[t] + 8u * b + i];
            let s = vec4<f32>(dot(q8_bytes(q.x), xa), dot(q8_bytes(q.y), xa), dot(q8_bytes(q.z), xa),
                dot(q8_bytes(q.w), xa));
#if MIN
            acc[t] += d * s + mn * dot(xa, vec4<f32>(1.0));
#else
            acc[t] += d * s;
#endif
#else
            let xa = x[xt[t] + 8u * b + i];
            let xb = x[xt[t] + 8u * b + 4u + i];
            let s = vec4<f32>(dot(q4_lo(q.x), xa) + dot(q4_hi(q.x), xb), dot(q4_lo(q.y), xa) + dot(q4_hi(q.y), xb),
                dot(q4_lo(q.z), xa) + dot(q4_hi(q.z), xb), dot(q4_lo(q.w), xa) + dot(q4_hi(q.w), xb));
            let xs = dot(xa + xb, vec4<f32>(1.0));
#if MIN
            acc[t] += d * s + mn * xs;
#else
            acc[t] += d * (s - 8.0 * xs);
#endif
#endif
#endif
        }
    }
    for (var t = 0u; t < TM; t++) {
        // Workgroup sum of acc[t], one token at a time through `red`.
#if SUBGROUPS
        let s = subgroupAdd(acc[t]);
        if (sl == 0u) {
            red[sg_id] = s;
        }
        workgroupBarrier();
        var total = vec4<f32>(0.0);
        if (li == 0u) {
            for (var k = 0u; k < n_sg; k++) {
                total += red[k];
            }
        }
#else
        red[li] = acc[t];
        workgroupBarrier();
        for (var h = WG / 2u; h > 0u; h /= 2u) {
            if (li < h) {
                red[li] += red[li + h];
            }
            workgroupBarrier();
        }
        let total = red[0];
#endif
        let m = m0 + t;
        if (li == 0u && m < p.m) {
            let yb = m * p.n + p.row0;
            for (var j = 0u; j < NR; j++) {
                let r = r0 + j;
                if (r < p.rows) {
#if BIAS
                    y[yb + r] = total[j] + bias[p.row0 + r];
#else
                    y[yb + r] = total[j];
#endif
                }
            }
        }
        workgroupBarrier();
    }
}
