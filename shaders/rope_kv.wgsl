// rope_kv: one step's attention inputs from its q, k, v projections in one dispatch: RoPE of q and k (Su et al.
// 2021, "RoFormer"; the angle and the pairs are lib/rope_angle.wgsl's, as in rope), after a per-head RMSNorm of
// each (NORM: Qwen3's and Gemma 3's q/k norms), q written out and k and v appended to the layer's KV cache at
// absolute positions pos .. pos + n_tokens (as kv_write; tokens at or past max_ctx are not cached).
// The sources are one stacked q|k|v tensor [n_tokens, (n_heads + 2 n_kv) head_dim] (the output of one matmul over
// stacked weights), bound three times, or three tensors: element d of head h of token t is at t * stride + off +
// h * head_dim + d in its source, with each source's stride and offset from the params.
// KV_F16: the caches hold halves packed two to a u32 (lib/kv_cache.wgsl), rounded by pack2x16float; the invocation
// of a k head owns every word of its cache row, so it stores each half by rewriting its word.
// Bindings: 0 k_cache [n_kv, max_ctx, head_dim] f32 or (KV_F16) f16 pairs (written) | 1 v_cache (the same, written)
//   | 2 q_out [n_tokens, n_heads, head_dim] f32 (written) | 3 qs, 4 ks, 5 vs: the q, k and v sources f32 (one
//   buffer thrice when stacked) | then (NORM) qk_norm [2, head_dim] f32 (q's weights, then k's) | then (FACTORS)
//   factors [rot_dim / 2] f32 | then (TREE) tree [n_tokens, TREE_W] u32.
// TREE (the nodes of a speculative draft tree, see lib/attn_tree.wgsl): token t is rotated at position pos +
// depth(t) and cached in slot pos + its own slot, the table's entry at its depth, instead of pos + t for both.
// Norm (as rms_norm): x * inverseSqrt(mean(x^2) + eps) * w, the sum of squares serial in f32. Rotation (as rope):
// y0 = x0 cos a - x1 sin a, y1 = x0 sin a + x1 cos a (cos and sin times attn_factor); dims from rot_dim on pass.
// Grid: n_tokens * (n_heads + 2 n_kv) invocations in workgroups of 64 (folded into y past the per-dimension limit),
// one per (token, head) of q, k and v in that order, each walking its head's dims.

struct Params {
    n_tokens: u32,
    n_heads: u32,
    n_kv: u32,
    head_dim: u32,
    rot_dim: u32,
    pos: u32,          // position of token 0 (StepVars.pos)
    style: u32,        // 0 rotate-half, 1 interleaved
    max_ctx: u32,
    log2_theta: f32,
    freq_scale: f32,
    attn_factor: f32,
    eps: f32,          // NORM
    q_stride: u32,     // elements between tokens in qs, ks, vs
    k_stride: u32,
    v_stride: u32,
    q_off: u32,        // token 0's first element in qs, ks, vs
    k_off: u32,
    v_off: u32,
}

#if KV_F16
@group(0) @binding(0) var<storage, read_write> k_cache: array<u32>;  // [n_kv, max_ctx, head_dim / 2]
@group(0) @binding(1) var<storage, read_write> v_cache: array<u32>;  // [n_kv, max_ctx, head_dim / 2]
#else
@group(0) @binding(0) var<storage, read_write> k_cache: array<f32>;  // [n_kv, max_ctx, head_dim]
@group(0) @binding(1) var<storage, read_write> v_cache: array<f32>;  // [n_kv, max_ctx, head_dim]
#endif
@group(0) @binding(2) var<storage, read_write> q_out: array<f32>;    // [n_tokens, n_heads, head_dim]
@group(0) @binding(3) var<storage, read> qs: array<f32>;             // [n_tokens, q_stride]
@group(0) @binding(4) var<storage, read> ks: array<f32>;             // [n_tokens, k_stride]
@group(0) @binding(5) var<storage, read> vs: array<f32>;             // [n_tokens, v_stride]
#if NORM
@group(0) @binding(6) var<storage, read> qk_norm: array<f32>;        // [2, head_dim]
#if FACTORS
@group(0) @binding(7) var<storage, read> factors: array<f32>;        // [rot_dim / 2]
#endif
#else
#if FACTORS
@group(0) @binding(6) var<storage, read> factors: array<f32>;        // [rot_dim / 2]
#endif
#endif
#if TREE
#if NORM
#if FACTORS
@group(0) @binding(8) var<storage, read> tree: array<u32>;           // [n_tokens, TREE_W]
#else
@group(0) @binding(7) var<storage, read> tree: array<u32>;           // [n_tokens, TREE_W]
#endif
#else
#if FACTORS
@group(0) @binding(7) var<storage, read> tree: array<u32>;           // [n_tokens, TREE_W]
#else
@group(0) @binding(6) var<storage, read> tree: array<u32>;           // [n_tokens, TREE_W]
#endif
#endif
#include "lib/tree_table.wgsl"
#endif
@group(1) @binding(0) var<uniform> p: Params;

#include "lib/rope_angle.wgsl"

// One q or k head: its source, its destination and the scale of its norm.
struct Head {
    is_k: bool,
    src: u32,   // first element in qs or ks
    dst: u32,   // first element in q_out or k_cache
    inv: f32,   // NORM: 1 / rms of the head
    w: u32,     // NORM: first weight in qk_norm
}

fn load(hd: Head, i: u32) -> f32 {
    var x: f32;
    if (hd.is_k) {
        x = ks[hd.src + i];
    } else {
        x = qs[hd.src + i];
    }
#if NORM
    x = x * hd.inv * qk_norm[hd.w + i];
#endif
    return x;
}

fn store(hd: Head, i: u32, v: f32) {
    if (hd.is_k) {
#if KV_F16
        // The half's bits replace their 16 bits of the word; the other half keeps its bits.
        let at = hd.dst + i;
        let shift = 16u * (at % 2u);
        let half = pack2x16float(vec2<f32>(v, 0.0)) & 0xffffu;
        k_cache[at / 2u] = (k_cache[at / 2u] & ~(0xffffu << shift)) | (half << shift);
#else
        k_cache[hd.dst + i] = v;
#endif
    } else {
        q_out[hd.dst + i] = v;
    }
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let heads = p.n_heads + 2u * p.n_kv;
    let idx = gid.x + gid.y * nwg.x * 64u;
    if (idx >= p.n_tokens * heads) {
        return;
    }
    let t = idx / heads;
    let h = idx % heads;
    let d = p.head_dim;
#if TREE
    let depth = tree_row_depth(t);
    let at = p.pos + depth;                               // the rotation's position
    let slot = p.pos + tree_path_slot(t, depth);          // the cache slot
#else
    let at = p.pos + t;
    let slot = at;
#endif
    if (h >= p.n_heads + p.n_kv) {
        let hv = h - p.n_heads - p.n_kv;
        if (slot < p.max_ctx) {
            let src = t * p.v_stride + p.v_off + hv * d;
            let dst = (hv * p.max_ctx + slot) * d;
#if KV_F16
            for (var i = 0u; i < d; i += 2u) {
                v_cache[(dst + i) / 2u] = pack2x16float(vec2<f32>(vs[src + i], vs[src + i + 1u]));
            }
#else
            for (var i = 0u; i < d; i++) {
                v_cache[dst + i] = vs[src + i];
            }
#endif
        }
        return;
    }
    var hd: Head;
    hd.is_k = h >= p.n_heads;
    hd.inv = 1.0;
    hd.w = 0u;
    if (hd.is_k) {
        let hk = h - p.n_heads;
        if (slot >= p.max_ctx) {
            return;
        }
        hd.src = t * p.k_stride + p.k_off + hk * d;
        hd.dst = (hk * p.max_ctx + slot) * d;
        hd.w = d;
    } else {
        hd.src = t * p.q_stride + p.q_off + h * d;
        hd.dst = (t * p.n_heads + h) * d;
    }
#if NORM
    var ss = 0.0;
    for (var i = 0u; i < d; i++) {
        var x: f32;
        if (hd.is_k) {
            x = ks[hd.src + i];
        } else {
            x = qs[hd.src + i];
        }
        ss += x * x;
    }
    hd.inv = inverseSqrt(ss / f32(d) + p.eps);
#endif
    for (var j = 0u; j < p.rot_dim / 2u; j++) {
        let cs = rope_cs(j, at);
        let dims = rope_dims(j);
        let x0 = load(hd, dims.x);
        let x1 = load(hd, dims.y);
        store(hd, dims.x, x0 * cs.x - x1 * cs.y);
        store(hd, dims.y, x0 * cs.y + x1 * cs.x);
    }
    for (var i = p.rot_dim; i < d; i++) {
        store(hd, i, load(hd, i));
    }
}
