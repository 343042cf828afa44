// Params of the matmul_q shaders (one struct for every layout; the Rust side fills it in src/ops/matmul_q.rs).

struct Params {
    m: u32,       // rows of x
    k: u32,       // reduction length (a multiple of 32)
    n: u32,       // columns of y (all parts)
    row0: u32,    // first output column of this part
    rows: u32,    // rows of W in this part
    groups: u32,  // blocks per row, K / 32
    xv: u32,      // x row stride in vec4s, K / 4
    tiles: u32,   // tiles of 32 rows in this part (tiled layout; unused by the row layout)
    alpha: f32,   // ADD: y = res + alpha * sum
    eps: f32,     // NORM: the RMSNorm epsilon
}
