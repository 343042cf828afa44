// rope: rotary position embedding (Su et al. 2021, "RoFormer"). Token t of the step sits at position pos + t; pair j
// of each head (j < rot_dim / 2) is rotated by the angle a = ((pos + t) * freq_scale) * inv_freq_j, with
// inv_freq_j = theta^(-2j / rot_dim) / factors[j] (factors: llama3 / longrope per-frequency divisors):
//   y0 = attn_factor * (x0 cos a - x1 sin a),  y1 = attn_factor * (x0 sin a + x1 cos a).
// Pairs: style 0 rotate-half (NeoX, HF Llama) (j, j + rot_dim/2); style 1 interleaved (GPT-J, GGML) (2j, 2j + 1).
// Dims from rot_dim to head_dim pass through unchanged.
// Bindings: 0 x [n_tokens, n_heads, head_dim] f32 | (FACTORS) factors [rot_dim / 2] f32
//           | last: y [n_tokens, n_heads, head_dim] f32 (written)
// Params: see Params. Grid: n_tokens * (rot_dim / 2 + head_dim - rot_dim) invocations in workgroups of 64 (folded
// into y past the per-dimension limit); each handles one pair (or one pass-through dim) across all heads, so cos
// and sin are computed once per (token, pair).
// Precision: the angle is formed in f32 as in HF, then reduced to [-pi, pi] exactly before cos/sin
// (lib/rope_angle.wgsl, shared with rope_kv).

struct Params {
    n_tokens: u32,
    n_heads: u32,
    head_dim: u32,
    rot_dim: u32,
    pos: u32,          // position of token 0 (StepVars.pos)
    style: u32,        // 0 rotate-half, 1 interleaved
    log2_theta: f32,
    freq_scale: f32,
    attn_factor: f32,
    n_heads2: u32,     // PAIR: heads of the second tensor (keys), same tokens and head_dim
}

#if PAIR
// Queries and keys in one dispatch: 0 x | 1 x2 [n_tokens, n_heads2, head_dim] | (factors) | y | y2 (written).
@group(0) @binding(0) var<storage, read> x: array<f32>;         // [n_tokens, n_heads, head_dim]
@group(0) @binding(1) var<storage, read> x2: array<f32>;        // [n_tokens, n_heads2, head_dim]
#if FACTORS
@group(0) @binding(2) var<storage, read> factors: array<f32>;   // [rot_dim / 2]
@group(0) @binding(3) var<storage, read_write> y: array<f32>;   // [n_tokens, n_heads, head_dim]
@group(0) @binding(4) var<storage, read_write> y2: array<f32>;  // [n_tokens, n_heads2, head_dim]
#else
@group(0) @binding(2) var<storage, read_write> y: array<f32>;   // [n_tokens, n_heads, head_dim]
@group(0) @binding(3) var<storage, read_write> y2: array<f32>;  // [n_tokens, n_heads2, head_dim]
#endif
#else
@group(0) @binding(0) var<storage, read> x: array<f32>;        // [n_tokens, n_heads, head_dim]
#if FACTORS
@group(0) @binding(1) var<storage, read> factors: array<f32>;  // [rot_dim / 2]
@group(0) @binding(2) var<storage, read_write> y: array<f32>;  // [n_tokens, n_heads, head_dim]
#else
@group(0) @binding(1) var<storage, read_write> y: array<f32>;  // [n_tokens, n_heads, head_dim]
#endif
#endif
@group(1) @binding(0) var<uniform> p: Params;

#include "lib/rope_angle.wgsl"

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let half = p.rot_dim / 2u;
    let per_token = half + (p.head_dim - p.rot_dim);
    let idx = gid.x + gid.y * nwg.x * 64u;
    if (idx >= p.n_tokens * per_token) {
        return;
    }
    let t = idx / per_token;
    let k = idx % per_token;
    let row = t * p.n_heads * p.head_dim;
    if (k >= half) {
        let d = p.rot_dim + (k - half);
        for (var h = 0u; h < p.n_heads; h++) {
            let at = row + h * p.head_dim + d;
            y[at] = x[at];
        }
#if PAIR
        for (var h = 0u; h < p.n_heads2; h++) {
            let at = t * p.n_heads2 * p.head_dim + h * p.head_dim + d;
            y2[at] = x2[at];
        }
#endif
        return;
    }
    let cs = rope_cs(k, p.pos + t);
    let c = cs.x;
    let s = cs.y;
    let dims = rope_dims(k);
    let i0 = dims.x;
    let i1 = dims.y;
    for (var h = 0u; h < p.n_heads; h++) {
        let b = row + h * p.head_dim;
        let x0 = x[b + i0];
        let x1 = x[b + i1];
        y[b + i0] = x0 * c - x1 * s;
        y[b + i1] = x0 * s + x1 * c;
    }
#if PAIR
    for (var h = 0u; h < p.n_heads2; h++) {
        let b = t * p.n_heads2 * p.head_dim + h * p.head_dim;
        let x0 = x2[b + i0];
        let x1 = x2[b + i1];
        y2[b + i0] = x0 * c - x1 * s;
        y2[b + i1] = x0 * s + x1 * c;
    }
#endif
}
