//! Draft trees for speculative decoding: the tree a draft source proposes (node 0 the last chosen token, each
//! other node a draft token after its parent), EAGLE-2's expansion of a draft model's tree (the top-k children of
//! the best nodes, by cumulative log-probability, reranked to the tree size), and the target's side: one step over
//! every node (`Llama::tree_step`) and the accepted path's K/V moved into place.
//! Sources: Li, Wei, Zhang, Zhang, "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees" (2024);
//! Miao et al., "SpecInfer" (2024), tree-based verification.

use super::Generator;
use crate::error::{Error, Result};
use crate::graph::StepVars;
use crate::model::tree_draft::{tree_size, TreeDraftResult};
use crate::ops::attention_decode::{tree_table, MAX_TREE_DEPTH, MAX_TREE_ROWS, TREE_W};
use crate::ops::tree_frontier::child_score;
use crate::ops::tree_select;
use std::collections::hash_map::Entry;

/// How a draft tree grows (CPM.cu's `spec_num_iter`, `spec_topk_per_iter`, `spec_tree_size`): `depth` expansion
/// rounds, each keeping the `topk` best new nodes (and each expanded node proposing its `topk` best children),
/// then the `size` best nodes of all (the root not counted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeShape {
    pub depth: usize,
    pub topk: usize,
    pub size: usize,
}

impl TreeShape {
    /// "DEPTH,TOPK,SIZE", e.g. "6,10,60".
    pub fn parse(s: &str) -> Result<TreeShape> {
        let bad = |why: String| Error::Invalid(format!("draft tree {s:?}: {why}"));
        let v: Vec<usize> = s
            .split(',')
            .map(|x| x.trim().parse::<usize>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| bad("want DEPTH,TOPK,SIZE (three whole numbers), e.g. 6,10,60".into()))?;
        let [depth, topk, size] = v[..] else {
            return Err(bad("want DEPTH,TOPK,SIZE, e.g. 6,10,60".into()));
        };
        let shape = TreeShape { depth, topk, size };
        shape.check().map_err(|e| bad(e.to_string()))?;
        Ok(shape)
    }

    /// An error unless every part is in range.
    pub fn check(&self) -> Result<()> {
        let max_size = MAX_TREE_ROWS - 1;
        if !(1..=MAX_TREE_DEPTH).contains(&self.depth)
            || !(1..=max_size).contains(&self.topk)
            || !(1..=max_size).contains(&self.size)
        {
            return Err(Error::Invalid(format!(
                "depth {} (1..={MAX_TREE_DEPTH}), top-k {} and size {} (1..={max_size} each)",
                self.depth, self.topk, self.size
            )));
        }
        Ok(())
    }
}

/// A draft tree: node 0 is the root (the last chosen token, not yet in the target's cache), every other node a
/// draft token following its parent; parents come before their children.
#[derive(Clone, Debug, Default)]
pub struct DraftTree {
    pub tokens: Vec<u32>,
    pub parents: Vec<usize>,
    depths: Vec<usize>,
}

impl DraftTree {
    /// Start over with only the root.
    pub fn reset(&mut self, root: u32) {
        self.tokens.clear();
        self.parents.clear();
        self.depths.clear();
        self.tokens.push(root);
        self.parents.push(0);
        self.depths.push(0);
    }

    /// Add `token` under `parent`; returns its index.
    pub fn push(&mut self, parent: usize, token: u32) -> usize {
        self.tokens.push(token);
        self.parents.push(parent);
        self.depths.push(self.depths[parent] + 1);
        self.tokens.len() - 1
    }

    /// Nodes, the root included.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn depth(&self, node: usize) -> usize {
        self.depths[node]
    }

    /// The deepest node's depth.
    pub fn max_depth(&self) -> usize {
        self.depths.iter().copied().max().unwrap_or(0)
    }

    /// The child of `parent` whose token is `token`.
    pub fn child(&self, parent: usize, token: u32) -> Option<usize> {
        (parent + 1..self.len()).find(|&i| self.parents[i] == parent && self.tokens[i] == token)
    }

    /// The nodes from the root to `node`.
    pub fn path(&self, node: usize) -> Vec<u32> {
        let mut p = vec![node as u32];
        let mut n = node;
        while n != 0 {
            n = self.parents[n];
            p.push(n as u32);
        }
        p.reverse();
        p
    }

    /// Add `tokens` as a path below the root, sharing the nodes already there, up to `max_nodes` nodes in all.
    pub fn insert(&mut self, tokens: &[u32], max_nodes: usize) {
        let mut node = 0;
        for &t in tokens {
            node = match self.child(node, t) {
                Some(c) => c,
                None if self.len() < max_nodes => self.push(node, t),
                None => return,
            };
        }
    }

    /// The table of a step over every node, node i in slot i (`attention_decode::tree_table`).
    pub fn table(&self) -> Result<Vec<u32>> {
        let paths: Vec<Vec<u32>> = (0..self.len()).map(|i| self.path(i)).collect();
        tree_table(paths.iter().map(Vec::as_slice))
    }
}

impl Generator<'_> {
    /// Run the nodes of a draft tree as one step: `ids` `[n]` with their `table` (`[n, TREE_W]`, slots relative to
    /// `base`), row r at position `base + depth(r)`, its K/V cached in slot `base + slot(r)`. `self.result` then
    /// holds every row's outputs, each what plain decoding along that row's path computes. The cached tokens are
    /// not changed: [`Generator::accept_path`] keeps a path. `base` is at most the cached length (a draft model's
    /// root is already cached at `base`; the target's is row 0). An EAGLE head's rows take `features` `[n, hidden]`.
    pub fn feed_tree(&mut self, base: usize, ids: &[u32], table: &[u32], features: Option<&[f32]>) -> Result<()> {
        self.run_tree(base, ids, table, features, false)
    }

    /// Whether [`Generator::feed_tree_accepting`] can run on this session: the argmax is read back and the head
    /// covers the whole vocabulary.
    pub fn can_accept_on_device(&self) -> bool {
        self.outputs.argmax && self.model.head_ids().is_none()
    }

    /// [`Generator::feed_tree`] at `base` (the cached length; row 0 the root), then in the same submission the
    /// greedy path (from the root, the child holding each row's argmax) and its K/V moved to positions `base ..`:
    /// `self.result.tree_path` holds the path's rows. The cached tokens are not changed:
    /// [`Generator::keep_moved_path`] keeps what the caller accepts of the path.
    pub fn feed_tree_accepting(&mut self, base: usize, ids: &[u32], table: &[u32]) -> Result<()> {
        if !self.can_accept_on_device() || base != self.tokens.len() {
            return Err(Error::Invalid(format!(
                "a tree step accepting on the device at {base} of {} cached tokens (it needs the argmax and the \
                 full head)",
                self.tokens.len()
            )));
        }
        self.run_tree(base, ids, table, None, true)
    }

    /// Keep `tokens`, a prefix of the path the last [`Generator::feed_tree_accepting`] at `base` accepted and moved:
    /// the cache then holds the tokens before `base` and these.
    pub fn keep_moved_path(&mut self, base: usize, tokens: &[u32]) -> Result<()> {
        if base > self.tokens.len() || tokens.len() > self.result.tree_path.len() {
            return Err(Error::Invalid(format!(
                "keeping {} tokens of a moved path of {} at {base} of {} cached",
                tokens.len(),
                self.result.tree_path.len(),
                self.tokens.len()
            )));
        }
        self.tokens.truncate(base);
        self.tokens.extend_from_slice(tokens);
        Ok(())
    }

    fn run_tree(
        &mut self,
        base: usize,
        ids: &[u32],
        table: &[u32],
        features: Option<&[f32]>,
        accept: bool,
    ) -> Result<()> {
        let n = ids.len();
        if n == 0 || table.len() != n * TREE_W || base > self.tokens.len() {
            return Err(Error::Invalid(format!(
                "a tree step of {n} nodes with a table of {} entries after {base} of {} cached tokens",
                table.len(),
                self.tokens.len()
            )));
        }
        self.check_vocab(ids)?;
        // The deepest row's depth, and the furthest a row reaches: its depth or the highest slot it uses.
        let (deepest, reach) = table.chunks(TREE_W).fold((0, 0), |(deepest, reach), row| {
            let d = (row[0] as usize).min(MAX_TREE_DEPTH);
            let slot = row[1..=d + 1].iter().map(|&s| s as usize).max().unwrap_or(0);
            (deepest.max(d), reach.max(slot.max(d)))
        });
        if base + reach >= self.cache.max_ctx {
            return Err(Error::Invalid(format!(
                "a draft tree reaching {} positions past {base} does not fit the context of {}",
                reach + 1,
                self.cache.max_ctx
            )));
        }
        // Every row attends as plain decoding at its position would (InfLLM-v2 switches by position).
        let Some(sparse) = self.tree_attends(base, deepest) else {
            return Err(Error::Invalid(format!(
                "a draft tree from position {base} to {} crosses this model's dense length or completes two InfLLM-v2 \
                 windows of a kind: verify a chain instead",
                base + deepest
            )));
        };
        let (gpu, model) = (self.gpu, self.model);
        if model.is_eagle() != features.is_some() || features.is_some_and(|f| f.len() != n * model.cfg.hidden) {
            return Err(Error::Invalid(format!(
                "a tree step of {n} nodes: an EAGLE head takes [n, {}] features, other models none",
                model.cfg.hidden
            )));
        }
        let step = self
            .plans
            .tree_step((gpu, model, &self.cache), self.outputs, (n, accept, sparse))?;
        if let Some(f) = features {
            step.write_features(gpu, f)?;
        }
        step.run_tree(gpu, ids, table, base, &mut self.result)
    }

    /// Catch up with `ids` (an EAGLE head's with `features` `[n, hidden]`) and grow a draft tree of `shape` (its
    /// `depth` rounds keeping `topk` nodes each, reranked to `size`), all in one submission
    /// ([`crate::model::Llama::tree_draft`]): `self.tree_result` then holds every round's candidates and frontier,
    /// and the tree. The cached tokens are then `ids` after the ones there were; the tree's rows wrote K/V past them
    /// (later steps overwrite it).
    pub fn feed_tree_draft(&mut self, ids: &[u32], features: Option<&[f32]>, shape: TreeShape) -> Result<()> {
        let key = self.tree_draft_key(ids, features, shape)?;
        let (gpu, pos) = (self.gpu, self.tokens.len());
        let plan = self.plans.tree_draft(gpu, self.model, &self.cache, key)?;
        plan.run(gpu, (ids, features), pos, &mut self.tree_result)?;
        self.tokens.extend_from_slice(ids);
        Ok(())
    }

    /// [`Generator::feed_tree_draft`] on `draft`, then this session's tree step accepting on the device
    /// ([`Generator::feed_tree_accepting`]) over the root `root` and the tree's nodes, in one submission: the tree
    /// reaches the verification's token ids and table on the device. `draft.tree_result` then holds the tree,
    /// `self.result` the verification's outputs and the accepted path; the cached tokens are not changed
    /// ([`Generator::keep_moved_path`] keeps what the caller accepts). Both sessions must run on the same device.
    pub fn verify_tree_draft(
        &mut self,
        draft: &mut Generator<'_>,
        (ids, features): (&[u32], Option<&[f32]>),
        shape: TreeShape,
        root: u32,
    ) -> Result<()> {
        let Some(sparse) = self
            .verifies_tree_draft(draft, shape)
            .filter(|_| (root as usize) < self.model.cfg.vocab)
        else {
            return Err(Error::Invalid(format!(
                "a draft tree of depth {} and size {} (root {root}, a draft vocabulary of {}) cannot be verified in \
                 its draft's submission at {} of a context of {}: it needs the draft's device, an argmax read back \
                 over the full vocabulary of {}, and a tree step that fits and attends as plain decoding would",
                shape.depth,
                shape.size,
                draft.model.cfg.vocab,
                self.tokens.len(),
                self.cache.max_ctx,
                self.model.cfg.vocab
            )));
        };
        let (base, n) = (self.tokens.len(), tree_size(shape.depth, shape.topk, shape.size) + 1);
        let (gpu, model) = (self.gpu, self.model);
        let verify = self
            .plans
            .tree_step((gpu, model, &self.cache), self.outputs, (n, true, sparse))?;
        let (key, dpos) = (draft.tree_draft_key(ids, features, shape)?, draft.tokens.len());
        let plan = draft.plans.tree_draft(gpu, draft.model, &draft.cache, key)?;
        plan.run_then_verify(
            gpu,
            (ids, features),
            dpos,
            &mut draft.tree_result,
            (verify, root, base),
            &mut self.result,
        )?;
        draft.tokens.extend_from_slice(ids);
        Ok(())
    }

    /// Whether this session can verify `draft`'s tree of `shape` in the draft's submission
    /// ([`Generator::verify_tree_draft`]), and then whether the tree step attends sparsely: the same device, the
    /// argmax read back over the full head, a vocabulary holding the draft's, and a tree step of at least one node
    /// after the root that fits the context and attends as plain decoding would ([`Generator::tree_attends`]).
    fn verifies_tree_draft(&self, draft: &Generator<'_>, shape: TreeShape) -> Option<bool> {
        let (base, size) = (self.tokens.len(), tree_size(shape.depth, shape.topk, shape.size));
        let able = std::ptr::eq(self.gpu, draft.gpu)
            && self.can_accept_on_device()
            && draft.model.cfg.vocab <= self.model.cfg.vocab
            && size > 0
            && base + size < self.cache.max_ctx;
        able.then(|| self.tree_attends(base, shape.depth)).flatten()
    }

    /// The plan key of [`Generator::feed_tree_draft`] (catch-up tokens, (depth, top-k, size)); an error unless it
    /// fits.
    fn tree_draft_key(
        &self,
        ids: &[u32],
        features: Option<&[f32]>,
        shape: TreeShape,
    ) -> Result<(usize, (usize, usize, usize))> {
        self.check_fits(ids)?;
        self.check_features(ids, features)?;
        let (depth, topk) = (shape.depth, shape.topk);
        if !self.tree_draft_fits(ids.len(), depth, topk) {
            return Err(Error::Invalid(format!(
                "a draft tree of depth {depth} and top-k {topk} after {} tokens does not fit one step at {} of a \
                 context of {}",
                ids.len(),
                self.tokens.len(),
                self.cache.max_ctx
            )));
        }
        Ok((ids.len(), (depth, topk, tree_size(depth, topk, shape.size))))
    }

    /// Whether a draft tree grown on the device after `m` tokens fits this session: the catch-up within one step
    /// and every round's rows within the context.
    pub fn tree_draft_fits(&self, m: usize, depth: usize, topk: usize) -> bool {
        m <= self.chunk && self.tokens.len() + m + depth.saturating_sub(1) * topk < self.cache.max_ctx
    }

    /// Keep one path of the last tree step at `base`: `tokens[k]`, cached in slot `base + slots[k]`, becomes the
    /// token at position `base + k` (its K/V moved there, in every layer, in one submission). The cache then holds
    /// the tokens before `base` and the path.
    pub fn accept_path(&mut self, base: usize, tokens: &[u32], slots: &[u32]) -> Result<()> {
        if tokens.len() != slots.len() || base > self.tokens.len() || base + tokens.len() > self.cache.max_ctx {
            return Err(Error::Invalid(format!(
                "a path of {} tokens ({} slots) at {base} of {} cached, context {}",
                tokens.len(),
                slots.len(),
                self.tokens.len(),
                self.cache.max_ctx
            )));
        }
        let moves: Vec<(u32, u32)> = slots
            .iter()
            .enumerate()
            .filter(|&(k, &s)| s as usize != k)
            .map(|(k, &s)| ((base + s as usize) as u32, (base + k) as u32))
            .collect();
        if !moves.is_empty() {
            if self.plans.mover.is_none() {
                self.plans.mover = Some(self.model.kv_mover(self.gpu, &self.cache)?);
            }
            self.plans.mover.as_mut().expect("just built").run(self.gpu, &moves)?;
        }
        // The tree step left InfLLM-v2's compressed keys alone: update the windows the path completes.
        let (gpu, model, cache) = (self.gpu, self.model, &self.cache);
        let n = tokens.len();
        if n > 0 && model.cfg.sparse.is_some() {
            let plan = match self.plans.compress.entry(n) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => e.insert(model.key_compressor(gpu, cache, n)?),
            };
            if let Some(plan) = plan {
                plan.run(gpu, &StepVars { pos: base as u32 })?;
            }
        }
        self.tokens.truncate(base);
        self.tokens.extend_from_slice(tokens);
        Ok(())
    }
}

/// The `k` best (token id, log-probability) of `logits` (one row; token ids through `ids` for a restricted head),
/// best first, ties to the lower index.
pub fn top_log_probs(logits: &[f32], k: usize, ids: Option<&[u32]>) -> Vec<(u32, f64)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max + logits.iter().map(|&l| (l as f64 - max).exp()).sum::<f64>().ln();
    let mut best: Vec<(usize, f32)> = Vec::with_capacity(k + 1);
    for (i, &l) in logits.iter().enumerate() {
        if best.len() == k && best.last().is_some_and(|b| b.1 >= l) {
            continue;
        }
        let at = best.partition_point(|b| b.1 >= l);
        best.insert(at, (i, l));
        best.truncate(k);
    }
    best.into_iter()
        .map(|(i, l)| (ids.map_or(i as u32, |m| m[i]), l as f64 - lse))
        .collect()
}

/// A candidate node of EAGLE-2's expansion: its parent candidate ([`ROOT`] for the root's children), token and
/// cumulative log-probability (in f32, as `tree_frontier` forms it on the device).
struct Cand {
    parent: usize,
    token: u32,
    score: f32,
    /// The draft cache slot (relative to the root's position) once the node has run (host growth; on the device
    /// `tree_frontier` assigns them).
    slot: u32,
    /// An EAGLE head's predicted feature of the node, once it has run (host growth only).
    feature: Vec<f32>,
}

/// The parent of the root's children.
const ROOT: usize = usize::MAX;

/// Sort candidate indices by score (descending, f32's total order), then index: `tree_frontier`'s order.
fn by_score(c: &[Cand], v: &mut [usize]) {
    v.sort_by(|&a, &b| c[b].score.total_cmp(&c[a].score).then(a.cmp(&b)));
}

/// EAGLE-2's draft tree after catching the draft session up with `tokens` (the tokens it has not cached, the last
/// one the root; an EAGLE head's with the target's `features` `[n, hidden]`): the root's `topk` best children start
/// the frontier; each round runs the frontier as one tree step and keeps the `topk` best of their children by
/// cumulative log-probability; finally the `size` best nodes of all (parents before children) form `tree`. With
/// `on_device` and where the session can (greedy, dense attention, the catch-up within one step, every round within
/// the context), the catch-up and every round run in one submission (`Llama::tree_draft`), else step by step; both
/// take the same nodes (reranked on the device too, and checked against the host's rerank). With `target` too, where
/// the tree grows on the device and `target` can verify it there, it does so in the same submission
/// ([`Generator::verify_tree_draft`]; `target.result` then holds its outputs and accepted path). The draft's cached
/// tokens are then `tokens` after the ones it had. Returns (grown on the device, verified).
pub(super) fn grow(
    gen: &mut Generator<'_>,
    target: Option<&mut Generator<'_>>,
    (tokens, features): (&[u32], Option<&[f32]>),
    shape: TreeShape,
    tree: &mut DraftTree,
    on_device: bool,
) -> Result<(bool, bool)> {
    let device = on_device && grows_on_device(gen, tokens.len(), shape);
    // The target verifies in the same submission where it can (the root is the last token the draft catches up on).
    let root = tree.tokens.first().copied().filter(|r| tokens.last() == Some(r));
    let verifier = target
        .zip(root)
        .filter(|(t, _)| device && t.verifies_tree_draft(gen, shape).is_some());
    let verified = verifier.is_some();
    let cands = match verifier {
        Some((target, root)) => {
            target.verify_tree_draft(gen, (tokens, features), shape, root)?;
            grown_on_device(&gen.tree_result, shape)?
        }
        None if device => {
            gen.feed_tree_draft(tokens, features, shape)?;
            grown_on_device(&gen.tree_result, shape)?
        }
        None => {
            match features {
                Some(f) => gen.feed_with(tokens, f)?,
                None => gen.feed(tokens)?,
            }
            grow_on_host(gen, shape, features.is_some())?
        }
    };
    select(&cands, shape, tree);
    if device {
        same_tree(&gen.tree_result, tree)?;
    }
    Ok((device, verified))
}

/// Whether `gen` can grow a tree of `shape` on the device after `m` tokens: a tree of at least one node, greedy
/// steps reading top-k and log-sum-exp, dense attention, the catch-up within one step, every round within the
/// context.
fn grows_on_device(gen: &Generator<'_>, m: usize, shape: TreeShape) -> bool {
    tree_size(shape.depth, shape.topk, shape.size) > 0
        && gen.tree_draft_fits(m, shape.depth, shape.topk)
        && gen.model().can_chain()
        && gen.outputs.topk >= shape.topk
        && gen.outputs.lse
        && shape.topk < MAX_TREE_ROWS
}

/// An error unless the tree `tree_select` made on the device is `tree` (the rows past its nodes are padding).
fn same_tree(r: &TreeDraftResult, tree: &DraftTree) -> Result<()> {
    let n = tree.len();
    let table = tree.table()?;
    let same = r.tree_ids.len() + 1 >= n
        && r.tree_ids[..n - 1] == tree.tokens[1..]
        && r.tree_table.get(..n * TREE_W) == Some(&table[..]);
    if !same {
        return Err(Error::Invalid(
            "the draft tree reranked on the device differs from the host's rerank of the same candidates (a bug; \
             please report it)"
                .into(),
        ));
    }
    Ok(())
}

/// The candidates of a tree grown on the device, from its read-backs; an error unless every round ran the
/// frontier the host's rule takes from the same numbers.
fn grown_on_device(r: &TreeDraftResult, shape: TreeShape) -> Result<Vec<Cand>> {
    let k = shape.topk;
    let mut cands: Vec<Cand> = Vec::new();
    // Round j's rows: the candidate each ran as (round 0: the root alone).
    let mut frontier: Vec<usize> = vec![ROOT];
    for j in 0..r.cand_ids.len() {
        let (ids, vals, lse) = (&r.cand_ids[j], &r.cand_vals[j], &r.lse[j]);
        if ids.len() != frontier.len() * k || vals.len() != ids.len() || lse.len() != frontier.len() {
            return Err(Error::Invalid(format!(
                "a draft tree's round {j} read back {} candidates",
                ids.len()
            )));
        }
        let first = cands.len();
        for (row, &f) in frontier.iter().enumerate() {
            let parent_score = if f == ROOT { 0.0 } else { cands[f].score };
            for c in row * k..(row + 1) * k {
                cands.push(Cand {
                    parent: f,
                    token: ids[c],
                    score: child_score(parent_score, vals[c], lse[row]),
                    slot: 0,
                    feature: Vec::new(),
                });
            }
        }
        let Some((ran_ids, parents)) = r.ran_ids.get(j).zip(r.parents.get(j)) else {
            break;
        };
        let mut next: Vec<usize> = (first..cands.len()).collect();
        by_score(&cands, &mut next);
        next.truncate(k);
        let same = next.len() == ran_ids.len()
            && next
                .iter()
                .zip(ran_ids)
                .zip(parents)
                .all(|((&c, &t), &p)| cands[c].token == t && (c - first) / k == p as usize);
        if !same {
            return Err(Error::Invalid(format!(
                "a draft tree grown on the device ran another frontier in round {} than the host's rule takes",
                j + 1
            )));
        }
        frontier = next;
    }
    Ok(cands)
}

/// EAGLE-2's expansion step by step, with a draft session whose last step ran the root (its outputs are the root's):
/// each round runs the frontier as one tree step ([`Generator::feed_tree`]). An EAGLE head (`eagle`) runs each node
/// with its parent's predicted feature (the root's: the last step's output) and predicts its own.
fn grow_on_host(gen: &mut Generator<'_>, shape: TreeShape, eagle: bool) -> Result<Vec<Cand>> {
    let h = gen.model().cfg.hidden;
    let root_feature = match eagle {
        true => gen
            .result
            .hidden
            .get(gen.result.hidden.len().saturating_sub(h)..)
            .unwrap_or(&[])
            .to_vec(),
        false => Vec::new(),
    };
    if eagle && root_feature.len() != h {
        return Err(Error::Invalid(
            "an EAGLE head's tree needs its steps' features (StepOutputs::hidden)".into(),
        ));
    }
    let on_device = gen.outputs.topk >= shape.topk && gen.outputs.lse;
    if !gen.outputs.logits && !on_device {
        return Err(Error::Invalid(format!(
            "a draft model grows a tree from its log-probabilities: its steps must read their logits, or their \
             top-{} and log-sum-exp (StepOutputs::logits, or topk and lse)",
            shape.topk
        )));
    }
    let base = gen.tokens.len().saturating_sub(1);
    let ids = gen.model().head_ids();
    let width = ids.map_or(gen.model().cfg.vocab, <[u32]>::len);
    // Row `r` of the last step (None: its last row): its `topk` best children's scores from `parent`'s.
    let best = |gen: &Generator<'_>, r: Option<usize>, parent: f32| -> Vec<(u32, f32)> {
        let res = &gen.result;
        if on_device {
            let (k, r) = (gen.outputs.topk, r.unwrap_or(res.lse.len().saturating_sub(1)));
            let lse = res.lse.get(r).copied().unwrap_or(f32::NAN);
            let at = (r * k).min(res.topk_ids.len());
            let ids = &res.topk_ids[at..(at + shape.topk).min(res.topk_ids.len())];
            ids.iter()
                .zip(&res.topk_logits[at..])
                .map(|(&t, &l)| (t, child_score(parent, l, lse)))
                .collect()
        } else {
            let rows = res.logits.len() / width.max(1);
            let r = r.unwrap_or(rows.saturating_sub(1));
            top_log_probs(&res.logits[r * width..(r + 1) * width], shape.topk, ids)
                .into_iter()
                .map(|(t, lp)| (t, parent + lp as f32))
                .collect()
        }
    };
    let mut cands: Vec<Cand> = best(gen, None, 0.0)
        .into_iter()
        .map(|(token, score)| Cand {
            parent: ROOT,
            token,
            score,
            slot: 0,
            feature: Vec::new(),
        })
        .collect();
    let mut frontier: Vec<usize> = (0..cands.len()).collect();
    let mut fed = 0u32;
    for depth in 1..shape.depth {
        // Round `depth`'s rows sit at that depth: the context must hold them, and (an InfLLM-v2 draft) their tree
        // step must attend as plain decoding would; else the tree stops growing here.
        let fits = base + 1 + fed as usize + frontier.len() < gen.max_ctx() && gen.tree_attends(base, depth).is_some();
        if frontier.is_empty() || !fits {
            break;
        }
        let mut paths = Vec::with_capacity(frontier.len());
        let mut tokens = Vec::with_capacity(frontier.len());
        let mut features = Vec::with_capacity(if eagle { frontier.len() * h } else { 0 });
        for (r, &f) in frontier.iter().enumerate() {
            cands[f].slot = 1 + fed + r as u32;
            let mut path = vec![cands[f].slot];
            let mut p = cands[f].parent;
            while p != ROOT {
                path.push(cands[p].slot);
                p = cands[p].parent;
            }
            path.push(0);
            path.reverse();
            paths.push(path);
            tokens.push(cands[f].token);
            if eagle {
                let p = cands[f].parent;
                features.extend_from_slice(if p == ROOT { &root_feature } else { &cands[p].feature });
            }
        }
        fed += frontier.len() as u32;
        let table = tree_table(paths.iter().map(Vec::as_slice))?;
        gen.feed_tree(base, &tokens, &table, eagle.then_some(features.as_slice()))?;
        if eagle {
            for (r, &f) in frontier.iter().enumerate() {
                cands[f].feature = gen.result.hidden[r * h..(r + 1) * h].to_vec();
            }
        }
        let mut next = Vec::with_capacity(frontier.len() * shape.topk);
        for (r, &f) in frontier.iter().enumerate() {
            for (token, score) in best(gen, Some(r), cands[f].score) {
                cands.push(Cand {
                    parent: f,
                    token,
                    score,
                    slot: 0,
                    feature: Vec::new(),
                });
                next.push(cands.len() - 1);
            }
        }
        by_score(&cands, &mut next);
        next.truncate(shape.topk);
        frontier = next;
    }
    Ok(cands)
}

/// The tree of the `size` best candidates (`tree` holds the root), as `tree_select` takes it on the device
/// ([`tree_select::reference`]: a node whose parent was not kept goes, with its descendants; the spine first, then
/// the others, parents before children).
fn select(cands: &[Cand], shape: TreeShape, tree: &mut DraftTree) {
    let rows: Vec<u32> = cands
        .iter()
        .flat_map(|c| {
            let parent = if c.parent == ROOT {
                tree_select::ROOT
            } else {
                c.parent as u32
            };
            [c.score.to_bits(), c.token, parent]
        })
        .collect();
    let size = shape.size.min(MAX_TREE_ROWS - 1).min(cands.len());
    let s = tree_select::reference(&rows, size);
    for (&c, &p) in s.cands.iter().zip(&s.parents) {
        tree.push(p, cands[c].token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_paths_children_and_table() {
        let mut t = DraftTree::default();
        t.reset(5);
        let a = t.push(0, 7);
        let b = t.push(0, 8);
        let c = t.push(a, 9);
        assert_eq!((t.len(), t.depth(c), t.max_depth()), (4, 2, 2));
        assert_eq!(t.path(c), [0, a as u32, c as u32]);
        assert_eq!((t.child(0, 8), t.child(a, 9), t.child(b, 9)), (Some(b), Some(c), None));
        t.insert(&[7, 9, 4], 10);
        assert_eq!(t.len(), 5, "shares 7 and 9, adds 4");
        t.insert(&[6, 6], 6);
        assert_eq!(t.len(), 6, "stops at the node limit");
        let table = t.table().unwrap();
        assert_eq!(
            &table[c * TREE_W..c * TREE_W + 5],
            &[2, 0, a as u32, c as u32, c as u32]
        );
    }

    #[test]
    fn top_log_probs_are_the_best_normalized() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, -1.0];
        let top = top_log_probs(&logits, 3, None);
        let ids: Vec<u32> = top.iter().map(|x| x.0).collect();
        assert_eq!(ids, [1, 3, 2], "ties to the lower id");
        let lse = logits.iter().map(|&l| (l as f64).exp()).sum::<f64>().ln();
        assert!((top[0].1 - (3.0 - lse)).abs() < 1e-12);
        let mapped = top_log_probs(&logits, 1, Some(&[10, 11, 12, 13, 14]));
        assert_eq!(mapped[0].0, 11);
    }

    #[test]
    fn shapes_parse_and_refuse() {
        assert_eq!(
            TreeShape::parse("6,10,60").unwrap(),
            TreeShape {
                depth: 6,
                topk: 10,
                size: 60
            }
        );
        for bad in ["", "6,10", "6,10,64", "0,1,1", "15,2,2", "a,b,c", "6,0,5"] {
            assert!(TreeShape::parse(bad).is_err(), "{bad}");
        }
    }
}
