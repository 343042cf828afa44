// softmax: y = exp(v - max v) / sum exp(v - max v) with v = scale * x, over each row of n values; or (LSE) the row's
// log-sum-exp, max v + log sum exp(v - max v), alone (log-probabilities are then v - lse).
// Bindings (VEC4, when n % 4 == 0: the same data as vec4 units, n / 4 per row):
//   0 x [rows, n] f32 | 1 y [rows, n] f32 (written; LSE: [rows] f32)
// Params: rows, n, scale. Grid: one workgroup of WG per row (folded into y past the per-dimension limit); the lanes
// stride over the row, so consecutive lanes read consecutive units.
// Variants: WG (8 on CPU adapters: one SIMD chunk, no cross-chunk barriers; 256 on GPUs), VEC4, and SUBGROUPS
// (subgroup reduction) or the workgroup-memory tree, both from lib/reduce.wgsl.
// Each lane keeps an online (max, sum) per component over its units (Milakov & Gimelshein 2018, "Online
// normalizer calculation for softmax"), so x is read twice: once for the statistics, once to write y.
// Special values: -inf entries (masks) give exactly 0; a row with no entry above -inf (fully masked) gives all
// zeros; a NaN or +inf in v makes its row NaN on IEEE adapters (WGSL lets an implementation assume no NaN/inf).

struct Params {
    rows: u32,
    n: u32,
    scale: f32,
}

#if VEC4
alias V = vec4<f32>;
alias VB = vec4<bool>;
const VW = 4u;
fn hsum(v: V) -> f32 {
    return (v.x + v.y) + (v.z + v.w);
}
fn hmax(v: V) -> f32 {
    return max(max(v.x, v.y), max(v.z, v.w));
}
fn any_of(b: VB) -> bool {
    return any(b);
}
#else
alias V = f32;
alias VB = bool;
const VW = 1u;
fn hsum(v: V) -> f32 {
    return v;
}
fn hmax(v: V) -> f32 {
    return v;
}
fn any_of(b: VB) -> bool {
    return b;
}
#endif

@group(0) @binding(0) var<storage, read> x: array<V>;        // [rows, n / VW]
#if LSE
@group(0) @binding(1) var<storage, read_write> y: array<f32>;  // [rows]
#else
@group(0) @binding(1) var<storage, read_write> y: array<V>;  // [rows, n / VW]
#endif
@group(1) @binding(0) var<uniform> p: Params;

#include "lib/reduce.wgsl"

// The lowest finite f32: the running max starts here, so it never becomes -inf and exp(v - m) stays defined.
const LOWEST: f32 = -3.40282347e38;

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
    let units = p.n / VW;
    let base = row * units;
    var m = V(LOWEST);
    var s = V(0.0);
    for (var i = lid; i < units; i += WG) {
        let v = p.scale * x[base + i];
        if (any_of(v > m)) {
            // A new maximum in some component (rare after the first units): rescale the sums.
            let nm = max(m, v);
            s = s * exp(m - nm) + exp(v - nm);
            m = nm;
        } else {
            s += exp(v - m);  // NaN falls here and poisons s
        }
    }
    let lane_max = hmax(m);
    let lane_sum = hsum(s * exp(m - V(lane_max)));
    let row_max = wg_max(lane_max, lane);
    let total = wg_sum(lane_sum * exp(lane_max - row_max), lane);
#if LSE
    // A fully masked row: log 0 = -inf. (A NaN total keeps its NaN.)
    if (lid == 0u) {
        y[row] = select(row_max + log(total), bitcast<f32>(0xff800000u), total == 0.0);
    }
#else
    // A fully masked row has total 0: write zeros rather than 0/0. (A NaN total keeps its NaN.)
    let inv = select(1.0 / total, 0.0, total == 0.0);
    for (var i = lid; i < units; i += WG) {
        y[base + i] = exp(p.scale * x[base + i] - V(row_max)) * inv;
    }
#endif
}
