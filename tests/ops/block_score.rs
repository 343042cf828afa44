//! block_score vs the f64 CPU reference: GQA groups 1..16, head dims 32..128, decode and prefill chunks at
//! positions on and off the stride, queries that see no window or no C2 window yet (the C1 fallback), caches not
//! a multiple of the block, long contexts with several C2 splits, other window/block configurations, and one plan
//! reused across steps together with kv_write and kv_compress (incremental caches, stale split partials).
//!
//! The compressed caches hold NaN past the windows complete at the step's last position, so reading a window
//! that no query may see fails the case. Keys are piecewise constant over 24-position segments plus noise, so
//! compressed keys differ from window to window and the scores span several orders of magnitude.
//! Metric: rel+abs with rtol 2e-4, atol 1e-9. Each score is a sum of exp(x - lse) terms; an absolute error e of
//! the exponent (f32 dot products of head_dim terms and the split log-sum-exp, about 1e-6 * (|x| + 1) here) is a
//! relative error e of the term, kept by the sum over the group and by the max; atol covers scores below 1e-9,
//! which no top-k can tell from 0. Blocks with no visible window must be exactly 0.
//! Tree form (a draft tree's step, token t at position pos + its depth, with its path's copies of the C1 and C2
//! windows it completes past the root; the caches NaN past the root's windows): against the reference at those
//! positions, and every row bit for bit the one-token step at its position over caches holding its path's copies;
//! and chained after kv_compress_tree as a tree step runs them, every row bit for bit plain decoding's kv_compress
//! and block_score along its path.

use crate::attention_decode::random_tree;
use crate::common::{exact, gpu_fallback, rel_abs, Case, Check, Rng};
use shaderlm::ops::attention_decode::{tree_table, MAX_TREE_DEPTH, TREE_W};
use shaderlm::gpu::{DType, Gpu, GpuTensor};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan, TensorId};
use shaderlm::ops::block_score::{self, ScoreConfig, ScoreShape};
use shaderlm::ops::kv_compress::{self, CompressShape, Window};
use shaderlm::ops::kv_write;

const RTOL: f64 = 2e-4;
const ATOL: f64 = 1e-9;
const AMP: f32 = 1.0;

const MINICPM: ScoreConfig = ScoreConfig {
    fine: Window { size: 32, stride: 16 },
    coarse: Window { size: 128, stride: 64 },
    block_size: 64,
    max_ctx: 0,
};

fn cfg(max_ctx: usize) -> ScoreConfig {
    ScoreConfig { max_ctx, ..MINICPM }
}

fn scale(hd: usize) -> f32 {
    1.0 / (hd as f32).sqrt()
}

/// Keys for positions `0 .. len` of `[n_kv, max_ctx, hd]` (NaN past `len`): a random level per 24-position
/// segment and head dimension, plus noise, times `amp`.
fn keys(rng: &mut Rng, n_kv: usize, max_ctx: usize, hd: usize, len: usize, amp: f32) -> Vec<f32> {
    let mut k = vec![f32::NAN; n_kv * max_ctx * hd];
    for h in 0..n_kv {
        let levels = rng.vec(max_ctx.div_ceil(24) * hd, 2.0);
        for p in 0..len {
            for d in 0..hd {
                k[(h * max_ctx + p) * hd + d] = amp * (levels[(p / 24) * hd + d] + 0.5 * rng.f32());
            }
        }
    }
    k
}

/// Compressed caches of `window` over the keys `0 .. len`, NaN for windows not complete by then.
fn compress(k: &[f32], n_kv: usize, max_ctx: usize, hd: usize, window: Window, len: usize) -> Vec<f32> {
    let s = CompressShape {
        n_kv,
        max_ctx,
        head_dim: hd,
        window,
    };
    let mut c = vec![f32::NAN; n_kv * s.n_windows() * hd];
    kv_compress::reference(k, &mut c, s, 0, len);
    c
}

fn run(gpu: &Gpu, s: ScoreShape, pos: usize, amp: f32, seed: u64) -> shaderlm::Result<Check> {
    let mut rng = Rng::new(seed);
    let (hd, ctx, len) = (s.head_dim, s.cfg.max_ctx, pos + s.n_tokens);
    let k = keys(&mut rng, s.n_kv, ctx, hd, len, amp);
    let c1 = compress(&k, s.n_kv, ctx, hd, s.cfg.fine, len);
    let c2 = compress(&k, s.n_kv, ctx, hd, s.cfg.coarse, len);
    let q = rng.vec(s.n_tokens * s.n_heads * hd, amp);
    let c1t = GpuTensor::upload_f32(gpu, "c1", &[s.n_kv, s.n1(), hd], &c1)?;
    let c2t = GpuTensor::upload_f32(gpu, "c2", &[s.n_kv, s.n2(), hd], &c2)?;
    let mut g = Graph::new();
    let tq = g.input("q", &[s.n_tokens, s.n_heads, hd], DType::F32);
    let (t1, t2) = (g.external(&c1t), g.external(&c2t));
    let out = g.block_score(tq, t1, t2, s.cfg, scale(hd))?;
    g.output(out);
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, tq, bytemuck::cast_slice(&q))?;
    plan.run(gpu, &StepVars { pos: pos as u32 })?;
    let want = block_score::reference(&q, &c1, &c2, s, pos, scale(hd));
    Ok(rel_abs(&plan.read_f32(out)?, &want, RTOL, ATOL))
}

/// The tree form over a random tree of `s.n_tokens` nodes at `pos`, the caches holding the windows the root sees
/// (NaN past them) and each row random copies of the next C1 and C2 windows (a row takes its path's, the copies of
/// its ancestor where the window completes): against the reference at each row's position (`bitwise` false), or
/// each row bit for bit against the one-token step at its position over caches holding its path's copies
/// (`bitwise`).
fn tree(gpu: &Gpu, s: ScoreShape, pos: usize, seed: u64, bitwise: bool) -> shaderlm::Result<Check> {
    let mut rng = Rng::new(seed);
    let (hd, ctx, n) = (s.head_dim, s.cfg.max_ctx, s.n_tokens);
    let paths = random_tree(&mut rng, n);
    let table = tree_table(paths.iter().map(Vec::as_slice))?;
    let positions: Vec<usize> = paths.iter().map(|p| pos + p.len() - 1).collect();
    let k = keys(&mut rng, s.n_kv, ctx, hd, pos + 1, AMP);
    let c1 = compress(&k, s.n_kv, ctx, hd, s.cfg.fine, pos + 1);
    let c2 = compress(&k, s.n_kv, ctx, hd, s.cfg.coarse, pos + 1);
    let (x1, x2) = (rng.vec(n * s.n_kv * hd, 2.0 * AMP), rng.vec(n * s.n_kv * hd, 2.0 * AMP));
    let q = rng.vec(n * s.n_heads * hd, AMP);
    let c1t = GpuTensor::upload_f32(gpu, "c1", &[s.n_kv, s.n1(), hd], &c1)?;
    let c2t = GpuTensor::upload_f32(gpu, "c2", &[s.n_kv, s.n2(), hd], &c2)?;
    let mut g = Graph::new();
    let tq = g.input("q", &[n, s.n_heads, hd], DType::F32);
    let tt = g.input("tree", &[n, TREE_W], DType::U32);
    let tx1 = g.input("x1", &[n, s.n_kv, hd], DType::F32);
    let tx2 = g.input("x2", &[n, s.n_kv, hd], DType::F32);
    let (t1, t2) = (g.external(&c1t), g.external(&c2t));
    let out = g.block_score_tree(tq, (t1, t2), (tx1, tx2), s.cfg, scale(hd), tt)?;
    g.output(out);
    let mut plan = Plan::new(gpu, g)?;
    for (t, v) in [(tq, &q), (tx1, &x1), (tx2, &x2)] {
        plan.write_input(gpu, t, bytemuck::cast_slice(v))?;
    }
    plan.write_input(gpu, tt, bytemuck::cast_slice(&table))?;
    plan.run(gpu, &StepVars { pos: pos as u32 })?;
    let got = plan.read_f32(out)?;
    if !bitwise {
        let want = block_score::reference_tree(&q, (&c1, &c2), (&x1, &x2), s, (&table, pos), scale(hd));
        return Ok(rel_abs(&got, &want, RTOL, ATOL));
    }
    let one_shape = ScoreShape { n_tokens: 1, ..s };
    let mut g = Graph::new();
    let tq = g.input("q", &[1, s.n_heads, hd], DType::F32);
    let t1 = g.input("c1", &[s.n_kv, s.n1(), hd], DType::F32);
    let t2 = g.input("c2", &[s.n_kv, s.n2(), hd], DType::F32);
    let o1 = g.block_score(tq, t1, t2, one_shape.cfg, scale(hd))?;
    g.output(o1);
    let mut one = Plan::new(gpu, g)?;
    let (row, row_x) = (s.n_heads * hd, s.n_kv * hd);
    // Row r's caches: its path's copy of the window it completes past the root (held by the path's row at the
    // depth where it completes) in place of the cache's.
    let own = |c: &[f32], x: &[f32], w: Window, nw: usize, r: usize, at: usize| -> Vec<f32> {
        let (mut c, e) = (c.to_vec(), w.count(pos + 1));
        if w.count(at + 1) > e {
            let a = paths[r][e * w.stride + w.size - 1 - pos] as usize;
            for h in 0..s.n_kv {
                c[(h * nw + e) * hd..][..hd].copy_from_slice(&x[a * row_x + h * hd..][..hd]);
            }
        }
        c
    };
    let mut want = Vec::with_capacity(got.len());
    for (r, &at) in positions.iter().enumerate() {
        one.write_input(gpu, tq, bytemuck::cast_slice(&q[r * row..(r + 1) * row]))?;
        one.write_input(gpu, t1, bytemuck::cast_slice(&own(&c1, &x1, s.cfg.fine, s.n1(), r, at)))?;
        one.write_input(gpu, t2, bytemuck::cast_slice(&own(&c2, &x2, s.cfg.coarse, s.n2(), r, at)))?;
        one.run(gpu, &StepVars { pos: at as u32 })?;
        want.extend(one.read_f32(o1)?.iter().map(|v| v.to_bits()));
    }
    Ok(exact(&got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), &want))
}

/// The tree step's chain over a random tree of `s.n_tokens` nodes at `pos` (keys in slots `pos ..`, the caches
/// holding the windows the root completes): kv_compress_tree for C1 and C2, then block_score_tree; each row bit for
/// bit what plain decoding along its path computes: kv_compress over a cache holding the prefix and then its path
/// in order, and the one-token block_score at its position.
fn tree_chain(gpu: &Gpu, s: ScoreShape, pos: usize, seed: u64) -> shaderlm::Result<Check> {
    let mut rng = Rng::new(seed);
    let (hd, ctx, n, kv) = (s.head_dim, s.cfg.max_ctx, s.n_tokens, s.n_kv);
    let paths = random_tree(&mut rng, n);
    let table = tree_table(paths.iter().map(Vec::as_slice))?;
    let k = keys(&mut rng, kv, ctx, hd, pos + n, AMP);
    let c1 = compress(&k, kv, ctx, hd, s.cfg.fine, pos + 1);
    let c2 = compress(&k, kv, ctx, hd, s.cfg.coarse, pos + 1);
    let q = rng.vec(n * s.n_heads * hd, AMP);
    let kt = GpuTensor::upload_f32(gpu, "k_cache", &[kv, ctx, hd], &k)?;
    let c1t = GpuTensor::upload_f32(gpu, "c1", &[kv, s.n1(), hd], &c1)?;
    let c2t = GpuTensor::upload_f32(gpu, "c2", &[kv, s.n2(), hd], &c2)?;
    let mut g = Graph::new();
    let tq = g.input("q", &[n, s.n_heads, hd], DType::F32);
    let tt = g.input("tree", &[n, TREE_W], DType::U32);
    let (tk, t1, t2) = (g.external(&kt), g.external(&c1t), g.external(&c2t));
    let own = (g.kv_compress_tree(tk, tt, s.cfg.fine)?, g.kv_compress_tree(tk, tt, s.cfg.coarse)?);
    let out = g.block_score_tree(tq, (t1, t2), own, s.cfg, scale(hd), tt)?;
    g.output(out);
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, tq, bytemuck::cast_slice(&q))?;
    plan.write_input(gpu, tt, bytemuck::cast_slice(&table))?;
    plan.run(gpu, &StepVars { pos: pos as u32 })?;
    let got = plan.read_f32(out)?;
    // Plain decoding along a path: the windows ending in (pos, pos + 15] from the path's keys in order (those past
    // the row's position come out NaN and unseen), then the one-token scores at the row's position.
    let mut g = Graph::new();
    let tk = g.input("k_cache", &[kv, ctx, hd], DType::F32);
    let (t1, t2) = (g.external(&c1t), g.external(&c2t));
    let steps = (MAX_TREE_DEPTH + 1).min(ctx - pos);
    g.kv_compress(tk, t1, steps, s.cfg.fine)?;
    g.kv_compress(tk, t2, steps, s.cfg.coarse)?;
    let mut compress_path = Plan::new(gpu, g)?;
    let mut g = Graph::new();
    let tq = g.input("q", &[1, s.n_heads, hd], DType::F32);
    let (t1, t2) = (g.external(&c1t), g.external(&c2t));
    let o1 = g.block_score(tq, t1, t2, s.cfg, scale(hd))?;
    g.output(o1);
    let mut one = Plan::new(gpu, g)?;
    let row = s.n_heads * hd;
    let mut want = Vec::with_capacity(got.len());
    for (r, path) in paths.iter().enumerate() {
        let mut kp = k.clone();
        for h in 0..kv {
            kp[(h * ctx + pos) * hd..(h + 1) * ctx * hd].fill(f32::NAN);
            for (j, &slot) in path.iter().enumerate() {
                let src = (h * ctx + pos + slot as usize) * hd;
                kp[(h * ctx + pos + j) * hd..][..hd].copy_from_slice(&k[src..src + hd]);
            }
        }
        compress_path.write_input(gpu, tk, bytemuck::cast_slice(&kp))?;
        compress_path.run(gpu, &StepVars { pos: pos as u32 })?;
        one.write_input(gpu, tq, bytemuck::cast_slice(&q[r * row..(r + 1) * row]))?;
        one.run(gpu, &StepVars { pos: (pos + path.len() - 1) as u32 })?;
        want.extend(one.read_f32(o1)?.iter().map(|v| v.to_bits()));
    }
    Ok(exact(&got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), &want))
}

/// A plan per step size with kv_write, kv_compress (C1 and C2) and block_score, sharing the caches; steps of
/// `chunks[i]` tokens from `start` (keys before it already in the caches), or at explicit positions when
/// `positions` is given. Scores are checked at every step against the reference on CPU-kept caches.
fn steps(
    gpu: &Gpu,
    n_heads: usize,
    n_kv: usize,
    hd: usize,
    c: ScoreConfig,
    plan_steps: &[(usize, usize)],
    seed: u64,
) -> shaderlm::Result<Check> {
    let mut rng = Rng::new(seed);
    let ctx = c.max_ctx;
    let cs = |window| CompressShape {
        n_kv,
        max_ctx: ctx,
        head_dim: hd,
        window,
    };
    // The whole cache holds keys (as earlier steps would have left); the steps overwrite what they cover.
    let mut k_cpu = keys(&mut rng, n_kv, ctx, hd, ctx, AMP);
    let mut c1 = compress(&k_cpu, n_kv, ctx, hd, c.fine, ctx);
    let mut c2 = compress(&k_cpu, n_kv, ctx, hd, c.coarse, ctx);
    let kt = GpuTensor::upload_f32(gpu, "k_cache", &[n_kv, ctx, hd], &k_cpu)?;
    let c1t = GpuTensor::upload_f32(gpu, "c1", &[n_kv, cs(c.fine).n_windows(), hd], &c1)?;
    let c2t = GpuTensor::upload_f32(gpu, "c2", &[n_kv, cs(c.coarse).n_windows(), hd], &c2)?;
    let mut plans: Vec<(usize, Plan, TensorId, TensorId, TensorId)> = Vec::new();
    let mut worst = Check::RelAbs { worst: 0.0, at: 0 };
    for &(pos, n) in plan_steps {
        if !plans.iter().any(|p| p.0 == n) {
            let mut g = Graph::new();
            let tq = g.input("q", &[n, n_heads, hd], DType::F32);
            let tk = g.input("k", &[n, n_kv, hd], DType::F32);
            let (kc, t1, t2) = (g.external(&kt), g.external(&c1t), g.external(&c2t));
            g.kv_write(tk, kc)?;
            g.kv_compress(kc, t1, n, c.fine)?;
            g.kv_compress(kc, t2, n, c.coarse)?;
            let out = g.block_score(tq, t1, t2, c, scale(hd))?;
            g.output(out);
            plans.push((n, Plan::new(gpu, g)?, tq, tk, out));
        }
        let (_, plan, tq, tk, out) = plans.iter_mut().find(|p| p.0 == n).expect("plan built above");
        let q = rng.vec(n * n_heads * hd, AMP);
        let k = rng.vec(n * n_kv * hd, 2.0 * AMP);
        plan.write_input(gpu, *tq, bytemuck::cast_slice(&q))?;
        plan.write_input(gpu, *tk, bytemuck::cast_slice(&k))?;
        plan.run(gpu, &StepVars { pos: pos as u32 })?;
        kv_write::reference(&k, &mut k_cpu, n_kv, ctx, hd, pos);
        kv_compress::reference(&k_cpu, &mut c1, cs(c.fine), pos, n);
        kv_compress::reference(&k_cpu, &mut c2, cs(c.coarse), pos, n);
        let s = ScoreShape {
            n_tokens: n,
            n_heads,
            n_kv,
            head_dim: hd,
            cfg: c,
        };
        let want = block_score::reference(&q, &c1, &c2, s, pos, scale(hd));
        let check = rel_abs(&plan.read_f32(*out)?, &want, RTOL, ATOL);
        if let (Check::RelAbs { worst: w, .. }, Check::RelAbs { worst: best, .. }) = (&check, &worst) {
            if w.is_nan() || w > best {
                worst = check;
            }
        }
    }
    Ok(worst)
}

/// (name, n_tokens, n_heads, n_kv, head_dim, pos, config, amp)
type Extra = (&'static str, usize, usize, usize, usize, usize, ScoreConfig, f32);

pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    // Tree form: (nodes, heads, kv heads, root position, max_ctx): before any C2 window (the C1 fallback; rows 3
    // deep complete C1 window 5), rows 2 deep completing the first C2 window (and C1 window 6) while shallower ones
    // fall back, and C1 and C2 windows completing 3 deep in a long context; 61 nodes (tokens in several workgroups).
    for (n, h, kv, pos, ctx) in [(9, 9, 3, 108, 512), (23, 4, 2, 125, 512), (61, 9, 3, 1020, 1100), (16, 32, 2, 700, 800)] {
        let hd = if h >= 16 { 128 } else { 64 };
        let s = ScoreShape {
            n_tokens: n,
            n_heads: h,
            n_kv: kv,
            head_dim: hd,
            cfg: cfg(ctx),
        };
        for bitwise in [false, true] {
            let what = if bitwise { "rows_equal_one_token_steps" } else { "vs_reference" };
            let name = format!("tree_{what}_n{n}_h{h}_kv{kv}_pos{pos}");
            v.push(Case::new("block_score", name, move |gpu| tree(gpu, s, pos, 7900 + n as u64, bitwise)));
        }
        let name = format!("tree_with_kv_compress_tree_rows_equal_plain_decoding_n{n}_h{h}_kv{kv}_pos{pos}");
        v.push(Case::new("block_score", name, move |gpu| tree_chain(gpu, s, pos, 7950 + n as u64)));
    }
    let mut seed = 7000u64;
    let mut push = |v: &mut Vec<Case>, name: String, s: ScoreShape, pos: usize, amp: f32| {
        seed += 1;
        let sd = seed;
        v.push(Case::new("block_score", name, move |gpu| run(gpu, s, pos, amp, sd)));
    };
    // Decode over GQA groups 1..16 and the visibility regimes: (query position + 1, max_ctx): no window (1, 31);
    // the first C1 window (32); C1 windows but no C2 window: the C1 normalizer (100); the first C2 window (128,
    // 129); a full cache not a multiple of the block (1000); a long context, cache not a multiple of 64 (4097).
    let heads = [(1usize, 1usize), (4, 2), (9, 3), (8, 1), (16, 2), (32, 2), (16, 1)];
    let lens = [
        (1usize, 512usize),
        (31, 512),
        (32, 512),
        (100, 512),
        (128, 512),
        (129, 300),
        (1000, 1000),
        (4097, 4200),
    ];
    for (n_heads, n_kv) in heads {
        for (len, ctx) in lens {
            let hd = if n_heads >= 16 { 128 } else { 64 };
            let s = ScoreShape {
                n_tokens: 1,
                n_heads,
                n_kv,
                head_dim: hd,
                cfg: cfg(ctx),
            };
            push(
                &mut v,
                format!("decode_h{n_heads}_kv{n_kv}_d{hd}_len{len}_ctx{ctx}"),
                s,
                len - 1,
                AMP,
            );
        }
    }
    let other_windows = ScoreConfig {
        fine: Window { size: 48, stride: 16 },
        coarse: Window { size: 96, stride: 32 },
        block_size: 64,
        max_ctx: 2000,
    };
    let small_blocks = ScoreConfig {
        fine: Window { size: 16, stride: 8 },
        coarse: Window { size: 64, stride: 32 },
        block_size: 32,
        max_ctx: 1500,
    };
    let big_blocks = ScoreConfig {
        block_size: 128,
        ..cfg(3000)
    };
    // Blocks of 64 with windows of stride 4: 17 windows per block, so 3 blocks per tile.
    let dense_windows = ScoreConfig {
        fine: Window { size: 8, stride: 4 },
        coarse: Window { size: 32, stride: 16 },
        block_size: 64,
        max_ctx: 700,
    };
    // A block size not a multiple of the stride: a block's last window is the one starting before its end.
    let odd_stride = ScoreConfig {
        fine: Window { size: 20, stride: 12 },
        coarse: Window { size: 80, stride: 48 },
        block_size: 64,
        max_ctx: 1200,
    };
    let extra: [Extra; 24] = [
        // Prefill: a first chunk (queries in block 0 see no window), chunks at positions off the stride, longer
        // than 128 tokens (several token groups), and every group size.
        ("prefill_first_chunk_h16_kv2", 128, 16, 2, 64, 0, cfg(2048), AMP),
        ("prefill_at_1000_h32_kv2", 128, 32, 2, 128, 1000, cfg(2048), AMP),
        ("prefill_300_at_37_h4_kv2", 300, 4, 2, 64, 37, cfg(1024), AMP),
        ("prefill_37_at_4000_h8_kv1", 37, 8, 1, 64, 4000, cfg(4200), AMP),
        ("prefill_20_group16", 20, 16, 1, 64, 500, cfg(1024), AMP),
        ("prefill_64_group1", 64, 3, 3, 64, 777, cfg(1024), AMP),
        ("prefill_to_cache_end_ctx1000", 100, 9, 3, 64, 900, cfg(1000), AMP),
        ("prefill_across_first_c2", 200, 6, 2, 64, 0, cfg(512), AMP),
        // Long contexts: several C2 splits, and few active splits in a large cache.
        ("decode_8192_h32_kv2", 1, 32, 2, 128, 8191, cfg(8192), AMP),
        ("decode_20000_of_32768", 1, 16, 2, 64, 19999, cfg(32768), AMP),
        ("decode_300_of_32768", 1, 16, 2, 64, 299, cfg(32768), AMP),
        ("prefill_128_at_16000", 128, 16, 2, 64, 16000, cfg(16384), AMP),
        // Head dims, large scores.
        ("head_dim_32", 5, 8, 2, 32, 600, cfg(1024), AMP),
        ("head_dim_80", 3, 6, 2, 80, 333, cfg(512), AMP),
        ("head_dim_80_prefill", 40, 6, 2, 80, 1000, cfg(1200), AMP),
        ("head_dim_96", 2, 12, 4, 96, 2500, cfg(4096), AMP),
        ("large_scores", 4, 8, 2, 64, 1500, cfg(2048), 4.0),
        // Other windows and blocks.
        ("windows_48_16_and_96_32", 50, 8, 2, 64, 1300, other_windows, AMP),
        ("blocks_32_windows_16_8", 40, 4, 1, 64, 1000, small_blocks, AMP),
        ("blocks_128", 30, 8, 2, 64, 2500, big_blocks, AMP),
        (
            "windows_8_4_three_blocks_per_tile",
            33,
            4,
            2,
            64,
            600,
            dense_windows,
            AMP,
        ),
        ("decode_windows_8_4", 1, 4, 1, 32, 650, dense_windows, AMP),
        ("block_not_multiple_of_stride", 45, 4, 2, 64, 1100, odd_stride, AMP),
        (
            "decode_block_not_multiple_of_stride",
            1,
            8,
            2,
            64,
            1000,
            odd_stride,
            AMP,
        ),
    ];
    for (name, n_tokens, n_heads, n_kv, head_dim, pos, c, amp) in extra {
        let s = ScoreShape {
            n_tokens,
            n_heads,
            n_kv,
            head_dim,
            cfg: c,
        };
        push(&mut v, name.to_string(), s, pos, amp);
    }
    // Without subgroups (the plain query loads), on a device with them turned off: q in a uniform buffer (decode)
    // and in storage (prefill), head_dim 80 (its 8-vec4 loop has a tail with subgroups), the C1 fallback.
    let fallback: [Extra; 5] = [
        ("no_subgroups_decode_h32_kv2", 1, 32, 2, 128, 4096, cfg(4200), AMP),
        ("no_subgroups_prefill_h16_kv2", 128, 16, 2, 64, 900, cfg(2048), AMP),
        ("no_subgroups_prefill_first_chunk", 150, 8, 2, 64, 0, cfg(1024), AMP),
        ("no_subgroups_head_dim_80", 20, 6, 2, 80, 700, cfg(1024), AMP),
        (
            "no_subgroups_head_dim_32_windows_8_4",
            9,
            4,
            1,
            32,
            400,
            dense_windows,
            AMP,
        ),
    ];
    for (i, (name, n_tokens, n_heads, n_kv, head_dim, pos, c, amp)) in fallback.into_iter().enumerate() {
        let s = ScoreShape {
            n_tokens,
            n_heads,
            n_kv,
            head_dim,
            cfg: c,
        };
        v.push(Case::new("block_score", name, move |_| {
            run(gpu_fallback(), s, pos, amp, 7800 + i as u64)
        }));
    }
    // One plan per step size with kv_write and kv_compress: prefill chunks of 128 from 0 to 1024, decode steps
    // (windows completing at some), a chunk off the stride; then the context shrinks (a new conversation), so
    // split partials of the earlier long steps are stale and must be ignored.
    let mut plan_steps: Vec<(usize, usize)> = (0..8).map(|i| (i * 128, 128)).collect();
    plan_steps.extend((1024..1040).map(|p| (p, 1)));
    plan_steps.extend([
        (1040, 128),
        (1168, 1),
        (5000, 128),
        (5128, 1),
        (40, 128),
        (168, 1),
        (3, 1),
    ]);
    v.push(Case::new(
        "block_score",
        "steps_with_kv_write_and_kv_compress_h16_kv2",
        move |gpu| steps(gpu, 16, 2, 64, cfg(8192), &plan_steps, 7900),
    ));
    v
}
