// Params and bindings of attention_decode's split kernels (attention_decode.wgsl for GPUs, attention_decode_cpu.wgsl
// for CPU adapters); the Rust side fills `SplitParams` in src/ops/attention_decode.rs. The including shader defines HD4.

#include "lib/kv_cache.wgsl"

struct Params {
    n_q: u32,
    n_heads: u32,
    n_kv: u32,
    group: u32,
    max_ctx: u32,
    pos: u32,
    splits: u32,
    scale: f32,
    window: u32,
    chunk: u32,   // keys per split
    first: u32,   // the split of workgroup x = 0
    single: u32,  // 1: split `first` is the only one launched; it writes the normalized output, no combine runs
}

@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;             // [n_q, n_heads, HD]
@group(0) @binding(1) var<storage, read> kc: array<kv4>;                  // [n_kv, max_ctx, HD] f32 or (KV_F16) f16
@group(0) @binding(2) var<storage, read> vc: array<kv4>;                  // [n_kv, max_ctx, HD] f32 or (KV_F16) f16
@group(0) @binding(3) var<storage, read_write> part_o: array<vec4<f32>>;  // [n_q, n_heads, splits, HD]
@group(0) @binding(4) var<storage, read_write> part_ml: array<vec2<f32>>; // [n_q, n_heads, splits, 2]
@group(0) @binding(5) var<storage, read_write> out: array<vec4<f32>>;     // [n_q, n_heads, HD]
@group(1) @binding(0) var<uniform> p: Params;
