// Workgroup-wide sum and max for one-workgroup-per-row kernels (rms_norm, softmax). Every invocation gets the
// result. Call only from workgroup-uniform control flow (there are barriers inside).
// Needs `const WG: u32` (the workgroup size, a power of two) from the including shader's key.
// SUBGROUPS: a subgroup reduction, one partial per subgroup in workgroup memory (indexed by subgroup_id, so nothing
// is assumed about how subgroups map to local indices), then every subgroup reduces the partials again.
// Fallback: a workgroup-memory tree, log2(WG) barriers.

struct Lane {
    lid: u32,      // local_invocation_index
    sg_lane: u32,  // subgroup_invocation_id (0 in the fallback)
    sg_size: u32,  // subgroup_size (1 in the fallback)
    sg_id: u32,    // subgroup_id (0 in the fallback)
    n_sg: u32,     // num_subgroups (1 in the fallback)
}

var<workgroup> red: array<f32, WG>;  // [WG] partials

#if SUBGROUPS
fn wg_sum(v: f32, l: Lane) -> f32 {
    let s = subgroupAdd(v);
    if (l.sg_lane == 0u) {
        red[l.sg_id] = s;
    }
    workgroupBarrier();
    var t = 0.0;
    for (var i = l.sg_lane; i < l.n_sg; i += l.sg_size) {
        t += red[i];
    }
    let total = subgroupAdd(t);
    workgroupBarrier();
    return total;
}

fn wg_max(v: f32, l: Lane) -> f32 {
    let s = subgroupMax(v);
    if (l.sg_lane == 0u) {
        red[l.sg_id] = s;
    }
    workgroupBarrier();
    var t = s;
    for (var i = l.sg_lane; i < l.n_sg; i += l.sg_size) {
        t = max(t, red[i]);
    }
    let total = subgroupMax(t);
    workgroupBarrier();
    return total;
}
#else
fn wg_sum(v: f32, l: Lane) -> f32 {
    red[l.lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (l.lid < s) {
            red[l.lid] += red[l.lid + s];
        }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();
    return total;
}

fn wg_max(v: f32, l: Lane) -> f32 {
    red[l.lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (l.lid < s) {
            red[l.lid] = max(red[l.lid], red[l.lid + s]);
        }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();
    return total;
}
#endif
