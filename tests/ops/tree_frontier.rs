//! tree_frontier vs CPU: the next frontier's tokens, table rows, scores (bit for bit), parent rows and candidate
//! indices, over random
//! frontiers (1 to 64 rows, 1 to 10 children each, parents up to 13 deep, keep from 1 to 64); ties in score (the
//! lower candidate index first), infinities and NaNs (f32's total order); two rounds chained in one plan (the first
//! round's outputs feed the second), run twice so the second run overwrites the first. The reference itself is
//! checked against what the selection means: every kept child scores at least as well as every child left out, the
//! kept ones in order, and each table row is its parent's path plus its own slot.

use crate::common::{exact, Case, Check, Rng};
use shaderlm::gpu::{DType, Gpu};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::attention_decode::{MAX_TREE_DEPTH, TREE_W};
use shaderlm::ops::tree_frontier::{self, child_score, FrontierValues};

/// One round's inputs: the last frontier's scores and table, each row's candidates (ids, logits) and lse.
#[derive(Clone)]
struct Round {
    scores: Vec<f32>,
    table: Vec<u32>,
    ids: Vec<u32>,
    vals: Vec<f32>,
    lse: Vec<f32>,
    k: usize,
}

fn below(rng: &mut Rng, n: usize) -> usize {
    (rng.next_u64() % n as u64) as usize
}

/// A table row at `depth` with a path of distinct slots ending in `own`.
fn table_row(rng: &mut Rng, depth: usize, own: u32) -> Vec<u32> {
    let mut row = vec![depth as u32, 0];
    row.extend((1..depth).map(|_| 1 + below(rng, 200) as u32));
    if depth > 0 {
        row.push(own);
    }
    row.resize(TREE_W, own);
    row
}

/// A random round of `f` rows with `k` candidates each; `levels` distinct logit values (few: many ties).
fn random_round(rng: &mut Rng, f: usize, k: usize, levels: usize) -> Round {
    let mut table = Vec::new();
    for r in 0..f {
        let depth = below(rng, MAX_TREE_DEPTH);
        table.extend(table_row(rng, depth, 300 + r as u32));
    }
    let level = |rng: &mut Rng| below(rng, levels) as f32 * 0.25 - 3.0;
    Round {
        scores: (0..f).map(|_| level(rng)).collect(),
        table,
        ids: (0..f * k).map(|_| below(rng, 50_000) as u32).collect(),
        vals: (0..f * k).map(|_| level(rng) * 4.0).collect(),
        lse: (0..f).map(|_| level(rng) + 8.0).collect(),
        k,
    }
}

/// The reference against the meaning of the selection (see the module doc); panics with the reason.
fn check_meaning(round: &Round, keep: usize, slot0: usize, next: &FrontierValues) {
    let (k, f) = (round.k, round.scores.len());
    let score = |c: usize| child_score(round.scores[c / k], round.vals[c], round.lse[c / k]);
    // Each kept child's candidate index: its parent row and the position of its token among the row's candidates.
    let kept: Vec<usize> = (0..keep)
        .map(|i| {
            let r = next.parents[i] as usize;
            let j = (0..k).find(|&j| round.ids[r * k + j] == next.ids[i] && score(r * k + j).to_bits() == next.scores[i].to_bits());
            r * k + j.expect("a kept child is one of its parent's candidates")
        })
        .collect();
    assert_eq!(next.chosen, kept.iter().map(|&c| c as u32).collect::<Vec<_>>(), "candidate indices");
    for w in kept.windows(2) {
        let ord = score(w[1]).total_cmp(&score(w[0])).then(w[0].cmp(&w[1]));
        assert!(ord.is_le() && w[0] != w[1], "kept children in order, each once");
    }
    let worst = kept[keep - 1];
    for c in (0..f * k).filter(|c| !kept.contains(c)) {
        let ord = score(c).total_cmp(&score(worst)).then(worst.cmp(&c));
        assert!(ord.is_lt(), "candidate {c} left out but better than a kept one");
    }
    for (i, &c) in kept.iter().enumerate() {
        let r = c / k;
        let d = round.table[r * TREE_W] as usize;
        let row = &next.table[i * TREE_W..(i + 1) * TREE_W];
        assert_eq!(row[0] as usize, d + 1, "depth");
        assert_eq!(&row[1..d + 2], &round.table[r * TREE_W + 1..r * TREE_W + d + 2], "the parent's path");
        assert!(row[d + 2..].iter().all(|&s| s as usize == slot0 + i), "own slot");
    }
}

/// Run rounds through one plan: round 0 from the given frontier; each later round from the previous round's
/// outputs and its own candidates (their row count must be the previous keep). Device against the reference chain.
fn run(gpu: &Gpu, rounds: &[Round], keeps: &[usize], slot0: usize, repeats: usize) -> shaderlm::Result<Check> {
    let mut g = Graph::new();
    let f0 = rounds[0].scores.len();
    let mut scores = g.input("scores", &[f0], DType::F32);
    let mut table = g.input("table", &[f0, TREE_W], DType::U32);
    let (s0, t0) = (scores, table);
    let mut inputs = Vec::new();
    let mut outs = Vec::new();
    let mut slot = slot0;
    for (j, (round, &keep)) in rounds.iter().zip(keeps).enumerate() {
        let f = round.scores.len();
        let ids = g.input(&format!("ids{j}"), &[f, round.k], DType::U32);
        let vals = g.input(&format!("vals{j}"), &[f, round.k], DType::F32);
        let lse = g.input(&format!("lse{j}"), &[f, 1], DType::F32);
        let next = g.tree_frontier((scores, table), (ids, vals, lse), keep, slot)?;
        for t in [next.ids, next.table, next.scores, next.parents, next.chosen] {
            g.output(t);
        }
        inputs.push((ids, vals, lse));
        outs.push(next);
        (scores, table) = (next.scores, next.table);
        slot += keep;
    }
    let mut plan = Plan::new(gpu, g)?;
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for rep in 0..repeats {
        // A later run gets other candidates for the first round, so stale outputs would show.
        let mut first = rounds[0].clone();
        first.vals.iter_mut().for_each(|v| *v -= rep as f32);
        first.vals.rotate_left(rep);
        let rounds: Vec<Round> = std::iter::once(first).chain(rounds[1..].iter().cloned()).collect();
        plan.write_input(gpu, s0, bytemuck::cast_slice(&rounds[0].scores))?;
        plan.write_input(gpu, t0, bytemuck::cast_slice(&rounds[0].table))?;
        for (round, &(ids, vals, lse)) in rounds.iter().zip(&inputs) {
            plan.write_input(gpu, ids, bytemuck::cast_slice(&round.ids))?;
            plan.write_input(gpu, vals, bytemuck::cast_slice(&round.vals))?;
            plan.write_input(gpu, lse, bytemuck::cast_slice(&round.lse))?;
        }
        plan.run(gpu, &StepVars::default())?;
        let (mut scores, mut table) = (rounds[0].scores.clone(), rounds[0].table.clone());
        let mut slot = slot0;
        for ((round, &keep), next) in rounds.iter().zip(keeps).zip(&outs) {
            let r = Round {
                scores,
                table,
                ..round.clone()
            };
            let w = tree_frontier::reference((&r.scores, &r.table), (&r.ids, &r.vals, &r.lse), keep, slot);
            check_meaning(&r, keep, slot, &w);
            got.extend(plan.read_u32(next.ids)?);
            got.extend(plan.read_u32(next.table)?);
            got.extend(plan.read_f32(next.scores)?.iter().map(|v| v.to_bits()));
            got.extend(plan.read_u32(next.parents)?);
            got.extend(plan.read_u32(next.chosen)?);
            want.extend(&w.ids);
            want.extend(&w.table);
            want.extend(w.scores.iter().map(|v| v.to_bits()));
            want.extend(&w.parents);
            want.extend(&w.chosen);
            (scores, table) = (w.scores, w.table);
            slot += keep;
        }
    }
    Ok(exact(&got, &want))
}

pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    // (rows, children, keep, distinct values, seed): EAGLE-2's shapes (the root's 10 children; 10 x 10 -> 10), the
    // most rows and keep, one child each, and few values (many ties).
    let grid = [(1, 10, 10, 1000, 1), (10, 10, 10, 1000, 2), (10, 10, 10, 3, 3), (64, 1, 64, 1000, 4), (4, 4, 16, 2, 5), (64, 10, 64, 5, 6), (7, 3, 1, 1000, 7)];
    for (f, k, keep, levels, seed) in grid {
        v.push(Case::new("tree_frontier", format!("random_f{f}_k{k}_keep{keep}_levels{levels}"), move |gpu| {
            let round = random_round(&mut Rng::new(seed), f, k, levels);
            run(gpu, &[round], &[keep], 1 + seed as usize, 2)
        }));
    }
    v.push(Case::new("tree_frontier", "infinities_and_nans_in_total_order", |gpu| {
        let mut round = random_round(&mut Rng::new(8), 3, 4, 1000);
        round.vals[1] = f32::INFINITY;
        round.vals[2] = f32::NEG_INFINITY;
        round.vals[5] = f32::NAN;
        round.vals[6] = -f32::NAN;
        round.lse[2] = f32::INFINITY;
        run(gpu, &[round], &[12], 1, 1)
    }));
    v.push(Case::new("tree_frontier", "three_rounds_chained_from_the_root", |gpu| {
        // The root (one row, depth 0, slot 0, score 0) -> 10 children -> 10 of 100 -> 10 of 100.
        let mut rng = Rng::new(9);
        let mut root = random_round(&mut rng, 1, 10, 1000);
        root.scores = vec![0.0];
        root.table = vec![0; TREE_W];
        let rounds = [root, random_round(&mut rng, 10, 10, 1000), random_round(&mut rng, 10, 10, 7)];
        run(gpu, &rounds, &[10, 10, 10], 1, 2)
    }));
    v.push(Case::new("tree_frontier", "bad_shapes_refused", |_| {
        let mut g = Graph::new();
        let s = g.input("scores", &[4], DType::F32);
        let t = g.input("table", &[4, TREE_W], DType::U32);
        let ids = g.input("ids", &[4, 3], DType::U32);
        let vals = g.input("vals", &[4, 3], DType::F32);
        let lse = g.input("lse", &[4], DType::F32);
        let short = g.input("short", &[4, TREE_W - 1], DType::U32);
        let u = g.input("u", &[4], DType::U32);
        let errors = [
            g.tree_frontier((s, short), (ids, vals, lse), 4, 1).is_err(),
            g.tree_frontier((u, t), (ids, vals, lse), 4, 1).is_err(),
            g.tree_frontier((s, t), (ids, vals, lse), 13, 1).is_err(),
            g.tree_frontier((s, t), (ids, vals, lse), 0, 1).is_err(),
            g.tree_frontier((s, t), (vals, ids, lse), 4, 1).is_err(),
            g.tree_frontier((s, t), (ids, vals, lse), 12, 1).is_err(),
        ];
        Ok(exact(&errors, &[true, true, true, true, true, false]))
    }));
    v
}
