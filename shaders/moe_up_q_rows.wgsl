// moe_up_q_rows: BlockFFN's sparse up projection (Song et al. 2025, arXiv 2507.08771) with block-quantized weights
// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, and super-block types repacked to 32-weight blocks) in the row-major layout
// for GPUs (src/quant/pack.rs, Layout::Rows):
//   h[m, ex*de + j] = silu(x[m, :] . Wup[ex*de + j, :]) * r[m, ex]      for each active expert ex, j < de
// W is [E*de, K] (PyTorch `block_linear` up_proj) packed as one matrix. As matmul_q_rows: a workgroup of 64 owns 4
// rows of one expert and TM tokens; its lanes stride along K one quant word at a time (coalesced), dequantize in
// registers, then reduce across the workgroup (lib/rows_word.wgsl). Workgroups whose expert slot is past the
// active count return at once (uniformly).
// Bindings: 0 x [M, K] f32 | 1 wq [E*de, G*WB] u32 | 2 ws [E*de, ceil(G/2)] u32 f16 scale pairs | 3 wm f16 pairs
//   of second constants (mins, or S16 scales; PAIR only) | then r [M, E] f32 | then alist [1 + E] u32 | then
//   h [M, E*de] f32 (written: active experts' columns).
// Defs: the format's flags (Q8, HB1, HB2, NL, MIN, S16, PAIR, XSUM, QC: Format::shader_flags), SUBGROUPS, TM tokens per
// workgroup. Workgroup size 64.
// Grid: ceil(M / TM) x E * de / 4 workgroups (the second folded into z past the per-dimension limit): token blocks
//   vary fastest, so workgroups that run together share their rows of W.

#include "lib/moe_common.wgsl"

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;      // [M, K/4]
@group(0) @binding(1) var<storage, read> wq: array<u32>;           // [E*de, G*WB]
@group(0) @binding(2) var<storage, read> ws: array<u32>;           // [E*de, ceil(G/2)] f16 pairs
#if PAIR
@group(0) @binding(3) var<storage, read> wm: array<u32>;           // [E*de, ceil(G/2)] f16 pairs
@group(0) @binding(4) var<storage, read> r: array<f32>;            // [M, E]
@group(0) @binding(5) var<storage, read> alist: array<u32>;       // [1 + E]
@group(0) @binding(6) var<storage, read_write> h: array<f32>;      // [M, E*de]
#else
@group(0) @binding(3) var<storage, read> r: array<f32>;            // [M, E]
@group(0) @binding(4) var<storage, read> alist: array<u32>;       // [1 + E]
@group(0) @binding(5) var<storage, read_write> h: array<f32>;      // [M, E*de]
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
    let flat = wg.y + wg.z * nwg.y;
    let slot = flat / p.per_expert;
    if (slot >= alist[0]) {
        return;  // uniform across the workgroup
    }
    let ex = alist[1u + slot];
    let r0 = ex * p.de + (flat % p.per_expert) * 4u;
    let wpr = p.groups * WB;         // device words per row
    let spr = (p.groups + 1u) / 2u;  // scale words per row
    let rq = vec4<u32>(r0, r0 + 1u, r0 + 2u, r0 + 3u) * wpr;
    let rs = vec4<u32>(r0, r0 + 1u, r0 + 2u, r0 + 3u) * spr;
    let m0 = wg.x * TM;
    var xt: array<u32, TM>;
    for (var t = 0u; t < TM; t++) {
        xt[t] = min(m0 + t, p.m - 1u) * p.xv;
    }
    var acc: array<vec4<f32>, TM>;
    for (var wd = li; wd < p.groups * WQ; wd += WG) {
        let w = load_word(rq, rs, wd);
        for (var t = 0u; t < TM; t++) {
            acc[t] += word_dot(w, xt[t]);
        }
    }
    for (var t = 0u; t < TM; t++) {
        let total = wg_sum(acc[t], lanes);
        let m = m0 + t;
        if (li == 0u && m < p.m) {
            let v = silu4(total) * r[m * p.experts + ex];
            let hb = m * p.rows + r0;
            h[hb] = v.x;
            h[hb + 1u] = v.y;
            h[hb + 2u] = v.z;
            h[hb + 3u] = v.w;
        }
    }
}
