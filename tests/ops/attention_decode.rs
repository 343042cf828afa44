//! attention_decode vs the f64 CPU reference: GQA ratios, head dims, KV lengths up to 4097, several query tokens,
//! empty splits, splits that some rows see none of, and one plan reused across decode steps.
//!
//! Metric: NMSE with the bound of attention_prefill (`NMSE_MAX`, reason there): the splits only regroup the same
//! f32 sums, and the combine adds one exp2 and a sum over at most 32 splits. Caches hold NaN past kv_len, so a read
//! past the current length fails the case.

use crate::attention_prefill::{caches, kv_caches, upload_cache, AMP, F16_ATOL, F16_RTOL, NMSE_MAX};
use crate::common::{exact, gpu_fallback, nmse, rel_abs, Case, Check, Rng};
use shaderlm::gpu::{DType, Gpu};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::attention_decode::{self, splits_for, tree_table, MAX_TREE_DEPTH, TREE_W};
use shaderlm::ops::attention_prefill::{self, AttnShape};
use shaderlm::ops::kv_write;

fn run(gpu: &Gpu, s: AttnShape, kv_len: usize, amp: f32, seed: u64) -> shaderlm::Result<Check> {
    run_window(gpu, s, kv_len, (amp, DType::F32), seed, None)
}

/// [`run`] with a sliding window (each query sees only its last `window` keys), over caches of `kv`.
pub fn run_window(
    gpu: &Gpu,
    s: AttnShape,
    kv_len: usize,
    (amp, kv): (f32, DType),
    seed: u64,
    window: Option<usize>,
) -> shaderlm::Result<Check> {
    let mut rng = Rng::new(seed);
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    let pos = kv_len - s.n_tokens;
    let q = rng.vec(s.n_tokens * s.n_heads * s.head_dim, amp);
    let [(kt, kc), (vt, vc)] = kv_caches(gpu, &mut rng, s, kv_len, amp, kv)?;
    let mut g = Graph::new();
    let tq = g.input("q", &[s.n_tokens, s.n_heads, s.head_dim], DType::F32);
    let (tk, tv) = (g.external(&kt), g.external(&vt));
    let o = g.attention_decode_window(tq, tk, tv, scale, window)?;
    g.output(o);
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, tq, bytemuck::cast_slice(&q))?;
    plan.run(gpu, &StepVars { pos: pos as u32 })?;
    let want = attention_prefill::reference_window(&q, &kc, &vc, s, pos, scale, window);
    Ok(nmse(&plan.read_f32(o)?, &want, NMSE_MAX))
}

/// kv_write (as a pair, or K and V apart) + attention_decode in one plan, run at each of `positions` with a new
/// token each time (as decode does; the params are re-read every run): the caches of `kv` must hold the writes (for
/// f16 rounded, within an f16 ulp: rtol 2^-10, atol 2^-24), and the attention the reference over what they hold.
/// Reports the worst step.
pub fn steps(gpu: &Gpu, s: AttnShape, positions: &[usize], (pair, kv): (bool, DType), seed: u64) -> shaderlm::Result<Check> {
    let mut rng = Rng::new(seed);
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    let (n, hd) = (s.n_tokens, s.head_dim);
    // Prefix positions never written by this test hold random keys, as an earlier prefill would have left.
    let [(kt, mut kc), (vt, mut vc)] = kv_caches(gpu, &mut rng, s, s.max_ctx, AMP, kv)?;
    let mut g = Graph::new();
    let tq = g.input("q", &[n, s.n_heads, hd], DType::F32);
    let tk_new = g.input("k", &[n, s.n_kv, hd], DType::F32);
    let tv_new = g.input("v", &[n, s.n_kv, hd], DType::F32);
    let (tk, tv) = (g.external(&kt), g.external(&vt));
    if pair {
        g.kv_write_pair(tk_new, tv_new, tk, tv)?;
    } else {
        g.kv_write(tk_new, tk)?;
        g.kv_write(tv_new, tv)?;
    }
    let o = g.attention_decode(tq, tk, tv, scale)?;
    g.output(o);
    let mut plan = Plan::new(gpu, g)?;
    let mut worst = nmse(&[], &[], NMSE_MAX);
    for &pos in positions {
        let q = rng.vec(n * s.n_heads * hd, AMP);
        let k = rng.vec(n * s.n_kv * hd, AMP);
        let v = rng.vec(n * s.n_kv * hd, 1.0);
        plan.write_input(gpu, tq, bytemuck::cast_slice(&q))?;
        plan.write_input(gpu, tk_new, bytemuck::cast_slice(&k))?;
        plan.write_input(gpu, tv_new, bytemuck::cast_slice(&v))?;
        plan.run(gpu, &StepVars { pos: pos as u32 })?;
        kv_write::reference(&k, &mut kc, s.n_kv, s.max_ctx, hd, pos);
        kv_write::reference(&v, &mut vc, s.n_kv, s.max_ctx, hd, pos);
        let written = [kt.download_f32(gpu)?, vt.download_f32(gpu)?].concat();
        let want = [kc.clone(), vc.clone()].concat();
        let cached = match kv {
            DType::F16 => rel_abs(&written, &want, F16_RTOL, F16_ATOL),
            _ => exact(&written, &want),
        };
        if !cached.passed() {
            return Ok(cached);
        }
        // The attention reads what the device cached.
        let (dk, dv) = written.split_at(kc.len());
        (kc, vc) = (dk.to_vec(), dv.to_vec());
        let want = attention_decode::reference(&q, &kc, &vc, s, pos, scale);
        let check = nmse(&plan.read_f32(o)?, &want, NMSE_MAX);
        if !check.passed() {
            return Ok(check);
        }
        worst = match (&check, &worst) {
            (Check::Nmse { value, .. }, Check::Nmse { value: w, .. }) if value > w => check,
            _ => worst,
        };
    }
    Ok(worst)
}

/// (name, n_q, n_heads, n_kv, head_dim, kv_len, max_ctx, amp, sliding window)
type Extra = (
    &'static str,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    f32,
    Option<usize>,
);

/// The heads of a GQA group share each key and value load in the CPU kernel (a workgroup serves up to 8 of them):
/// the output equals, bit for bit, the same attention with every kv head repeated per query head (group 1, one
/// head per workgroup), over one split and several, f32 and f16 caches.
fn group_shared(gpu: &Gpu, s: AttnShape, kv_len: usize, kv: DType, seed: u64) -> shaderlm::Result<Check> {
    let mut rng = Rng::new(seed);
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    let pos = kv_len - s.n_tokens;
    let q = rng.vec(s.n_tokens * s.n_heads * s.head_dim, AMP);
    let (kc, vc) = caches(&mut rng, s, kv_len, AMP);
    let head = s.max_ctx * s.head_dim;
    // kv head h / group's rows, once per query head h.
    let repeat = |c: &[f32]| -> Vec<f32> {
        (0..s.n_heads).flat_map(|h| c[h / s.group() * head..][..head].to_vec()).collect()
    };
    let run = |s: AttnShape, kc: &[f32], vc: &[f32]| -> shaderlm::Result<Vec<f32>> {
        let shape = [s.n_kv, s.max_ctx, s.head_dim];
        let (kt, vt) = (upload_cache(gpu, "k", &shape, kc, kv)?, upload_cache(gpu, "v", &shape, vc, kv)?);
        let mut g = Graph::new();
        let tq = g.input("q", &[s.n_tokens, s.n_heads, s.head_dim], DType::F32);
        let (tk, tv) = (g.external(&kt), g.external(&vt));
        let o = g.attention_decode(tq, tk, tv, scale)?;
        g.output(o);
        let mut plan = Plan::new(gpu, g)?;
        plan.write_input(gpu, tq, bytemuck::cast_slice(&q))?;
        plan.run(gpu, &StepVars { pos: pos as u32 })?;
        plan.read_f32(o)
    };
    let shared = run(s, &kc, &vc)?;
    let apart = run(AttnShape { n_kv: s.n_heads, ..s }, &repeat(&kc), &repeat(&vc))?;
    Ok(exact(&shared, &apart))
}

pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    // (n_q, n_heads, n_kv, head_dim, kv_len, max_ctx): groups of 3 (SmolLM2), 7 (Qwen2.5 0.5B: 7 heads per
    // workgroup), 16 (two workgroups of 8), 6 at head_dim 80 (3 per workgroup), one split and several.
    let groups = [(1, 9, 3, 64, 70, 256), (4, 14, 2, 64, 300, 1024), (3, 16, 1, 128, 1000, 2048), (2, 12, 2, 80, 40, 64)];
    for (i, (n_tokens, n_heads, n_kv, head_dim, kv_len, max_ctx)) in groups.into_iter().enumerate() {
        let kv = if i % 2 == 0 { DType::F32 } else { DType::F16 };
        let s = AttnShape { n_tokens, n_heads, n_kv, head_dim, max_ctx };
        let name = format!("group_shared_q{n_tokens}_h{n_heads}_kv{n_kv}_d{head_dim}_len{kv_len}_{kv:?}");
        v.push(Case::new("attention_decode", name, move |gpu| group_shared(gpu, s, kv_len, kv, 2900 + i as u64)));
    }
    let mut seed = 3000u64;
    let heads = [(1usize, 1usize), (3, 1), (9, 3), (4, 1), (8, 1), (14, 2)];
    // (kv_len, max_ctx): max_ctx fixes the split count (splits_for): 1 key among 8 splits (7 empty); 2 keys, one
    // split; 255 keys in 4 splits of 64; 1000 keys filling 3 splits of 334 (a short last one); 4097 keys in 16 splits.
    let lens = [(1usize, 2048usize), (2, 300), (255, 1024), (1000, 1000), (4097, 4200)];
    for (n_heads, n_kv) in heads {
        for head_dim in [64usize, 128] {
            for (kv_len, max_ctx) in lens {
                seed += 1;
                let s = AttnShape {
                    n_tokens: 1,
                    n_heads,
                    n_kv,
                    head_dim,
                    max_ctx,
                };
                let name = format!(
                    "h{n_heads}_kv{n_kv}_d{head_dim}_len{kv_len}_splits{}",
                    splits_for(max_ctx)
                );
                v.push(Case::new("attention_decode", name, move |gpu| {
                    run(gpu, s, kv_len, AMP, seed)
                }));
            }
        }
    }
    let extra: [Extra; 20] = [
        // 32 splits of 2 keys: splits 17..31 are empty.
        ("some_splits_empty", 1, 9, 3, 64, 33, 8192, AMP, None),
        ("one_key_32_splits", 1, 4, 1, 128, 1, 8192, AMP, None),
        // Speculative verification: several queries, causal inside the step.
        ("spec_4_tokens", 4, 9, 3, 64, 300, 512, AMP, None),
        // 8 tokens x group 8 = 64 rows: 4 row blocks along z.
        ("spec_8_tokens_gqa8", 8, 8, 1, 128, 1000, 2048, AMP, None),
        ("spec_8_tokens_14_2", 8, 14, 2, 64, 4097, 4200, AMP, None),
        // 20 splits of 2 keys for 8 queries: the last splits hold keys only the last queries see, so the other
        // rows' partials there are empty (m = NEG, l = 0).
        ("spec_rows_with_empty_splits", 8, 4, 1, 64, 40, 8192, AMP, None),
        ("spec_whole_cache", 8, 3, 1, 64, 8, 8, AMP, None),
        ("head_dim_32", 1, 8, 2, 32, 700, 1024, AMP, None),
        ("head_dim_80", 2, 6, 2, 80, 333, 512, AMP, None),
        ("head_dim_96", 1, 12, 4, 96, 2500, 4096, AMP, None),
        ("large_scores", 1, 4, 1, 64, 1000, 2048, 8.0, None),
        // Sliding windows (Gemma 3): the keys before a window hold finite random values, so a kernel that reads
        // them changes the result.
        ("window1", 1, 4, 1, 64, 300, 512, AMP, Some(1)),
        ("window5_spec4", 4, 4, 1, 64, 300, 512, AMP, Some(5)),
        ("window300_splits", 1, 8, 2, 64, 4097, 4200, AMP, Some(300)),
        ("window512_many_splits", 1, 4, 1, 128, 2000, 8192, AMP, Some(512)),
        ("window_past_kv_len", 2, 4, 2, 64, 100, 512, AMP, Some(4096)),
        ("window_spec8_crosses_split", 8, 8, 1, 64, 1000, 8192, AMP, Some(260)),
        ("head_dim_256_window", 1, 4, 1, 256, 700, 1024, AMP, Some(512)),
        ("head_dim_256_spec", 3, 8, 2, 256, 90, 256, AMP, Some(4096)),
        // Gemma 3 270M's shape: the last 3 tokens of a 1,411-token prompt, the window 512 keys behind.
        ("gemma3_tail_past_window", 3, 4, 1, 256, 1411, 2048, AMP, Some(512)),
    ];
    // Each also on the device without subgroups, which runs the workgroup kernel instead of the CPU-adapter one.
    for (name, n_tokens, n_heads, n_kv, head_dim, kv_len, max_ctx, amp, window) in extra {
        seed += 1;
        let s = AttnShape {
            n_tokens,
            n_heads,
            n_kv,
            head_dim,
            max_ctx,
        };
        v.push(Case::new("attention_decode", name, move |gpu| {
            run_window(gpu, s, kv_len, (amp, DType::F32), seed, window)
        }));
        v.push(Case::new("attention_decode", format!("{name}_no_subgroups"), move |_| {
            run_window(gpu_fallback(), s, kv_len, (amp, DType::F32), seed, window)
        }));
    }
    // Batch invariance: row r of an n-query step equals the one-query step at position pos + r bit for bit
    // (speculative verification): across split boundaries, with windows, GQA groups over several row blocks.
    // (name, n_q, n_heads, n_kv, head_dim, kv_len, sliding window)
    type Batch = (&'static str, usize, usize, usize, usize, usize, Option<usize>);
    let batch: [Batch; 6] = [
        ("batch_rows_equal_one_row_short", 4, 9, 3, 64, 40, None),
        ("batch_rows_equal_one_row_crosses_split", 8, 9, 3, 64, 1029, None),
        ("batch_rows_equal_one_row_gqa8", 8, 8, 1, 128, 700, None),
        ("batch_rows_equal_one_row_window", 8, 4, 1, 64, 1030, Some(260)),
        ("batch_rows_equal_one_row_window_in_first_split", 5, 4, 2, 64, 300, Some(4)),
        ("batch_rows_equal_one_row_d256_window", 3, 4, 1, 256, 1411, Some(512)),
    ];
    for (name, n_tokens, n_heads, n_kv, head_dim, kv_len, window) in batch {
        seed += 1;
        let s = AttnShape {
            n_tokens,
            n_heads,
            n_kv,
            head_dim,
            max_ctx: 4096,
        };
        v.push(Case::new("attention_decode", name, move |gpu| {
            batch_rows(gpu, s, kv_len, (seed, DType::F32), window)
        }));
        v.push(Case::new("attention_decode", format!("{name}_no_subgroups"), move |_| {
            batch_rows(gpu_fallback(), s, kv_len, (seed, DType::F32), window)
        }));
    }
    // One plan, successive decode steps (positions 0..20, then a jump past a split boundary).
    let positions: Vec<usize> = (0..20).chain([300, 301, 511]).collect();
    seed += 1;
    let s = AttnShape {
        n_tokens: 1,
        n_heads: 9,
        n_kv: 3,
        head_dim: 64,
        max_ctx: 512,
    };
    let p2 = positions.clone();
    v.push(Case::new(
        "attention_decode",
        "decode_steps_reuse_plan_h9_kv3_d64",
        move |gpu| steps(gpu, s, &p2, (false, DType::F32), seed),
    ));
    seed += 1;
    let s = AttnShape {
        n_tokens: 3,
        n_heads: 8,
        n_kv: 2,
        head_dim: 128,
        max_ctx: 1024,
    };
    v.push(Case::new(
        "attention_decode",
        "spec_steps_reuse_plan_t3_h8_kv2_d128",
        move |gpu| steps(gpu, s, &[0, 3, 6, 500, 1021], (false, DType::F32), seed),
    ));
    // Only the splits that hold keys are launched (counts set per step); when the context shrinks (a new
    // conversation in the same session), the partials of splits launched earlier are stale and must be ignored.
    seed += 1;
    let s = AttnShape {
        n_tokens: 1,
        n_heads: 9,
        n_kv: 3,
        head_dim: 64,
        max_ctx: 4096,
    };
    let at = [3000, 10, 700, 5, 4095, 0];
    v.push(Case::new(
        "attention_decode",
        "shrinking_context_ignores_stale_splits",
        move |gpu| steps(gpu, s, &at, (false, DType::F32), seed),
    ));
    v.push(Case::new(
        "attention_decode",
        "shrinking_context_ignores_stale_splits_no_subgroups",
        move |_| steps(gpu_fallback(), s, &at, (false, DType::F32), seed),
    ));
    tree_cases(&mut v);
    v
}

/// Bitwise: the rows of one `s.n_tokens`-query step ending at `kv_len` against one-query steps at each position.
pub fn batch_rows(
    gpu: &Gpu,
    s: AttnShape,
    kv_len: usize,
    (seed, kv): (u64, DType),
    window: Option<usize>,
) -> shaderlm::Result<Check> {
    let mut rng = Rng::new(seed);
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    let (n, hd) = (s.n_tokens, s.head_dim);
    let pos = kv_len - n;
    let q = rng.vec(n * s.n_heads * hd, AMP);
    let (kc, vc) = caches(&mut rng, s, kv_len, AMP);
    let cache_shape = [s.n_kv, s.max_ctx, hd];
    let kt = upload_cache(gpu, "k_cache", &cache_shape, &kc, kv)?;
    let vt = upload_cache(gpu, "v_cache", &cache_shape, &vc, kv)?;
    let run = |rows: usize, q: &[f32], pos: usize| -> shaderlm::Result<Vec<u32>> {
        let mut g = Graph::new();
        let tq = g.input("q", &[rows, s.n_heads, hd], DType::F32);
        let (tk, tv) = (g.external(&kt), g.external(&vt));
        let o = g.attention_decode_window(tq, tk, tv, scale, window)?;
        g.output(o);
        let mut plan = Plan::new(gpu, g)?;
        plan.write_input(gpu, tq, bytemuck::cast_slice(q))?;
        plan.run(gpu, &StepVars { pos: pos as u32 })?;
        Ok(plan.read_f32(o)?.iter().map(|v| v.to_bits()).collect())
    };
    let got = run(n, &q, pos)?;
    let row = s.n_heads * hd;
    let mut want = Vec::with_capacity(got.len());
    for r in 0..n {
        want.extend(run(1, &q[r * row..(r + 1) * row], pos + r)?);
    }
    Ok(exact(&got, &want))
}

/// A random tree of `n` nodes (node 0 the root, each parent before its child, no deeper than `MAX_TREE_DEPTH`):
/// each node's path of slots (node i in slot i) from the root.
pub fn random_tree(rng: &mut Rng, n: usize) -> Vec<Vec<u32>> {
    let mut paths: Vec<Vec<u32>> = vec![vec![0]];
    for i in 1..n {
        let mut parent = (rng.next_u64() % i as u64) as usize;
        while paths[parent].len() > MAX_TREE_DEPTH {
            parent = paths[parent][paths[parent].len() - 2] as usize;
        }
        let mut path = paths[parent].clone();
        path.push(i as u32);
        paths.push(path);
    }
    paths
}

/// A tree step over `s.n_tokens` nodes of a random tree written at `pos ..` (positions past them hold NaN, so a read
/// outside a row's path fails the case): the tree, its table, q, the caches and the output `[n_q, n_heads, hd]`.
struct TreeRun {
    paths: Vec<Vec<u32>>,
    table: Vec<u32>,
    q: Vec<f32>,
    caches: (Vec<f32>, Vec<f32>),
    out: Vec<f32>,
}

fn tree_run(gpu: &Gpu, s: AttnShape, pos: usize, (seed, kv): (u64, DType), window: Option<usize>) -> shaderlm::Result<TreeRun> {
    let mut rng = Rng::new(seed);
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    let (n, hd) = (s.n_tokens, s.head_dim);
    let paths = random_tree(&mut rng, n);
    let table = tree_table(paths.iter().map(Vec::as_slice))?;
    let q = rng.vec(n * s.n_heads * hd, AMP);
    let (kc, vc) = caches(&mut rng, s, pos + n, AMP);
    let cache_shape = [s.n_kv, s.max_ctx, hd];
    let kt = upload_cache(gpu, "k_cache", &cache_shape, &kc, kv)?;
    let vt = upload_cache(gpu, "v_cache", &cache_shape, &vc, kv)?;
    let mut g = Graph::new();
    let tq = g.input("q", &[n, s.n_heads, hd], DType::F32);
    let tt = g.input("tree", &[n, TREE_W], DType::U32);
    let (tk, tv) = (g.external(&kt), g.external(&vt));
    let o = g.attention_decode_tree(tq, tk, tv, scale, window, tt)?;
    g.output(o);
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, tq, bytemuck::cast_slice(&q))?;
    plan.write_input(gpu, tt, bytemuck::cast_slice(&table))?;
    plan.run(gpu, &StepVars { pos: pos as u32 })?;
    let out = plan.read_f32(o)?;
    Ok(TreeRun {
        paths,
        table,
        q,
        caches: (kc, vc),
        out,
    })
}

/// The caches `[n_kv, max_ctx, hd]` of a tree step (its nodes' K/V side by side from `pos`) as plain decoding of
/// one node's `path` (its slots from the root) would have left them: the path's K/V in order at `pos ..`, NaN after.
pub fn path_caches((kc, vc): (&[f32], &[f32]), s: AttnShape, pos: usize, path: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let hd = s.head_dim;
    let (mut k1, mut v1) = (kc.to_vec(), vc.to_vec());
    for h in 0..s.n_kv {
        for p in pos..s.max_ctx {
            let dst = (h * s.max_ctx + p) * hd;
            match path.get(p - pos) {
                Some(&slot) => {
                    let src = (h * s.max_ctx + pos + slot as usize) * hd;
                    k1[dst..dst + hd].copy_from_slice(&kc[src..src + hd]);
                    v1[dst..dst + hd].copy_from_slice(&vc[src..src + hd]);
                }
                None => {
                    k1[dst..dst + hd].fill(f32::NAN);
                    v1[dst..dst + hd].fill(f32::NAN);
                }
            }
        }
    }
    (k1, v1)
}

/// Tree form, bitwise: row r of a tree step equals the one-query step at `pos + depth(r)` over a cache holding the
/// prefix and then r's path in order (what plain decoding of that path would have cached).
pub fn tree_rows(
    gpu: &Gpu,
    s: AttnShape,
    pos: usize,
    (seed, kv): (u64, DType),
    window: Option<usize>,
) -> shaderlm::Result<Check> {
    let t = tree_run(gpu, s, pos, (seed, kv), window)?;
    let (kc, vc) = &t.caches;
    let (scale, hd, row) = (1.0 / (s.head_dim as f32).sqrt(), s.head_dim, s.n_heads * s.head_dim);
    let cache_shape = [s.n_kv, s.max_ctx, hd];
    let got: Vec<u32> = t.out.iter().map(|v| v.to_bits()).collect();
    let mut want = Vec::with_capacity(got.len());
    for (r, path) in t.paths.iter().enumerate() {
        let (k1, v1) = path_caches((kc, vc), s, pos, path);
        let kt1 = upload_cache(gpu, "k_cache", &cache_shape, &k1, kv)?;
        let vt1 = upload_cache(gpu, "v_cache", &cache_shape, &v1, kv)?;
        let mut g = Graph::new();
        let tq = g.input("q", &[1, s.n_heads, hd], DType::F32);
        let (tk, tv) = (g.external(&kt1), g.external(&vt1));
        let o = g.attention_decode_window(tq, tk, tv, scale, window)?;
        g.output(o);
        let mut one = Plan::new(gpu, g)?;
        one.write_input(gpu, tq, bytemuck::cast_slice(&t.q[r * row..(r + 1) * row]))?;
        one.run(gpu, &StepVars { pos: (pos + path.len() - 1) as u32 })?;
        want.extend(one.read_f32(o)?.iter().map(|v| v.to_bits()));
    }
    Ok(exact(&got, &want))
}

/// Tree form against the f64 CPU reference (`reference_tree`), the same NMSE bound as the plain form.
fn tree_vs_reference(gpu: &Gpu, s: AttnShape, pos: usize, seed: u64) -> shaderlm::Result<Check> {
    let t = tree_run(gpu, s, pos, (seed, DType::F32), None)?;
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    let want = attention_decode::reference_tree(&t.q, &t.caches.0, &t.caches.1, s, (pos, &t.table), scale, None);
    Ok(nmse(&t.out, &want, NMSE_MAX))
}

/// The tree cases: (name, nodes, n_heads, n_kv, head_dim, pos, max_ctx, window), each on both kernels.
pub fn tree_cases(v: &mut Vec<Case>) {
    type Tree = (&'static str, usize, usize, usize, usize, usize, usize, Option<usize>);
    let trees: [Tree; 6] = [
        ("tree_rows_equal_path_steps_small", 5, 9, 3, 64, 20, 512, None),
        ("tree_rows_equal_path_steps_61_nodes", 61, 9, 3, 64, 300, 1024, None),
        // Paths crossing a split boundary (256-key splits at max_ctx 4096) and a key tile.
        ("tree_rows_equal_path_steps_crosses_split", 17, 8, 1, 128, 250, 4096, None),
        ("tree_rows_equal_path_steps_window", 12, 4, 1, 64, 700, 1024, Some(260)),
        ("tree_rows_equal_path_steps_d256", 9, 4, 1, 256, 90, 512, Some(512)),
        ("tree_rows_equal_path_steps_gqa16", 7, 16, 1, 64, 33, 256, None),
    ];
    for (i, (name, n_tokens, n_heads, n_kv, head_dim, pos, max_ctx, window)) in trees.into_iter().enumerate() {
        let seed = 4100 + i as u64;
        let s = AttnShape {
            n_tokens,
            n_heads,
            n_kv,
            head_dim,
            max_ctx,
        };
        v.push(Case::new("attention_decode", name, move |gpu| {
            tree_rows(gpu, s, pos, (seed, DType::F32), window)
        }));
        v.push(Case::new("attention_decode", format!("{name}_no_subgroups"), move |_| {
            tree_rows(gpu_fallback(), s, pos, (seed, DType::F32), window)
        }));
        if window.is_none() {
            v.push(Case::new("attention_decode", format!("{name}_vs_reference"), move |gpu| {
                tree_vs_reference(gpu, s, pos, seed)
            }));
        }
    }
}
