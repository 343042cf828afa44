//! Draft sources for speculative decoding: prompt lookup (the tokens that followed the latest earlier occurrence of
//! the last n-gram, in the prompt or the output so far) and a draft model that shares the target's vocabulary.
//! A draft only proposes; the target's verification decides, so a bad draft costs time, never correctness.

use super::tree::{grow, DraftTree, TreeShape};
use super::{Generator, StepResult};
use crate::error::{Error, Result};
use crate::model::llama::MAX_CHAIN;
use crate::sampling::Sampler;
use crate::tokenizer::Tokenizer;

/// A source of draft tokens.
pub trait Drafter {
    /// Up to `max` tokens likely to follow `history` (the prompt and every token chosen so far) into `out`
    /// (cleared first); none when it has no guess.
    fn propose(&mut self, history: &[u32], max: usize, out: &mut Vec<u32>) -> Result<()>;
    /// A tree of drafts after `history` grown as `shape` says, into `tree` (reset to the root, `history`'s last
    /// token), at most `max_nodes` nodes with the root; with `target`, where this source can, also `target`'s greedy
    /// verification of the tree in the same submission (its tree step accepting on the device,
    /// [`Generator::verify_tree_draft`]; `target.result` then holds it). Returns (grown in one submission on the
    /// device (`tree::grow`), verified). By default the chain [`Drafter::propose`] gives, not verified.
    fn grow_tree(
        &mut self,
        _target: Option<&mut Generator<'_>>,
        history: &[u32],
        (shape, max_nodes): (TreeShape, usize),
        tree: &mut DraftTree,
    ) -> Result<(bool, bool)> {
        let mut chain = Vec::new();
        self.propose(history, shape.depth.min(max_nodes.saturating_sub(1)), &mut chain)?;
        tree.insert(&chain, max_nodes);
        Ok((false, false))
    }
    /// [`Drafter::grow_tree`] without a verification: true when the tree grew in one submission on the device.
    fn propose_tree(
        &mut self,
        history: &[u32],
        shape: TreeShape,
        max_nodes: usize,
        tree: &mut DraftTree,
    ) -> Result<bool> {
        self.grow_tree(None, history, (shape, max_nodes), tree).map(|r| r.0)
    }
    /// [`Drafter::grow_tree`] with `target`'s verification where this source can: (grown on the device, verified).
    fn propose_tree_verified(
        &mut self,
        target: &mut Generator<'_>,
        history: &[u32],
        shape: TreeShape,
        max_nodes: usize,
        tree: &mut DraftTree,
    ) -> Result<(bool, bool)> {
        self.grow_tree(Some(target), history, (shape, max_nodes), tree)
    }
    /// Draft up to `max` tokens after `history` into `out` and have `target` verify them in the same submission
    /// (its [`Generator::verify`] of `history`'s last token and the drafts), where this source can: true when it
    /// did, false (nothing run) when the caller is to [`Drafter::propose`] and verify in two steps.
    fn propose_verified(
        &mut self,
        _target: &mut Generator<'_>,
        _history: &[u32],
        _max: usize,
        _out: &mut Vec<u32>,
    ) -> Result<bool> {
        Ok(false)
    }
    /// The source's name in reports.
    fn name(&self) -> &'static str;
    /// For drafts sampled at random: the distribution each proposal of the last `propose` was drawn from ((id,
    /// probability) pairs); the verification then applies speculative sampling's acceptance test. None for
    /// deterministic drafts, which are kept only where they equal the target's own choice.
    fn draft_dists(&self) -> Option<&[Vec<(u32, f32)>]> {
        None
    }
    /// The target's last step ran tokens at positions `pos ..` and gave `result` (an EAGLE head keeps the
    /// features, `result.hidden`). Rows past what the target keeps are overwritten by later calls.
    fn observe(&mut self, _pos: usize, _result: &StepResult) {}
    /// The target's last step ran a draft tree at `pos` and kept `path` (its rows from the root, row 0): row
    /// `path[k]` holds the outputs at position `pos + k`.
    fn observe_path(&mut self, _pos: usize, _result: &StepResult, _path: &[u32]) {}
    /// Whether [`Drafter::observe`] needs the target's hidden states (`StepOutputs::hidden`).
    fn needs_hidden(&self) -> bool {
        false
    }
    /// Whether [`Drafter::observe`] needs the hidden states entering three of the target's layers
    /// (`StepOutputs::aux_hidden`, an EAGLE-3 head's features).
    fn needs_aux_hidden(&self) -> bool {
        false
    }
}

/// Prompt lookup decoding: for n from `ngram_max` down to `ngram_min`, the latest earlier occurrence of the last n
/// tokens, and the tokens that followed it (as llama.cpp's `lookup` and Saxena's prompt lookup decoding do).
#[derive(Clone, Debug)]
pub struct Lookup {
    pub ngram_min: usize,
    pub ngram_max: usize,
}

impl Default for Lookup {
    fn default() -> Self {
        Lookup {
            ngram_min: 2,
            ngram_max: 4,
        }
    }
}

impl Drafter for Lookup {
    fn propose(&mut self, history: &[u32], max: usize, out: &mut Vec<u32>) -> Result<()> {
        out.clear();
        let len = history.len();
        for n in (self.ngram_min.max(1)..=self.ngram_max).rev() {
            if n >= len {
                continue;
            }
            let tail = &history[len - n..];
            // Latest start j < len - n whose n tokens equal the tail: the tokens from j + n on follow it.
            if let Some(j) = (0..len - n).rev().find(|&j| &history[j..j + n] == tail) {
                let from = j + n;
                out.extend_from_slice(&history[from..(from + max).min(len)]);
                return Ok(());
            }
        }
        Ok(())
    }
    fn name(&self) -> &'static str {
        "lookup"
    }
    /// The continuations of up to `shape.topk` earlier occurrences of the last n-gram (longest n first, latest
    /// first), each up to `shape.depth` tokens, merged into one tree.
    fn grow_tree(
        &mut self,
        _target: Option<&mut Generator<'_>>,
        history: &[u32],
        (shape, max_nodes): (TreeShape, usize),
        tree: &mut DraftTree,
    ) -> Result<(bool, bool)> {
        let len = history.len();
        let mut found = 0;
        for n in (self.ngram_min.max(1)..=self.ngram_max).rev() {
            if n >= len {
                continue;
            }
            let tail = &history[len - n..];
            for j in (0..len - n).rev().filter(|&j| &history[j..j + n] == tail) {
                let from = j + n;
                tree.insert(
                    &history[from..(from + shape.depth).min(len)],
                    max_nodes.min(shape.size + 1),
                );
                found += 1;
                if found == shape.topk {
                    return Ok((false, false));
                }
            }
        }
        Ok((false, false))
    }
}

/// A smaller model with the target's vocabulary drafting greedily, or with `sampler` by sampling (its steps must
/// then read logits), with its own KV cache kept in step with the tokens chosen so far; it stops a draft early
/// where its top token's probability falls below `p_min` (when its steps read logits).
pub struct DraftModel<'a> {
    pub gen: Generator<'a>,
    pub p_min: f32,
    /// Greedy chains are verified in their own submission ([`Drafter::propose_verified`]) and greedy draft trees
    /// grow in one submission (`tree::grow`); on by default.
    pub one_submission: bool,
    /// Sample drafts (with its own seed) instead of taking the argmax.
    pub sampler: Option<Sampler>,
    /// The distributions the last drafts were sampled from.
    dists: Vec<Vec<(u32, f32)>>,
}

impl<'a> DraftModel<'a> {
    /// A greedy draft session.
    pub fn greedy(gen: Generator<'a>, p_min: f32) -> Self {
        DraftModel {
            gen,
            p_min,
            one_submission: true,
            sampler: None,
            dists: Vec::new(),
        }
    }

    /// A session sampling its drafts with `sampler` (whose seed should differ from the target's).
    pub fn sampling(gen: Generator<'a>, sampler: Sampler) -> Self {
        DraftModel {
            gen,
            p_min: 0.0,
            one_submission: true,
            sampler: Some(sampler),
            dists: Vec::new(),
        }
    }

    /// A sampled draft after `history` (the draft's distribution recorded), mapped to token ids through a
    /// restricted head.
    fn sample(&mut self, history: &[u32]) -> Result<u32> {
        let Some(sampler) = &mut self.sampler else {
            return Ok(self.best().0);
        };
        if self.gen.result.logits.is_empty() {
            return Err(Error::Invalid(
                "a sampling draft model needs its steps to read logits".into(),
            ));
        }
        let u = sampler.uniform(history.len(), 0);
        let ids = self.gen.model().head_ids();
        let dist: Vec<(u32, f32)> = sampler
            .probs(&mut self.gen.result.logits, history)
            .iter()
            .map(|&(i, p)| (ids.map_or(i, |m| m[i as usize]), p))
            .collect();
        let id = crate::sampling::pick(&dist, u);
        self.dists.push(dist);
        Ok(id)
    }
}

impl DraftModel<'_> {
    /// Truncate the draft's cache to the prefix `history` still agrees with, short of its last token (fed again, so
    /// the outputs are those after the whole history); returns that length. None when there is nothing to draft
    /// from or the history does not fit the draft's context.
    fn keep_prefix(&mut self, history: &[u32]) -> Option<usize> {
        if history.is_empty() || history.len() > self.gen.max_ctx() {
            return None;
        }
        let same = self.gen.tokens.iter().zip(history).take_while(|(a, b)| a == b).count();
        let keep = same.min(history.len() - 1);
        self.gen.truncate(keep);
        Some(keep)
    }

    /// Whether drafts come from chained steps: greedy, with no probability threshold, on a model that can chain.
    fn chains(&self) -> bool {
        self.sampler.is_none() && self.p_min == 0.0 && self.gen.model().can_chain()
    }

    /// Whether a chain of `max` drafts after `m` catch-up tokens fits one chained step and the draft's context.
    fn chain_fits(&self, m: usize, max: usize) -> bool {
        m <= MAX_CHAIN.min(self.gen.chunk)
            && max <= MAX_CHAIN
            && self.gen.tokens.len() + m + max - 1 <= self.gen.max_ctx()
    }

    /// The draft's greedy token after its last step, and its probability (1 when the step reads no logits; with
    /// a restricted head, within the subset).
    fn best(&self) -> (u32, f32) {
        let r = &self.gen.result;
        let id = r.argmax.unwrap_or(0);
        if r.logits.is_empty() {
            return (id, 1.0);
        }
        let top = r.logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = r.logits.iter().map(|&l| ((l - top) as f64).exp()).sum();
        (id, (1.0 / sum) as f32)
    }
}

impl Drafter for DraftModel<'_> {
    fn propose(&mut self, history: &[u32], max: usize, out: &mut Vec<u32>) -> Result<()> {
        out.clear();
        if max == 0 {
            return Ok(());
        }
        let Some(keep) = self.keep_prefix(history) else {
            return Ok(());
        };
        self.dists.clear();
        // Greedy drafts with no probability threshold: the catch-up and the whole draft in one chained step (or
        // the draft after a long catch-up in one).
        let chain = self.chains();
        let rest = &history[keep..];
        if chain && self.chain_fits(rest.len(), max) {
            self.gen.feed_chain(rest, max)?;
            out.extend_from_slice(&self.gen.result.row_argmax);
            return Ok(());
        }
        self.gen.feed(rest)?;
        if chain && max > 1 && self.gen.tokens.len() + max - 1 <= self.gen.max_ctx() {
            let first = self.best().0;
            self.gen.feed_chain(&[first], max - 1)?;
            out.push(first);
            out.extend_from_slice(&self.gen.result.row_argmax);
            return Ok(());
        }
        // The history each sampled draft follows (its penalties and its position-keyed draw).
        let mut seen = if self.sampler.is_some() {
            history.to_vec()
        } else {
            Vec::new()
        };
        for i in 0..max {
            let (mut id, p) = self.best();
            if p < self.p_min {
                break;
            }
            if self.sampler.is_some() {
                id = self.sample(&seen)?;
                seen.push(id);
            }
            out.push(id);
            if i + 1 == max || self.gen.tokens.len() >= self.gen.max_ctx() {
                break;
            }
            self.gen.feed(&[id])?;
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
        if !self.one_submission || max == 0 || !self.chains() || !std::ptr::eq(self.gen.gpu(), target.gpu()) {
            return Ok(false);
        }
        let Some(keep) = self.keep_prefix(history) else {
            return Ok(false);
        };
        let rest = &history[keep..];
        if !self.chain_fits(rest.len(), max) {
            return Ok(false);
        }
        self.dists.clear();
        target.verify_chain(&mut self.gen, rest, max)?;
        out.extend_from_slice(&self.gen.result.row_argmax);
        Ok(true)
    }
    fn name(&self) -> &'static str {
        "draft model"
    }
    /// EAGLE-2's dynamic tree grown by this model (`tree::grow`, verified by `target` in the same submission where
    /// it can), with the catch-up step.
    fn grow_tree(
        &mut self,
        target: Option<&mut Generator<'_>>,
        history: &[u32],
        (shape, max_nodes): (TreeShape, usize),
        tree: &mut DraftTree,
    ) -> Result<(bool, bool)> {
        let Some(keep) = self.keep_prefix(history) else {
            return Ok((false, false));
        };
        let shape = TreeShape {
            size: shape.size.min(max_nodes.saturating_sub(1)),
            ..shape
        };
        let on_device = self.one_submission && self.sampler.is_none();
        grow(&mut self.gen, target, (&history[keep..], None), shape, tree, on_device)
    }
    fn draft_dists(&self) -> Option<&[Vec<(u32, f32)>]> {
        self.sampler.as_ref().map(|_| self.dists.as_slice())
    }
}

/// An error unless the draft's vocabulary is the target's: the same size, the same text for every token, the same
/// stop tokens. `target_file` and `draft_file` name the models in the message.
pub fn check_same_vocab(target: (&Tokenizer, usize, &str), draft: (&Tokenizer, usize, &str)) -> Result<()> {
    let ((t, t_vocab, t_file), (d, d_vocab, d_file)) = (target, draft);
    let bad = |why: String| {
        Err(Error::Invalid(format!(
            "draft model {d_file} cannot draft for {t_file}: {why}"
        )))
    };
    if t_vocab != d_vocab {
        return bad(format!("its vocabulary has {d_vocab} tokens, the target's {t_vocab}"));
    }
    for id in 0..t_vocab as u32 {
        let (a, b) = (t.token_text(id), d.token_text(id));
        if a != b {
            return bad(format!("token {id} is {b:?} in the draft and {a:?} in the target"));
        }
        if t.is_stop(id) != d.is_stop(id) {
            return bad(format!(
                "token {id} ({a:?}) ends a turn in one model and not in the other"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(history: &[u32], max: usize) -> Vec<u32> {
        let mut out = vec![99];
        Lookup::default().propose(history, max, &mut out).unwrap();
        out
    }

    #[test]
    fn lookup_proposes_what_followed_the_latest_match_of_the_longest_ngram() {
        // The tail [2, 3] occurred at 1 (followed by 4, 5) and at 6 (followed by 9); the latest wins.
        assert_eq!(lookup(&[1, 2, 3, 4, 5, 1, 2, 3, 9, 7, 2, 3], 3), [9, 7, 2]);
        // The 3-gram [1, 2, 3] beats the later 2-gram match.
        assert_eq!(lookup(&[1, 2, 3, 4, 5, 8, 2, 3, 6, 1, 2, 3], 2), [4, 5]);
        // The proposal stops at the end of the history.
        assert_eq!(lookup(&[5, 6, 7, 5, 6], 4), [7, 5, 6]);
        // No match: nothing, and the old contents are cleared.
        assert_eq!(lookup(&[1, 2, 3, 4], 4), Vec::<u32>::new());
        assert_eq!(lookup(&[], 4), Vec::<u32>::new());
        // A repeated token continues itself.
        assert_eq!(lookup(&[7, 7, 7, 7], 3), [7]);
    }
}
