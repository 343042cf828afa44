// The register-blocked dense k-step shared by matmul_gemm, moe_up_dense and moe_down_dense (LAVAPIPE.md §4):
// provides kstep, one vector of k of 4 rows of W (f32, or 8 halves with WH) times TM tokens of x, added to a
// 4-row accumulator per token. Only with VEC (rows are whole vectors; the unaligned path stays in matmul_gemm).
// The including shader defines TM and declares x (array<vec4<f32>>, [M, K/4]) and w (array<vec4<f32>>, or
// array<vec4<u32>> of 8 halves with WH), and includes lib/matmul_w.wgsl first (half_lo, half_hi).

#if VEC
// Adds k-step c of the 4 rows whose first elements are at b (one vec4 of f32, or of 8 halves with WH) times the
// TM tokens' x (rows at xr) to acc (acc[t][j]: token t times row j). The columns of the 4 x 4 (x 8) block of W are
// a register transpose, free on SIMD-per-lane hardware.
fn kstep(acc: ptr<function, array<vec4<f32>, TM>>, xr: ptr<function, array<u32, TM>>, b: vec4<u32>, c: u32) {
#if WH
    let q0 = w[b.x + c];
    let q1 = w[b.y + c];
    let q2 = w[b.z + c];
    let q3 = w[b.w + c];
    let l0 = half_lo(q0);
    let l1 = half_lo(q1);
    let l2 = half_lo(q2);
    let l3 = half_lo(q3);
    let h0 = half_hi(q0);
    let h1 = half_hi(q1);
    let h2 = half_hi(q2);
    let h3 = half_hi(q3);
    let k0 = vec4<f32>(l0.x, l1.x, l2.x, l3.x);
    let k1 = vec4<f32>(l0.y, l1.y, l2.y, l3.y);
    let k2 = vec4<f32>(l0.z, l1.z, l2.z, l3.z);
    let k3 = vec4<f32>(l0.w, l1.w, l2.w, l3.w);
    let k4 = vec4<f32>(h0.x, h1.x, h2.x, h3.x);
    let k5 = vec4<f32>(h0.y, h1.y, h2.y, h3.y);
    let k6 = vec4<f32>(h0.z, h1.z, h2.z, h3.z);
    let k7 = vec4<f32>(h0.w, h1.w, h2.w, h3.w);
    for (var t = 0u; t < TM; t++) {
        let xa = x[(*xr)[t] + 2u * c];
        let xc = x[(*xr)[t] + 2u * c + 1u];
        (*acc)[t] += k0 * xa.x + k1 * xa.y + k2 * xa.z + k3 * xa.w + k4 * xc.x + k5 * xc.y + k6 * xc.z + k7 * xc.w;
    }
#else
    let w0 = w[b.x + c];
    let w1 = w[b.y + c];
    let w2 = w[b.z + c];
    let w3 = w[b.w + c];
    let k0 = vec4<f32>(w0.x, w1.x, w2.x, w3.x);
    let k1 = vec4<f32>(w0.y, w1.y, w2.y, w3.y);
    let k2 = vec4<f32>(w0.z, w1.z, w2.z, w3.z);
    let k3 = vec4<f32>(w0.w, w1.w, w2.w, w3.w);
    for (var t = 0u; t < TM; t++) {
        let xa = x[(*xr)[t] + c];
        (*acc)[t] += k0 * xa.x + k1 * xa.y + k2 * xa.z + k3 * xa.w;
    }
#endif
}
#endif
