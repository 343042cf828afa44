// silu_mul: y = silu(gate) * up (or gelu_tanh(gate) * up with GELU) = gate / (1 + exp(-gate)) * up, elementwise over n f32 values (the SwiGLU
// activation of Llama-style FFNs; Shazeer 2020, "GLU Variants Improve Transformer").
// Bindings (VEC4, when n % 4 == 0: the same data as n / 4 vec4 units):
//   0 gate [n] f32 | 1 up [n] f32 | 2 y [n] f32 (written)
// Params: units (n, or n / 4 with VEC4). Grid: ceil(units / 256) workgroups of 256 (folded into y past the
// per-dimension limit), one unit per invocation.
// The activation is lib/glu.wgsl's (shared with the matmul kernels' GLU epilogue); GELU: gelu_tanh(gate) * up.

struct Params {
    units: u32,
    row_units: u32,  // FUSED: units per row of F (gate and up lie side by side in one [rows, 2F] tensor)
}

#if VEC4
alias V = vec4<f32>;
#else
alias V = f32;
#endif

alias GV = V;
#include "lib/glu.wgsl"

#if FUSED
// The output of one matmul over concatenated [gate; up] weights: 0 gu [rows, 2F] | 1 y [rows, F] (written).
@group(0) @binding(0) var<storage, read> gu: array<V>;       // [rows, 2F] as units
@group(0) @binding(1) var<storage, read_write> y: array<V>;  // [rows, F] as units
fn gate_up(i: u32) -> array<V, 2> {
    let row = i / p.row_units;
    let at = i + row * p.row_units;  // row * 2F + j
    return array<V, 2>(gu[at], gu[at + p.row_units]);
}
#else
@group(0) @binding(0) var<storage, read> gate: array<V>;     // [n] as units
@group(0) @binding(1) var<storage, read> up: array<V>;       // [n] as units
@group(0) @binding(2) var<storage, read_write> y: array<V>;  // [n] as units
fn gate_up(i: u32) -> array<V, 2> {
    return array<V, 2>(gate[i], up[i]);
}
#endif
@group(1) @binding(0) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i < p.units) {
        let gu = gate_up(i);
        y[i] = glu(gu[0], gu[1]);
    }
}
