// kv_move: move cached keys and values between positions of one layer's KV cache, in order: after a speculative
// draft tree is verified, the accepted path's nodes (written side by side, see rope_kv's TREE form) move to
// consecutive positions, so the cache holds what plain decoding would have written.
// The caches are moved as 32-bit words, whatever their element type: a row is `row_words` words (head_dim for f32,
// head_dim / 2 for f16 pairs).
// Bindings: 0 k_cache [n_kv, max_ctx, row_words] u32 (written) | 1 v_cache [n_kv, max_ctx, row_words] u32 (written)
//   | 2 moves [1 + 2 MAX_MOVES] u32: the count n, then n (source, destination) position pairs.
// The moves run in the order given, each invocation doing all of them for its element, so a later move may read
// a position an earlier one wrote (the host orders them; for a tree path every destination is below its source).
// Grid: ceil(n_kv * row_words / 64) workgroups of 64 (folded into y), one invocation per (kv head, word).

struct Params {
    n_kv: u32,
    row_words: u32,
    max_ctx: u32,
}

@group(0) @binding(0) var<storage, read_write> k_cache: array<u32>;  // [n_kv, max_ctx, row_words]
@group(0) @binding(1) var<storage, read_write> v_cache: array<u32>;  // [n_kv, max_ctx, row_words]
@group(0) @binding(2) var<storage, read> moves: array<u32>;          // [1 + 2 MAX_MOVES]
@group(1) @binding(0) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * 64u;
    if (idx >= p.n_kv * p.row_words) {
        return;
    }
    let h = idx / p.row_words;
    let d = idx % p.row_words;
    let n = min(moves[0], MAX_MOVES);
    for (var i = 0u; i < n; i++) {
        let src = moves[1u + 2u * i];
        let dst = moves[2u + 2u * i];
        if (src != dst && src < p.max_ctx && dst < p.max_ctx) {
            let s = (h * p.max_ctx + src) * p.row_words + d;
            let t = (h * p.max_ctx + dst) * p.row_words + d;
            k_cache[t] = k_cache[s];
            v_cache[t] = v_cache[s];
        }
    }
}
