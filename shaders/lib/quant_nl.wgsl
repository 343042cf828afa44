// The IQ4_NL codebook (ggml's kvalues_iq4nl: -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89,
// 113) as a quartic in the index rounded to the nearest integer: exact at all 16 indices (the minimax quartic, error
// at most 0.433, so any f32 evaluation order rounds right; src/quant/iq4_nl.rs NL_POLY and its test). On lavapipe a
// table indexed per lane is a scalar loop: a `var<private>` table made the tiled IQ4_NL GEMV at 4096 x 4096 take
// 10.3 ms against 5.4 ms with this polynomial (4 multiply-adds and a round per 4 rows; Q4_0: 2.5 ms).

const NL_C0 = -126.56701;
const NL_C1 = 24.17383;
const NL_C2 = -1.371927;
const NL_C3 = 0.03108644;
const NL_C4 = 0.0015860428;

// The codebook values of indices t (0..16, as f32).
fn nl4(t: vec4<f32>) -> vec4<f32> {
    let c = fma(fma(fma(t, vec4<f32>(NL_C4), vec4<f32>(NL_C3)), t, vec4<f32>(NL_C2)), t, vec4<f32>(NL_C1));
    return round(fma(c, t, vec4<f32>(NL_C0)));
}
