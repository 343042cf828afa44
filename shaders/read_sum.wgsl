// read_sum: partial sums of an f32 buffer read as vec4s: a plain streaming read with a result that can be checked,
// the memory-read ceiling the weight-streaming kernels (matmul_q's GEMVs) are measured against.
// Partial g sums vec4s [g * span, (g + 1) * span) of x (clipped at nv). Its workgroup's invocation i reads
// per = span / WG of them, contiguous from g * span + i * per (each invocation streams its own 16-byte-aligned
// run; LAVAPIPE.md §4), into four vec4 accumulators (independent add chains), then the workgroup sums its
// invocations' totals (lib/reduce.wgsl). (The tiled matmul's order, the 8 lanes of a chunk reading 128 contiguous
// bytes per step, measured the same on lavapipe, as did 8 loads per step instead of 4.)
// Bindings: 0 x [nv] vec4<f32> | 1 partials [groups] f32 (written).
// Params: nv, span, groups (below).
// Defs: WG (8 on CPU adapters: one llvmpipe SIMD chunk, no barrier between chunks; 256 on GPUs), SUBGROUPS.
// Grid: groups workgroups of WG (folded into y past the per-dimension limit).

struct Params {
    nv: u32,      // vec4s of x
    span: u32,    // vec4s per partial, a multiple of 4 WG
    groups: u32,  // partials
}

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;        // [nv]
@group(0) @binding(1) var<storage, read_write> partials: array<f32>;  // [groups]
@group(1) @binding(0) var<uniform> p: Params;

#include "lib/reduce.wgsl"

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
#if SUBGROUPS
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_size) sg_size: u32,
    @builtin(subgroup_id) sg_id: u32,
    @builtin(num_subgroups) n_sg: u32,
#endif
) {
#if SUBGROUPS
    let lane = Lane(lid, sg_lane, sg_size, sg_id, n_sg);
#else
    let lane = Lane(lid, 0u, 1u, 0u, 1u);
#endif
    let g = wid.x + wid.y * nwg.x;
    // Workgroups past the last partial (grid folding) read nothing but still reach the barriers.
    let per = p.span / WG;
    let start = min(g * p.span + lid * per, p.nv);
    let end = min(start + per, p.nv);
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    var i = start;
    while (i + 4u <= end) {
        a0 += x[i];
        a1 += x[i + 1u];
        a2 += x[i + 2u];
        a3 += x[i + 3u];
        i += 4u;
    }
    while (i < end) {
        a0 += x[i];
        i += 1u;
    }
    let a = (a0 + a1) + (a2 + a3);
    let total = wg_sum((a.x + a.y) + (a.z + a.w), lane);
    if (lid == 0u && g < p.groups) {
        partials[g] = total;
    }
}
