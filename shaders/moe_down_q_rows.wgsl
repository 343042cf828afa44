// moe_down_q_rows: BlockFFN's sparse down projection (Song et al. 2025, arXiv 2507.08771) with block-quantized
// weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, and super-block types repacked to 32-weight blocks) in the row-major
// layout for GPUs (src/quant/pack.rs, Layout::Rows):
//   y[m, o] = sum over the experts ex in the active list of Wdown[o, ex*de .. +de] . h[m, ex*de .. +de]
// W is [hidden, E*de] (PyTorch `block_linear` down_proj) packed as one matrix with K = E*de. As matmul_q_rows: a
// workgroup of 64 owns 4 output rows and TM tokens; its lanes stride over the quant words of the listed experts'
// blocks only (each expert's words are contiguous in a row), then reduce across the workgroup (lib/rows_word.wgsl).
// Bindings: 0 h [M, E*de] f32 | 1 wq [hidden, G*WB] u32 | 2 ws [hidden, ceil(G/2)] u32 f16 scale pairs | 3 wm f16
//   pairs of second constants (mins, or S16 scales; PAIR only) | then alist [1 + E] u32 | then y [M, hidden] f32
//   (written).
// Defs: the format's flags (Q8, HB1, HB2, NL, MIN, S16, PAIR, XSUM, QC: Format::shader_flags), SUBGROUPS, TM tokens per
// workgroup. Workgroup size 64.
// Grid: ceil(M / TM) x ceil(hidden / 4) workgroups (the second folded into z past the per-dimension limit): token
//   blocks vary fastest, so workgroups that run together share their rows of W.

#include "lib/moe_common.wgsl"

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;      // [M, E*de/4] (h)
@group(0) @binding(1) var<storage, read> wq: array<u32>;           // [hidden, G*WB]
@group(0) @binding(2) var<storage, read> ws: array<u32>;           // [hidden, ceil(G/2)] f16 pairs
#if PAIR
@group(0) @binding(3) var<storage, read> wm: array<u32>;           // [hidden, ceil(G/2)] f16 pairs
@group(0) @binding(4) var<storage, read> alist: array<u32>;       // [1 + E]
@group(0) @binding(5) var<storage, read_write> y: array<f32>;      // [M, hidden]
#else
@group(0) @binding(3) var<storage, read> alist: array<u32>;       // [1 + E]
@group(0) @binding(4) var<storage, read_write> y: array<f32>;      // [M, hidden]
#endif

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
#if SUBGROUPS
    let lanes = Lanes(li, sl, sg_id, n_sg);
#else
    let lanes = Lanes(li, 0u, 0u, 1u);
#endif
    let r0 = (wg.y + wg.z * nwg.y) * 4u;
    if (r0 >= p.rows) {
        return;  // uniform across the workgroup
    }
    let wpr = p.groups * WB;         // device words per row
    let spr = (p.groups + 1u) / 2u;  // scale words per row
    // Rows past hidden re-read the last one; their sums are not written.
    let rr = min(vec4<u32>(r0, r0 + 1u, r0 + 2u, r0 + 3u), vec4<u32>(p.rows - 1u));
    let rq = rr * wpr;
    let rs = rr * spr;
    let m0 = wg.x * TM;
    var xt: array<u32, TM>;
    for (var t = 0u; t < TM; t++) {
        xt[t] = min(m0 + t, p.m - 1u) * p.xv;
    }
    var acc: array<vec4<f32>, TM>;
    let wpe = p.per_expert * WQ;  // quant words of one expert in a row (not counting high-bit words)
    let total_words = alist[0] * wpe;
    for (var i = li; i < total_words; i += WG) {
        let wd = alist[1u + i / wpe] * wpe + i % wpe;
        let w = load_word(rq, rs, wd);
        for (var t = 0u; t < TM; t++) {
            acc[t] += word_dot(w, xt[t]);
        }
    }
    for (var t = 0u; t < TM; t++) {
        let total = wg_sum(acc[t], lanes);
        let m = m0 + t;
        if (li == 0u && m < p.m) {
            let yb = m * p.rows;
            for (var j = 0u; j < 4u; j++) {
                let o = r0 + j;
                if (o < p.rows) {
                    y[yb + o] = total[j];
                }
            }
        }
    }
}
