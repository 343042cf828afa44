// add: c = a + alpha * b, elementwise over n f32 values (residual connections, alpha = 1 but for MiniCPM's depth
// scaling); SCALE variant: c = alpha * a (one input).
// Bindings: 0 a [n] f32 | 1 b [n] f32 (not SCALE) | then c [n] f32 (written)
// Params: n, alpha. Grid: ceil(n / 256) workgroups of 256 (folded into y past the per-dimension limit).

struct Params {
    n: u32,
    alpha: f32,
}

@group(0) @binding(0) var<storage, read> a: array<f32>;        // [n]
#if SCALE
@group(0) @binding(1) var<storage, read_write> c: array<f32>;  // [n]
#else
@group(0) @binding(1) var<storage, read> b: array<f32>;        // [n]
@group(0) @binding(2) var<storage, read_write> c: array<f32>;  // [n]
#endif
@group(1) @binding(0) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i < p.n) {
#if SCALE
        c[i] = p.alpha * a[i];
#else
        c[i] = a[i] + p.alpha * b[i];
#endif
    }
}
