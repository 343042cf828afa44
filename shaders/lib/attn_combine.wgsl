// The combine dispatch of the split attention kernels (attention_decode, attention_sparse; flash-decoding): each
// output vec4 weighs the splits' unnormalized partial outputs by exp2(m_s - M) and divides by the weighted sums.
// A row no split saw a key for (den = 0: an empty sparse selection) is 0. The including shader defines HD4, WG and
// NEG. Bindings: 0 part_o [rows, splits, HD] | 1 part_ml [rows, splits, 2] (running max m, sum l) | 2 out [rows, HD]
// (written). Grid: ceil(rows * HD / 4 / WG) workgroups of WG (folded into y), one invocation per output vec4.

struct Params {
    n_rows: u32,   // query tokens x query heads
    splits: u32,   // stride of the partials
    first: u32,    // splits first .. end were launched this step (the host launches only those that can hold keys)
    end: u32,
}

@group(0) @binding(0) var<storage, read> part_o: array<vec4<f32>>;    // [n_rows, splits, HD]
@group(0) @binding(1) var<storage, read> part_ml: array<vec2<f32>>;   // [n_rows, splits, 2]
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>; // [n_rows, HD]
@group(1) @binding(0) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= p.n_rows * HD4) {
        return;
    }
    let base = (i / HD4) * p.splits;
    let c = i % HD4;
    var mx = NEG;
    for (var s = p.first; s < p.end; s++) {
        mx = max(mx, part_ml[base + s].x);
    }
    var num = vec4<f32>(0.0);
    var den = 0.0;
    for (var s = p.first; s < p.end; s++) {
        let ml = part_ml[base + s];
        let w = exp2(ml.x - mx);
        den += w * ml.y;
        num += w * part_o[(base + s) * HD4 + c];
    }
    out[i] = select(vec4<f32>(0.0), num / den, den > 0.0);
}
