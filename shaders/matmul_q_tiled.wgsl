// matmul_q_tiled: y[m, row0 + r] = x[m, :] . W[r, :] (+ bias[row0 + r]) for block-quantized W (Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0, IQ4_NL, and super-block types repacked to 32-weight blocks) in the chunk-tiled layout (src/quant/pack.rs, Layout::Tiled;
// LAVAPIPE.md §4), over one row part of W.
// The decode path for CPU adapters (lavapipe): each invocation owns 4 consecutive rows; the 8 invocations of a SIMD
// chunk (one tile of 32 rows) stream one contiguous region, 32 k (one block) per loop step, dequantizing in
// registers with f32 accumulation. The offsets and the minimums are folded out of the block sum:
//   Q4_0, Q5_0: d * (sum q x - QC sum x)   MIN (Q4_1, Q5_1, Q4_K, Q5_K): d * sum q x + m * sum x   Q8_0, NL
//   (IQ4_NL, IQ4_XS: q the codebook value): d * sum q x   S16 (Q6_K): d * (sum_lo q x - 32 sum_lo x) + d2 *
//   (sum_hi q x - 32 sum_hi x) over weights 0..16 (lo) and 16..32 (hi)   SUPER, per half: Q2_K a (sum q x) -
//   n sum x, Q3_K a (sum q x - 4 sum x), a and n formed from the sub-block codes and the super-block factors.
// x is read at uniform indices (from a uniform buffer when XU); with SUBGROUPS (subgroup size >= 8) each lane
// loads one vec4 of the block's x and the 8 vectors are broadcast, 8x fewer loads.
// Bindings: 0 x [M, K] f32 (a uniform array of 4096 vec4s when XU, else storage) | 1 wq [tiles, G, WB, 8] vec4<u32>
//   quant words (then high-bit words) | 2 ws [tiles, G, 8] vec2<u32> f16 scales (vec4<u32> d, d, m, m for PAIR; SUPER:
//   16-bit sub-block codes) | 3 wd [tiles, G/8, 8] super-block factors (FACT only: vec4<u32> Q2K, K4, vec2<u32>
//   Q3K) (1..3: lib/quant_tiled_w.wgsl) | then bias [N] f32 (BIAS only) | then y [M, N] f32 (written: columns
//   row0..row0+rows).
// NORM (with SUBGROUPS): x is RMSNorm'ed in the prologue into workgroup memory (weight nw [K/4] at binding NORM_AT,
//   eps in the params, K at most 4096); POST (with NORM, one row): the row normed is h = x + alpha *
//   rms_norm(r, pw) (Gemma's post-norm and residual add, as rms_norm's POST form computes it; r [K/4] at POST_R_AT,
//   pw [K/4] at POST_W_AT), and the first workgroup writes h to h_out [K/4] at H_AT; ADD: y = res + alpha * sums (lib/store_rows.wgsl; res at binding RES_AT);
//   ROPE: W is q|k|v or some of its projections and the epilogue is rope_kv's (lib/rope_store.wgsl: y is q_out, k
//   and v go to the caches). TWO (with NORM, one row): a second weight in another format holds the p.rows_b rows
//   after W's (v where a Q4_K_M file stores it in Q6_K or Q8_0; with ROPE rows of q|k|v, else y's columns p.rows..),
//   in one dispatch: workgroups from p.wg_b on run namespace B's
//   loop (lib/tiled_gemv.wgsl) over p.tiles_b tiles; its buffers at W_AT_B.. (after every other binding), then
//   its bias bias_b [rows_b] at BIAS_B_AT (BIAS).
// Defs: Q8 (8-bit quants, else 4-bit nibbles), HB1 / HB2 (one / two high-bit words per block: 5- / 6-bit quants),
//   NL (codebook nibbles), MIN (a min per block), S16 (a second scale for weights 16..32), PAIR (MIN or S16: two
//   constants per block), XSUM (block sums of x: an offset or a min; XSUM2 each half's), SUPER with Q2K or Q3K
//   (2-bit words, sub-block codes, super-block factors: lib/quant_tiled.wgsl), QC (the offset), XU, SUBGROUPS,
//   BIAS, WG (workgroup size, a multiple of 8),
//   GLU with GELU (act(gate) * up over row pairs, y [M, N/2]: lib/store_rows.wgsl).
// Grid: ceil(tiles * 8 / WG) workgroups of WG (TWO: p.wg_b + ceil(tiles_b * 8 / WG)), folded into y past the
// per-dimension limit, x 1 x M.

#include "lib/quant_params.wgsl"

#if XU
@group(0) @binding(0) var<uniform> x: array<vec4<f32>, 4096>;   // [M, K/4], padded to 64 KiB
#else
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;   // [M, K/4]
#endif
#include "lib/quant_tiled_w.wgsl"
#if FACT
#if BIAS
@group(0) @binding(4) var<storage, read> bias: array<f32>;      // [N]
@group(0) @binding(5) var<storage, read_write> y: array<f32>;   // [M, N]
#else
@group(0) @binding(4) var<storage, read_write> y: array<f32>;   // [M, N]
#endif
#else
#if BIAS
@group(0) @binding(3) var<storage, read> bias: array<f32>;      // [N]
@group(0) @binding(4) var<storage, read_write> y: array<f32>;   // [M, N]
#else
@group(0) @binding(3) var<storage, read_write> y: array<f32>;   // [M, N]
#endif
#endif
@group(1) @binding(0) var<uniform> p: Params;
#if NORM
@group(0) @binding(NORM_AT) var<storage, read> nw: array<vec4<f32>>;  // [K/4] the RMSNorm weight
var<workgroup> xn: array<vec4<f32>, 1024>;  // [K/4] x's row RMSNorm'ed (K at most 4096)
var<workgroup> norm_inv: f32;
#if POST
@group(0) @binding(POST_R_AT) var<storage, read> pr: array<vec4<f32>>;       // [K/4] the branch output r
@group(0) @binding(POST_W_AT) var<storage, read> pw: array<vec4<f32>>;       // [K/4] r's RMSNorm weight
@group(0) @binding(H_AT) var<storage, read_write> h_out: array<vec4<f32>>;   // [K/4] x + alpha * rms_norm(r)
var<workgroup> post_inv: f32;
#endif
#endif

#include "lib/store_rows.wgsl"
#if ROPE
#include "lib/rope_store.wgsl"
#endif

#include "lib/tiled_gemv.wgsl"
#if TWO
#include "lib/tiled_gemv.wgsl" as B
#if BIAS
@group(0) @binding(BIAS_B_AT) var<storage, read> bias_b: array<f32>;  // [rows_b]
#endif
#endif

#if TWO
// The second weight's sums of rows r .. r + 4 with its bias added (lib/rope_store.wgsl's `biased`).
fn biased_b(s: vec4<f32>, r: u32) -> vec4<f32> {
    var o = s;
#if BIAS
    for (var j = 0u; j < 4u; j++) {
        o[j] += bias_b[min(r + j, p.rows_b - 1u)];
    }
#endif
    return o;
}
#endif

#if NORM
// Unit u of the row the norm prologue normalizes (x's row from vec4 xi; POST: x + alpha * rms_norm(r, pw), with r's
// factor r_inv, in rms_norm's order of operations), or with `of_r` (POST only) r's own unit.
fn prologue_x(xi: u32, u: u32, r_inv: f32, of_r: bool) -> vec4<f32> {
#if POST
    if (of_r) {
        return pr[u];
    }
    return x[xi + u] + p.alpha * (pr[u] * r_inv * pw[u]);
#else
    return x[xi + u];
#endif
}

// The sum of squares of prologue_x's row over the first subgroup (`xv` units for its lanes, 0 for the others), with
// the lanes, order and arithmetic of rms_norm on CPU adapters (lane l sums units l, l + 16, ... and l + 8, l + 24,
// ..., then one subgroupAdd).
fn prologue_sum_squares(xi: u32, xv: u32, sl: u32, r_inv: f32, of_r: bool) -> f32 {
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var ui = sl;
    for (; ui + 8u < xv; ui += 16u) {
        let u = prologue_x(xi, ui, r_inv, of_r);
        let v = prologue_x(xi, ui + 8u, r_inv, of_r);
        a0 += u * u;
        a1 += v * v;
    }
    if (ui < xv) {
        let u = prologue_x(xi, ui, r_inv, of_r);
        a0 += u * u;
    }
    let a = a0 + a1;
    return subgroupAdd((a.x + a.y) + (a.z + a.w));
}
#endif

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
#if SUBGROUPS
    @builtin(subgroup_invocation_id) sl: u32,
#endif
) {
#if SUBGROUPS
    let lane_sg = sl;
#else
    let lane_sg = 0u;
#endif
    let gi = wg.x + wg.y * nwg.x;
#if TWO
    // Workgroups from p.wg_b on belong to the second weight (its tiles and rows follow the first's).
    let second = gi >= p.wg_b;
    let c = (gi - select(0u, p.wg_b, second)) * WG + li;  // group of 4 rows in its weight
    let tiles = select(p.tiles, p.tiles_b, second);
#else
    let c = gi * WG + li;  // group of 4 rows in the part
    let tiles = p.tiles;
#endif
    // Invocations past the last tile recompute it (no early return: subgroup operations need every lane).
    let tile = min(c / 8u, tiles - 1u);
    let lane = c % 8u;
    let xi = wg.z * p.xv;
#if NORM
    // RMSNorm of x's row in the prologue (needs SUBGROUPS), once per workgroup: the first subgroup sums the squares
    // with the lanes, order and arithmetic of rms_norm on CPU adapters (WG 8, VEC4, one subgroup: lane l sums units
    // l, l + 16, ... and l + 8, l + 24, ...), the others add nothing; then every invocation normalizes a share of x
    // into workgroup memory as rms_norm does, so the normalized x equals rms_norm's output bit for bit and fused and
    // unfused steps agree exactly. The tiles of a workgroup (WG 8 to 64) share the prologue.
    let xv = select(0u, p.xv, li < 8u);
#if POST
    // POST: the row normed is h = x + alpha * rms_norm(r, pw) (one row; rms_norm's POST form, the same sums in
    // the same order): r's factor first, then h's sum of squares below.
    let r_inv = inverseSqrt(prologue_sum_squares(xi, xv, sl, 0.0, true) / f32(p.k) + p.eps);
#else
    let r_inv = 0.0;
#endif
    let ss = prologue_sum_squares(xi, xv, sl, r_inv, false);
    if (li == 0u) {
        norm_inv = inverseSqrt(ss / f32(p.k) + p.eps);
#if POST
        post_inv = r_inv;
#endif
    }
    workgroupBarrier();
    let inv = norm_inv;
#if POST
    let rinv = post_inv;
#else
    let rinv = 0.0;
#endif
    for (var u = li; u < p.xv; u += WG) {
        let hv = prologue_x(xi, u, rinv, false);
        xn[u] = hv * inv * nw[u];
#if POST
        // The first workgroup writes h, the residual stream the layer goes on with.
        if (gi == 0u) {
            h_out[u] = hv;
        }
#endif
    }
    workgroupBarrier();
#endif
#if TWO
    // The second weight's workgroups run namespace B's loop over its own tiles.
    var acc: vec4<f32>;
    if (second) {
        acc = tile_sums_B(tile, lane, xi, lane_sg);
    } else {
        acc = tile_sums(tile, lane, xi, lane_sg);
    }
#else
    let acc = tile_sums(tile, lane, xi, lane_sg);
#endif
#if ROPE
    let r = c * 4u;
#if TWO
    if (second) {
        if (r < p.rows_b) {
            rope_store4(wg.z, p.rows + r, biased_b(acc, r));
        }
        return;
    }
#endif
    if (r < p.rows) {
        rope_store4(wg.z, r, biased(acc, r));
    }
#else
#if TWO
    // Without the rope epilogue the second weight's rows follow the first's in y (one row: p.n = rows + rows_b).
    if (second) {
        let s = biased_b(acc, c * 4u);
        for (var j = 0u; j < 4u; j++) {
            let r = c * 4u + j;
            if (r < p.rows_b) {
                y[p.rows + r] = s[j];
            }
        }
        return;
    }
#endif
    store4(wg.z, c * 4u, acc);
#endif
}
