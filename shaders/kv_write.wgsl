// kv_write: append a step's keys (or values) to one layer's KV cache at absolute positions pos .. pos+n_tokens.
// Cache layout: [n_kv_heads, max_ctx, head_dim] f32 (or f16, KV_F16), each head's positions contiguous
// (attention_prefill and attention_decode stream one head's keys as one contiguous region).
// Bindings: 0 k [n_tokens, n_kv_heads, head_dim] f32 | 1 cache [n_kv_heads, max_ctx, head_dim] f32 (written)
// PAIR variant: keys and values together (one dispatch instead of two), see the bindings below.
// KV_F16: the cache holds halves packed two to a u32 (lib/kv_cache.wgsl); one invocation per pair of elements,
// rounded by pack2x16float.
// Params: n_tokens, n_kv, head_dim, max_ctx, pos (re-read every run: one plan serves every decode step).
// Grid: ceil(n_tokens * n_kv * head_dim / 256) (KV_F16: / 512) workgroups of 256 (folded into y past the per-dimension limit);
// one invocation per element, consecutive invocations write consecutive elements of one head's row.
// Tokens whose position would be >= max_ctx are dropped (the host guarantees pos + n_tokens <= max_ctx; the
// guard keeps a bad step from overwriting the next head's positions).

#if KV_F16
alias elem = u32;  // two halves
const PER: u32 = 2u;

fn cached(x: vec2<f32>) -> u32 {
    return pack2x16float(x);
}
#else
alias elem = f32;
const PER: u32 = 1u;

fn cached(x: vec2<f32>) -> f32 {
    return x.x;
}
#endif

struct Params {
    n_tokens: u32,
    n_kv: u32,
    head_dim: u32,
    max_ctx: u32,
    pos: u32,
}

#if PAIR
// Keys and values in one dispatch: 0 k | 1 v [n_tokens, n_kv, head_dim] | 2 k_cache | 3 v_cache (written).
@group(0) @binding(0) var<storage, read> k: array<f32>;              // [n_tokens, n_kv, head_dim]
@group(0) @binding(1) var<storage, read> v: array<f32>;              // [n_tokens, n_kv, head_dim]
@group(0) @binding(2) var<storage, read_write> cache: array<elem>;    // [n_kv, max_ctx, head_dim]
@group(0) @binding(3) var<storage, read_write> v_cache: array<elem>;  // [n_kv, max_ctx, head_dim]
#else
@group(0) @binding(0) var<storage, read> k: array<f32>;            // [n_tokens, n_kv, head_dim]
@group(0) @binding(1) var<storage, read_write> cache: array<elem>;  // [n_kv, max_ctx, head_dim]
#endif
@group(1) @binding(0) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    // Invocation u writes cache unit u of the step (PER elements: i .. i + PER of k).
    let u = gid.x + gid.y * nwg.x * 256u;
    let i = u * PER;
    let row = p.n_kv * p.head_dim;
    if (i >= p.n_tokens * row) {
        return;
    }
    let t = i / row;
    let h = (i % row) / p.head_dim;
    let d = i % p.head_dim;
    let at = p.pos + t;
    if (at >= p.max_ctx) {
        return;
    }
    let dst = ((h * p.max_ctx + at) * p.head_dim + d) / PER;
    cache[dst] = cached(vec2<f32>(k[i], k[i + PER - 1u]));
#if PAIR
    v_cache[dst] = cached(vec2<f32>(v[i], v[i + PER - 1u]));
#endif
}
