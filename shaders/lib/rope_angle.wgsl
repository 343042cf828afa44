// The angle of RoPE pair j (rope, rope_kv): a = (at * freq_scale) * inv_freq_j, with inv_freq_j =
// theta^(-2j / rot_dim) / factors[j] (FACTORS), at the token's absolute position, then reduced to [-pi, pi] exactly
// (Cody-Waite with 2*pi split into an 8-bit head and a tail) before cos/sin, whose accuracy GPUs only promise there.
// The including shader declares p (fields rot_dim, log2_theta, freq_scale, attn_factor, style) and, with FACTORS,
// factors (array<f32>, [rot_dim / 2]).

const INV_TAU: f32 = 0.15915494309189535;
const TAU_HI: f32 = 6.28125;                 // 201 / 32: k * TAU_HI is exact for k < 2^16
const TAU_LO: f32 = 0.0019353071795864769;   // 2 pi - TAU_HI

// (cos a, sin a) * attn_factor of pair j at absolute position `at`.
fn rope_cs(j: u32, at: u32) -> vec2<f32> {
    var inv_freq = exp2(-(f32(2u * j) / f32(p.rot_dim)) * p.log2_theta);
#if FACTORS
    inv_freq = inv_freq / factors[j];
#endif
    let a = (f32(at) * p.freq_scale) * inv_freq;
    let turns = round(a * INV_TAU);
    let r = (a - turns * TAU_HI) - turns * TAU_LO;
    return vec2<f32>(cos(r) * p.attn_factor, sin(r) * p.attn_factor);
}

// The dims of pair j in a head: style 0 rotate-half (j, j + rot_dim / 2), style 1 interleaved (2j, 2j + 1).
fn rope_dims(j: u32) -> vec2<u32> {
    if (p.style == 1u) {
        return vec2<u32>(2u * j, 2u * j + 1u);
    }
    return vec2<u32>(j, j + p.rot_dim / 2u);
}
