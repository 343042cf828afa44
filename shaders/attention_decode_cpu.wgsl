// attention_decode_cpu: attention_decode's split kernel for CPU adapters (lavapipe), where workgroup memory and
// barriers are costly (each barrier switches coroutines per 8-lane SIMD chunk; LAVAPIPE.md §4): a workgroup is one
// subgroup of 8 lanes serving one query row (token x query head) and one split of the keys, with no workgroup
// memory. The lanes split the head dimension (lane j owns the vec4 columns j, j + 8, ...) and walk the keys in
// order, four at a time: a subgroup sum gives the four scores to every lane, every lane keeps the same online softmax (running
// max m, sum l) and its own columns of the P * V accumulator in registers. Same contract as attention_decode.wgsl (the math, the cache layout, the splits at absolute key positions,
// the partials, `single`): every row's result depends on its position and the keys alone, so row r of a
// many-query step equals the one-query step bit for bit. Scores are in the log2 domain (q pre-scaled by
// scale * log2(e)). Needs subgroups of at least 8 lanes (the SUBGROUPS flag says so; there is no other form).
// Bindings: 0 q [n_q, n_heads, HD] | 1 k_cache [n_kv, max_ctx, HD] | 2 v_cache [n_kv, max_ctx, HD] | 3 part_o
//   [n_q, n_heads, splits, HD] (written: unnormalized sum p * v) | 4 part_ml [n_q, n_heads, splits, 2] (written:
//   running max and sum) | 5 out [n_q, n_heads, HD] (written instead of the partials when `single`).
// (TREE) 6 tree [n_q, TREE_W] u32: each row's depth and the cache slots of its path (lib/attn_tree.wgsl).
// Grid (splits, n_kv, n_q * group / RG), workgroups of 8: workgroup (s, h, z) serves split s of the RG query rows
// of token z * RG / group at heads h * group + (z * RG) % group + g, g < RG (RG divides the GQA group: its heads
// share each key and value load).

#include "lib/attn_lanes.wgsl"
const NCR: u32 = NC * RG;

#include "lib/attn_split_io.wgsl"
#include "lib/attn_tree.wgsl"

@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(subgroup_invocation_id) lane: u32) {
    let split = p.first + wg.x;
    let kvh = wg.y;
    let tok = (wg.z * RG) / p.group;
    let head0 = kvh * p.group + (wg.z * RG) % p.group;  // the first of RG heads of one GQA group, one token
    set_tree_row(tok);
#if TREE
    // Keys at positions up to pos + TREE_W - 2, the deepest path's: each row sees its own.
    let kv_len = min(p.pos + TREE_W - 1u, p.max_ctx);
    let at = p.pos + tree_depth(tok);  // the row's position
#else
    let kv_len = min(p.pos + p.n_q, p.max_ctx);
    let at = p.pos + tok;
#endif
    let k_begin = min(split * p.chunk, kv_len);
    let k_end = min(k_begin + p.chunk, kv_len);
    // Keys [lo, hi) of this split are visible to the rows (causal, and the sliding window when there is one).
    let hi = min(at + 1u, k_end);
    let w_lo = select(0u, at + 1u - p.window, p.window > 0u && at + 1u > p.window);
    let lo = max(k_begin, w_lo);
    let cbase = kvh * p.max_ctx * HD4;

    // Lane j owns the columns (vec4s of HD) j, j + 8, ...: NC of them, the last masked where HD4 % 8 != 0. Row g's
    // query and accumulator columns are entries g * NC + j.
    var qr: array<vec4<f32>, NCR>;
    var acc: array<vec4<f32>, NCR>;
    var m: array<f32, RG>;
    var l: array<f32, RG>;
    let qscale = p.scale * LOG2E;
    for (var g = 0u; g < RG; g++) {
        let row = tok * p.n_heads + head0 + g;
        for (var j = 0u; j < NC; j++) {
            let c = min(lane + j * LANES, HD4 - 1u);
            let own = lane + j * LANES < HD4;
            qr[g * NC + j] = select(vec4<f32>(0.0), q[row * HD4 + c] * qscale, own);
            acc[g * NC + j] = vec4<f32>(0.0);
        }
        m[g] = NEG;
        l[g] = 0.0;
    }
    // Four keys per step: one subgroup sum per row gives its four scores; keys at or past hi re-read key hi - 1 and
    // get the score NEG, so weight 0. Each key and value vector is loaded once for the RG rows, and each row's
    // arithmetic is the one-row kernel's (RG 1), in the same order: the results do not depend on RG.
    for (var t = lo; t < hi; t += 4u) {
        var kb: vec4<u32>;
        for (var i = 0u; i < 4u; i++) {
            kb[i] = cbase + key_slot(min(t + i, hi - 1u)) * HD4;
        }
        var dt: array<mat4x4<f32>, RG>;
        for (var j = 0u; j < NC; j++) {
            let c = min(lane + j * LANES, HD4 - 1u);
            for (var i = 0u; i < 4u; i++) {
                let kv = kv_load(kc[kb[i] + c]);
                for (var g = 0u; g < RG; g++) {
                    dt[g][i] += qr[g * NC + j] * kv;
                }
            }
        }
        let live = vec4<u32>(t) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(hi);
        var a: array<f32, RG>;
        var pw: array<vec4<f32>, RG>;
        for (var g = 0u; g < RG; g++) {
            let d = dt[g];
            let part = vec4<f32>(
                (d[0].x + d[0].y) + (d[0].z + d[0].w),
                (d[1].x + d[1].y) + (d[1].z + d[1].w),
                (d[2].x + d[2].y) + (d[2].z + d[2].w),
                (d[3].x + d[3].y) + (d[3].z + d[3].w),
            );
            let s = select(vec4<f32>(NEG), subgroupAdd(part), live);
            let m_new = max(m[g], max(max(s.x, s.y), max(s.z, s.w)));
            a[g] = exp2(m[g] - m_new);
            let w = select(vec4<f32>(0.0), exp2(s - vec4<f32>(m_new)), live);
            pw[g] = w;
            l[g] = l[g] * a[g] + ((w.x + w.y) + (w.z + w.w));
            m[g] = m_new;
        }
        for (var j = 0u; j < NC; j++) {
            let c = min(lane + j * LANES, HD4 - 1u);
            let v0 = kv_load(vc[kb[0] + c]);
            let v1 = kv_load(vc[kb[1] + c]);
            let v2 = kv_load(vc[kb[2] + c]);
            let v3 = kv_load(vc[kb[3] + c]);
            for (var g = 0u; g < RG; g++) {
                let w = pw[g];
                acc[g * NC + j] = acc[g * NC + j] * a[g] + ((w.x * v0 + w.y * v1) + (w.z * v2 + w.w * v3));
            }
        }
    }
    for (var g = 0u; g < RG; g++) {
        let row = tok * p.n_heads + head0 + g;
        for (var j = 0u; j < NC; j++) {
            let c = lane + j * LANES;
            if (c < HD4) {
                if (p.single == 1u) {
                    // The combine's arithmetic for one split (weight exp2(0) = 1): bit for bit the same output.
                    out[row * HD4 + c] = select(vec4<f32>(0.0), acc[g * NC + j] / l[g], l[g] > 0.0);
                } else {
                    part_o[(row * p.splits + split) * HD4 + c] = acc[g * NC + j];
                }
            }
        }
        if (lane == 0u && p.single == 0u) {
            part_ml[row * p.splits + split] = vec2<f32>(m[g], l[g]);
        }
    }
}
