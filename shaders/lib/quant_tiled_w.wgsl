// The weight bindings of the chunk-tiled quantized kernels (matmul_q_tiled, matmul_q_tiled_mm, moe_up_q_tiled,
// moe_down_q_tiled; layout in lib/quant_tiled.wgsl), from binding W_AT (1; another for namespace B): W_AT wq quant
// words (then high-bit words), W_AT + 1 ws block constants, W_AT + 2 wd super-block factors (FACT only). The
// including shader declares binding 0 (x) and the bindings after these (from 3, or 4 with FACT).

@group(0) @binding(W_AT) var<storage, read> wq: array<vec4<u32>>;  // [tiles, G, WB, 8] 4 rows' words
#if K4
@group(0) @binding(W_AT + 1u) var<storage, read> ws: array<vec2<u32>>;  // [tiles, G, 8] 16-bit codes sc | m << 8
#else
#if PAIR
@group(0) @binding(W_AT + 1u) var<storage, read> ws: array<vec4<u32>>;  // [tiles, G, 8] (d01, d23, m01, m23) f16 pairs
#else
@group(0) @binding(W_AT + 1u) var<storage, read> ws: array<vec2<u32>>;  // [tiles, G, 8] (d01, d23) f16 pairs
#endif
#endif
#if FACT
#if FACT2
@group(0) @binding(W_AT + 2u) var<storage, read> wd: array<vec4<u32>>;  // [tiles, G/8, 8] (d01, d23, dmin01, dmin23) f16 pairs
#else
@group(0) @binding(W_AT + 2u) var<storage, read> wd: array<vec2<u32>>;  // [tiles, G/8, 8] (d01, d23) f16 pairs
#endif
#endif
