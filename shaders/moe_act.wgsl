// moe_act: the elementwise step of BlockFFN's dense fallback (Song et al. 2025, arXiv 2507.08771), between two
// dense matmuls over all experts: h[m, ex*de + j] = silu(u[m, ex*de + j]) * r[m, ex], one vec4 per invocation.
// Used when a chunk's union of active experts is nearly all of them (see src/ops/moe_ffn.rs).
// Bindings: 0 u [M, E*de] f32 | 1 r [M, E] f32 | 2 h [M, E*de] f32 (written).
// Params: units (M*E*de/4), de4 (de/4: vec4s per expert). de % 4 == 0.
// Grid: ceil(units / 256) workgroups of 256 (folded into y past the per-dimension limit).

struct Params {
    units: u32,
    de4: u32,
}

@group(0) @binding(0) var<storage, read> u: array<vec4<f32>>;        // [M, E*de/4]
@group(0) @binding(1) var<storage, read> r: array<f32>;              // [M, E]
@group(0) @binding(2) var<storage, read_write> h: array<vec4<f32>>;  // [M, E*de/4]
@group(1) @binding(0) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i < p.units) {
        let v = u[i];
        // Row-major [M, E, de/4]: vec4 i belongs to expert block i / de4 of the flattened [M * E] list.
        h[i] = v / (1.0 + exp(-v)) * r[i / p.de4];
    }
}
