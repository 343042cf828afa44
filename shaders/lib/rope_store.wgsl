// ROPE: rope_kv as the epilogue of matmul_q_tiled's GEMV over a stacked q|k|v weight, or one of its whole
// projections from row qkv0 of q|k|v (q, q|k, k|v, v; one part, interleaved RoPE pairs): a decode step's projections,
// rotation and cache write in one dispatch per weight. An invocation's 4 consecutive rows lie in one head (head_dim is
// a multiple of 4) and hold the pairs (2j, 2j + 1) and (2j + 2, 2j + 3) of its dims: q rows are rotated into y
// (q_out [M, n_heads, head_dim]), k rows rotated and v rows as they are into the caches at position pos + m (not
// past max_ctx), with rope_kv's arithmetic (lib/rope_angle.wgsl) and f16 rounding after the bias (BIAS) as
// store_rows adds it, so the fused step caches and attends with the unfused one's bits.
// Bindings: KC_AT k_cache, VC_AT v_cache [n_kv, max_ctx, head_dim] f32 or (KV_F16) f16 pairs (written) | FACTORS_AT
//   factors [rot_dim / 2] f32 (FACTORS). The including shader declares y (array<f32>), bias (BIAS) and p (the rope
//   fields of lib/quant_params.wgsl), adds the bias (`biased`) and skips rows past the weight's. Also the epilogue of
//   matmul_q_tiled_mm for a chain of tokens (verification steps): row m of x at position pos + m.

#if KV_F16
@group(0) @binding(KC_AT) var<storage, read_write> k_cache: array<u32>;  // [n_kv, max_ctx, head_dim / 2] f16 x 2
@group(0) @binding(VC_AT) var<storage, read_write> v_cache: array<u32>;  // [n_kv, max_ctx, head_dim / 2] f16 x 2
#else
@group(0) @binding(KC_AT) var<storage, read_write> k_cache: array<f32>;  // [n_kv, max_ctx, head_dim]
@group(0) @binding(VC_AT) var<storage, read_write> v_cache: array<f32>;  // [n_kv, max_ctx, head_dim]
#endif
#if FACTORS
@group(0) @binding(FACTORS_AT) var<storage, read> factors: array<f32>;   // [rot_dim / 2]
#endif

#include "lib/rope_angle.wgsl"

// Pair j of a head, (x0, x1) at dims (2j, 2j + 1), at position `at`: rotated as rope_kv rotates it when 2j < rot_dim.
fn rope_pair(j: u32, at: u32, x0: f32, x1: f32) -> vec2<f32> {
    if (2u * j >= p.rot_dim) {
        return vec2<f32>(x0, x1);
    }
    let cs = rope_cs(j, at);
    return vec2<f32>(x0 * cs.x - x1 * cs.y, x0 * cs.y + x1 * cs.x);
}

// The sums of rows r .. r + 4 with their bias added (clamped to the weight's last row), as store_rows adds it.
fn biased(s: vec4<f32>, r: u32) -> vec4<f32> {
    var o = s;
#if BIAS
    for (var j = 0u; j < 4u; j++) {
        o[j] += bias[p.row0 + min(r + j, p.rows - 1u)];
    }
#endif
    return o;
}

// 4 consecutive values of a cache row from element `at` (even).
fn put4(is_k: bool, at: u32, v: vec4<f32>) {
#if KV_F16
    let w = vec2<u32>(pack2x16float(v.xy), pack2x16float(v.zw));
    if (is_k) {
        k_cache[at / 2u] = w.x;
        k_cache[at / 2u + 1u] = w.y;
    } else {
        v_cache[at / 2u] = w.x;
        v_cache[at / 2u + 1u] = w.y;
    }
#else
    for (var i = 0u; i < 4u; i++) {
        if (is_k) {
            k_cache[at + i] = v[i];
        } else {
            v_cache[at + i] = v[i];
        }
    }
#endif
}

// The sums `s` (bias added) of rows r .. r + 4 of the weight (rows qkv0 + r .. of q|k|v; r below its rows) for
// row m of x, rotated and stored.
fn rope_store4(m: u32, r: u32, s: vec4<f32>) {
    let d = p.head_dim;
    let qn = p.n_heads * d;
    let kn = p.n_kv * d;
    let at = p.pos + m;
    let r0 = p.qkv0 + r;
    if (r0 >= qn + kn) {
        if (at < p.max_ctx) {
            let rv = r0 - qn - kn;
            put4(false, ((rv / d) * p.max_ctx + at) * d + rv % d, s);
        }
        return;
    }
    let rk = select(r0, r0 - qn, r0 >= qn);  // row in q, or in k
    let i = rk % d;
    let y4 = vec4<f32>(rope_pair(i / 2u, at, s.x, s.y), rope_pair(i / 2u + 1u, at, s.z, s.w));
    if (r0 < qn) {
        let yb = m * qn + rk;
        for (var j = 0u; j < 4u; j++) {
            y[yb + j] = y4[j];
        }
    } else if (at < p.max_ctx) {
        put4(true, ((rk / d) * p.max_ctx + at) * d + i, y4);
    }
}
