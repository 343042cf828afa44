//! tree_accept vs CPU: the path and the move list exactly, for chains, branching trees (the path through a later
//! sibling, so its K/V must move), duplicate siblings (the lowest row wins), no match at the root, and random trees
//! of up to 64 rows and 14 deep. The reference path is also checked against the host's own walk
//! (`DraftTree::child`, what speculative decoding does without this op), and one plan runs twice so the second,
//! shorter path must overwrite the first.

use crate::common::{exact, Case, Check, Rng};
use shaderlm::generate::tree::DraftTree;
use shaderlm::gpu::{DType, Gpu};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::attention_decode::{MAX_TREE_DEPTH, TREE_W};
use shaderlm::ops::tree_accept;

/// A tree (row 0 the root) and each row's choice.
struct Tree {
    tree: DraftTree,
    choice: Vec<u32>,
}

/// The host's walk: from the root, the child `DraftTree::child` finds for each row's choice.
fn host_path(t: &Tree) -> Vec<u32> {
    let mut path = vec![0u32];
    let mut node = 0;
    while let Some(c) = t.tree.child(node, t.choice[node]) {
        path.push(c as u32);
        node = c;
    }
    path
}

/// Run the op over each tree in turn (one plan per row count) at `pos`; device and reference outputs must agree,
/// and the reference path must be the host walk's.
fn run(gpu: &Gpu, trees: &[Tree], pos: u32) -> shaderlm::Result<Check> {
    let n = trees[0].tree.len();
    let mut g = Graph::new();
    let ids = g.input("ids", &[n], DType::U32);
    let table = g.input("table", &[n, TREE_W], DType::U32);
    let choice = g.input("choice", &[n, 1], DType::U32);
    let (path, moves) = g.tree_accept(ids, table, choice)?;
    g.output(path);
    g.output(moves);
    let mut plan = Plan::new(gpu, g)?;
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for t in trees {
        let tab = t.tree.table()?;
        plan.write_input(gpu, ids, bytemuck::cast_slice(&t.tree.tokens))?;
        plan.write_input(gpu, table, bytemuck::cast_slice(&tab))?;
        plan.write_input(gpu, choice, bytemuck::cast_slice(&t.choice))?;
        plan.run(gpu, &StepVars { pos })?;
        got.extend(plan.read_u32(path)?);
        got.extend(plan.read_u32(moves)?);
        let (p, m) = tree_accept::reference(&t.tree.tokens, &tab, &t.choice, pos);
        let host = host_path(t);
        assert_eq!(&p[1..=host.len()], host.as_slice(), "reference path against the host walk");
        assert_eq!(p[0] as usize, host.len());
        // The moves put path row k (slot = row index) at pos + k.
        let expected: Vec<(u32, u32)> =
            host.iter().enumerate().filter(|&(k, &r)| r as usize != k).map(|(k, &r)| (pos + r, pos + k as u32)).collect();
        let listed: Vec<(u32, u32)> = (0..m[0] as usize).map(|i| (m[1 + 2 * i], m[2 + 2 * i])).collect();
        assert_eq!(listed, expected, "reference moves");
        want.extend(p);
        want.extend(m);
    }
    Ok(exact(&got, &want))
}

/// A chain of `len` drafts below the root whose first `keep` rows choose the next draft (the rest choose a token
/// no row holds).
fn chain(len: usize, keep: usize) -> Tree {
    let mut tree = DraftTree::default();
    tree.reset(100);
    let mut node = 0;
    for i in 0..len {
        node = tree.push(node, 200 + i as u32);
    }
    let choice = (0..=len).map(|i| if i < keep { 200 + i as u32 } else { 7 }).collect();
    Tree { tree, choice }
}

/// A number in 0..n.
fn below(rng: &mut Rng, n: usize) -> usize {
    (rng.next_u64() % n as u64) as usize
}

/// A random tree of `n` rows, each row's parent one of the earlier rows not at the deepest depth; tokens from a
/// small vocabulary so that choices often match children, siblings with equal tokens included.
fn random(rng: &mut Rng, n: usize, vocab: u32) -> Tree {
    let mut tree = DraftTree::default();
    tree.reset(0);
    let mut depth = vec![0usize];
    while tree.len() < n {
        let parent = below(rng, tree.len());
        if depth[parent] == MAX_TREE_DEPTH {
            continue;
        }
        tree.push(parent, below(rng, vocab as usize) as u32);
        depth.push(depth[parent] + 1);
    }
    let choice = (0..n).map(|_| below(rng, vocab as usize) as u32).collect();
    Tree { tree, choice }
}

/// (name, the trees of successive runs, pos)
type Fixed = (&'static str, fn() -> Vec<Tree>, u32);

pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    let fixed: Vec<Fixed> = vec![
        ("chain_all_accepted", || vec![chain(7, 8)], 40),
        ("chain_two_accepted_then_one", || vec![chain(5, 2), chain(5, 1)], 0),
        ("no_child_matches", || vec![chain(3, 0)], 17),
        ("deepest_chain", || vec![chain(MAX_TREE_DEPTH, MAX_TREE_DEPTH + 1)], 4000),
        ("later_sibling_moves", || {
            // root -> {a, b}, a -> {c}, b -> {d, e}: the choices take b then e, rows 2 and 5, moved to 1 and 2.
            let mut tree = DraftTree::default();
            tree.reset(1);
            let a = tree.push(0, 10);
            let b = tree.push(0, 11);
            tree.push(a, 12);
            tree.push(b, 13);
            tree.push(b, 14);
            vec![Tree { tree, choice: vec![11, 0, 14, 0, 0, 0] }]
        }, 9),
        ("duplicate_siblings_lowest_row", || {
            let mut tree = DraftTree::default();
            tree.reset(1);
            let a = tree.push(0, 5);
            tree.push(0, 5);
            tree.push(a, 6);
            vec![Tree { tree, choice: vec![5, 6, 6, 0] }]
        }, 3),
    ];
    for (name, make, pos) in fixed {
        v.push(Case::new("tree_accept", name, move |gpu| run(gpu, &make(), pos)));
    }
    for (n, vocab, seed) in [(2, 2, 1), (16, 3, 2), (33, 2, 3), (61, 2, 4), (64, 4, 5), (64, 1, 6)] {
        v.push(Case::new("tree_accept", format!("random_n{n}_vocab{vocab}"), move |gpu| {
            let mut rng = Rng::new(seed);
            let trees: Vec<Tree> = (0..4).map(|_| random(&mut rng, n, vocab)).collect();
            run(gpu, &trees, 100 + seed as u32)
        }));
    }
    v.push(Case::new("tree_accept", "bad_shapes_refused", |_| {
        let mut g = Graph::new();
        let ids = g.input("ids", &[4], DType::U32);
        let table = g.input("table", &[4, TREE_W], DType::U32);
        let choice = g.input("choice", &[4], DType::U32);
        let short = g.input("short", &[4, TREE_W - 1], DType::U32);
        let f = g.input("f", &[4], DType::F32);
        let big = g.input("big", &[65], DType::U32);
        let big_table = g.input("big_table", &[65, TREE_W], DType::U32);
        let errors = [
            g.tree_accept(ids, short, choice).is_err(),
            g.tree_accept(ids, table, f).is_err(),
            g.tree_accept(big, big_table, big).is_err(),
            g.tree_accept(ids, table, choice).is_err(),
        ];
        Ok(exact(&errors, &[true, true, true, false]))
    }));
    v
}
