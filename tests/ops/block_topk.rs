//! block_topk vs the CPU reference (the selection rule written out: forced blocks, then a stable sort of the
//! candidates by score descending, ties to the lower id): exact. The kernel only compares keys and copies ids, so
//! the index lists must match slot for slot, padding included. Every case runs both kernels: `serial/` (the CPU
//! adapters' default) and `workgroup/` (the GPUs').
//!
//! Cases: random scores (few ties), scores from a handful of levels (many ties, so the lower-id rule decides),
//! all-equal scores, NaN / +-inf / +-0 / subnormals, a query in the first block, queries whose blocks are all
//! forced, nb that is not a multiple of the workgroup or of anything, chunks of up to 300 tokens spanning many
//! query blocks, a budget above the blocks available, a position past the cache (query block clamped), the
//! MiniCPM4 configuration at 32K and 128K, and one plan reused across decode steps.

use crate::attention_decode::random_tree;
use crate::common::{exact, Case, Check, Rng};
use shaderlm::ops::attention_decode::{tree_table, TREE_W};
use shaderlm::gpu::{DType, Gpu};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::block_topk::{self, BlockSelection, TopkVariant};

/// How a case's scores are drawn.
#[derive(Clone, Copy, Debug)]
enum Scores {
    /// Uniform in [-1, 1) (2^24 levels: ties are rare).
    Random,
    /// One of `n` levels: many ties.
    Levels(u32),
    /// Every score the same.
    Constant,
    /// Mostly random, with NaN, +-inf, +-0 and subnormals mixed in.
    Specials,
    /// Mostly +0 and -0 (which must tie), some NaN (below -inf), -inf and 1.
    Zeros,
}

fn scores(rng: &mut Rng, n: usize, kind: Scores) -> Vec<f32> {
    const SPECIALS: [f32; 8] = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1e-40,
        -1e-40,
        f32::MIN_POSITIVE,
    ];
    (0..n)
        .map(|_| match kind {
            Scores::Random => rng.f32(),
            Scores::Levels(l) => rng.below(l) as f32 * 0.25,
            Scores::Constant => 0.5,
            Scores::Specials => match rng.below(3) {
                0 => SPECIALS[rng.below(SPECIALS.len() as u32) as usize],
                _ => rng.f32(),
            },
            Scores::Zeros => [
                1.0,
                0.0,
                0.0,
                0.0,
                0.0,
                0.0,
                0.0,
                -0.0,
                -0.0,
                -0.0,
                -0.0,
                -0.0,
                -0.0,
                f32::NAN,
                f32::NAN,
            ]
            .get(rng.below(16) as usize)
            .copied()
            .unwrap_or(f32::NEG_INFINITY),
        })
        .collect()
}

#[derive(Clone, Copy)]
struct Shape {
    n_tokens: usize,
    n_kv: usize,
    nb: usize,
}

/// One plan, run at each of `positions` with fresh scores; the worst step's mismatches.
fn run(gpu: &Gpu, sh: &Shape, s: BlockSelection, v: TopkVariant, positions: &[usize], kind: Scores, seed: u64) -> R {
    let mut rng = Rng::new(seed);
    let mut g = Graph::new();
    let ts = g.input("scores", &[sh.n_tokens, sh.n_kv, sh.nb], DType::F32);
    let sel = g.block_topk_variant(ts, s, v)?;
    g.output(sel);
    let mut plan = Plan::new(gpu, g)?;
    let mut worst = exact::<u32>(&[], &[]);
    for &pos in positions {
        let x = scores(&mut rng, sh.n_tokens * sh.n_kv * sh.nb, kind);
        plan.write_input(gpu, ts, bytemuck::cast_slice(&x))?;
        plan.run(gpu, &StepVars { pos: pos as u32 })?;
        let want = block_topk::reference(&x, sh.n_tokens, sh.n_kv, sh.nb, s, pos);
        let check = exact(&plan.read_u32(sel)?, &want);
        if !check.passed() {
            worst = check;
        }
    }
    Ok(worst)
}

type R = shaderlm::Result<Check>;

/// The tree form: a random tree of `sh.n_tokens` nodes at `pos`, token t at `pos` + its depth, against the
/// reference at those positions.
fn tree(gpu: &Gpu, sh: &Shape, s: BlockSelection, v: TopkVariant, pos: usize, seed: u64) -> R {
    let mut rng = Rng::new(seed);
    let paths = random_tree(&mut rng, sh.n_tokens);
    let table = tree_table(paths.iter().map(Vec::as_slice))?;
    let mut g = Graph::new();
    let ts = g.input("scores", &[sh.n_tokens, sh.n_kv, sh.nb], DType::F32);
    let tt = g.input("tree", &[sh.n_tokens, TREE_W], DType::U32);
    let sel = g.block_topk_tree_variant(ts, s, tt, v)?;
    g.output(sel);
    let mut plan = Plan::new(gpu, g)?;
    let x = scores(&mut rng, sh.n_tokens * sh.n_kv * sh.nb, Scores::Levels(4));
    plan.write_input(gpu, ts, bytemuck::cast_slice(&x))?;
    plan.write_input(gpu, tt, bytemuck::cast_slice(&table))?;
    plan.run(gpu, &StepVars { pos: pos as u32 })?;
    let positions = block_topk::tree_positions(&table, pos);
    assert!(positions.iter().any(|&p| p / s.block_size != pos / s.block_size), "the tree crosses a block");
    let want = block_topk::reference_at(&x, sh.n_kv, sh.nb, s, &positions);
    Ok(exact(&plan.read_u32(sel)?, &want))
}

/// The case on both kernels: `serial/name` (CPU adapters' default) and `workgroup/name` (GPUs').
fn both(v: &mut Vec<Case>, name: &str, sh: Shape, s: BlockSelection, positions: &[usize], kind: Scores, seed: u64) {
    for (prefix, variant) in [("serial", TopkVariant::Serial), ("workgroup", TopkVariant::Workgroup)] {
        let positions = positions.to_vec();
        v.push(Case::new("block_topk", format!("{prefix}/{name}"), move |gpu| {
            run(gpu, &sh, s, variant, &positions, kind, seed)
        }));
    }
}

fn selection(block_size: usize, init_blocks: usize, local_blocks: usize, budget: usize) -> BlockSelection {
    BlockSelection {
        block_size,
        init_blocks,
        local_blocks,
        budget,
    }
}

/// (name, n_tokens, n_kv, nb, selection, positions, scores)
type Named = (
    &'static str,
    usize,
    usize,
    usize,
    BlockSelection,
    &'static [usize],
    Scores,
);

pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    // Tree form on both kernels: trees whose rows straddle a block boundary (blocks of 16, the root 2 keys before one).
    for (n, n_kv, nb) in [(23usize, 2usize, 40usize), (61, 1, 97)] {
        for (prefix, variant) in [("serial", TopkVariant::Serial), ("workgroup", TopkVariant::Workgroup)] {
            let sh = Shape { n_tokens: n, n_kv, nb };
            let s = selection(16, 1, 2, 8);
            let pos = (nb - 3) * 16 - 2;
            v.push(Case::new("block_topk", format!("{prefix}/tree_n{n}_kv{n_kv}_nb{nb}"), move |gpu| {
                tree(gpu, &sh, s, variant, pos, 8100 + n as u64)
            }));
        }
    }
    let mut seed = 7000u64;
    // The grid: nb (not multiples of 64 or of anything but 512 and 2048), selections from a small one to MiniCPM4's,
    // one decode token and small chunks, the last token's block near the end of the scores.
    let sels = [
        ("b16_i1_l2_k8", selection(16, 1, 2, 8)),
        ("b64_i2_l3_k13", selection(64, 2, 3, 13)),
        ("minicpm4", BlockSelection::infllm_v2(64, 1, 2048, 64)),
    ];
    for nb in [1usize, 7, 97, 131, 512, 509, 2048] {
        for (sname, s) in sels {
            for (n_tokens, n_kv) in [(1usize, 2usize), (3, 1), (8, 2)] {
                for kind in [Scores::Random, Scores::Levels(4)] {
                    seed += 1;
                    // The last token sits in the last block, 5 keys into it.
                    let pos = ((nb - 1) * s.block_size + 5).saturating_sub(n_tokens - 1);
                    let name = format!("nb{nb}_{sname}_t{n_tokens}_kv{n_kv}_{kind:?}");
                    let sh = Shape { n_tokens, n_kv, nb };
                    both(&mut v, &name, sh, s, &[pos], kind, seed);
                }
            }
        }
    }
    use Scores::{Constant, Levels, Random, Specials, Zeros};
    let m = BlockSelection::infllm_v2(64, 1, 2048, 64);
    let over = selection(16, 1, 4, 200);
    let past = selection(64, 1, 3, 9);
    let plain = selection(32, 0, 0, 17);
    let init40 = selection(16, 40, 2, 50);
    let chunk = selection(16, 1, 3, 12);
    const STEPS: &[usize] = &[0, 1, 64, 2200, 2240, 32767, 100, 5000];
    let named: [Named; 16] = [
        // qb = 0: only block 0, the rest padding.
        ("query_in_first_block", 1, 2, 512, m, &[0, 63], Random),
        // qb < init + local: every block 0 ..= qb is forced, scores ignored.
        ("all_forced_qb20", 2, 2, 512, m, &[20 * 64 + 3], Random),
        ("all_forced_qb33", 1, 2, 512, m, &[33 * 64], Random),
        // The first query block with a candidate (qb = 34: block 1, room 62).
        ("first_candidate", 1, 2, 512, m, &[34 * 64 + 10], Random),
        ("ties_levels2", 4, 2, 512, m, &[300 * 64 + 1], Levels(2)),
        ("ties_all_equal", 2, 2, 512, m, &[511 * 64 + 63], Constant),
        ("nan_inf_zero_subnormal", 3, 2, 509, m, &[508 * 64], Specials),
        // The cut falls among the zeros: +0 and -0 tie, so the lower ids win whatever their signs.
        ("signed_zeros_tie", 2, 2, 512, m, &[511 * 64], Zeros),
        // 66 candidates for 62 slots: the ones left out are NaN, never -inf.
        ("nan_below_neg_inf", 4, 2, 100, m, &[99 * 64 + 7], Zeros),
        // Budget larger than the blocks there are: everything up to qb, then padding.
        ("budget_over_available", 3, 1, 50, over, &[49 * 16 + 2], Random),
        // Positions past the cache: the query block is clamped to nb - 1.
        ("position_past_cache", 2, 2, 40, past, &[40 * 64 + 500], Random),
        // No init or local blocks beyond the query's own: a plain top-k below qb.
        ("no_init_no_local", 2, 3, 300, plain, &[299 * 32], Levels(8)),
        // More init blocks than blocks before the query.
        ("init_past_query", 2, 2, 100, init40, &[30 * 16], Random),
        // A chunk of 300 tokens over 19 query blocks (block 16), then one over 5 blocks of 64.
        ("chunk300_many_query_blocks", 300, 2, 97, chunk, &[1200], Levels(16)),
        ("chunk300_minicpm", 300, 2, 512, m, &[32768 - 300], Random),
        // One plan across decode steps (params re-read each run), including a jump back to a short context.
        ("decode_steps_reuse_plan", 1, 2, 512, m, STEPS, Random),
    ];
    for (name, n_tokens, n_kv, nb, s, positions, kind) in named {
        seed += 1;
        let sh = Shape { n_tokens, n_kv, nb };
        both(&mut v, name, sh, s, positions, kind, seed);
    }
    // A budget that cannot hold the forced blocks is refused when the graph is built.
    v.push(Case::new("block_topk", "rejects_budget_below_forced", |_| {
        let mut g = Graph::new();
        let ts = g.input("scores", &[1, 2, 64], DType::F32);
        let refused = g.block_topk(ts, selection(64, 1, 32, 33)).is_err();
        Ok(exact(&[refused], &[true]))
    }));
    // Rule checks on the reference itself (the GPU cases compare against it): forced counts and the tie rule.
    v.push(Case::new("block_topk", "reference_rule", |_| {
        let s = selection(1, 1, 2, 5);
        // 10 blocks of 1 key, query at position 9 (qb 9): forced 0 and 7, 8, 9; candidates 1 ..= 6 with scores
        // 0.5, 0.9, 0.9, 0.1, 0.9, 0.2: one slot left, the highest score at the lowest id is block 2.
        let row = [9.0, 0.5, 0.9, 0.9, 0.1, 0.9, 0.2, -1.0, -1.0, -1.0];
        let got = block_topk::reference(&row, 1, 1, 10, s, 9);
        Ok(exact(&got, &[0, 2, 7, 8, 9]))
    }));
    v
}
