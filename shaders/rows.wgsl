// rows: y = x[start .. start + count, :], a copy of whole rows (e.g. the last token's hidden state before the LM head).
// Bindings: 0 x [m, d] f32 | 1 y [count, d] f32 (written)
// Params: start row, count, d. Grid: ceil(count * d / 256) workgroups of 256 (folded into y past the limit).

struct Params { start: u32, count: u32, d: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;        // [m, d]
@group(0) @binding(1) var<storage, read_write> y: array<f32>;  // [count, d]
@group(1) @binding(0) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i < p.count * p.d) {
        y[i] = x[p.start * p.d + i];
    }
}
