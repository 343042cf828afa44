// attention_prefill: causal GQA softmax attention of a chunk of queries against one layer's KV cache, flash-style
// (online softmax with a running max and sum, no materialized score matrix).
// Source: Dao et al., "FlashAttention" (2022) and "FlashAttention-2" (2023): tiles of keys/values staged in fast
// memory and reused by many queries; the output is rescaled when the running max grows.
//
// Bindings: 0 q [n_tokens, n_heads, HD] f32 | 1 k_cache [n_kv, max_ctx, HD] | 2 v_cache [n_kv, max_ctx, HD] (f32, or
//           f16 pairs with KV_F16: lib/kv_cache.wgsl)
//           | 3 out [n_tokens, n_heads, HD] f32 (written)
// Params: n_tokens, n_heads, n_kv, group (= n_heads / n_kv), max_ctx, pos (absolute position of query 0), scale,
// window (sliding-window attention: query i sees only the last `window` keys, pos + i + 1 - window ..= pos + i;
// 0 for none).
// Defs: HD (head_dim, a multiple of 4), BK (keys per tile).
// Grid: (ceil(n_tokens * group / 64), n_kv) workgroups of 64. Workgroup (x, y) serves kv head y and 64 "rows":
// row r = token * group + g is query `token` of head y * group + g, so the query heads of one GQA group and
// consecutive tokens share each K/V tile. One invocation per row holds q and its output accumulator privately.
// Query i sits at position pos + i and sees keys 0 ..= pos + i (the last `window` of them with a window); the
// workgroup walks the keys from its first row's first to its last row's last.
// Scores are kept in the log2 domain (q is pre-scaled by scale * log2(e)) so that exp2 does the softmax.

const HD4: u32 = HD / 4;
const WG: u32 = 64u;
const LOG2E: f32 = 1.4426950408889634;
// Running max of a row before any key: finite, so that exp2(m_old - m_new) never computes inf - inf.
const NEG: f32 = -1.0e30;

#include "lib/attn_prefill_io.wgsl"

var<workgroup> ks: array<vec4<f32>, BK * HD4>;  // [BK, HD] keys of the current tile
var<workgroup> vs: array<vec4<f32>, BK * HD4>;  // [BK, HD] values of the current tile

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let kvh = wg.y;
    let rows = p.n_tokens * p.group;
    let row0 = wg.x * WG;
    // Keys the workgroup needs: those its last row sees (uniform, so the barriers below are in uniform control).
    let last = min(row0 + WG, rows) - 1u;
    let kv_end = min(p.pos + last / p.group + 1u, p.max_ctx);
    // Rows past the end compute a copy of the last row and write nothing.
    let row = min(row0 + lid, rows - 1u);
    let tok = row / p.group;
    let head = kvh * p.group + row % p.group;
    let my_end = min(p.pos + tok + 1u, p.max_ctx);
    // First key the row sees, and the first any row of the workgroup sees (uniform: its first row's).
    let my_begin = select(0u, p.pos + tok + 1u - p.window, p.window > 0u && p.pos + tok + 1u > p.window);
    let tok0 = row0 / p.group;
    let kv_begin = select(0u, p.pos + tok0 + 1u - p.window, p.window > 0u && p.pos + tok0 + 1u > p.window);

    var qv: array<vec4<f32>, HD4>;
    var acc: array<vec4<f32>, HD4>;
    let qbase = (tok * p.n_heads + head) * HD4;
    let qs = p.scale * LOG2E;
    for (var d = 0u; d < HD4; d++) {
        qv[d] = q[qbase + d] * qs;
        acc[d] = vec4<f32>(0.0);
    }
    var m = NEG;
    var l = 0.0;
    let cbase = kvh * p.max_ctx * HD4;

    for (var t0 = kv_begin - kv_begin % BK; t0 < kv_end; t0 += BK) {
        let n = min(BK, kv_end - t0);
        workgroupBarrier();  // everyone is done with the previous tile
        for (var i = lid; i < BK * HD4; i += WG) {
            var kk = vec4<f32>(0.0);
            var vv = vec4<f32>(0.0);
            if (i / HD4 < n) {
                kk = kv_load(kc[cbase + t0 * HD4 + i]);
                vv = kv_load(vc[cbase + t0 * HD4 + i]);
            }
            ks[i] = kk;
            vs[i] = vv;
        }
        workgroupBarrier();
        // Rows whose last visible key is before this tile skip it (only on the diagonal tiles of a chunk).
        if (t0 < my_end && t0 + BK > my_begin) {
            var s: array<f32, BK>;
            var tmax = NEG;
            for (var j = 0u; j < BK; j++) {
                var dt = vec4<f32>(0.0);
                for (var d = 0u; d < HD4; d++) {
                    dt += qv[d] * ks[j * HD4 + d];
                }
                let seen = t0 + j < my_end && t0 + j >= my_begin;
                let sj = select(NEG, dt.x + dt.y + dt.z + dt.w, seen);
                s[j] = sj;
                tmax = max(tmax, sj);
            }
            let m_new = max(m, tmax);
            let alpha = exp2(m - m_new);
            l *= alpha;
            for (var d = 0u; d < HD4; d++) {
                acc[d] *= alpha;
            }
            for (var j = 0u; j < BK; j++) {
                let pj = select(0.0, exp2(s[j] - m_new), t0 + j < my_end && t0 + j >= my_begin);
                l += pj;
                for (var d = 0u; d < HD4; d++) {
                    acc[d] += pj * vs[j * HD4 + d];
                }
            }
            m = m_new;
        }
    }
    if (row0 + lid < rows) {
        let inv = 1.0 / l;
        for (var d = 0u; d < HD4; d++) {
            out[qbase + d] = acc[d] * inv;
        }
    }
}
