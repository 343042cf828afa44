//! Quantizing one matrix `W [n, k]` onto a format's grid: round-to-nearest, or GPTQ (Frantar et al., "GPTQ:
//! Accurate Post-Training Quantization for Generative Pre-trained Transformers", 2022), which quantizes the columns
//! one at a time and moves each column's rounding error onto the columns not yet quantized, weighted by the inverse
//! Hessian `H = 2 X Xᵀ / T` of the layer's inputs, so that `‖(W - Q) X‖` rather than `‖W - Q‖` is minimized.
//!
//! A [`Grid`] is one format's quantizer for a group of inputs of one output row: its parameters are fitted to the
//! group's weights when the sweep reaches the group's first column (after the earlier columns' updates), exactly as
//! the format's round-to-nearest quantizer would fit them, so that with `H = I` the result is that quantizer's.
//! The packers then write the codes in the format's own layout.

use crate::error::{Error, Result};
use crate::quant::gptq::{GptqTensors, Scheme};
use crate::quant::{f16_to_f32, f32_to_f16, q4_0, q8_0, GgmlType};

/// One group's fitted parameters: `value(code) = scale * (code - zero)`, `scale` as stored (f16, here in f32).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Params {
    pub scale: f32,
    pub zero: f32,
    /// What codes are computed with: ggml multiplies by `1 / d` of the unrounded `d`; GPTQ divides by the stored
    /// scale.
    inv: f32,
}

/// A format's quantization grid.
pub trait Grid: Sync {
    /// Inputs per group (`k` for one group over the row).
    fn group(&self, k: usize) -> usize;
    /// Parameters for a group's weights of one row.
    fn fit(&self, xs: &[f32]) -> Result<Params>;
    /// The code of `x`.
    fn code(&self, x: f32, p: &Params) -> u32;
    fn value(&self, code: u32, p: &Params) -> f32 {
        p.scale * (code as f32 - p.zero)
    }
}

/// ggml's Q4_0: the value of largest magnitude (sign kept) maps to -8, `d = max / -8`, codes `x / d + 8` rounded
/// and clamped to 15 (`q4_0::quantize`).
pub struct Q4_0Grid;

impl Grid for Q4_0Grid {
    fn group(&self, _k: usize) -> usize {
        q4_0::QK
    }
    fn fit(&self, xs: &[f32]) -> Result<Params> {
        let d = q4_0::block_scale(xs);
        Ok(Params {
            scale: f16_to_f32(f32_to_f16(d)),
            zero: 8.0,
            inv: if d != 0.0 { 1.0 / d } else { 0.0 },
        })
    }
    fn code(&self, x: f32, p: &Params) -> u32 {
        q4_0::code(x, p.inv) as u32
    }
}

/// ggml's Q8_0: `d = amax / 127`, codes `x / d` rounded (ties away from zero) (`q8_0::quantize`); codes are stored
/// offset by 128 here so that they are unsigned.
pub struct Q8_0Grid;

impl Grid for Q8_0Grid {
    fn group(&self, _k: usize) -> usize {
        q8_0::QK
    }
    fn fit(&self, xs: &[f32]) -> Result<Params> {
        let d = q8_0::block_scale(xs);
        Ok(Params {
            scale: f16_to_f32(f32_to_f16(d)),
            zero: 128.0,
            inv: if d != 0.0 { 1.0 / d } else { 0.0 },
        })
    }
    fn code(&self, x: f32, p: &Params) -> u32 {
        (q8_0::code(x, p.inv) as i32 + 128) as u32
    }
}

/// 4-bit GPTQ, v1 checkpoint format: the fit of `gptq::quantize` (symmetric: `scale = 2 max|x| / 15`, zero 8;
/// asymmetric: the range widened to 0, `scale = range / 15`, `zero = round(-min / scale)`, and a zero of 0, which
/// v1 cannot store, becomes 1 with `scale = range / 14`); the scale rounded to f16 before the codes.
pub struct GptqGrid {
    pub group_size: Option<usize>,
    pub sym: bool,
}

impl Grid for GptqGrid {
    fn group(&self, k: usize) -> usize {
        self.group_size.unwrap_or(k)
    }
    fn fit(&self, xs: &[f32]) -> Result<Params> {
        let maxq = 15f32;
        let (lo, hi) = xs.iter().fold((0f32, 0f32), |(a, b), &x| (a.min(x), b.max(x)));
        let (scale, z) = if self.sym {
            (2.0 * lo.abs().max(hi) / maxq, (maxq + 1.0) / 2.0)
        } else {
            let scale = (hi - lo) / maxq;
            let z = if scale > 0.0 { (-lo / scale).round() } else { 0.0 };
            if z == 0.0 {
                ((hi - lo) / (maxq - 1.0), 1.0)
            } else {
                (scale, z)
            }
        };
        let mut d = f16_to_f32(f32_to_f16(scale));
        if !d.is_finite() {
            return Err(Error::Invalid(format!("GPTQ scale {scale} overflows f16")));
        }
        if d == 0.0 {
            d = 1.0; // an all-zero group: every code is the zero
        }
        Ok(Params {
            scale: d,
            zero: z,
            inv: 1.0 / d,
        })
    }
    fn code(&self, x: f32, p: &Params) -> u32 {
        ((x / p.scale).round() + p.zero).clamp(0.0, 15.0) as u32
    }
}

/// A matrix on a grid: one code per weight and one [`Params`] per (row, group).
pub struct Solved {
    pub n: usize,
    pub k: usize,
    /// Inputs per group.
    pub group: usize,
    /// `[n, k]`.
    pub codes: Vec<u8>,
    /// `[n, ceil(k / group)]`.
    pub params: Vec<Params>,
}

impl Solved {
    /// The quantized weights `[n, k]`.
    pub fn values(&self, grid: &dyn Grid) -> Vec<f32> {
        let groups = self.k.div_ceil(self.group);
        let mut w = vec![0f32; self.n * self.k];
        for (i, (o, &c)) in w.iter_mut().zip(&self.codes).enumerate() {
            let (r, col) = (i / self.k, i % self.k);
            *o = grid.value(c as u32, &self.params[r * groups + col / self.group]);
        }
        w
    }
}

/// The inverse Hessian of one layer's inputs as GPTQ uses it: the upper Cholesky factor `U` of `H⁻¹` (`H⁻¹ = UᵀU`),
/// f32 `[k, k]` row-major, and the input columns that never saw a non-zero input.
pub struct InverseHessian {
    pub k: usize,
    u: Vec<f32>,
    dead: Vec<bool>,
}

/// Cholesky factor `L` (lower, row-major) of a symmetric positive definite `a [k, k]`; `None` when not positive
/// definite.
fn cholesky(a: &[f64], k: usize) -> Option<Vec<f64>> {
    let mut l = vec![0f64; k * k];
    for i in 0..k {
        for j in 0..=i {
            let dot: f64 = l[i * k..i * k + j]
                .iter()
                .zip(&l[j * k..j * k + j])
                .map(|(x, y)| x * y)
                .sum();
            let s = a[i * k + j] - dot;
            if i == j {
                if s <= 0.0 || !s.is_finite() {
                    return None;
                }
                l[i * k + i] = s.sqrt();
            } else {
                l[i * k + j] = s / l[j * k + j];
            }
        }
    }
    Some(l)
}

impl InverseHessian {
    /// From `H [k, k]` (f64, symmetric): dead inputs get `H_ii = 1` (their weights are zeroed, as GPTQ does),
    /// `damp * mean(diag H)` is added to the diagonal (retried ten times larger, up to three times, when `H` is
    /// still not positive definite).
    ///
    /// `U` comes from one Cholesky factorization: with `J` the reversal, `J H J = M Mᵀ` (`M` lower) gives
    /// `H = R Rᵀ` with `R = J M J` upper, so `H⁻¹ = R⁻ᵀ R⁻¹` and `U = R⁻¹` (upper).
    pub fn new(h: &[f64], k: usize, damp: f64) -> Result<InverseHessian> {
        if h.len() != k * k || k == 0 {
            return Err(Error::Invalid(format!(
                "a Hessian of {} values for {k} inputs",
                h.len()
            )));
        }
        let dead: Vec<bool> = (0..k).map(|i| h[i * k + i] == 0.0).collect();
        let mean = (0..k).map(|i| if dead[i] { 1.0 } else { h[i * k + i] }).sum::<f64>() / k as f64;
        let mut damp = damp.max(0.0);
        for _ in 0..4 {
            // Reversed: jhj[a, b] = h[k-1-a, k-1-b].
            let mut jhj = vec![0f64; k * k];
            for a in 0..k {
                for b in 0..k {
                    let (i, j) = (k - 1 - a, k - 1 - b);
                    jhj[a * k + b] = if i == j && dead[i] { 1.0 } else { h[i * k + j] };
                }
                jhj[a * k + a] += damp * mean;
            }
            if let Some(m) = cholesky(&jhj, k) {
                // R = J M J is upper: R[i, j] = M[k-1-i, k-1-j]. U = R⁻¹ (upper) row by row from the bottom:
                // U[i, :] = (e_i - Σ_{l>i} R[i, l] U[l, :]) / R[i, i], contiguous row updates.
                let r = |i: usize, j: usize| m[(k - 1 - i) * k + (k - 1 - j)];
                let mut u = vec![0f64; k * k];
                let mut row = vec![0f64; k];
                for i in (0..k).rev() {
                    row.iter_mut().for_each(|x| *x = 0.0);
                    row[i] = 1.0;
                    for l in i + 1..k {
                        let c = r(i, l);
                        if c != 0.0 {
                            for (x, y) in row[l..].iter_mut().zip(&u[l * k + l..(l + 1) * k]) {
                                *x -= c * y;
                            }
                        }
                    }
                    let d = r(i, i);
                    for (x, y) in u[i * k + i..(i + 1) * k].iter_mut().zip(&row[i..]) {
                        *x = y / d;
                    }
                }
                return Ok(InverseHessian {
                    k,
                    u: u.iter().map(|&x| x as f32).collect(),
                    dead,
                });
            }
            damp = if damp == 0.0 { 0.01 } else { damp * 10.0 };
        }
        Err(Error::Invalid(
            "the calibration Hessian is not positive definite even with damping".into(),
        ))
    }
}

/// Quantize `w [n, k]` onto `grid`: round-to-nearest without `hinv`, GPTQ with it. Rows are independent (each row's
/// error moves only within the row), so they are swept in parallel.
pub fn solve(w: &[f32], n: usize, k: usize, grid: &dyn Grid, hinv: Option<&InverseHessian>) -> Result<Solved> {
    if w.len() != n * k || n == 0 || k == 0 {
        return Err(Error::Invalid(format!("quantize [{n}, {k}] from {} values", w.len())));
    }
    if hinv.is_some_and(|h| h.k != k) {
        return Err(Error::Invalid(format!(
            "a Hessian for {} inputs, the layer has {k}",
            hinv.map_or(0, |h| h.k)
        )));
    }
    let group = grid.group(k).clamp(1, k);
    let groups = k.div_ceil(group);
    let mut codes = vec![0u8; n * k];
    let mut params = vec![
        Params {
            scale: 0.0,
            zero: 0.0,
            inv: 0.0
        };
        n * groups
    ];
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get()).min(n);
    let rows_per = n.div_ceil(threads);
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = codes
            .chunks_mut(rows_per * k)
            .zip(params.chunks_mut(rows_per * groups))
            .enumerate()
            .map(|(c, (codes, params))| {
                let w = &w[c * rows_per * k..];
                s.spawn(move || -> Result<()> {
                    let mut row = vec![0f32; k];
                    for (r, (codes, params)) in codes.chunks_mut(k).zip(params.chunks_mut(groups)).enumerate() {
                        row.copy_from_slice(&w[r * k..(r + 1) * k]);
                        sweep_row(&mut row, codes, params, grid, group, hinv)?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Invalid("a quantizer thread panicked".into())))
            })
            .collect()
    });
    results.into_iter().collect::<Result<()>>()?;
    Ok(Solved {
        n,
        k,
        group,
        codes,
        params,
    })
}

/// One row: fit each group at its first column, quantize column by column, and (GPTQ) move the error
/// `(w_i - q_i) / U_ii` onto the later columns along `U`'s row `i`.
fn sweep_row(
    row: &mut [f32],
    codes: &mut [u8],
    params: &mut [Params],
    grid: &dyn Grid,
    group: usize,
    hinv: Option<&InverseHessian>,
) -> Result<()> {
    let k = row.len();
    if let Some(h) = hinv {
        for (x, &dead) in row.iter_mut().zip(&h.dead) {
            if dead {
                *x = 0.0;
            }
        }
    }
    let mut p = params[0];
    for i in 0..k {
        if i % group == 0 {
            p = grid.fit(&row[i..(i + group).min(k)])?;
            params[i / group] = p;
        }
        let c = grid.code(row[i], &p);
        codes[i] = c as u8;
        if let Some(h) = hinv {
            let urow = &h.u[i * k..(i + 1) * k];
            let err = (row[i] - grid.value(c, &p)) / urow[i];
            for (x, u) in row[i + 1..].iter_mut().zip(&urow[i + 1..]) {
                *x -= err * u;
            }
        }
    }
    Ok(())
}

/// ggml blocks (Q4_0 or Q8_0) from a solve over 32-weight groups.
pub fn pack_ggml(ty: GgmlType, s: &Solved) -> Result<Vec<u8>> {
    if !s.k.is_multiple_of(32) || s.group != 32 {
        return Err(Error::Invalid(format!("{ty} packs 32-weight groups of whole rows")));
    }
    let blocks = s.n * s.k / 32;
    let (bytes, qs) = match ty {
        GgmlType::Q4_0 => (q4_0::BLOCK_BYTES, q4_0::QS_OFFSET),
        GgmlType::Q8_0 => (q8_0::BLOCK_BYTES, q8_0::QS_OFFSET),
        _ => return Err(Error::Invalid(format!("no block packer for {ty}"))),
    };
    let mut out = vec![0u8; blocks * bytes];
    for (b, (blk, codes)) in out.chunks_exact_mut(bytes).zip(s.codes.chunks_exact(32)).enumerate() {
        let p = &s.params[b];
        // `scale` is the block's d (already an f16 value; Q4_0's is signed).
        blk[0..2].copy_from_slice(&f32_to_f16(p.scale).to_le_bytes());
        match ty {
            GgmlType::Q4_0 => {
                for j in 0..16 {
                    blk[qs + j] = codes[j] | (codes[j + 16] << 4);
                }
            }
            _ => {
                for j in 0..32 {
                    blk[qs + j] = (codes[j] as i32 - 128) as i8 as u8;
                }
            }
        }
    }
    Ok(out)
}

/// The on-disk GPTQ v1 tensors (4 bits, zeros stored minus one, `g_idx = k / group_size`) of a [`GptqGrid`] solve.
pub fn pack_gptq(s: &Solved, group_size: Option<usize>) -> Result<GptqTensors> {
    let scheme = Scheme::gptq(4, group_size);
    scheme.check()?;
    let (n, k, pw) = (s.n, s.k, 8);
    if !n.is_multiple_of(pw) || !k.is_multiple_of(32) || s.group != group_size.unwrap_or(k).min(k) {
        return Err(Error::Invalid(format!(
            "GPTQ packing of [{n}, {k}] with groups of {}",
            s.group
        )));
    }
    let g = scheme.groups(k);
    let mut t = GptqTensors {
        n,
        k,
        qweight: vec![0; k / pw * n],
        qzeros: vec![0; g * n / pw],
        scales: vec![0; g * n],
        g_idx: Some((0..k).map(|i| (i / s.group) as i32).collect()),
    };
    for o in 0..n {
        for gi in 0..g {
            let p = &s.params[o * g + gi];
            t.scales[gi * n + o] = f32_to_f16(p.scale);
            let stored = (p.zero as u32).saturating_sub(1) & 15;
            t.qzeros[gi * (n / pw) + o / pw] |= stored << (4 * (o % pw));
        }
        for i in 0..k {
            t.qweight[(i / pw) * n + o] |= (s.codes[o * k + i] as u32 & 15) << (4 * (i % pw));
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::gptq;

    fn weights(n: usize, k: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n * k)
            .map(|i| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * (1.0 + (i % 5) as f32 * 0.3)
            })
            .collect()
    }

    #[test]
    fn round_to_nearest_matches_the_format_quantizers_bit_for_bit() {
        let (n, k) = (16, 256);
        let w = weights(n, k, 3);
        for (ty, grid) in [
            (GgmlType::Q4_0, &Q4_0Grid as &dyn Grid),
            (GgmlType::Q8_0, &Q8_0Grid as &dyn Grid),
        ] {
            let s = solve(&w, n, k, grid, None).unwrap();
            assert_eq!(
                pack_ggml(ty, &s).unwrap(),
                crate::quant::quantize(ty, &w).unwrap(),
                "{ty}"
            );
            assert_eq!(
                s.values(grid),
                crate::quant::dequantize(ty, &pack_ggml(ty, &s).unwrap()).unwrap()
            );
        }
        for (gs, sym) in [(Some(32), true), (Some(128), false), (None, false), (None, true)] {
            let grid = GptqGrid { group_size: gs, sym };
            let s = solve(&w, n, k, &grid, None).unwrap();
            let ours = pack_gptq(&s, gs).unwrap();
            let theirs = gptq::quantize(&Scheme::gptq(4, gs), &w, n, k, sym, None).unwrap();
            assert_eq!(ours, theirs, "group {gs:?} sym {sym}");
            assert_eq!(s.values(&grid), gptq::dequantize(&Scheme::gptq(4, gs), &ours));
        }
    }

    /// Inputs with correlated features: `x = A z`, `z` independent.
    fn inputs(t: usize, k: usize) -> Vec<f32> {
        let z = weights(t, k, 11);
        let a = weights(k, k, 12);
        (0..t)
            .flat_map(|r| {
                let z = &z[r * k..(r + 1) * k];
                (0..k)
                    .map(|c| (0..k).map(|j| a[c * k + j] * z[j] * (j < 6) as u8 as f32).sum::<f32>() + 0.05 * z[c])
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn hessian(x: &[f32], t: usize, k: usize) -> Vec<f64> {
        let mut h = vec![0f64; k * k];
        for r in 0..t {
            let xr = &x[r * k..(r + 1) * k];
            for i in 0..k {
                for j in 0..k {
                    h[i * k + j] += 2.0 * xr[i] as f64 * xr[j] as f64 / t as f64;
                }
            }
        }
        h
    }

    fn output_error(w: &[f32], q: &[f32], x: &[f32], n: usize, k: usize) -> f64 {
        let t = x.len() / k;
        let mut e = 0f64;
        for r in 0..t {
            for o in 0..n {
                let d: f64 = (0..k)
                    .map(|i| (w[o * k + i] - q[o * k + i]) as f64 * x[r * k + i] as f64)
                    .sum();
                e += d * d;
            }
        }
        e
    }

    #[test]
    fn inverse_hessian_factor_is_upper_and_inverts_h() {
        // Independent inputs: a well-conditioned H, so that U in f32 inverts it to ~1e-5.
        let k = 24;
        let x = weights(64, k, 7);
        let h = hessian(&x, 64, k);
        let ih = InverseHessian::new(&h, k, 0.0).unwrap();
        // Uᵀ U H = I.
        for i in 0..k {
            for j in 0..k {
                if j < i {
                    assert_eq!(ih.u[i * k + j], 0.0);
                }
                let mut s = 0f64;
                for l in 0..k {
                    let hinv: f64 = (0..k).map(|m| ih.u[m * k + i] as f64 * ih.u[m * k + l] as f64).sum();
                    s += hinv * h[l * k + j];
                }
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((s - want).abs() < 1e-4, "({i}, {j}): {s}");
            }
        }
    }

    #[test]
    fn gptq_lowers_the_output_error_below_round_to_nearest() {
        // The GPTQ objective is ‖(W - Q) X‖²; on correlated inputs it must beat RTN on every format, while every
        // weight stays on the format's grid (the packers' dequantization reproduces the solve's values).
        let (n, k, t) = (32, 64, 256);
        let w = weights(n, k, 5);
        let x = inputs(t, k);
        let ih = InverseHessian::new(&hessian(&x, t, k), k, 0.01).unwrap();
        let grids: [(&str, &dyn Grid); 4] = [
            ("q4_0", &Q4_0Grid),
            ("q8_0", &Q8_0Grid),
            (
                "gptq g32 sym",
                &GptqGrid {
                    group_size: Some(32),
                    sym: true,
                },
            ),
            (
                "gptq g-1 asym",
                &GptqGrid {
                    group_size: None,
                    sym: false,
                },
            ),
        ];
        for (name, grid) in grids {
            let rtn = solve(&w, n, k, grid, None).unwrap().values(grid);
            let s = solve(&w, n, k, grid, Some(&ih)).unwrap();
            let q = s.values(grid);
            let (er, eg) = (output_error(&w, &rtn, &x, n, k), output_error(&w, &q, &x, n, k));
            assert!(eg < 0.8 * er, "{name}: GPTQ {eg} vs RTN {er}");
            if name.starts_with("gptq") {
                let gs = if name.contains("g32") { Some(32) } else { None };
                let t = pack_gptq(&s, gs).unwrap();
                assert_eq!(gptq::dequantize(&Scheme::gptq(4, gs), &t), q);
            } else {
                let ty = if name == "q4_0" { GgmlType::Q4_0 } else { GgmlType::Q8_0 };
                assert_eq!(crate::quant::dequantize(ty, &pack_ggml(ty, &s).unwrap()).unwrap(), q);
            }
        }
    }
}
