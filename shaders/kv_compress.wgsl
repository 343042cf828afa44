// kv_compress: InfLLM-v2 compressed keys. Window i of a layer's K cache covers positions [i * stride, i * stride +
// size); its compressed key is the mean of those keys (InfLLM-V2, arXiv 2509.24663; MiniCPM4 `CompressK`).
// This kernel computes the windows completed by one step: first .. first + count (the host derives them from pos
// and the step's token count, see kv_compress.rs), after the step's kv_write.
// Bindings: 0 k_cache [n_kv, max_ctx, head_dim] f32 or (KV_F16) f16 pairs (lib/kv_cache.wgsl) | 1 c_cache [n_kv, n_windows, head_dim] f32 (written).
// Params: n_kv, hd4 (head_dim / 4), max_ctx, n_windows, size, stride, first, count, inv_size (1 / size).
// Grid: ceil(max windows per step * n_kv * hd4 / 64) workgroups of 64 (folded into y past 65535); one invocation
// per (window, head, vec4 column), the column fastest, so consecutive invocations read consecutive 16-byte columns
// of a key row and write consecutive columns of one compressed row. Invocations past count exit.

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
}

@group(0) @binding(0) var<storage, read> k_cache: array<kv4>;              // [n_kv, max_ctx, head_dim]
@group(0) @binding(1) var<storage, read_write> c_cache: array<vec4<f32>>;  // [n_kv, n_windows, head_dim]
@group(1) @binding(0) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= p.count * p.n_kv * p.hd4) {
        return;
    }
    let c = i % p.hd4;
    let h = (i / p.hd4) % p.n_kv;
    let w = p.first + i / (p.hd4 * p.n_kv);
    let base = (h * p.max_ctx + w * p.stride) * p.hd4 + c;
    // Two running sums halve the dependency chain of the adds.
    var a = vec4<f32>(0.0);
    var b = vec4<f32>(0.0);
    var j = 0u;
    for (; j + 1u < p.size; j += 2u) {
        a += kv_load(k_cache[base + j * p.hd4]);
        b += kv_load(k_cache[base + (j + 1u) * p.hd4]);
    }
    if (j < p.size) {
        a += kv_load(k_cache[base + j * p.hd4]);
    }
    c_cache[(h * p.n_windows + w) * p.hd4 + c] = (a + b) * p.inv_size;
}
