// Gated activation act(gate) * up, elementwise over the includer's alias GV (f32 or a vector of f32): silu_mul and
// the GLU epilogue of the matmul kernels (lib/store_rows.wgsl) share this one expression.
// silu(g) = g / (1 + exp(-g)): gate below about -88 makes exp(-g) +inf and silu -0, as in IEEE (no NaN).
// GELU (GeGLU, Gemma): gelu_tanh(g) = 0.5 g (1 + tanh(u)), u = sqrt(2 / pi) (g + 0.044715 g^3), computed as
// g / (1 + exp(-2u)) (the same identity, no tanh overflow).

fn glu(g: GV, u: GV) -> GV {
#if GELU
    let u2 = 1.5957691216057308 * (g + 0.044715 * g * g * g);  // 2 u
    return g / (1.0 + exp(-u2)) * u;
#else
    return g / (1.0 + exp(-g)) * u;
#endif
}
