//! The f16 KV cache (the `KV_F16` variants, lib/kv_cache.wgsl) in every op that reads or writes a cache:
//! attention_decode (both split kernels), attention_prefill, attention_sparse and kv_compress (and its tree form) against their CPU
//! references over the cache's f16 values; kv_write and rope_kv against their f32 forms rounded to f16; kv_move bit
//! for bit; and the batch-invariance and tree cases of attention_decode bit for bit with an f16 cache.
//!
//! Bounds: the readers convert each half to f32 exactly and keep f32 math, so they take their f32 bounds against
//! a reference fed the same f16 values (NMSE_MAX, or kv_compress's rel+abs). The writers round f32 to f16: the
//! result must be the f32 value rounded to nearest or toward zero (Vulkan allows either), so within one f16 ulp:
//! rtol 2^-10, atol 2^-24 (the smallest subnormal). Caches start NaN past the keys written or random, as in the f32
//! cases, so a read past the length or a stray write fails.

use crate::attention_decode::{batch_rows, random_tree, steps, tree_rows};
use crate::attention_prefill::{kv_caches, shape, AMP, F16_ATOL, F16_RTOL, NMSE_MAX};
use crate::attention_sparse::selections;
use crate::common::{exact, gpu_fallback, nmse, rel_abs, Case, Check, Rng};
use shaderlm::gpu::{DType, Gpu, GpuTensor};
use shaderlm::graph::{Graph, Plan, StepVars};
use shaderlm::ops::attention_decode::{tree_table, TREE_W};
use shaderlm::ops::attention_prefill::AttnShape;
use shaderlm::ops::block_topk::BlockSelection;
use shaderlm::ops::kv_compress::{self, CompressShape, Window};
use shaderlm::ops::kv_move::{self, moves_list, MAX_MOVES};
use shaderlm::ops::kv_write::{self, round_f16};
use shaderlm::ops::rope::{RopeConfig, RopeStyle};
use shaderlm::ops::rope_kv::QkvSource;
use shaderlm::ops::{attention_decode, attention_sparse};

/// rope_kv into f16 caches against rope_kv into f32 caches in the same plan (the same rotation code): q bit for
/// bit, the f16 caches within an ulp of the f32 ones. `tree`: the tree form over a random tree of n_tokens nodes.
fn rope_kv(gpu: &Gpu, s: AttnShape, style: RopeStyle, norm: bool, tree: bool, seed: u64) -> shaderlm::Result<Check> {
    let mut rng = Rng::new(seed);
    let (n, hd) = (s.n_tokens, s.head_dim);
    let width = (s.n_heads + 2 * s.n_kv) * hd;
    let qkv = rng.vec(n * width, 1.0);
    let weights: Vec<f32> = (0..2 * hd).map(|_| 1.0 + 0.5 * rng.f32()).collect();
    let init = round_f16(&rng.vec(s.n_kv * s.max_ctx * hd, 1.0));
    let cache_shape = [s.n_kv, s.max_ctx, hd];
    let up32 = |name: &str| GpuTensor::upload_f32(gpu, name, &cache_shape, &init);
    let up16 = |name: &str| GpuTensor::upload_f16(gpu, name, &cache_shape, &init);
    let (k32, v32, k16, v16) = (up32("k32")?, up32("v32")?, up16("k16")?, up16("v16")?);
    let table = tree_table(random_tree(&mut rng, n).iter().map(Vec::as_slice))?;
    let mut g = Graph::new();
    let src = g.input("qkv", &[n, width], DType::F32);
    let w = norm.then(|| g.input("qk_norm", &[2, hd], DType::F32));
    let tt = tree.then(|| g.input("tree", &[n, TREE_W], DType::U32));
    let mut cfg = RopeConfig::new(style, 10000.0, hd);
    cfg.freq_scale = 0.5;
    let mut outs = Vec::new();
    for (kc, vc) in [(&k32, &v32), (&k16, &v16)] {
        let caches = (g.external(kc), g.external(vc));
        let q = g.rope_kv_tree(QkvSource::stacked(src), w.map(|w| (w, 1e-6)), cfg, caches, tt)?;
        g.output(q);
        outs.push(q);
    }
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, src, bytemuck::cast_slice(&qkv))?;
    if let Some(w) = w {
        plan.write_input(gpu, w, bytemuck::cast_slice(&weights))?;
    }
    if let Some(tt) = tt {
        plan.write_input(gpu, tt, bytemuck::cast_slice(&table))?;
    }
    plan.run(gpu, &StepVars { pos: 9 })?;
    let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let q_equal = exact(&bits(plan.read_f32(outs[0])?), &bits(plan.read_f32(outs[1])?));
    if !q_equal.passed() {
        return Ok(q_equal);
    }
    let want = round_f16(&[k32.download_f32(gpu)?, v32.download_f32(gpu)?].concat());
    let got = [k16.download_f32(gpu)?, v16.download_f32(gpu)?].concat();
    Ok(rel_abs(&got, &want, F16_RTOL, F16_ATOL))
}

/// kv_move on f16 caches: the moved halves bit for bit (head_dim 6: rows of 3 words).
fn moves(gpu: &Gpu) -> shaderlm::Result<Check> {
    let (n_kv, hd, ctx) = (3, 6, 20);
    let mut rng = Rng::new(11);
    let n = n_kv * ctx * hd;
    let (mut k, mut v) = (round_f16(&rng.vec(n, 1.0)), round_f16(&rng.vec(n, 1.0)));
    let shape = [n_kv, ctx, hd];
    let kt = GpuTensor::upload_f16(gpu, "k", &shape, &k)?;
    let vt = GpuTensor::upload_f16(gpu, "v", &shape, &v)?;
    let mut g = Graph::new();
    let tm = g.input("moves", &[1 + 2 * MAX_MOVES], DType::U32);
    let (tk, tv) = (g.external(&kt), g.external(&vt));
    g.kv_move(tk, tv, tm)?;
    let mut plan = Plan::new(gpu, g)?;
    let list = moves_list(&[(12, 11), (13, 12), (17, 13), (25, 1)])?;
    plan.write_input(gpu, tm, bytemuck::cast_slice(&list))?;
    plan.run(gpu, &StepVars::default())?;
    kv_move::reference(&mut k, &mut v, &list, n_kv, ctx, hd);
    let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let got = [kt.download_f32(gpu)?, vt.download_f32(gpu)?].concat();
    Ok(exact(&bits(got), &bits([k, v].concat())))
}

/// The compressed-key cases' shape: MiniCPM4's C1 windows over 2 KV heads of 64.
const COMPRESS: CompressShape = CompressShape {
    n_kv: 2,
    max_ctx: 200,
    head_dim: 64,
    window: Window { size: 32, stride: 16 },
};

/// kv_write + kv_compress over an f16 K cache, two steps, against the reference over the cached halves.
fn compress(gpu: &Gpu) -> shaderlm::Result<Check> {
    let s = COMPRESS;
    let (n_kv, hd, ctx) = (s.n_kv, s.head_dim, s.max_ctx);
    let mut rng = Rng::new(12);
    let mut k_cpu = vec![f32::NAN; n_kv * ctx * hd];
    let c_init = rng.vec(n_kv * s.n_windows() * hd, 1.0);
    let kt = GpuTensor::upload_f16(gpu, "k_cache", &[n_kv, ctx, hd], &k_cpu)?;
    let ct = GpuTensor::upload_f32(gpu, "c_cache", &[n_kv, s.n_windows(), hd], &c_init)?;
    let n = 70;
    let mut g = Graph::new();
    let k = g.input("k", &[n, n_kv, hd], DType::F32);
    let (tk, tc) = (g.external(&kt), g.external(&ct));
    g.kv_write(k, tk)?;
    g.kv_compress(tk, tc, n, s.window)?;
    let mut plan = Plan::new(gpu, g)?;
    for pos in [0, n] {
        let keys = rng.vec(n * n_kv * hd, 1.0);
        plan.write_input(gpu, k, bytemuck::cast_slice(&keys))?;
        plan.run(gpu, &StepVars { pos: pos as u32 })?;
        kv_write::reference(&round_f16(&keys), &mut k_cpu, n_kv, ctx, hd, pos);
    }
    let mut want = c_init;
    kv_compress::reference(&k_cpu, &mut want, s, 0, 2 * n);
    Ok(rel_abs(&ct.download_f32(gpu)?, &want, 1e-5, 1e-5))
}

/// kv_compress's tree form over an f16 K cache (a 23-node tree rooted 3 before a window's end), against the
/// reference over the cached halves.
fn compress_tree(gpu: &Gpu) -> shaderlm::Result<Check> {
    let s = COMPRESS;
    let (n_kv, hd, ctx, pos, rows) = (s.n_kv, s.head_dim, s.max_ctx, 44, 23);
    let mut rng = Rng::new(13);
    let k = round_f16(&rng.vec(n_kv * ctx * hd, 1.0));
    let table = tree_table(random_tree(&mut rng, rows).iter().map(Vec::as_slice))?;
    let kt = GpuTensor::upload_f16(gpu, "k_cache", &[n_kv, ctx, hd], &k)?;
    let mut g = Graph::new();
    let tk = g.external(&kt);
    let tt = g.input("tree", &[rows, TREE_W], DType::U32);
    let out = g.kv_compress_tree(tk, tt, s.window)?;
    g.output(out);
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, tt, bytemuck::cast_slice(&table))?;
    plan.run(gpu, &StepVars { pos: pos as u32 })?;
    let want = kv_compress::reference_tree(&k, &table, s, pos);
    Ok(rel_abs(&plan.read_f32(out)?, &want, 1e-5, 1e-5))
}

/// attention_sparse (decode split + combine for n_tokens <= 8, prefill otherwise) over f16 caches.
fn sparse(gpu: &Gpu, s: AttnShape, pos: usize, seed: u64) -> shaderlm::Result<Check> {
    let mut rng = Rng::new(seed);
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    let bs = BlockSelection {
        block_size: 64,
        init_blocks: 1,
        local_blocks: 2,
        budget: 8,
    };
    let q = rng.vec(s.n_tokens * s.n_heads * s.head_dim, AMP);
    let [(kt, kc), (vt, vc)] = kv_caches(gpu, &mut rng, s, pos + s.n_tokens, AMP, DType::F16)?;
    let ids = selections(&mut rng, s, bs, pos);
    let mut g = Graph::new();
    let tq = g.input("q", &[s.n_tokens, s.n_heads, s.head_dim], DType::F32);
    let tsel = g.input("sel", &[s.n_tokens, s.n_kv, bs.budget], DType::U32);
    let (tk, tv) = (g.external(&kt), g.external(&vt));
    let o = g.attention_sparse(tq, tk, tv, tsel, bs.block_size, scale)?;
    g.output(o);
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, tq, bytemuck::cast_slice(&q))?;
    plan.write_input(gpu, tsel, bytemuck::cast_slice(&ids))?;
    plan.run(gpu, &StepVars { pos: pos as u32 })?;
    let want = attention_sparse::reference(&q, &kc, &vc, &ids, s, bs.block_size, pos, scale);
    Ok(nmse(&plan.read_f32(o)?, &want, NMSE_MAX))
}

pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    // (name, n_q, n_heads, n_kv, head_dim, kv_len, max_ctx, window): decode on both split kernels, prefill chunks
    // (head_dim 256 through the split kernel).
    type Attn = (&'static str, usize, usize, usize, usize, usize, usize, Option<usize>);
    let attn: [Attn; 6] = [
        ("kv_f16_decode_3_splits", 1, 9, 3, 64, 1000, 1000, None),
        ("kv_f16_decode_spec3_window", 3, 8, 2, 128, 300, 4096, Some(100)),
        ("kv_f16_decode_d256_window", 1, 4, 1, 256, 700, 1024, Some(512)),
        ("kv_f16_prefill_chunk_after_prefix", 37, 9, 3, 64, 137, 256, None),
        ("kv_f16_prefill_gqa7_d128_window", 20, 14, 2, 128, 300, 512, Some(64)),
        ("kv_f16_prefill_d256", 12, 4, 1, 256, 90, 256, None),
    ];
    for (i, (name, n, h, kv, d, kv_len, ctx, window)) in attn.into_iter().enumerate() {
        let (s, seed, f16) = (shape(n, h, kv, d, ctx), 9100 + i as u64, (AMP, DType::F16));
        let attention = move |gpu: &Gpu| {
            if n <= attention_decode::MAX_TOKENS {
                crate::attention_decode::run_window(gpu, s, kv_len, f16, seed, window)
            } else {
                crate::attention_prefill::run_window(gpu, s, kv_len - n, f16, seed, window)
            }
        };
        let op = if n <= attention_decode::MAX_TOKENS {
            "attention_decode"
        } else {
            "attention_prefill"
        };
        v.push(Case::new(op, name, attention));
        v.push(Case::new(op, format!("{name}_no_subgroups"), move |_| {
            attention(gpu_fallback())
        }));
    }
    let s = shape(8, 9, 3, 64, 4096);
    v.push(Case::new(
        "attention_decode",
        "kv_f16_batch_rows_equal_one_row_crosses_split",
        move |gpu| batch_rows(gpu, s, 1029, (9201, DType::F16), None),
    ));
    v.push(Case::new(
        "attention_decode",
        "kv_f16_batch_rows_equal_one_row_no_subgroups",
        move |_| batch_rows(gpu_fallback(), s, 1029, (9201, DType::F16), Some(260)),
    ));
    let s = shape(17, 8, 1, 128, 4096);
    v.push(Case::new(
        "attention_decode",
        "kv_f16_tree_rows_equal_path_steps",
        move |gpu| tree_rows(gpu, s, 250, (9202, DType::F16), None),
    ));
    v.push(Case::new(
        "attention_decode",
        "kv_f16_tree_rows_equal_path_steps_no_subgroups",
        move |_| tree_rows(gpu_fallback(), s, 250, (9202, DType::F16), None),
    ));
    let s = shape(1, 9, 3, 64, 512);
    v.push(Case::new("kv_write", "kv_f16_decode_steps_pair", move |gpu| {
        steps(gpu, s, &[0, 1, 2, 300, 511], (true, DType::F16), 9203)
    }));
    let s = shape(3, 8, 2, 128, 1024);
    v.push(Case::new("kv_write", "kv_f16_spec_steps_k_and_v_apart", move |gpu| {
        steps(gpu, s, &[0, 3, 500, 1021], (false, DType::F16), 9204)
    }));
    let s = shape(5, 9, 3, 64, 40);
    v.push(Case::new("rope_kv", "kv_f16_rotate_half", move |gpu| {
        rope_kv(gpu, s, RopeStyle::RotateHalf, false, false, 9205)
    }));
    v.push(Case::new("rope_kv", "kv_f16_interleaved_norm", move |gpu| {
        rope_kv(gpu, s, RopeStyle::Interleaved, true, false, 9206)
    }));
    v.push(Case::new("rope_kv", "kv_f16_tree_norm", move |gpu| {
        rope_kv(gpu, shape(12, 9, 3, 64, 40), RopeStyle::RotateHalf, true, true, 9207)
    }));
    v.push(Case::new("kv_move", "kv_f16_moves_halves", moves));
    v.push(Case::new("kv_compress", "kv_f16_two_steps", compress));
    v.push(Case::new("kv_compress", "kv_f16_tree", compress_tree));
    v.push(Case::new("attention_sparse", "kv_f16_decode", move |gpu| {
        sparse(gpu, shape(3, 8, 2, 64, 800), 777, 9208)
    }));
    v.push(Case::new("attention_sparse", "kv_f16_prefill", move |gpu| {
        sparse(gpu, shape(37, 14, 2, 128, 1300), 1200, 9209)
    }));
    v
}
