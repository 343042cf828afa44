// embedding: y[i, :] = table[ids[i], :] as f32, for the ids that fall in one row part of the table,
// [row0, row0 + rows) (a table over the binding limit is split by rows; one dispatch per part). Ids >= v (the host
// rejects them before) give zero rows, written by the last part's dispatch; nothing reads out of bounds.
// Bindings: 0 ids [m] u32 | 1 table part [rows, d] f32, or with HALF f16 two per u32 word, each row padded to
//           whole words ([rows, ceil(d / 2)] u32) | 2 y [m, d] f32 (written)
// f16 -> f32 is decoded from the bits (exact for every half, subnormals, infinities and NaNs included), not with
// unpack2x16float, which naga only accepts with the SHADER_FLOAT16_IN_FLOAT32 capability (absent on GLES, and
// on llvmpipe tied to native f16). A gather is memory-bound, so the few integer ops cost nothing.
// Params: m, d, row0, rows, v, last. Grid: one workgroup of 64 per id (folded into y past the per-dimension
// limit); the lanes stride over the row.

struct Params {
    m: u32,
    d: u32,
    row0: u32,  // first table row in this part
    rows: u32,  // rows in this part
    v: u32,     // rows in the whole table
    last: u32,  // 1 for the last part's dispatch: it also writes the zero rows of ids >= v
}

@group(0) @binding(0) var<storage, read> ids: array<u32>;      // [m]
#if HALF
@group(0) @binding(1) var<storage, read> table: array<u32>;    // [rows, ceil(d / 2)] (f16 pairs)
#else
@group(0) @binding(1) var<storage, read> table: array<f32>;    // [rows, d]
#endif
@group(0) @binding(2) var<storage, read_write> y: array<f32>;  // [m, d]
@group(1) @binding(0) var<uniform> p: Params;

#if HALF
// One IEEE half (low 16 bits of h) as f32.
fn half_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    let normal = bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
    let special = bitcast<f32>(sign | 0x7f800000u | (m << 13u));  // inf, NaN
    let subnormal = bitcast<f32>(sign | bitcast<u32>(f32(m) * 5.9604644775390625e-8));  // m * 2^-24, exact
    return select(select(normal, special, e == 31u), subnormal, e == 0u);
}
#endif

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = wid.x + wid.y * nwg.x;
    if (i >= p.m) {
        return;
    }
    let id = ids[i];
    let out = i * p.d;
    if (id >= p.v) {
        if (p.last == 1u) {
            for (var c = lid; c < p.d; c += 64u) {
                y[out + c] = 0.0;
            }
        }
        return;
    }
    if (id < p.row0 || id - p.row0 >= p.rows) {
        return;  // another part's row
    }
    let r = id - p.row0;
#if HALF
    let words = (p.d + 1u) / 2u;
    for (var w = lid; w < words; w += 64u) {
        let pair = table[r * words + w];
        y[out + 2u * w] = half_to_f32(pair & 0xffffu);
        if (2u * w + 1u < p.d) {
            y[out + 2u * w + 1u] = half_to_f32(pair >> 16u);
        }
    }
#else
    for (var c = lid; c < p.d; c += 64u) {
        y[out + c] = table[r * p.d + c];
    }
#endif
}
