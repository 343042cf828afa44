// rms_norm: y = x / sqrt(mean(x^2) + eps) * weight, over each row of d values.
// Source: Zhang & Sennrich 2019, "Root Mean Square Layer Normalization"; the order of operations follows HF
// LlamaRMSNorm ((x * rsqrt(var + eps)) * weight).
// Bindings (VEC4, when d % 4 == 0: the same data as vec4 units, d / 4 per row):
//   0 x [rows, d] f32 | 1 weight [d] f32 | 2 y [rows, d] f32 (written)
// Params: rows, d, eps. Grid: one workgroup of WG per row (folded into y past the per-dimension limit); the lanes
// stride over the row, so consecutive lanes read consecutive units.
// RESIDUAL variant: normalizes h = x + alpha * r and also writes h (the residual stream), saving the add's dispatch.
// POST (with RESIDUAL): r is first RMSNorm'ed with its own weight (Gemma's post-attention and post-FFN norms):
// h = x + alpha * rms_norm(r, rw), computed with rms_norm's reduction and order of operations, so h and y equal
// rms_norm then the RESIDUAL form bit for bit, in one dispatch instead of two.
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
// Bindings: 0 x [rows, d] | 1 r [rows, d] | 2 weight [d] | 3 y [rows, d] (written) | 4 h [rows, d] (written);
// POST: 3 rw [d] (r's norm weight), then 4 y and 5 h.
@group(0) @binding(0) var<storage, read> x: array<V>;        // [rows, d / VW]
@group(0) @binding(1) var<storage, read> r: array<V>;        // [rows, d / VW]
@group(0) @binding(2) var<storage, read> w: array<V>;        // [d / VW]
#if POST
@group(0) @binding(3) var<storage, read> rw: array<V>;       // [d / VW]
@group(0) @binding(4) var<storage, read_write> y: array<V>;  // [rows, d / VW]
@group(0) @binding(5) var<storage, read_write> h: array<V>;  // [rows, d / VW]
var<private> r_inv: f32;  // r's row: 1 / sqrt(mean(r^2) + eps)
#else
@group(0) @binding(3) var<storage, read_write> y: array<V>;  // [rows, d / VW]
@group(0) @binding(4) var<storage, read_write> h: array<V>;  // [rows, d / VW]
#endif
// Unit j of the row starting at unit `base`. Each lane writes h at the indices it later reads back (the same
// lane-to-index map in both passes).
fn load(base: u32, j: u32) -> V {
    let i = base + j;
#if POST
    let rn = r[i] * r_inv * rw[j];
    let v = x[i] + p.alpha * rn;
#else
    let v = x[i] + p.alpha * r[i];
#endif
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
fn load(base: u32, j: u32) -> V {
    return x[base + j];
}
fn reload(i: u32) -> V {
    return x[i];
}
#endif
@group(1) @binding(0) var<uniform> p: Params;

#include "lib/reduce.wgsl"

// The row's sum of squares of load(base, j) (of r's raw values with `raw`, POST only), in rms_norm's lane order: two
// independent accumulators (more loads in flight, shorter sequential sums), then the workgroup sum.
fn row_sum_squares(base: u32, units: u32, lid: u32, lane: Lane, raw: bool) -> f32 {
    var a0 = V(0.0);
    var a1 = V(0.0);
    var i = lid;
    for (; i + WG < units; i += 2u * WG) {
        let u = unit(base, i, raw);
        let v = unit(base, i + WG, raw);
        a0 += u * u;
        a1 += v * v;
    }
    if (i < units) {
        let u = unit(base, i, raw);
        a0 += u * u;
    }
    return wg_sum(hsum(a0 + a1), lane);
}

fn unit(base: u32, j: u32, raw: bool) -> V {
#if POST
    if (raw) {
        return r[base + j];
    }
#endif
    return load(base, j);
}

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
#if POST
    // r's own RMSNorm first: its sum of squares as the main pass sums h's (below), so rms_norm(r, rw) is exact.
    r_inv = inverseSqrt(row_sum_squares(base, units, lid, lane, true) / f32(p.d) + p.eps);
#endif
    let ss = row_sum_squares(base, units, lid, lane, false);
    let inv = inverseSqrt(ss / f32(p.d) + p.eps);
    for (var j = lid; j < units; j += WG) {
        y[base + j] = reload(base + j) * inv * w[j];
    }
}
