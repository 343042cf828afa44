// The tiled GEMV's inner loop (matmul_q_tiled): the sums of one lane's 4 rows of a tile over all of K, for the
// x row starting at vec4 `xi0` (NORM: the normalized row in workgroup memory, xn). A function so that a kernel can
// run it for two weight formats: `#include "lib/tiled_gemv.wgsl" as B` instantiates it for the second
// (tile_sums_B over wq_B, ws_B, wd_B; the weight bindings from W_AT, lib/quant_tiled_w.wgsl).
// `sl` is the subgroup lane (SUBGROUPS; 0 otherwise). The including shader declares x, p and (NORM) xn.

#include "lib/quant_tiled_w.wgsl"
#include "lib/quant_tiled.wgsl"

fn tile_sums(tile: u32, lane: u32, xi0: u32, sl: u32) -> vec4<f32> {
    let wstep = WB * 8u;
    var wi = tile * p.groups * wstep + lane;
    var si = tile * p.groups * 8u + lane;
    var xi = xi0;
    var acc = vec4<f32>(0.0);
#if NORM
    var ni = sl & 7u;
#endif
    for (var g = 0u; g < p.groups; g++) {
        // The block's 8 x vectors, pre-scaled for the quant helpers (lib/quant_tiled.wgsl), and their sum(s).
        // (Written out here rather than through x_block / w_block / block_dot, which measured 5% slower for Q4.)
#if SUBGROUPS
#if NORM
        let xr = xn[ni];
        ni += 8u;
#else
        let xr = x[xi + (sl & 7u)];
#endif
        let xl = xr * select(XA_SCALE, XB_SCALE, (sl & 4u) != 0u);
#if XSUM
        let xd = dot(xr, vec4<f32>(1.0));
        let xs0 = (subgroupBroadcast(xd, 0u) + subgroupBroadcast(xd, 1u))
            + (subgroupBroadcast(xd, 2u) + subgroupBroadcast(xd, 3u));
        let xs1 = (subgroupBroadcast(xd, 4u) + subgroupBroadcast(xd, 5u))
            + (subgroupBroadcast(xd, 6u) + subgroupBroadcast(xd, 7u));
        let xs = xs0 + xs1;
#endif
        let x0 = subgroupBroadcast(xl, 0u);
        let x1 = subgroupBroadcast(xl, 1u);
        let x2 = subgroupBroadcast(xl, 2u);
        let x3 = subgroupBroadcast(xl, 3u);
        let x4 = subgroupBroadcast(xl, 4u);
        let x5 = subgroupBroadcast(xl, 5u);
        let x6 = subgroupBroadcast(xl, 6u);
        let x7 = subgroupBroadcast(xl, 7u);
#else
        let r0 = x[xi];
        let r1 = x[xi + 1u];
        let r2 = x[xi + 2u];
        let r3 = x[xi + 3u];
        let r4 = x[xi + 4u];
        let r5 = x[xi + 5u];
        let r6 = x[xi + 6u];
        let r7 = x[xi + 7u];
        let x0 = r0 * XA_SCALE;
        let x1 = r1 * XA_SCALE;
        let x2 = r2 * XA_SCALE;
        let x3 = r3 * XA_SCALE;
        let x4 = r4 * XB_SCALE;
        let x5 = r5 * XB_SCALE;
        let x6 = r6 * XB_SCALE;
        let x7 = r7 * XB_SCALE;
#if XSUM
#if XSUM2
        let xs0 = dot((r0 + r1) + (r2 + r3), vec4<f32>(1.0));
        let xs1 = dot((r4 + r5) + (r6 + r7), vec4<f32>(1.0));
#else
        let xs = dot((r0 + r1) + (r2 + r3) + ((r4 + r5) + (r6 + r7)), vec4<f32>(1.0));
#endif
#endif
#endif
#if SUPER
        acc += block_dot(w_block(wi, si), XBlock(x0, x1, x2, x3, x4, x5, x6, x7, xs0, xs1));
#else
#if Q8
        let s = q8_word(wq[wi], x0) + q8_word(wq[wi + 8u], x1) + q8_word(wq[wi + 16u], x2)
            + q8_word(wq[wi + 24u], x3) + q8_word(wq[wi + 32u], x4) + q8_word(wq[wi + 40u], x5)
            + q8_word(wq[wi + 48u], x6) + q8_word(wq[wi + 56u], x7);
        acc += halves4(ws[si]) * s;
#else
#if HB1
        // 5- and 6-bit quants, and codebook nibbles: through the shared block helpers.
#if XSUM2
        let xb = XBlock(x0, x1, x2, x3, x4, x5, x6, x7, xs0, xs1);
#else
        let xb = XBlock(x0, x1, x2, x3, x4, x5, x6, x7, xs, 0.0);
#endif
        acc += block_dot(w_block(wi, si), xb);
#else
#if NL
        let xb = XBlock(x0, x1, x2, x3, x4, x5, x6, x7, 0.0, 0.0);
        acc += block_dot(w_block(wi, si), xb);
#else
#if K4
        // Q4_K: through the block helpers, as the GEMM (rows of a batch equal the one-row result bit for bit).
        acc += block_dot(w_block(wi, si), XBlock(x0, x1, x2, x3, x4, x5, x6, x7, xs, 0.0));
#else
        let s = q4_word(wq[wi], x0, x4) + q4_word(wq[wi + 8u], x1, x5) + q4_word(wq[wi + 16u], x2, x6)
            + q4_word(wq[wi + 24u], x3, x7);
#if MIN
        let sc = ws[si];
        acc += halves4(sc.xy) * s + halves4(sc.zw) * xs;
#else
        acc += halves4(ws[si]) * (s - QC * xs);
#endif
#endif
#endif
#endif
#endif
#endif
        wi += wstep;
        si += 8u;
        xi += 8u;
    }
    return acc;
}
