// attention_prefill_cpu: attention_prefill for CPU adapters with 8-lane subgroups (lavapipe), where workgroup memory
// and barriers are costly and a load is a per-lane loop (LAVAPIPE.md §4): a workgroup is one subgroup of 8 lanes
// serving R consecutive rows (token x query head of one GQA group, as attention_prefill numbers them), with no
// workgroup memory. The lanes split the head dimension (lane j owns the vec4 columns j, j + 8, ..., as in
// attention_decode_cpu.wgsl) and walk the keys four at a time: each key and value a lane loads serves all R rows,
// a subgroup sum per row gives its four scores, and each row keeps its own online softmax (running max m, sum l) and
// its columns of the P * V accumulator in registers. Same contract as attention_prefill.wgsl (bindings, params,
// causal mask and sliding window); scores in the log2 domain (q pre-scaled by scale * log2(e)).
// Bindings: 0 q [n_tokens, n_heads, HD] f32 | 1 k_cache [n_kv, max_ctx, HD] | 2 v_cache [n_kv, max_ctx, HD] (f32, or
//   f16 pairs with KV_F16: lib/kv_cache.wgsl) | 3 out [n_tokens, n_heads, HD] f32 (written).
// Defs: HD (head_dim, a multiple of 4), R (rows per workgroup), SUBGROUPS (required).
// Grid: (ceil(n_tokens * group / R), n_kv) workgroups of 8: workgroup (x, y) serves rows x * R .. of kv head y.

#include "lib/attn_lanes.wgsl"

#include "lib/attn_prefill_io.wgsl"

@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(subgroup_invocation_id) lane: u32) {
    let kvh = wg.y;
    let rows = p.n_tokens * p.group;
    let row0 = wg.x * R;
    let cbase = kvh * p.max_ctx * HD4;
    let qscale = p.scale * LOG2E;
    // Per row: its q and output row (rows past the end repeat the last one and write nothing), and the keys
    // [lo, hi) it sees (causal, and the sliding window when there is one).
    var lo: array<u32, R>;
    var hi: array<u32, R>;
    var qr: array<vec4<f32>, R * NC>;
    var acc: array<vec4<f32>, R * NC>;
    var m: array<f32, R>;
    var l: array<f32, R>;
    var obase: array<u32, R>;
    for (var r = 0u; r < R; r++) {
        let row = min(row0 + r, rows - 1u);
        let tok = row / p.group;
        let head = kvh * p.group + row % p.group;
        let at = p.pos + tok;  // the row's position
        hi[r] = min(at + 1u, p.max_ctx);
        lo[r] = select(0u, at + 1u - p.window, p.window > 0u && at + 1u > p.window);
        obase[r] = (tok * p.n_heads + head) * HD4;
        m[r] = NEG;
        l[r] = 0.0;
        for (var j = 0u; j < NC; j++) {
            let c = min(lane + j * LANES, HD4 - 1u);
            let own = lane + j * LANES < HD4;
            qr[r * NC + j] = select(vec4<f32>(0.0), q[obase[r] + c] * qscale, own);
            acc[r * NC + j] = vec4<f32>(0.0);
        }
    }
    // The keys any row sees: from the first row's first to the last row's last (rows grow in position).
    let k_lo = lo[0];
    let k_hi = hi[R - 1u];
    for (var t = k_lo; t < k_hi; t += 4u) {
        var kb: vec4<u32>;
        for (var i = 0u; i < 4u; i++) {
            kb[i] = cbase + min(t + i, k_hi - 1u) * HD4;
        }
        // Four keys' partial dots for every row: each loaded key column serves the R rows.
        var dt: array<mat4x4<f32>, R>;
        for (var j = 0u; j < NC; j++) {
            let c = min(lane + j * LANES, HD4 - 1u);
            let k0 = kv_load(kc[kb[0] + c]);
            let k1 = kv_load(kc[kb[1] + c]);
            let k2 = kv_load(kc[kb[2] + c]);
            let k3 = kv_load(kc[kb[3] + c]);
            for (var r = 0u; r < R; r++) {
                let qq = qr[r * NC + j];
                dt[r][0] += qq * k0;
                dt[r][1] += qq * k1;
                dt[r][2] += qq * k2;
                dt[r][3] += qq * k3;
            }
        }
        var pw: array<vec4<f32>, R>;
        var a: array<f32, R>;
        let keys = vec4<u32>(t) + vec4<u32>(0u, 1u, 2u, 3u);
        for (var r = 0u; r < R; r++) {
            let d = dt[r];
            let part = vec4<f32>(
                (d[0].x + d[0].y) + (d[0].z + d[0].w),
                (d[1].x + d[1].y) + (d[1].z + d[1].w),
                (d[2].x + d[2].y) + (d[2].z + d[2].w),
                (d[3].x + d[3].y) + (d[3].z + d[3].w),
            );
            let live = keys >= vec4<u32>(lo[r]) & keys < vec4<u32>(hi[r]);
            let s = select(vec4<f32>(NEG), subgroupAdd(part), live);
            let m_new = max(m[r], max(max(s.x, s.y), max(s.z, s.w)));
            a[r] = exp2(m[r] - m_new);
            pw[r] = select(vec4<f32>(0.0), exp2(s - vec4<f32>(m_new)), live);
            l[r] = l[r] * a[r] + ((pw[r].x + pw[r].y) + (pw[r].z + pw[r].w));
            m[r] = m_new;
        }
        for (var j = 0u; j < NC; j++) {
            let c = min(lane + j * LANES, HD4 - 1u);
            let v0 = kv_load(vc[kb[0] + c]);
            let v1 = kv_load(vc[kb[1] + c]);
            let v2 = kv_load(vc[kb[2] + c]);
            let v3 = kv_load(vc[kb[3] + c]);
            for (var r = 0u; r < R; r++) {
                let w = pw[r];
                acc[r * NC + j] = acc[r * NC + j] * a[r] + ((w.x * v0 + w.y * v1) + (w.z * v2 + w.w * v3));
            }
        }
    }
    for (var r = 0u; r < R; r++) {
        if (row0 + r < rows) {
            for (var j = 0u; j < NC; j++) {
                let c = lane + j * LANES;
                if (c < HD4) {
                    out[obase[r] + c] = acc[r * NC + j] / l[r];
                }
            }
        }
    }
}
