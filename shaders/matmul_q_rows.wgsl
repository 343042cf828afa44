// matmul_q_rows: y[m, row0 + r] = x[m, :] . W[r, :] (+ bias[row0 + r]) for block-quantized W (Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0, IQ4_NL, and super-block types repacked to 32-weight blocks) in the row-major layout (src/quant/pack.rs, Layout::Rows), over one
// row part of W: the GPU path. A workgroup owns 4 rows of W and TM rows of x; its lanes stride along K one u32
// quant word at a time (consecutive lanes read consecutive words: coalesced), dequantize in registers with f32
// accumulation, then reduce across the workgroup (subgroupAdd plus workgroup memory with SUBGROUPS, a
// workgroup-memory tree otherwise). TM = 1 is the GEMV; TM > 1 reuses each weight word for TM tokens (prefill).
// The word load and dot and the workgroup sum are lib/rows_word.wgsl's, shared with moe_up_q_rows / moe_down_q_rows.
// Q4_0, Q5_0: d * (sum q x - QC sum x); MIN (Q4_1, Q5_1, Q4_K, Q5_K): d * sum q x + m * sum x; Q8_0 and NL
// (IQ4_NL, IQ4_XS; q the codebook value): d * sum q x; S16 (Q6_K): the high nibbles (weights 16..32) take the
// second scale, each half with its offset. HB1 / HB2: 5- / 6-bit quants from the nibble word and the block's
// high-bit word(s), which every lane of the block's 4 nibble words reads.
// F16 (adapters with SHADER_F16): the quants are dequantized to f16 once per word ((q - QH_C) / QH_S, at most 8 in
// magnitude; Q8 as q / 8; scales and mins adjusted to match); the products with x rounded to f16 and each word's sum of them (8 products per row for Q4,
// 4 for Q8) are f16, then scaled and accumulated in f32, so the error does not grow with K. A word whose x has a
// value of magnitude X16_MAX or more is summed in f32 for that token (f16 range; lib/quant_rows.wgsl).
// Bindings: 0 x [M, K] f32 | 1 wq [rows, G * WB] u32 quant words (each block's high-bit words after them) | 2 ws [rows, ceil(G/2)] u32 f16 scale pairs |
//   3 wm [rows, ceil(G/2)] u32 f16 pairs of second constants (mins, or S16 scales; PAIR only), or wd super-block
//   factors (SUPER only: Q2K [rows, G/8] d | dmin << 16, Q3K [rows, ceil(G/16)] f16 pairs of d) | then bias [N] f32
//   (BIAS only) | then y [M, N] f32 (written: columns row0..row0+rows).
// SUPER (Q2_K, Q3_K; no F16 form): one 2-bit word (a sub-block of 16 weights) per lane and step, its scale a (and
//   Q2_K's min n) formed in f32 from the 16-bit code pair in ws and the super-block factors: Q2_K a sum q x - n sum x,
//   Q3_K a (sum q x - 4 sum x).
// Defs: TM, Q8, HB1, HB2, NL, MIN, S16, PAIR (MIN or S16), SUPER, Q2K, Q3K, QC, XSUM and XSUM2 (unused here),
//   SUBGROUPS, BIAS, F16,
//   GLU with GELU (act(gate) * up over row pairs, y [M, N/2]: lib/store_rows.wgsl).
//   Workgroup size 64.
// Grid: ceil(rows / 4) workgroups (folded into y past the per-dimension limit) x 1 x ceil(M / TM).

#include "lib/quant_params.wgsl"

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
#if SUPER
#if Q2K
@group(0) @binding(3) var<storage, read> wd: array<u32>;       // [rows, G/8] d | dmin << 16 (f16)
#else
@group(0) @binding(3) var<storage, read> wd: array<u32>;       // [rows, ceil(G/16)] f16 pairs of d
#endif
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
#endif
@group(1) @binding(0) var<uniform> p: Params;

#include "lib/store_rows.wgsl"

#include "lib/rows_word.wgsl"

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
    let wpr = p.groups * WB;         // device words per row
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
#if SUPER
#if Q2K
    let dpr = p.groups / 8u;  // factor words per row
#else
    let dpr = (p.groups / 8u + 1u) / 2u;
#endif
    var rd: vec4<u32>;
    for (var j = 0u; j < NR; j++) {
        rd[j] = min(r0 + j, p.rows - 1u) * dpr;
    }
    // One 2-bit word (16 weights: sub-block hf of block b) per lane and step.
    for (var w = li; w < p.groups * WQ; w += WG) {
        let b = w / WQ;
        let hf = w % WQ;
        let sb = b / 8u;
        var q: vec4<u32>;
        var hq = vec4<u32>(0u);
        var a: vec4<f32>;
        var n = vec4<f32>(0.0);
        for (var j = 0u; j < NR; j++) {
            q[j] = wq[rq[j] + b * WB + hf];
#if Q3K
            hq[j] = wq[rq[j] + b * WB + WQ];
#endif
            let code = (ws[rs[j] + b / 2u] >> (16u * (b & 1u) + 8u * hf)) & 0xffu;
#if Q2K
            let f = wd[rd[j] + sb];
            a[j] = half_of(f, false) * f32(code & 15u);
            n[j] = half_of(f, true) * f32(code >> 4u);
#else
            a[j] = half_of(wd[rd[j] + sb / 2u], (sb & 1u) == 1u) * (f32(code & 63u) - 32.0);
#endif
        }
        var qf: array<vec4<f32>, 16>;  // [row j, field i]: weights 16 hf + 4 i .. + 4 of row j
        for (var j = 0u; j < NR; j++) {
            for (var i = 0u; i < 4u; i++) {
                qf[4u * j + i] = q2_field(q[j], hq[j], hf, i);
            }
        }
        for (var t = 0u; t < TM; t++) {
            let xb = xt[t] + 8u * b + 4u * hf;
            let x0 = x[xb];
            let x1 = x[xb + 1u];
            let x2 = x[xb + 2u];
            let x3 = x[xb + 3u];
            let xs = dot((x0 + x1) + (x2 + x3), vec4<f32>(1.0));
            var s: vec4<f32>;
            for (var j = 0u; j < NR; j++) {
                s[j] = (dot(qf[4u * j], x0) + dot(qf[4u * j + 1u], x1))
                    + (dot(qf[4u * j + 2u], x2) + dot(qf[4u * j + 3u], x3));
            }
#if Q2K
            acc[t] += a * s - n * xs;
#else
            acc[t] += a * (s - QC * xs);
#endif
        }
    }
#else
    // One quant word per lane and step (the high-bit words are read with the nibble words they belong to),
    // dequantized once for the TM tokens (lib/rows_word.wgsl).
    for (var w = li; w < p.groups * WQ; w += WG) {
        let word = load_word(rq, rs, w);
        for (var t = 0u; t < TM; t++) {
            acc[t] += word_dot(word, xt[t]);
        }
    }
#endif
#if SUBGROUPS
    let lanes = Lanes(li, sl, sg_id, n_sg);
#else
    let lanes = Lanes(li, 0u, 0u, 1u);
#endif
    for (var t = 0u; t < TM; t++) {
        // Workgroup sum of acc[t], one token at a time through `red`.
        let total = wg_sum(acc[t], lanes);
        let m = m0 + t;
        if (li == 0u && m < p.m) {
            store4(m, r0, total);
        }
    }
}
