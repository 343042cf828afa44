// kv_compress: InfLLM-v2 compressed keys. Window i of a layer's K cache covers positions [i * stride, i * stride +
// size); its compressed key is the mean of those keys (InfLLM-V2, arXiv 2509.24663; MiniCPM4 `CompressK`).
// This kernel computes the windows completed by one step: first .. first + count (the host derives them from pos
// and the step's token count, see kv_compress.rs), after the step's kv_write.
// TREE (a draft tree's step, attention_decode's tree table): window `first` (the first one the root does not
// complete) along the path of each row at the depth where it completes, the mean over the keys of the row's path:
// position t < pos from cache slot t, t >= pos from the slot the row's path names (lib/tree_table.wgsl);
// zeros for the other rows (deeper rows share their ancestor's). The same sums in the same order as the plain
// form, so a row's window equals the one plain decoding along its path would cache, bit for bit.
// Bindings: 0 k_cache [n_kv, max_ctx, head_dim] f32 or (KV_F16) f16 pairs (lib/kv_cache.wgsl) | 1 c_cache [n_kv,
//   n_windows, head_dim] f32 (written); TREE: 1 tree [rows, TREE_W] u32 | 2 rows' windows [rows, n_kv, head_dim]
//   f32 (written).
// Params: n_kv, hd4 (head_dim / 4), max_ctx, n_windows, size, stride, first, count (TREE: rows), inv_size (1 /
// size), pos (TREE: the root's position).
// Grid: ceil(max windows per step (TREE: rows) * n_kv * hd4 / 64) workgroups of 64 (folded into y past 65535); one
// invocation per (window or row, head, vec4 column), the column fastest, so consecutive invocations read
// consecutive 16-byte columns of a key row and write consecutive columns of one compressed row. Invocations past
// count exit.

#include "lib/kv_cache.wgsl"

struct Params {
    n_kv: u32,
    hd4: u32,
    max_ctx: u32,
    n_windows: u32,
    size: u32,
    stride: u32,
    first: u32,
    count: u32,
    inv_size: f32,
    pos: u32,
}

@group(0) @binding(0) var<storage, read> k_cache: array<kv4>;              // [n_kv, max_ctx, head_dim]
#if TREE
@group(0) @binding(1) var<storage, read> tree: array<u32>;                 // [rows, TREE_W]
@group(0) @binding(2) var<storage, read_write> c_out: array<vec4<f32>>;    // [rows, n_kv, head_dim]
#include "lib/tree_table.wgsl"
#else
@group(0) @binding(1) var<storage, read_write> c_out: array<vec4<f32>>;    // [n_kv, n_windows, head_dim]
#endif
@group(1) @binding(0) var<uniform> p: Params;

// The cache slot of the key at position t for tree row r (the identity without TREE).
fn slot(r: u32, t: u32) -> u32 {
#if TREE
    return tree_key_slot(r, t);
#else
    return t;
#endif
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= p.count * p.n_kv * p.hd4) {
        return;
    }
    let c = i % p.hd4;
    let h = (i / p.hd4) % p.n_kv;
#if TREE
    let r = i / (p.hd4 * p.n_kv);
    let w = p.first;
    let out = (r * p.n_kv + h) * p.hd4 + c;
    // Row r sits at position pos + depth; window w ends at position w * stride + size - 1.
    if (p.pos + tree_row_depth(r) + 1u != w * p.stride + p.size) {
        c_out[out] = vec4<f32>(0.0);
        return;
    }
#else
    let r = 0u;
    let w = p.first + i / (p.hd4 * p.n_kv);
    let out = (h * p.n_windows + w) * p.hd4 + c;
#endif
    let head = h * p.max_ctx;
    let start = w * p.stride;
    // Two running sums halve the dependency chain of the adds.
    var a = vec4<f32>(0.0);
    var b = vec4<f32>(0.0);
    var j = 0u;
    for (; j + 1u < p.size; j += 2u) {
        a += kv_load(k_cache[(head + slot(r, start + j)) * p.hd4 + c]);
        b += kv_load(k_cache[(head + slot(r, start + j + 1u)) * p.hd4 + c]);
    }
    if (j < p.size) {
        a += kv_load(k_cache[(head + slot(r, start + j)) * p.hd4 + c]);
    }
    c_out[out] = (a + b) * p.inv_size;
}
