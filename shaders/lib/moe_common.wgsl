// Shared by the moe_up_* and moe_down_* shaders (BlockFFN's sparse experts): the parameter block, the active-expert
// list written by moe_router, and SiLU. The Rust side fills Params in src/ops/moe_common.rs.
//
// The active list is u32 [1 + E]: its count c, then the c active expert ids in ascending order (entries past c are
// stale). Every kernel's grid is sized for all E experts; work items whose expert slot is >= c return at once
// (sparse up), or loops run over the c listed experts only (sparse down).

struct Params {
    m: u32,           // tokens (rows of x)
    experts: u32,     // E
    de: u32,          // expert size: rows of W per expert (up), k per expert (down)
    rows: u32,        // rows of W, also the output row length: E * de (up), hidden (down)
    kv: u32,          // dense W: row stride in elements of `w`
    xv: u32,          // x row stride in vec4s
    groups: u32,      // quantized W: 32-weight blocks per row
    tiles: u32,       // quantized W, tiled layout: 32-row tiles
    per_expert: u32,  // up: workgroups per expert; down (quantized): 32-blocks per expert
}

@group(1) @binding(0) var<uniform> p: Params;

// SiLU(v) = v / (1 + exp(-v)); for v below about -88, exp overflows and the result is -0 (no NaN).
fn silu4(v: vec4<f32>) -> vec4<f32> {
    return v / (1.0 + exp(-v));
}
