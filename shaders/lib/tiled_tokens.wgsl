// Token blocking of the chunk-tiled kernels that keep several tokens per invocation (matmul_q_tiled_mm,
// moe_up_q_tiled, moe_down_q_tiled): provides Toks (TM tokens' x cursors and accumulators), toks_new, token_dot,
// toks_add and toks_acc. TM is 1, 2 (T2), 4 (T2 and T4) or 8 (T2, T4 and T8). The tokens are fields, not arrays indexed in loops, so
// that each block dequantized by w_block stays in registers and serves every token.
// The including shader includes lib/quant_tiled.wgsl and declares x (array<vec4<f32>>, [M, K/4]).

struct Toks {
    x0: u32,  // first x vector (vec4 index) of token m0
    a0: vec4<f32>,  // its sums of the invocation's 4 rows
#if T2
    x1: u32,
    a1: vec4<f32>,
#endif
#if T4
    x2: u32,
    x3: u32,
    a2: vec4<f32>,
    a3: vec4<f32>,
#endif
#if T8
    x4: u32,
    x5: u32,
    x6: u32,
    x7: u32,
    a4: vec4<f32>,
    a5: vec4<f32>,
    a6: vec4<f32>,
    a7: vec4<f32>,
#endif
}

// Tokens m0 .. m0 + TM, x rows xv vec4s apart, plus xl (this lane's vector with SUBGROUPS). Tokens past `last`
// re-read it; their sums are not written.
fn toks_new(m0: u32, last: u32, xv: u32, xl: u32) -> Toks {
    var t: Toks;  // zero-initialized: the sums start at 0
    t.x0 = min(m0, last) * xv + xl;
#if T2
    t.x1 = min(m0 + 1u, last) * xv + xl;
#endif
#if T4
    t.x2 = min(m0 + 2u, last) * xv + xl;
    t.x3 = min(m0 + 3u, last) * xv + xl;
#endif
#if T8
    t.x4 = min(m0 + 4u, last) * xv + xl;
    t.x5 = min(m0 + 5u, last) * xv + xl;
    t.x6 = min(m0 + 6u, last) * xv + xl;
    t.x7 = min(m0 + 7u, last) * xv + xl;
#endif
    return t;
}

// One token's contribution of block w: its x block starts at vec4 index `at` (plus this lane's vector with
// SUBGROUPS, already in `at`; sl is this lane's subgroup index, unused without SUBGROUPS).
fn token_dot(w: WBlock, at: u32, sl: u32) -> vec4<f32> {
#if SUBGROUPS
    return block_dot(w, x_block(x[at], sl));
#else
    return block_dot(w, x_block(at));
#endif
}

// Adds block w for every token, its x block `xo` vectors past each token's cursor.
fn toks_add(t: ptr<function, Toks>, w: WBlock, xo: u32, sl: u32) {
    (*t).a0 += token_dot(w, (*t).x0 + xo, sl);
#if T2
    (*t).a1 += token_dot(w, (*t).x1 + xo, sl);
#endif
#if T4
    (*t).a2 += token_dot(w, (*t).x2 + xo, sl);
    (*t).a3 += token_dot(w, (*t).x3 + xo, sl);
#endif
#if T8
    (*t).a4 += token_dot(w, (*t).x4 + xo, sl);
    (*t).a5 += token_dot(w, (*t).x5 + xo, sl);
    (*t).a6 += token_dot(w, (*t).x6 + xo, sl);
    (*t).a7 += token_dot(w, (*t).x7 + xo, sl);
#endif
}

// The sums of token m0 + n (n < TM).
fn toks_acc(t: Toks, n: u32) -> vec4<f32> {
    switch n {
#if T2
        case 1u: { return t.a1; }
#endif
#if T4
        case 2u: { return t.a2; }
        case 3u: { return t.a3; }
#endif
#if T8
        case 4u: { return t.a4; }
        case 5u: { return t.a5; }
        case 6u: { return t.a6; }
        case 7u: { return t.a7; }
#endif
        default: { return t.a0; }
    }
}
