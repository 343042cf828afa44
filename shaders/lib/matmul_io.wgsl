// Params and bindings shared by matmul_gemm and matmul_gemv_gpu: x, W (f32 or packed f16, scalar or vec4),
// optional bias, y. Bindings: 0 x [M, K] | 1 w [rows, K] | (2 bias [N]) | y [M, N] (written).

struct Params {
    m: u32,     // rows of x
    k: u32,     // reduction length
    n: u32,     // columns of y (all parts)
    row0: u32,  // first output column of this part
    rows: u32,  // rows of W in this part
    kv: u32,    // W row stride in elements of `w`
    xv: u32,    // x row stride in elements of `x`
}

#if VEC
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;   // [M, K/4]
#else
@group(0) @binding(0) var<storage, read> x: array<f32>;         // [M, K]
#endif
#if WH
#if VEC
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;   // [rows, K/8] f16 x 8
#else
@group(0) @binding(1) var<storage, read> w: array<u32>;         // [rows, ceil(K/2)] f16 x 2
#endif
#else
#if VEC
@group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;   // [rows, K/4]
#else
@group(0) @binding(1) var<storage, read> w: array<f32>;         // [rows, K]
#endif
#endif
#if BIAS
@group(0) @binding(2) var<storage, read> bias: array<f32>;      // [N]
@group(0) @binding(3) var<storage, read_write> y: array<f32>;   // [M, N]
#else
@group(0) @binding(2) var<storage, read_write> y: array<f32>;   // [M, N]
#endif
@group(1) @binding(0) var<uniform> p: Params;
