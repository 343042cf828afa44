//! tree_select vs CPU: rounds of candidates gathered into the list bit for bit and the draft tree reranked from it
//! (tokens and table rows), over draft-shaped rounds chained through `tree_frontier` as a draft tree grows them
//! (EAGLE-2's (6,10,60), (2,10,12), (3,4,16), ties), and over lists written directly: random scores (children
//! better than their parents: orphans dropped, padding rows), infinities and NaNs, a chain deeper than a tree
//! holds, size 1 and 63. Each run twice, other values the second time. The reference itself is checked against
//! what the rerank means: the nodes are the kept candidates whose ancestors were all kept, parents first, the
//! spine first, and each table row is its parent's path plus its own slot.

use crate::common::{exact, Case, Check, Rng};
use shaderlm::gpu::{DType, Gpu};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::attention_decode::{MAX_TREE_DEPTH, TREE_W};
use shaderlm::ops::tree_frontier;
use shaderlm::ops::tree_select::{self, Selected, CAND_W, ROOT};

/// The reference against the meaning of the rerank (see the module doc); panics with the reason.
fn check_meaning(cands: &[u32], size: usize, s: &Selected) {
    let nc = cands.len() / CAND_W;
    let score = |c: usize| f32::from_bits(cands[c * CAND_W]);
    let parent = |c: usize| cands[c * CAND_W + 2];
    let better = |a: usize, b: usize| score(a).total_cmp(&score(b)).then(b.cmp(&a)).is_gt();
    // The top `size`, then only those whose every ancestor is among them.
    let top: Vec<usize> = (0..nc).filter(|&c| (0..nc).filter(|&o| better(o, c)).count() < size).collect();
    let rooted = |mut c: usize| loop {
        if !top.contains(&c) {
            return false;
        }
        match parent(c) {
            ROOT => return true,
            p if (p as usize) < c => c = p as usize,
            _ => return false,
        }
    };
    let mut want: Vec<usize> = top.iter().copied().filter(|&c| rooted(c)).collect();
    let depth_of = |mut c: usize| {
        let mut d = 1;
        while parent(c) != ROOT {
            c = parent(c) as usize;
            d += 1;
        }
        d
    };
    want.retain(|&c| depth_of(c) <= MAX_TREE_DEPTH);
    let mut got = s.cands.clone();
    got.sort();
    assert_eq!(got, want, "the nodes are the kept, rooted candidates");
    let mut spine = true;
    for (i, &c) in s.cands.iter().enumerate() {
        let pn = s.parents[i];
        assert!(pn <= i, "parents before children");
        let want_parent = if pn == 0 { ROOT } else { s.cands[pn - 1] as u32 };
        assert_eq!(parent(c), want_parent, "node {} under its candidate's parent", i + 1);
        // Spine nodes: each the best kept child of the one before.
        if spine && pn == i {
            let best = s.cands.iter().filter(|&&o| parent(o) == want_parent).all(|&o| o == c || better(c, o));
            assert!(best, "spine node {} is its parent's best child", i + 1);
        } else {
            spine = false;
        }
        let m = i + 1;
        let row = &s.table[m * TREE_W..(m + 1) * TREE_W];
        let d = s.table[pn * TREE_W] as usize;
        assert_eq!(row[0] as usize, d + 1, "depth");
        assert_eq!(&row[1..d + 2], &s.table[pn * TREE_W + 1..pn * TREE_W + d + 2], "the parent's path");
        assert!(row[d + 2..].iter().all(|&x| x as usize == m), "own slot");
        assert_eq!(s.ids[i], cands[c * CAND_W + 1], "token");
    }
    assert_eq!(s.table.len(), (size + 1) * TREE_W);
}

/// Device against reference for a list written directly, `repeats` runs with other scores each time.
fn run_list(gpu: &Gpu, cands: &[u32], size: usize, repeats: usize) -> shaderlm::Result<Check> {
    let nc = cands.len() / CAND_W;
    let mut g = Graph::new();
    let list = g.input("cands", &[nc, CAND_W], DType::U32);
    let (ids, table) = g.tree_select(list, size)?;
    g.output(ids);
    g.output(table);
    let mut plan = Plan::new(gpu, g)?;
    let (mut got, mut want) = (Vec::new(), Vec::new());
    let mut cands = cands.to_vec();
    for rep in 0..repeats {
        if rep > 0 {
            // Another ranking: scores rotated among the rows.
            let scores: Vec<u32> = (0..nc).map(|c| cands[((c + rep) % nc) * CAND_W]).collect();
            for (c, s) in scores.into_iter().enumerate() {
                cands[c * CAND_W] = s;
            }
        }
        plan.write_input(gpu, list, bytemuck::cast_slice(&cands))?;
        plan.run(gpu, &StepVars::default())?;
        let s = tree_select::reference(&cands, size);
        check_meaning(&cands, size, &s);
        got.extend(plan.read_u32(ids)?);
        got.extend(plan.read_u32(table)?);
        want.extend(&s.ids);
        want.extend(&s.table);
    }
    Ok(exact(&got, &want))
}

/// A list of `nc` candidates, each under ROOT or an earlier row (`p_root` of them under ROOT), scores from
/// `levels` values (few: many ties).
fn random_list(rng: &mut Rng, nc: usize, levels: u32, p_root: f32) -> Vec<u32> {
    (0..nc)
        .flat_map(|c| {
            let score = rng.below(levels) as f32 * -0.5;
            let parent = if c == 0 || rng.unit() < p_root { ROOT } else { rng.below(c as u32) };
            [score.to_bits(), rng.below(50_000), parent]
        })
        .collect()
}

/// A draft tree's rounds as `Llama::tree_draft` chains them: the root's `k` children, then `depth - 1` rounds of
/// `tree_frontier` keeping `k` and their `k` children each, every round collected; then the rerank to `size`.
fn run_rounds(gpu: &Gpu, (depth, k, size): (usize, usize, usize), levels: u32, seed: u64) -> shaderlm::Result<Check> {
    let nc = k + (depth - 1) * k * k;
    let mut g = Graph::new();
    let list = g.uninit("cands", &[nc, CAND_W], DType::U32);
    let root_score = g.input("root_score", &[1], DType::F32);
    let root_table = g.input("root_table", &[1, TREE_W], DType::U32);
    let root_chosen = g.input("root_chosen", &[1], DType::U32);
    let mut inputs = Vec::new();
    let (mut scores, mut table, mut chosen) = (root_score, root_table, root_chosen);
    let (mut offset, mut parent_base) = (0, None);
    for j in 0..depth {
        let f = if j == 0 { 1 } else { k };
        let ids = g.input(&format!("ids{j}"), &[f, k], DType::U32);
        let vals = g.input(&format!("vals{j}"), &[f, k], DType::F32);
        let lse = g.input(&format!("lse{j}"), &[f], DType::F32);
        g.tree_select_collect(list, (scores, chosen), (ids, vals, lse), offset, parent_base)?;
        inputs.push((ids, vals, lse));
        if j + 1 < depth {
            let fr = g.tree_frontier((scores, table), (ids, vals, lse), k, 1 + j * k)?;
            (scores, table, chosen) = (fr.scores, fr.table, fr.chosen);
            parent_base = Some(offset);
            offset += f * k;
        }
    }
    let (ids, tree_table) = g.tree_select(list, size)?;
    g.output(ids);
    g.output(tree_table);
    g.output(list);
    let mut plan = Plan::new(gpu, g)?;
    let mut rng = Rng::new(seed);
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        plan.write_input(gpu, root_score, bytemuck::bytes_of(&0f32))?;
        plan.write_input(gpu, root_table, bytemuck::cast_slice(&[0u32; TREE_W]))?;
        plan.write_input(gpu, root_chosen, bytemuck::bytes_of(&0u32))?;
        // The host's side: the same rounds through tree_frontier's and tree_select's references.
        let mut cands = vec![0u32; nc * CAND_W];
        let (mut scores, mut table, mut chosen) = (vec![0f32], vec![0u32; TREE_W], vec![0u32]);
        let (mut offset, mut parent_base) = (0, ROOT);
        for (j, &(ids, vals, lse)) in inputs.iter().enumerate() {
            let f = scores.len();
            // Logits from few levels (ties), best first as topk gives them; lse above them all.
            let mut v: Vec<f32> = (0..f * k).map(|_| rng.below(levels) as f32 * -0.25).collect();
            v.chunks_mut(k).for_each(|row| row.sort_by(|a, b| b.total_cmp(a)));
            let l: Vec<f32> = (0..f).map(|_| 1.0 + rng.below(4) as f32 * 0.5).collect();
            let t: Vec<u32> = (0..f * k).map(|_| rng.below(50_000)).collect();
            plan.write_input(gpu, ids, bytemuck::cast_slice(&t))?;
            plan.write_input(gpu, vals, bytemuck::cast_slice(&v))?;
            plan.write_input(gpu, lse, bytemuck::cast_slice(&l))?;
            tree_select::collect_reference(&mut cands, (&scores, &chosen), (&t, &v, &l), offset, parent_base);
            if j + 1 < depth {
                let fr = tree_frontier::reference((&scores, &table), (&t, &v, &l), k, 1 + j * k);
                (scores, table, chosen) = (fr.scores, fr.table, fr.chosen);
                parent_base = offset as u32;
                offset += f * k;
            }
        }
        plan.run(gpu, &StepVars::default())?;
        let s = tree_select::reference(&cands, size);
        check_meaning(&cands, size, &s);
        assert_eq!(s.cands.len(), size, "a draft's children never beat their parents: no orphans");
        got.extend(plan.read_u32(list)?);
        got.extend(plan.read_u32(ids)?);
        got.extend(plan.read_u32(tree_table)?);
        want.extend(&cands);
        want.extend(&s.ids);
        want.extend(&s.table);
    }
    Ok(exact(&got, &want))
}

pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    // (depth, top-k, size, distinct logits): the shapes; few values make ties.
    for (shape, levels, seed) in [((6, 10, 60), 1000, 1), ((2, 10, 12), 1000, 2), ((3, 4, 16), 3, 3), ((6, 10, 60), 4, 4)] {
        let (d, k, n) = shape;
        v.push(Case::new("tree_select", format!("rounds_d{d}_k{k}_size{n}_levels{levels}"), move |gpu| {
            run_rounds(gpu, shape, levels, seed)
        }));
    }
    // (candidates, size, distinct scores, share under the root).
    for (nc, size, levels, p_root, seed) in [(40, 12, 1000, 0.2, 5), (200, 63, 6, 0.1, 6), (63, 63, 1000, 0.5, 7), (9, 1, 3, 0.3, 8), (500, 30, 1000, 0.02, 9)] {
        v.push(Case::new("tree_select", format!("list_{nc}_size{size}_levels{levels}"), move |gpu| {
            run_list(gpu, &random_list(&mut Rng::new(seed), nc, levels, p_root), size, 2)
        }));
    }
    v.push(Case::new("tree_select", "infinities_and_nans_in_total_order", |gpu| {
        let mut cands = random_list(&mut Rng::new(10), 30, 1000, 0.3);
        for (c, x) in [(2, f32::INFINITY), (5, f32::NEG_INFINITY), (7, f32::NAN), (11, -f32::NAN), (13, f32::NAN)] {
            cands[c * CAND_W] = x.to_bits();
        }
        run_list(gpu, &cands, 20, 1)
    }));
    v.push(Case::new("tree_select", "a_chain_deeper_than_a_tree", |gpu| {
        // Candidate c under c - 1, scores falling: a spine of 20 nodes, cut at MAX_TREE_DEPTH.
        let cands: Vec<u32> = (0..20u32)
            .flat_map(|c| [(-(c as f32)).to_bits(), 100 + c, if c == 0 { ROOT } else { c - 1 }])
            .collect();
        run_list(gpu, &cands, 20, 1)
    }));
    v.push(Case::new("tree_select", "bad_shapes_refused", |_| {
        let mut g = Graph::new();
        let list = g.uninit("cands", &[20, CAND_W], DType::U32);
        let wide = g.input("wide", &[20, CAND_W + 1], DType::U32);
        let s = g.input("scores", &[2], DType::F32);
        let c = g.input("chosen", &[2], DType::U32);
        let ids = g.input("ids", &[2, 4], DType::U32);
        let vals = g.input("vals", &[2, 4], DType::F32);
        let lse = g.input("lse", &[2], DType::F32);
        let errors = [
            g.tree_select(wide, 4).is_err(),
            g.tree_select(list, 0).is_err(),
            g.tree_select(list, 21).is_err(),
            g.tree_select_collect(list, (s, c), (ids, vals, lse), 13, Some(0)).is_err(),
            g.tree_select_collect(list, (s, c), (ids, vals, lse), 8, Some(8)).is_err(),
            g.tree_select_collect(list, (c, s), (ids, vals, lse), 8, Some(0)).is_err(),
            g.tree_select_collect(list, (s, c), (ids, vals, lse), 12, Some(4)).is_err(),
            g.tree_select(list, 20).is_err(),
        ];
        Ok(exact(&errors, &[true, true, true, true, true, true, false, false]))
    }));
    v
}
