//! Drafting with an EAGLE-1 head ([`crate::model::eagle`]): the head's session holds one entry per target position
//! j, built from token `t_{j+1}` and the target's feature `f_j`; a draft continues from the last real entry with the
//! head's own predicted features, one head step per draft token; or EAGLE-2's dynamic tree (`tree::expand`), each
//! node run with its parent's predicted feature.

use super::draft::Drafter;
use super::tree::{grow, DraftTree, TreeShape};
use super::{Generator, StepResult};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::model::eagle3::FeatureProjector;
use crate::model::llama::MAX_CHAIN;
use crate::model::{Llama, StepOutputs};

/// An EAGLE head drafting greedily for its target.
pub struct EagleDraft<'a> {
    gen: Generator<'a>,
    /// The target's feature of every position it has run, `[positions, hidden]`.
    features: Vec<f32>,
    /// Leading entries of the head's cache built from the target's features (the rest from predicted ones).
    real: usize,
    /// The head's last predicted feature.
    last: Vec<f32>,
    /// An EAGLE-3 head's projection of the target's three hidden states to its features, and its scratch.
    projector: Option<FeatureProjector>,
    rows: Vec<f32>,
    projected: Vec<f32>,
    /// A failure while observing the target (reported by the next proposal).
    failed: Option<Error>,
    /// Greedy chains in one submission ([`Generator::feed_chain_with`]: the catch-up and the whole draft, or with
    /// the target's verification too, [`Drafter::propose_verified`]); false runs one head step per submission (for
    /// measuring and testing). On by default; draft trees too grow in one submission where they can.
    pub chained: bool,
}

impl<'a> EagleDraft<'a> {
    /// A drafting session of `head` (from [`Llama::load_eagle`]) for `max_ctx` positions.
    pub fn new(gpu: &'a Gpu, head: &'a Llama, max_ctx: usize) -> Result<EagleDraft<'a>> {
        Self::with_outputs(gpu, head, max_ctx, 0)
    }

    /// A session that also grows draft trees of up to `topk` children per node ([`Drafter::propose_tree`]): its
    /// steps read each row's top-`topk` and log-sum-exp too (the log-probabilities, computed on the device).
    pub fn for_trees(gpu: &'a Gpu, head: &'a Llama, max_ctx: usize, topk: usize) -> Result<EagleDraft<'a>> {
        if topk == 0 {
            return Err(Error::Invalid("a draft tree needs a top-k of at least 1".into()));
        }
        Self::with_outputs(gpu, head, max_ctx, topk)
    }

    fn with_outputs(gpu: &'a Gpu, head: &'a Llama, max_ctx: usize, topk: usize) -> Result<EagleDraft<'a>> {
        if !head.is_eagle() {
            return Err(Error::Invalid("EagleDraft needs an EAGLE head".into()));
        }
        let outputs = StepOutputs {
            argmax: true,
            hidden: true,
            topk,
            lse: topk > 0,
            ..Default::default()
        };
        Ok(EagleDraft {
            gen: Generator::new(gpu, head, max_ctx, outputs)?,
            features: Vec::new(),
            real: 0,
            last: Vec::new(),
            projector: head.is_eagle3().then(FeatureProjector::default),
            rows: Vec::new(),
            projected: Vec::new(),
            failed: None,
            chained: true,
        })
    }

    /// Tokens per step when the head catches up with the target (the target's prefill chunk).
    pub fn set_chunk(&mut self, chunk: usize) {
        self.gen.chunk = chunk;
    }

    fn hidden(&self) -> usize {
        self.gen.model().cfg.hidden
    }

    /// The head's draft after its last step, and its output feature kept for the next.
    fn take_draft(&mut self) -> Result<u32> {
        let h = self.hidden();
        let r = &self.gen.result;
        let d = r
            .argmax
            .ok_or_else(|| Error::Invalid("the EAGLE head's step read no argmax".into()))?;
        let rows = r.hidden.len() / h;
        self.last.clear();
        self.last.extend_from_slice(&r.hidden[(rows.max(1) - 1) * h..rows * h]);
        Ok(d)
    }
}

impl EagleDraft<'_> {
    /// Keep the head's real cache entries that still match `history` (entry j pairs f_j with `history[j + 1]`)
    /// and drop the rest: `(keep, n)`, the entries kept and the target's positions run (features known; `history[n]`
    /// is the token it runs next), so entries `keep .. n` are to be redone. None when there is nothing to draft
    /// from or no room for `max` drafts.
    fn keep(&mut self, history: &[u32], max: usize) -> Result<Option<(usize, usize)>> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        let h = self.hidden();
        let n = history.len().saturating_sub(1);
        if n == 0 || max == 0 || self.features.len() < n * h {
            return Ok(None);
        }
        let tokens = &self.gen.tokens;
        let same = tokens.iter().zip(&history[1..]).take_while(|(a, b)| a == b).count();
        let keep = same.min(self.real).min(n - 1);
        self.gen.truncate(keep);
        Ok((n + max <= self.gen.max_ctx()).then_some((keep, n)))
    }

    /// Redo entries `keep .. n` in one head step from the target's features.
    fn redo(&mut self, history: &[u32], keep: usize, n: usize) -> Result<()> {
        let h = self.hidden();
        self.gen
            .feed_with(&history[keep + 1..=n], &self.features[keep * h..n * h])?;
        self.real = n;
        Ok(())
    }

    /// Whether `m` entries to redo and `max` drafts fit one chained step.
    fn chain_fits(&self, m: usize, max: usize) -> bool {
        self.chained && m <= MAX_CHAIN.min(self.gen.chunk) && max <= MAX_CHAIN
    }
}

impl EagleDraft<'_> {
    /// What the target reads back for this head: its final hidden states, or (EAGLE-3) three layers' side by side.
    fn target_rows<'r>(&self, result: &'r StepResult) -> &'r [f32] {
        match self.projector {
            Some(_) => &result.aux_hidden,
            None => &result.hidden,
        }
    }

    fn target_width(&self) -> usize {
        self.hidden() * if self.projector.is_some() { 3 } else { 1 }
    }

    /// The features of positions `pos ..` from the target's rows `rows` of `result` (EAGLE-3: projected by `fc`).
    fn keep_features(&mut self, pos: usize, result: &StepResult, rows: impl Iterator<Item = u32>) {
        let (h, width) = (self.hidden(), self.target_width());
        let src = self.target_rows(result);
        self.rows.clear();
        for r in rows {
            match src.get(r as usize * width..(r as usize + 1) * width) {
                Some(row) => self.rows.extend_from_slice(row),
                None => break,
            }
        }
        self.features.truncate(pos * h);
        self.features.resize(pos * h, 0.0);
        match &mut self.projector {
            Some(p) if !self.rows.is_empty() => {
                match p.project(self.gen.gpu(), self.gen.model(), &self.rows, &mut self.projected) {
                    Ok(()) => self.features.extend_from_slice(&self.projected),
                    Err(e) => self.failed = Some(e),
                }
            }
            Some(_) => {}
            None => self.features.extend_from_slice(&self.rows),
        }
        // Entries from `pos` on may have used other features.
        self.real = self.real.min(pos);
    }
}

impl Drafter for EagleDraft<'_> {
    fn propose(&mut self, history: &[u32], max: usize, out: &mut Vec<u32>) -> Result<()> {
        out.clear();
        let Some((keep, n)) = self.keep(history, max)? else {
            return Ok(());
        };
        if self.chain_fits(n - keep, max) {
            // The entries to redo and every draft in one submission.
            let h = self.hidden();
            self.gen
                .feed_chain_with(&history[keep + 1..=n], Some(&self.features[keep * h..n * h]), max)?;
            self.real = n;
            out.extend_from_slice(&self.gen.result.row_argmax);
            return Ok(());
        }
        self.redo(history, keep, n)?;
        let mut d = self.take_draft()?;
        out.push(d);
        while out.len() < max {
            let last = std::mem::take(&mut self.last);
            self.gen.feed_with(&[d], &last)?;
            self.last = last;
            d = self.take_draft()?;
            out.push(d);
        }
        Ok(())
    }
    fn propose_verified(
        &mut self,
        target: &mut Generator<'_>,
        history: &[u32],
        max: usize,
        out: &mut Vec<u32>,
    ) -> Result<bool> {
        out.clear();
        if !self.chained || max == 0 || !std::ptr::eq(self.gen.gpu(), target.gpu()) {
            return Ok(false);
        }
        let Some((keep, n)) = self.keep(history, max)? else {
            return Ok(false);
        };
        if !self.chain_fits(n - keep, max) {
            return Ok(false);
        }
        let h = self.hidden();
        let catch_up = (&history[keep + 1..=n], Some(&self.features[keep * h..n * h]));
        target.verify_chain_with(&mut self.gen, catch_up, max)?;
        self.real = n;
        out.extend_from_slice(&self.gen.result.row_argmax);
        Ok(true)
    }
    fn name(&self) -> &'static str {
        "eagle"
    }
    /// EAGLE-2's dynamic tree from the head (`tree::grow` with features, verified by `target` in the same
    /// submission where it can); needs a session from [`EagleDraft::for_trees`].
    fn grow_tree(
        &mut self,
        target: Option<&mut Generator<'_>>,
        history: &[u32],
        (shape, max_nodes): (TreeShape, usize),
        tree: &mut DraftTree,
    ) -> Result<(bool, bool)> {
        let size = shape.size.min(max_nodes.saturating_sub(1));
        if size == 0 {
            return Ok((false, false));
        }
        let Some((keep, n)) = self.keep(history, shape.depth)? else {
            return Ok((false, false));
        };
        // The entries to redo from the target's features, then the tree.
        let h = self.hidden();
        let catch_up = (&history[keep + 1..=n], Some(&self.features[keep * h..n * h]));
        let shape = TreeShape { size, ..shape };
        let grown = grow(&mut self.gen, target, catch_up, shape, tree, self.chained)?;
        self.real = n;
        Ok(grown)
    }
    fn observe(&mut self, pos: usize, result: &StepResult) {
        let rows = self.target_rows(result).len() / self.target_width();
        self.keep_features(pos, result, 0..rows as u32);
    }
    fn observe_path(&mut self, pos: usize, result: &StepResult, path: &[u32]) {
        self.keep_features(pos, result, path.iter().copied());
    }
    fn needs_hidden(&self) -> bool {
        self.projector.is_none()
    }
    fn needs_aux_hidden(&self) -> bool {
        self.projector.is_some()
    }
}
