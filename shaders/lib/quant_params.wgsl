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
    // ROPE (lib/rope_store.wgsl; the fields of rope_kv's params that lib/rope_angle.wgsl reads):
    n_heads: u32,
    n_kv: u32,
    head_dim: u32,
    rot_dim: u32,
    pos: u32,     // position of row 0 of x (StepVars.pos)
    style: u32,
    max_ctx: u32,
    log2_theta: f32,
    freq_scale: f32,
    attn_factor: f32,
    qkv0: u32,    // ROPE: the first row of this weight in q|k|v
    // TWO: the second weight's first workgroup, tiles and rows (its rows follow the first's in q|k|v).
    wg_b: u32,
    tiles_b: u32,
    rows_b: u32,
}
