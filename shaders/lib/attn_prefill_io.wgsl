// Params and bindings of attention_prefill's kernels (attention_prefill.wgsl for GPUs, attention_prefill_cpu.wgsl for
// CPU adapters); the Rust side fills `PrefillParams` in src/ops/attention_prefill.rs. The including shader defines HD4.

#include "lib/kv_cache.wgsl"

struct Params {
    n_tokens: u32,
    n_heads: u32,
    n_kv: u32,
    group: u32,
    max_ctx: u32,
    pos: u32,
    scale: f32,
    window: u32,
}

@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;          // [n_tokens, n_heads, HD]
@group(0) @binding(1) var<storage, read> kc: array<kv4>;               // [n_kv, max_ctx, HD] f32 or (KV_F16) f16
@group(0) @binding(2) var<storage, read> vc: array<kv4>;               // [n_kv, max_ctx, HD] f32 or (KV_F16) f16
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;  // [n_tokens, n_heads, HD]
@group(1) @binding(0) var<uniform> p: Params;
