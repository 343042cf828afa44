// rms_norm: y = x / sqrt(mean(x^2) + eps) * weight, over each row of d values.
// Source: Zhang & Sennrich 2019, "Root Mean Square Layer Normalization"; the order of operations follows HF
// LlamaRMSNorm ((x * rsqrt(var + eps)) * weight).
// Bindings (VEC4, when d % 4 == 0: the same data as vec4 units, d / 4 per row):
//   0 x [rows, d] f32 | 1 weight [d] f32 | 2 y [rows, d] f32 (written)
// Params: rows, d, eps. Grid: one workgroup of WG per row (folded into y past the per-dimension limit); the lanes
// stride over the row, so consecutive lanes read consecutive units.
// RESIDUAL variant: normalizes h = x + alpha * r and also writes h (the residual stream), saving the add's dispatch.
// Variants: WG (8 on CPU adapters: one SIMD chunk, no cross-chunk barriers; 256 on GPUs), VEC4, and SUBGROUPS
// (subgroup reduction) or the workgroup-memory tree, both from lib/reduce.wgsl.

struct Params {
    rows: u32,
    d: u32,
    eps: f32,
    alpha: f32,  // RESIDUAL: h = x + alpha * r (muP residual scaling; 1 elsewhere)
}

#if VEC4
alias V = vec4<f32>;
const VW = 4u;
fn hsum(v: V) -> f32 {
    return (v.x + v.y) + (v.z + v.w);
}
#else
alias V = f32;
const VW = 1u;
fn hsum(v: V) -> f32 {
    return v;
}
#endif

#if RESIDUAL
// Fused residual add (one dispatch instead of two): h = x + alpha * r is written and normalized.
// Bindings: 0 x [rows, d] | 1 r [rows, d] | 2 weight [d] | 3 y [rows, d] (written) | 4 h [rows, d] (written).
@group(0) @binding(0) var<storage, read> x: array<V>;        // [rows, d / VW]
@group(0) @binding(1) var<storage, read> r: array<V>;        // [rows, d / VW]
@group(0) @binding(2) var<storage, read> w: array<V>;        // [d / VW]
@group(0) @binding(3) var<storage, read_write> y: array<V>;  // [rows, d / VW]
@group(0) @binding(4) var<storage, read_write> h: array<V>;  // [rows, d / VW]
// Each lane writes h at the indices it later reads back (the same lane-to-index map in both passes).
fn load(i: u32) -> V {
    let v = x[i] + p.alpha * r[i];
    h[i] = v;
    return v;
}
fn reload(i: u32) -> V {
    return h[i];
}
#else
@group(0) @binding(0) var<storage, read> x: array<V>;        // [rows, d / VW]
@group(0) @binding(1) var<storage, read> w: array<V>;        // [d / VW]
@group(0) @binding(2) var<storage, read_write> y: array<V>;  // [rows, d / VW]
fn load(i: u32) -> V {
    return x[i];
}
fn reload(i: u32) -> V {
    return x[i];
}
#endif
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
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;  // workgroup-uniform
    }
    let units = p.d / VW;
    let base = row * units;
    // Two independent accumulators: more loads in flight, shorter sequential sums.
    var a0 = V(0.0);
    var a1 = V(0.0);
    var i = lid;
    for (; i + WG < units; i += 2u * WG) {
        let u = load(base + i);
        let v = load(base + i + WG);
        a0 += u * u;
        a1 += v * v;
    }
    if (i < units) {
        let u = load(base + i);
        a0 += u * u;
    }
    let ss = wg_sum(hsum(a0 + a1), lane);
    let inv = inverseSqrt(ss / f32(p.d) + p.eps);
    for (var j = lid; j < units; j += WG) {
        y[base + j] = reload(base + j) * inv * w[j];
    }
}
