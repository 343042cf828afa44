// The weight bindings of the chunk-tiled quantized kernels (matmul_q_tiled, matmul_q_tiled_mm, moe_up_q_tiled,
// moe_down_q_tiled; layout in lib/quant_tiled.wgsl): 1 wq quant words (then high-bit words), 2 ws block constants,
// 3 wd super-block factors (FACT only). The including shader declares binding 0 (x) and the bindings after these
// (from 3, or 4 with FACT).

@group(0) @binding(1) var<storage, read> wq: array<vec4<u32>>;  // [tiles, G, WB, 8] 4 rows' words
#if K4
@group(0) @binding(2) var<storage, read> ws: array<vec2<u32>>;  // [tiles, G, 8] 16-bit codes sc | m << 8
#else
#if PAIR
@group(0) @binding(2) var<storage, read> ws: array<vec4<u32>>;  // [tiles, G, 8] (d01, d23, m01, m23) f16 pairs
#else
@group(0) @binding(2) var<storage, read> ws: array<vec2<u32>>;  // [tiles, G, 8] (d01, d23) f16 pairs
#endif
#endif
#if FACT
#if FACT2
@group(0) @binding(3) var<storage, read> wd: array<vec4<u32>>;  // [tiles, G/8, 8] (d01, d23, dmin01, dmin23) f16 pairs
#else
@group(0) @binding(3) var<storage, read> wd: array<vec2<u32>>;  // [tiles, G/8, 8] (d01, d23) f16 pairs
#endif
#endif
