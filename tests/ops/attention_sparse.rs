//! attention_sparse vs its f64 CPU reference, over GQA ratios 1 to 16 (and 2 row blocks of 16), the head dims of
//! the dense ops, decode (1 to 8 tokens: split + combine) and prefill chunks (up to 300 tokens), block sizes from
//! 1 to 100 (a block longer than a tile), lengths that are not multiples of 64; selections as block_topk makes
//! them (forced blocks, scored ones, padding). Also: a selection of every block equals the dense attention ops'
//! output, an empty selection gives 0, one plan reused across decode steps (shrinking contexts leave stale
//! partials that must be ignored), and block_topk feeding attention_sparse in one graph. Tree form (a draft tree's
//! step: row r at position pos + its depth, its path's keys in the slots of the tree table): against its reference,
//! and every row bit for bit the one-token step at its position over a cache holding its path in order.
//!
//! Metric: NMSE with the bound of attention_prefill (`NMSE_MAX`, reason there): the kernel does the same f32
//! arithmetic as attention_decode over a subset of the keys. Caches hold NaN past the step's last key, so a read
//! past a query's visible keys (or of a block past its own) fails the case.

use crate::attention_decode::{path_caches, random_tree};
use crate::attention_prefill::{caches, shape, AMP, NMSE_MAX};
use crate::common::{exact, nmse, Case, Check, Rng};
use shaderlm::ops::attention_decode::{tree_table, TREE_W};
use shaderlm::gpu::{DType, Gpu, GpuTensor};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan, TensorId};
use shaderlm::ops::attention_prefill::{self, AttnShape};
use shaderlm::ops::attention_sparse;
use shaderlm::ops::block_topk::{self, BlockSelection, EMPTY};

/// Selections of the tokens at `pos ..` by block_topk's rule over random scores (what the model feeds the op).
pub fn selections(rng: &mut Rng, s: AttnShape, bs: BlockSelection, pos: usize) -> Vec<u32> {
    let nb = s.max_ctx.div_ceil(bs.block_size);
    let scores = rng.vec(s.n_tokens * s.n_kv * nb, 1.0);
    block_topk::reference(&scores, s.n_tokens, s.n_kv, nb, bs, pos)
}

/// Every block of the cache, in order: dense causal attention (blocks past a query are ignored).
fn all_blocks(s: AttnShape, block_size: usize) -> Vec<u32> {
    let nb = s.max_ctx.div_ceil(block_size);
    (0..s.n_tokens * s.n_kv).flat_map(|_| 0..nb as u32).collect()
}

/// A graph with q, the caches, sel and the sparse attention node; returns (plan, q, sel, out).
fn plan(
    gpu: &Gpu,
    s: AttnShape,
    budget: usize,
    block_size: usize,
    kc: &[f32],
    vc: &[f32],
    dense: bool,
) -> shaderlm::Result<(Plan, TensorId, TensorId, TensorId, Option<TensorId>)> {
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    let cache_shape = [s.n_kv, s.max_ctx, s.head_dim];
    let kt = GpuTensor::upload_f32(gpu, "k_cache", &cache_shape, kc)?;
    let vt = GpuTensor::upload_f32(gpu, "v_cache", &cache_shape, vc)?;
    let mut g = Graph::new();
    let tq = g.input("q", &[s.n_tokens, s.n_heads, s.head_dim], DType::F32);
    let tsel = g.input("sel", &[s.n_tokens, s.n_kv, budget], DType::U32);
    let (tk, tv) = (g.external(&kt), g.external(&vt));
    let o = g.attention_sparse(tq, tk, tv, tsel, block_size, scale)?;
    g.output(o);
    let od = if dense {
        let od = if s.n_tokens <= attention_sparse::MAX_TOKENS {
            g.attention_decode(tq, tk, tv, scale)?
        } else {
            g.attention_prefill(tq, tk, tv, scale)?
        };
        g.output(od);
        Some(od)
    } else {
        None
    };
    Ok((Plan::new(gpu, g)?, tq, tsel, o, od))
}

/// The selection a case feeds the op.
#[derive(Clone, Copy, Debug)]
enum Sel {
    /// block_topk's rule over random scores.
    TopK(BlockSelection),
    /// Every block (dense); also compared with the dense op's output.
    All(usize),
    /// Only padding: no key.
    Empty(usize, usize),
}

fn run(gpu: &Gpu, s: AttnShape, sel: Sel, pos: usize, amp: f32, seed: u64) -> shaderlm::Result<Check> {
    let mut rng = Rng::new(seed);
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    let q = rng.vec(s.n_tokens * s.n_heads * s.head_dim, amp);
    let (kc, vc) = caches(&mut rng, s, pos + s.n_tokens, amp);
    let (ids, block_size) = match sel {
        Sel::TopK(bs) => (selections(&mut rng, s, bs, pos), bs.block_size),
        Sel::All(b) => (all_blocks(s, b), b),
        Sel::Empty(b, budget) => (vec![EMPTY; s.n_tokens * s.n_kv * budget], b),
    };
    let budget = ids.len() / (s.n_tokens * s.n_kv);
    let (mut plan, tq, tsel, o, od) = plan(gpu, s, budget, block_size, &kc, &vc, matches!(sel, Sel::All(_)))?;
    plan.write_input(gpu, tq, bytemuck::cast_slice(&q))?;
    plan.write_input(gpu, tsel, bytemuck::cast_slice(&ids))?;
    plan.run(gpu, &StepVars { pos: pos as u32 })?;
    let got = plan.read_f32(o)?;
    let want = attention_sparse::reference(&q, &kc, &vc, &ids, s, block_size, pos, scale);
    let check = nmse(&got, &want, NMSE_MAX);
    match od {
        // Dense: the worse of (vs the reference, vs the dense op's output, dense reference vs sparse reference).
        Some(od) => {
            let dense_ref = attention_prefill::reference(&q, &kc, &vc, s, pos, scale);
            let checks = [
                check,
                nmse(&got, &plan.read_f32(od)?, NMSE_MAX),
                nmse(&want, &dense_ref, 1e-24),
            ];
            Ok(checks
                .into_iter()
                .find(|c| !c.passed())
                .unwrap_or_else(|| nmse(&got, &want, NMSE_MAX)))
        }
        None => Ok(check),
    }
}

/// One plan at each of `positions` with new queries and selections (decode reuses its plan): the worst step.
fn steps(gpu: &Gpu, s: AttnShape, bs: BlockSelection, positions: &[usize], seed: u64) -> shaderlm::Result<Check> {
    let mut rng = Rng::new(seed);
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    let (kc, vc) = caches(&mut rng, s, s.max_ctx, AMP);
    let (mut plan, tq, tsel, o, _) = plan(gpu, s, bs.budget, bs.block_size, &kc, &vc, false)?;
    let mut worst = nmse(&[], &[], NMSE_MAX);
    for &pos in positions {
        let q = rng.vec(s.n_tokens * s.n_heads * s.head_dim, AMP);
        let ids = selections(&mut rng, s, bs, pos);
        plan.write_input(gpu, tq, bytemuck::cast_slice(&q))?;
        plan.write_input(gpu, tsel, bytemuck::cast_slice(&ids))?;
        plan.run(gpu, &StepVars { pos: pos as u32 })?;
        let want = attention_sparse::reference(&q, &kc, &vc, &ids, s, bs.block_size, pos, scale);
        let check = nmse(&plan.read_f32(o)?, &want, NMSE_MAX);
        if let (Check::Nmse { value, .. }, Check::Nmse { value: w, .. }) = (&check, &worst) {
            if value.is_nan() || value > w {
                worst = check;
            }
        }
    }
    Ok(worst)
}

/// block_topk then attention_sparse in one graph (scores -> sel -> attention), against the references chained.
fn chained(gpu: &Gpu, s: AttnShape, bs: BlockSelection, pos: usize, seed: u64) -> shaderlm::Result<Check> {
    let mut rng = Rng::new(seed);
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    let nb = s.max_ctx.div_ceil(bs.block_size);
    let q = rng.vec(s.n_tokens * s.n_heads * s.head_dim, AMP);
    let scores = rng.vec(s.n_tokens * s.n_kv * nb, 1.0);
    let (kc, vc) = caches(&mut rng, s, pos + s.n_tokens, AMP);
    let cache_shape = [s.n_kv, s.max_ctx, s.head_dim];
    let kt = GpuTensor::upload_f32(gpu, "k_cache", &cache_shape, &kc)?;
    let vt = GpuTensor::upload_f32(gpu, "v_cache", &cache_shape, &vc)?;
    let mut g = Graph::new();
    let tq = g.input("q", &[s.n_tokens, s.n_heads, s.head_dim], DType::F32);
    let ts = g.input("scores", &[s.n_tokens, s.n_kv, nb], DType::F32);
    let (tk, tv) = (g.external(&kt), g.external(&vt));
    let sel = g.block_topk(ts, bs)?;
    let o = g.attention_sparse(tq, tk, tv, sel, bs.block_size, scale)?;
    g.output(o);
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, tq, bytemuck::cast_slice(&q))?;
    plan.write_input(gpu, ts, bytemuck::cast_slice(&scores))?;
    plan.run(gpu, &StepVars { pos: pos as u32 })?;
    let ids = block_topk::reference(&scores, s.n_tokens, s.n_kv, nb, bs, pos);
    let want = attention_sparse::reference(&q, &kc, &vc, &ids, s, bs.block_size, pos, scale);
    Ok(nmse(&plan.read_f32(o)?, &want, NMSE_MAX))
}

fn bsel(block_size: usize, init_blocks: usize, local_blocks: usize, budget: usize) -> BlockSelection {
    BlockSelection {
        block_size,
        init_blocks,
        local_blocks,
        budget,
    }
}

/// The tree form over a random tree of `s.n_tokens` nodes at `pos` (their K/V side by side from `pos`, NaN past
/// them), each row's selection by block_topk's rule at its position: against `reference_tree` (`bitwise` false), or
/// each row bit for bit against the one-token step at its position over a cache holding its path in order.
fn tree(gpu: &Gpu, s: AttnShape, bs: BlockSelection, pos: usize, seed: u64, bitwise: bool) -> shaderlm::Result<Check> {
    let mut rng = Rng::new(seed);
    let (n, hd, ctx) = (s.n_tokens, s.head_dim, s.max_ctx);
    let scale = 1.0 / (hd as f32).sqrt();
    let paths = random_tree(&mut rng, n);
    let table = tree_table(paths.iter().map(Vec::as_slice))?;
    let positions = block_topk::tree_positions(&table, pos);
    let q = rng.vec(n * s.n_heads * hd, AMP);
    let (kc, vc) = caches(&mut rng, s, pos + n, AMP);
    let nb = ctx.div_ceil(bs.block_size);
    let ids = block_topk::reference_at(&rng.vec(n * s.n_kv * nb, 1.0), s.n_kv, nb, bs, &positions);
    let cache_shape = [s.n_kv, ctx, hd];
    let kt = GpuTensor::upload_f32(gpu, "k_cache", &cache_shape, &kc)?;
    let vt = GpuTensor::upload_f32(gpu, "v_cache", &cache_shape, &vc)?;
    let mut g = Graph::new();
    let tq = g.input("q", &[n, s.n_heads, hd], DType::F32);
    let tsel = g.input("sel", &[n, s.n_kv, bs.budget], DType::U32);
    let tt = g.input("tree", &[n, TREE_W], DType::U32);
    let (tk, tv) = (g.external(&kt), g.external(&vt));
    let o = g.attention_sparse_tree(tq, (tk, tv), tsel, (bs.block_size, scale), tt)?;
    g.output(o);
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, tq, bytemuck::cast_slice(&q))?;
    plan.write_input(gpu, tsel, bytemuck::cast_slice(&ids))?;
    plan.write_input(gpu, tt, bytemuck::cast_slice(&table))?;
    plan.run(gpu, &StepVars { pos: pos as u32 })?;
    let got = plan.read_f32(o)?;
    if !bitwise {
        let want = attention_sparse::reference_tree(&q, (&kc, &vc), &ids, (s, bs.block_size), (pos, &table), scale);
        return Ok(nmse(&got, &want, NMSE_MAX));
    }
    let (row, sel_row) = (s.n_heads * hd, s.n_kv * bs.budget);
    let mut want = Vec::with_capacity(got.len());
    for (r, path) in paths.iter().enumerate() {
        let (k1, v1) = path_caches((&kc, &vc), s, pos, path);
        let kt1 = GpuTensor::upload_f32(gpu, "k_cache", &cache_shape, &k1)?;
        let vt1 = GpuTensor::upload_f32(gpu, "v_cache", &cache_shape, &v1)?;
        let mut g = Graph::new();
        let tq = g.input("q", &[1, s.n_heads, hd], DType::F32);
        let tsel = g.input("sel", &[1, s.n_kv, bs.budget], DType::U32);
        let (tk, tv) = (g.external(&kt1), g.external(&vt1));
        let o1 = g.attention_sparse(tq, tk, tv, tsel, bs.block_size, scale)?;
        g.output(o1);
        let mut one = Plan::new(gpu, g)?;
        one.write_input(gpu, tq, bytemuck::cast_slice(&q[r * row..(r + 1) * row]))?;
        one.write_input(gpu, tsel, bytemuck::cast_slice(&ids[r * sel_row..(r + 1) * sel_row]))?;
        one.run(gpu, &StepVars { pos: positions[r] as u32 })?;
        want.extend(one.read_f32(o1)?.iter().map(|v| v.to_bits()));
    }
    Ok(exact(&got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), &want))
}

pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    // Tree form: (nodes, heads, kv heads, head dim, root position, block size); blocks of 16 so that paths cross
    // block boundaries, 3 local blocks and budget 6 so that the selection drops blocks.
    for (n, h, kv, hd, pos, b) in [(9, 9, 3, 64, 200, 16), (23, 4, 1, 64, 301, 16), (61, 8, 2, 128, 150, 32)] {
        let s = shape(n, h, kv, hd, pos + n + 19);
        for bitwise in [false, true] {
            let what = if bitwise { "rows_equal_one_token_steps" } else { "vs_reference" };
            let name = format!("tree_{what}_n{n}_h{h}_kv{kv}_d{hd}_pos{pos}_b{b}");
            v.push(Case::new("attention_sparse", name, move |gpu| {
                tree(gpu, s, bsel(b, 1, 3, 6), pos, 8500 + n as u64, bitwise)
            }));
        }
    }
    let mut seed = 8000u64;
    // The grid: blocks of 64, 1 init + 2 local + up to 4 scored blocks (budget 8), 19 NaN slots past the step.
    let heads = [(1usize, 1usize), (3, 1), (8, 2), (14, 2), (16, 1), (32, 2)];
    let tokens = [(1usize, 1000usize), (3, 777), (8, 2500), (37, 1200), (130, 250)];
    for (n_heads, n_kv) in heads {
        for head_dim in [64usize, 128] {
            for (n_tokens, pos) in tokens {
                seed += 1;
                let s = shape(n_tokens, n_heads, n_kv, head_dim, pos + n_tokens + 19);
                let name = format!("h{n_heads}_kv{n_kv}_d{head_dim}_t{n_tokens}_pos{pos}");
                v.push(Case::new("attention_sparse", name, move |gpu| {
                    run(gpu, s, Sel::TopK(bsel(64, 1, 2, 8)), pos, AMP, seed)
                }));
            }
        }
    }
    let mut add = |name: String, s: AttnShape, sel: Sel, pos: usize, amp: f32| {
        seed += 1;
        let seed = seed;
        v.push(Case::new("attention_sparse", name, move |gpu| {
            run(gpu, s, sel, pos, amp, seed)
        }));
    };
    // Other head dims: (head_dim, n_tokens, n_heads, n_kv, pos).
    for (d, n, h, kv, pos) in [(32, 2, 8, 2, 700), (80, 5, 6, 2, 333), (96, 40, 12, 4, 900)] {
        let s = shape(n, h, kv, d, pos + n + 19);
        add(format!("head_dim_{d}_t{n}"), s, Sel::TopK(bsel(32, 1, 3, 9)), pos, AMP);
    }
    // Other block sizes (1, not a power of two, longer than a tile): (block, local, budget, n_tokens, pos).
    for (b, local, budget, n, pos) in [(1, 40, 100, 4, 300), (48, 4, 10, 3, 1500), (100, 1, 5, 20, 1700)] {
        let s = shape(n, 8, 2, 64, pos + n + 19);
        add(
            format!("block_size_{b}_t{n}"),
            s,
            Sel::TopK(bsel(b, 1, local, budget)),
            pos,
            AMP,
        );
    }
    // Groups over 16 query heads: 2 row blocks per (token, KV head), the second partial for 24.
    for (n, h, kv, d, pos) in [(3, 32, 1, 64, 1000), (40, 48, 2, 128, 600)] {
        let name = format!("gqa{}_t{n}_two_row_blocks", h / kv);
        add(
            name,
            shape(n, h, kv, d, pos + n + 19),
            Sel::TopK(bsel(32, 1, 3, 9)),
            pos,
            AMP,
        );
    }
    add(
        "large_scores".into(),
        shape(2, 8, 2, 64, 1030),
        Sel::TopK(bsel(16, 1, 4, 20)),
        1000,
        8.0,
    );
    // MiniCPM4's selection: (name, n_tokens, n_heads, head_dim, pos, max_ctx); 2 KV heads.
    let minicpm = Sel::TopK(BlockSelection::infllm_v2(64, 1, 2048, 64));
    // Scaled down for long chunks: window 128 of blocks of 16, topk 8.
    let small = Sel::TopK(BlockSelection::infllm_v2(16, 1, 128, 8));
    let models = [
        ("query_in_first_block", 1, 16, 64, 0, 64, minicpm),
        ("decode_minicpm4_0_5b_32k", 1, 16, 64, 32000, 32768, minicpm),
        ("decode_minicpm4_8b_16k", 1, 32, 128, 16000, 16384, minicpm),
        ("spec8_minicpm4_8b_8k", 8, 32, 128, 8000, 8200, minicpm),
        ("chunk70_from_zero", 70, 16, 64, 0, 100, small),
        ("prefill300_minicpm4_0_5b_like", 300, 16, 64, 2000, 2320, small),
        ("prefill300_gqa4", 300, 8, 128, 900, 1219, small),
    ];
    for (name, n, h, d, pos, ctx, sel) in models {
        add(name.into(), shape(n, h, 2, d, ctx), sel, pos, AMP);
    }
    for n in [2, 20] {
        add(
            format!("empty_selection_t{n}"),
            shape(n, 8, 2, 64, 600),
            Sel::Empty(64, 5),
            500,
            AMP,
        );
    }
    // Every block selected (blocks past each query included, NaN keys there): the dense ops' output.
    // (n_tokens, n_heads, n_kv, head_dim, pos, max_ctx, block)
    let dense = [
        (1, 9, 3, 64, 1000, 1100, 64),
        (5, 8, 2, 128, 300, 333, 64),
        (8, 16, 2, 64, 2000, 2100, 16),
        (130, 14, 2, 64, 100, 260, 64),
        (37, 4, 1, 128, 500, 600, 16),
        (300, 16, 2, 64, 0, 320, 64),
    ];
    for (n, h, kv, d, pos, ctx, b) in dense {
        let name = format!("dense_equal_t{n}_h{h}_kv{kv}_d{d}_b{b}");
        add(name, shape(n, h, kv, d, ctx), Sel::All(b), pos, AMP);
    }
    // One plan across steps; a shrinking context relaunches fewer splits and must ignore the stale partials.
    // Budget 40 gives 10 splits of 4 slots; position 10 fills one.
    let shrinking = [3000usize, 10, 700, 5, 4095, 0, 2047];
    seed += 1;
    let s = shape(1, 16, 2, 64, 4096);
    v.push(Case::new(
        "attention_sparse",
        "decode_steps_shrinking_context",
        move |gpu| steps(gpu, s, bsel(64, 1, 4, 40), &shrinking, seed),
    ));
    seed += 1;
    let s = shape(3, 8, 2, 128, 4096);
    v.push(Case::new(
        "attention_sparse",
        "spec3_steps_shrinking_context",
        move |gpu| steps(gpu, s, bsel(64, 1, 4, 40), &[3000, 7, 700, 4093], seed),
    ));
    // block_topk feeding attention_sparse: (name, n_tokens, pos).
    for (name, n, pos) in [("chained_decode", 1usize, 5000usize), ("chained_prefill", 40, 3000)] {
        seed += 1;
        let s = shape(n, 16, 2, 64, 5100);
        v.push(Case::new("attention_sparse", name, move |gpu| {
            chained(gpu, s, BlockSelection::infllm_v2(64, 1, 512, 16), pos, seed)
        }));
    }
    v
}
