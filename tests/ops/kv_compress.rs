//! kv_compress vs the f64 CPU reference: steps of kv_write + kv_compress through one plan per step size, checked
//! after every step against a one-shot computation of every window complete so far (incremental = one-shot).
//!
//! The K cache starts as NaN, so a window computed before all its keys are written comes out NaN and fails; the
//! compressed cache starts random, so a write to a window not yet complete (or past the cache) is a mismatch.
//! Metric: rel+abs, rtol 1e-5, atol 1e-5 (keys in [-1, 1]): the kernel sums `size` f32 keys in two running sums
//! (error at most about size/2 * 2^-24 * max|k| = 4e-6 for size 128) and scales by 1/size; untouched windows must
//! match exactly, which the bound also accepts only for bit-equal random values.
//! Tree form (the window a draft tree's paths complete past the root, at the rows where they complete it): against
//! the reference, and every such row bit for bit the window the plain form computes over a cache holding the row's
//! path in order (zeros in the other rows); roots where some or no rows complete a window.

use crate::attention_decode::random_tree;
use crate::common::{exact, rel_abs, Case, Check, Rng};
use shaderlm::ops::attention_decode::{tree_table, MAX_TREE_DEPTH, TREE_W};
use shaderlm::gpu::{DType, Gpu, GpuTensor};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan, TensorId};
use shaderlm::ops::kv_compress::{self, CompressShape, Window};

const RTOL: f64 = 1e-5;
const ATOL: f64 = 1e-5;

/// Run steps of `chunks[i]` tokens from position 0 (one plan per distinct size, sharing the caches); returns the
/// worst check over the steps.
fn run(gpu: &Gpu, s: CompressShape, chunks: &[usize], seed: u64) -> shaderlm::Result<Check> {
    let mut rng = Rng::new(seed);
    let (n_kv, hd, ctx) = (s.n_kv, s.head_dim, s.max_ctx);
    let mut k_cpu = vec![f32::NAN; n_kv * ctx * hd];
    let c_init = rng.vec(n_kv * s.n_windows() * hd, 1.0);
    let kt = GpuTensor::upload_f32(gpu, "k_cache", &[n_kv, ctx, hd], &k_cpu)?;
    let ct = GpuTensor::upload_f32(gpu, "c_cache", &[n_kv, s.n_windows(), hd], &c_init)?;
    let mut plans: Vec<(usize, Plan, TensorId)> = Vec::new();
    let mut worst = Check::RelAbs { worst: 0.0, at: 0 };
    let mut pos = 0;
    for &n in chunks {
        if !plans.iter().any(|p| p.0 == n) {
            let mut g = Graph::new();
            let k = g.input("k", &[n, n_kv, hd], DType::F32);
            let (tk, tc) = (g.external(&kt), g.external(&ct));
            g.kv_write(k, tk)?;
            g.kv_compress(tk, tc, n, s.window)?;
            plans.push((n, Plan::new(gpu, g)?, k));
        }
        let (_, plan, k) = plans.iter_mut().find(|p| p.0 == n).expect("plan built above");
        let keys = rng.vec(n * n_kv * hd, 1.0);
        plan.write_input(gpu, *k, bytemuck::cast_slice(&keys))?;
        plan.run(gpu, &StepVars { pos: pos as u32 })?;
        shaderlm::ops::kv_write::reference(&keys, &mut k_cpu, n_kv, ctx, hd, pos);
        pos += n;
        // One shot over the prefix of `pos` keys (positions past the cache dropped).
        let mut want = c_init.clone();
        kv_compress::reference(&k_cpu, &mut want, s, 0, pos.min(ctx));
        let check = rel_abs(&ct.download_f32(gpu)?, &want, RTOL, ATOL);
        if let (Check::RelAbs { worst: w, .. }, Check::RelAbs { worst: best, .. }) = (&check, &worst) {
            if w.is_nan() || w > best {
                worst = check;
            }
        }
    }
    Ok(worst)
}

/// The tree form over a random tree of `rows` nodes rooted at `pos` (keys in slots `pos ..`, NaN past them):
/// against the reference (`bitwise` false), or each row bit for bit against the plain form's window over a cache
/// holding the prefix and then the row's path in order.
fn tree(gpu: &Gpu, s: CompressShape, pos: usize, rows: usize, seed: u64, bitwise: bool) -> shaderlm::Result<Check> {
    let mut rng = Rng::new(seed);
    let (n_kv, hd, ctx) = (s.n_kv, s.head_dim, s.max_ctx);
    let paths = random_tree(&mut rng, rows);
    let table = tree_table(paths.iter().map(Vec::as_slice))?;
    let mut k = rng.vec(n_kv * ctx * hd, 1.0);
    for h in 0..n_kv {
        k[(h * ctx + pos + rows) * hd..(h + 1) * ctx * hd].fill(f32::NAN);
    }
    let mut g = Graph::new();
    let tk = g.input("k_cache", &[n_kv, ctx, hd], DType::F32);
    let tt = g.input("tree", &[rows, TREE_W], DType::U32);
    let out = g.kv_compress_tree(tk, tt, s.window)?;
    g.output(out);
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, tk, bytemuck::cast_slice(&k))?;
    plan.write_input(gpu, tt, bytemuck::cast_slice(&table))?;
    plan.run(gpu, &StepVars { pos: pos as u32 })?;
    let got = plan.read_f32(out)?;
    if !bitwise {
        return Ok(rel_abs(&got, &kv_compress::reference_tree(&k, &table, s, pos), RTOL, ATOL));
    }
    // The plain form over a step covering the deepest a tree reaches, the row's path in place.
    let steps = (MAX_TREE_DEPTH + 1).min(ctx - pos);
    let ct = GpuTensor::zeros(gpu, "c_cache", &[n_kv, s.n_windows(), hd], DType::F32)?;
    let mut g = Graph::new();
    let tk = g.input("k_cache", &[n_kv, ctx, hd], DType::F32);
    let tc = g.external(&ct);
    g.kv_compress(tk, tc, steps, s.window)?;
    let mut one = Plan::new(gpu, g)?;
    let first = s.window.count(pos + 1);
    let mut want = Vec::with_capacity(got.len());
    for path in &paths {
        let mut kp = k.clone();
        for h in 0..n_kv {
            for (j, &slot) in path.iter().enumerate() {
                let (dst, src) = ((h * ctx + pos + j) * hd, (h * ctx + pos + slot as usize) * hd);
                kp.copy_within(src..src + hd, dst);
            }
        }
        if pos + path.len() != first * s.window.stride + s.window.size {
            want.extend(std::iter::repeat_n(0f32.to_bits(), n_kv * hd));
            continue;
        }
        one.write_input(gpu, tk, bytemuck::cast_slice(&kp))?;
        one.run(gpu, &StepVars { pos: pos as u32 })?;
        let c = ct.download_f32(gpu)?;
        for h in 0..n_kv {
            let at = (h * s.n_windows() + first) * hd;
            want.extend(c[at..at + hd].iter().map(|v| v.to_bits()));
        }
    }
    Ok(exact(&got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), &want))
}

/// (name, n_kv, head_dim, max_ctx, window (size, stride), step sizes from position 0)
type Grid = (&'static str, usize, usize, usize, (usize, usize), Vec<usize>);

pub fn cases() -> Vec<Case> {
    let fine = (32, 16);
    let coarse = (128, 64);
    let decode_70: Vec<usize> = vec![1; 70];
    let mut grid: Vec<Grid> = vec![
        // One token per step: windows complete at positions 31, 47, 63 (C1) and 127 (C2).
        ("decode_steps", 2, 64, 256, fine, decode_70.clone()),
        ("decode_steps_coarse", 2, 64, 256, coarse, vec![1; 140]),
        // A chunk ending off the stride, single tokens at positions not multiple of 16, then a chunk of 100 that
        // completes several windows at once.
        (
            "chunk_then_tokens_then_chunk",
            3,
            64,
            400,
            fine,
            vec![37, 1, 1, 1, 5, 100],
        ),
        (
            "chunk_then_tokens_then_chunk_coarse",
            3,
            64,
            400,
            coarse,
            vec![37, 1, 1, 1, 5, 100, 200],
        ),
        // Prefill in chunks of 128 to 4096 keys, then decode: long context, incremental = one shot.
        (
            "prefill_4096_then_decode",
            2,
            128,
            4200,
            fine,
            [vec![128; 32], vec![1; 20]].concat(),
        ),
        (
            "prefill_4096_then_decode_coarse",
            2,
            128,
            4200,
            coarse,
            [vec![128; 32], vec![1; 20]].concat(),
        ),
        // The whole prompt in one step.
        ("one_shot_4097", 2, 64, 4097, fine, vec![4097]),
        // max_ctx not a multiple of the stride: the last positions belong to no window; filling to the end.
        ("cache_end_not_on_stride", 2, 64, 1000, fine, vec![600, 390, 1, 9]),
        // A step that runs past max_ctx: the windows past the cache are dropped.
        ("step_past_cache_end", 1, 32, 100, fine, vec![90, 20]),
        // Other windows: odd size and stride, stride larger than the step, size = stride.
        ("odd_window_5_3", 2, 32, 120, (5, 3), vec![1, 2, 7, 1, 50, 1, 1]),
        ("window_48_stride_16", 1, 64, 300, (48, 16), vec![47, 1, 1, 17, 100]),
        ("non_overlapping_16_16", 2, 32, 100, (16, 16), vec![15, 1, 1, 40, 3]),
    ];
    for (n_kv, hd) in [(1usize, 32usize), (8, 80), (4, 96), (2, 128)] {
        grid.push(("head_dims", n_kv, hd, 300, fine, vec![19, 1, 60, 13]));
    }
    // Tree form: (n_kv, head_dim, max_ctx, window, root position, rows). Windows end at 47 (fine, root 44: rows 3
    // deep complete it), 191 (coarse, root 186), 63 (16/8, root 60), never within 14 of root 48 (fine).
    let trees = [
        (2, 64, 256, fine, 44, 23),
        (3, 128, 512, coarse, 186, 40),
        (1, 32, 128, (16, 8), 60, 9),
        (2, 64, 256, fine, 48, 30),
    ];
    let mut v: Vec<Case> = Vec::new();
    for (i, (n_kv, hd, ctx, (size, stride), pos, rows)) in trees.into_iter().enumerate() {
        let s = CompressShape {
            n_kv,
            max_ctx: ctx,
            head_dim: hd,
            window: Window { size, stride },
        };
        for bitwise in [false, true] {
            let what = if bitwise { "rows_equal_plain_form_on_their_paths" } else { "vs_reference" };
            let label = format!("tree_{what}_kv{n_kv}_d{hd}_w{size}s{stride}_pos{pos}_rows{rows}");
            v.push(Case::new("kv_compress", label, move |gpu| tree(gpu, s, pos, rows, 5100 + i as u64, bitwise)));
        }
    }
    v.extend(grid.into_iter()
        .enumerate()
        .map(|(i, (name, n_kv, hd, ctx, (size, stride), chunks))| {
            let s = CompressShape {
                n_kv,
                max_ctx: ctx,
                head_dim: hd,
                window: Window { size, stride },
            };
            let label = format!("{name}_kv{n_kv}_d{hd}_ctx{ctx}_w{size}s{stride}");
            Case::new("kv_compress", label, move |gpu| run(gpu, s, &chunks, 5000 + i as u64))
        }));
    v
}
