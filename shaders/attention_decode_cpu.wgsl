// attention_decode_cpu: attention_decode's split kernel for CPU adapters (lavapipe), where workgroup memory and
// barriers are costly (each barrier switches coroutines per 8-lane SIMD chunk; LAVAPIPE.md §4): a workgroup is one
// subgroup of 8 lanes serving one query row (token x query head) and one split of the keys, with no workgroup
// memory. Lane j takes the split's keys k_begin + j, k_begin + j + 8, ..., keeps its own online softmax (running
// max m, sum l) and P * V accumulator in registers, and the 8 lanes merge theirs with subgroup operations at the
// end. Same contract as attention_decode.wgsl (the math, the cache layout, the splits at absolute key positions,
// the partials, `single`): every row's result depends on its position and the keys alone, so row r of a
// many-query step equals the one-query step bit for bit. Scores are in the log2 domain (q pre-scaled by
// scale * log2(e)). Needs subgroups of at least 8 lanes (the SUBGROUPS flag says so; there is no other form).
// Bindings: 0 q [n_q, n_heads, HD] | 1 k_cache [n_kv, max_ctx, HD] | 2 v_cache [n_kv, max_ctx, HD] | 3 part_o
//   [n_q, n_heads, splits, HD] (written: unnormalized sum p * v) | 4 part_ml [n_q, n_heads, splits, 2] (written:
//   running max and sum) | 5 out [n_q, n_heads, HD] (written instead of the partials when `single`).
// Grid (splits, n_kv, n_q * group), workgroups of 8: workgroup (s, h, z) serves split s of query row
// (token z / group, head h * group + z % group).

const HD4: u32 = HD / 4;
const LANES: u32 = 8u;
const NEG: f32 = -1.0e30;
const LOG2E: f32 = 1.4426950408889634;

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
    single: u32,  // 1: split `first` is the only one launched; it writes the normalized output
}

@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;             // [n_q, n_heads, HD]
@group(0) @binding(1) var<storage, read> kc: array<vec4<f32>>;            // [n_kv, max_ctx, HD]
@group(0) @binding(2) var<storage, read> vc: array<vec4<f32>>;            // [n_kv, max_ctx, HD]
@group(0) @binding(3) var<storage, read_write> part_o: array<vec4<f32>>;  // [n_q, n_heads, splits, HD]
@group(0) @binding(4) var<storage, read_write> part_ml: array<vec2<f32>>; // [n_q, n_heads, splits, 2]
@group(0) @binding(5) var<storage, read_write> out: array<vec4<f32>>;     // [n_q, n_heads, HD]
@group(1) @binding(0) var<uniform> p: Params;

@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(subgroup_invocation_id) lane: u32) {
    let split = p.first + wg.x;
    let kvh = wg.y;
    let tok = wg.z / p.group;
    let head = kvh * p.group + wg.z % p.group;
    let row = tok * p.n_heads + head;
    let kv_len = min(p.pos + p.n_q, p.max_ctx);
    let k_begin = min(split * p.chunk, kv_len);
    let k_end = min(k_begin + p.chunk, kv_len);
    // Keys [lo, hi) of this split are visible to the row (causal, and the sliding window when there is one).
    let hi = min(p.pos + tok + 1u, k_end);
    let w_lo = select(0u, p.pos + tok + 1u - p.window, p.window > 0u && p.pos + tok + 1u > p.window);
    let lo = max(k_begin, w_lo);
    let cbase = kvh * p.max_ctx * HD4;

    var qr: array<vec4<f32>, HD4>;
    let qscale = p.scale * LOG2E;
    for (var d = 0u; d < HD4; d++) {
        qr[d] = q[row * HD4 + d] * qscale;
    }
    var acc: array<vec4<f32>, HD4>;
    for (var d = 0u; d < HD4; d++) {
        acc[d] = vec4<f32>(0.0);
    }
    var m = NEG;
    var l = 0.0;
    for (var t = k_begin + lane; t < hi; t += LANES) {
        if (t < lo) {
            continue;
        }
        let kb = cbase + t * HD4;
        var dt = vec4<f32>(0.0);
        for (var d = 0u; d < HD4; d++) {
            dt += qr[d] * kc[kb + d];
        }
        let s = (dt.x + dt.y) + (dt.z + dt.w);
        let m_new = max(m, s);
        let a = exp2(m - m_new);
        let pw = exp2(s - m_new);
        l = l * a + pw;
        m = m_new;
        for (var d = 0u; d < HD4; d++) {
            acc[d] = acc[d] * a + pw * vc[kb + d];
        }
    }
    // Merge the lanes: weights exp2(m_j - M) (0 for a lane that saw no key, 1 where no lane did).
    let mx = subgroupMax(m);
    let w = exp2(m - mx);
    let lsum = subgroupAdd(l * w);
    if (p.single == 1u) {
        // The combine's arithmetic for one split (weight exp2(0) = 1): bit for bit the same output.
        for (var d = 0u; d < HD4; d++) {
            let o = subgroupAdd(acc[d] * w);
            if (lane == 0u) {
                out[row * HD4 + d] = select(vec4<f32>(0.0), o / lsum, lsum > 0.0);
            }
        }
    } else {
        let slot = row * p.splits + split;
        for (var d = 0u; d < HD4; d++) {
            let o = subgroupAdd(acc[d] * w);
            if (lane == 0u) {
                part_o[slot * HD4 + d] = o;
            }
        }
        if (lane == 0u) {
            part_ml[slot] = vec2<f32>(mx, lsum);
        }
    }
}
