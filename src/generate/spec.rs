//! Speculative decoding, lossless: a draft source proposes the next tokens, the target checks all of them in one
//! verification step (outputs for every row), and the generation keeps the drafts up to the first one the target
//! would not have chosen, plus the target's own choice there. The target's choice at each row is made exactly as
//! plain decoding makes it (the kernels are batch invariant, the sampler's draw is keyed by position), so the output
//! is token for token the plain run's, greedy or seeded (sample-and-match). Rejected drafts leave the cache by
//! truncation: their positions are overwritten by the next step.
//! Sources: Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative Decoding" (2023); Saxena,
//! "Prompt Lookup Decoding" (2023).

use super::draft::Drafter;
use super::draft_len::DraftLength;
use super::emit::Emitter;
use super::tree::{DraftTree, TreeShape};
use super::{choose, record_topk, row_logits, GenOptions, GenOutput, Generator};
use crate::error::Result;
use crate::ops::attention_decode::{MAX_TOKENS, MAX_TREE_ROWS};
use crate::sampling::pick;
use crate::sampling::Sampler;
use crate::tokenizer::Tokenizer;
use std::collections::HashMap;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Most draft tokens per verification step (the step holds them and the token before them).
pub const MAX_DRAFT: usize = MAX_TOKENS - 1;
/// Draft tokens per chain step until a draft is accepted (then `max_draft`).
pub const PROBE_DRAFTS: usize = 1;

/// How speculation runs.
#[derive(Clone, Debug)]
pub struct SpecOptions {
    /// Draft tokens per step, 1..=[`MAX_DRAFT`] ([`PROBE_DRAFTS`] until a draft is accepted).
    pub max_draft: usize,
    /// Speculation turns itself off when, over the last `window` verification steps (or the first `window / 2`; or
    /// the first 2 if they kept no draft), fewer than this many drafts were accepted per step (0 keeps it on): a verification step costs more than a
    /// one-token step, so drafts that are rarely right make decoding slower than plain.
    pub min_accepted: f32,
    pub window: usize,
    /// Verify a draft tree grown as this says instead of a chain of `max_draft` (EAGLE-2's dynamic tree for a
    /// draft model; several matches for prompt lookup; the chain for other sources).
    pub tree: Option<TreeShape>,
    /// Choose each chain step's drafts, up to `max_draft`, from the acceptance so far and the measured cost of each
    /// step size ([`DraftLength`]) instead of always `max_draft`.
    pub adaptive: bool,
}

impl Default for SpecOptions {
    fn default() -> Self {
        SpecOptions {
            max_draft: MAX_DRAFT,
            min_accepted: 0.5,
            window: 8,
            tree: None,
            adaptive: false,
        }
    }
}

/// What speculation did in one generation.
#[derive(Clone, Debug, Default)]
pub struct SpecStats {
    /// Verification steps, and one-token steps taken when there was no draft (or speculation was off).
    pub verify_steps: usize,
    pub plain_steps: usize,
    pub drafted: usize,
    pub accepted: usize,
    /// Per draft depth d (0-based): drafts proposed at depth d, and accepted.
    pub drafted_at: Vec<usize>,
    pub accepted_at: Vec<usize>,
    /// Verification steps whose drafts were made in the same submission ([`Drafter::propose_verified`]); their
    /// drafting time counts as verification time.
    pub one_submission: usize,
    /// Tree steps that accepted greedily on the device and moved the path's K/V in their own submission.
    pub tree_on_device: usize,
    /// Draft trees grown in one submission on the device (`tree::grow`).
    pub trees_grown_on_device: usize,
    pub draft_time: Duration,
    pub verify_time: Duration,
    pub plain_time: Duration,
    /// Why speculation turned itself off, if it did.
    pub turned_off: Option<String>,
    /// Chain verification steps by their number of drafts (index: drafts).
    pub steps_by_drafts: Vec<usize>,
}

impl SpecStats {
    /// Tokens per verification step (accepted drafts plus the target's own token).
    pub fn mean_accepted_len(&self) -> f64 {
        (self.accepted + self.verify_steps) as f64 / self.verify_steps.max(1) as f64
    }

    /// A few lines for `--stats`.
    pub fn report(&self, source: &str) -> String {
        let per_depth: Vec<String> = self
            .drafted_at
            .iter()
            .zip(&self.accepted_at)
            .map(|(&d, &a)| format!("{:.2}", a as f64 / d.max(1) as f64))
            .collect();
        let ms = |d: Duration, n: usize| d.as_secs_f64() * 1e3 / n.max(1) as f64;
        // Where every step drafted in the verification's submission, there is no drafting time of its own.
        let times = if self.one_submission > 0 && self.one_submission == self.verify_steps {
            format!(
                "draft and verify {:.2} ms/step",
                ms(self.verify_time, self.verify_steps)
            )
        } else {
            format!(
                "draft {:.2} ms/step, verify {:.2} ms/step",
                ms(self.draft_time, self.verify_steps),
                ms(self.verify_time, self.verify_steps)
            )
        };
        let mut s = format!(
            "speculation ({source}): {} verification steps, {} tokens per step, {}/{} drafts accepted; \
             acceptance by depth [{}]\n  {times}, plain {:.2} ms/step ({} plain steps)",
            self.verify_steps,
            format_args!("{:.2}", self.mean_accepted_len()),
            self.accepted,
            self.drafted,
            per_depth.join(", "),
            ms(self.plain_time, self.plain_steps),
            self.plain_steps,
        );
        if self.one_submission > 0 {
            s.push_str(&format!(
                "\n  {} verification steps drafted in the verification's submission (their drafting counted as verify)",
                self.one_submission
            ));
        }
        if self.trees_grown_on_device > 0 {
            s.push_str(&format!(
                "\n  {} draft trees grown on the device, each in one submission",
                self.trees_grown_on_device
            ));
        }
        if self.tree_on_device > 0 {
            s.push_str(&format!(
                "\n  {} tree steps accepted on the device (the path's K/V moved in the same submission)",
                self.tree_on_device
            ));
        }
        let chains: Vec<String> = (1..self.steps_by_drafts.len())
            .filter(|&k| self.steps_by_drafts[k] > 0)
            .map(|k| format!("{k} x{}", self.steps_by_drafts[k]))
            .collect();
        if !chains.is_empty() {
            s.push_str(&format!("\n  chain steps by drafts: {}", chains.join(", ")));
        }
        if let Some(why) = &self.turned_off {
            s.push_str(&format!("\n  turned off: {why}"));
        }
        s
    }

    /// Add another generation's stats to these (the first turn-off reason is kept).
    pub fn merge(&mut self, other: &SpecStats) {
        self.verify_steps += other.verify_steps;
        self.plain_steps += other.plain_steps;
        self.drafted += other.drafted;
        self.accepted += other.accepted;
        self.one_submission += other.one_submission;
        self.tree_on_device += other.tree_on_device;
        self.trees_grown_on_device += other.trees_grown_on_device;
        add_counts(&mut self.drafted_at, &other.drafted_at);
        add_counts(&mut self.accepted_at, &other.accepted_at);
        add_counts(&mut self.steps_by_drafts, &other.steps_by_drafts);
        self.draft_time += other.draft_time;
        self.verify_time += other.verify_time;
        self.plain_time += other.plain_time;
        if self.turned_off.is_none() {
            self.turned_off.clone_from(&other.turned_off);
        }
    }

    fn record(&mut self, drafted: usize, accepted: usize) {
        if self.steps_by_drafts.len() <= drafted {
            self.steps_by_drafts.resize(drafted + 1, 0);
        }
        self.steps_by_drafts[drafted] += 1;
        self.record_tree(drafted, drafted, accepted);
    }

    /// A verification of `drafted` drafts reaching `depth` (a chain: `drafted`) of which `accepted` were kept.
    fn record_tree(&mut self, drafted: usize, depth: usize, accepted: usize) {
        self.verify_steps += 1;
        self.drafted += drafted;
        self.accepted += accepted;
        if self.drafted_at.len() < depth {
            self.drafted_at.resize(depth, 0);
            self.accepted_at.resize(depth, 0);
        }
        for d in 0..depth {
            self.drafted_at[d] += 1;
            self.accepted_at[d] += usize::from(d < accepted);
        }
    }
}

/// Adds the counts `from` to `to` element by element, `to` grown with zeros to fit.
fn add_counts(to: &mut Vec<usize>, from: &[usize]) {
    if to.len() < from.len() {
        to.resize(from.len(), 0);
    }
    for (t, &f) in to.iter_mut().zip(from) {
        *t += f;
    }
}

/// A draft source and how to use it.
pub struct Speculator<'d> {
    pub drafter: &'d mut dyn Drafter,
    pub opts: SpecOptions,
    /// The adaptive draft length's acceptance and step costs, kept from one generation to the next.
    lengths: DraftLength,
}

impl<'d> Speculator<'d> {
    pub fn new(drafter: &'d mut dyn Drafter, opts: SpecOptions) -> Self {
        Speculator {
            drafter,
            opts,
            lengths: DraftLength::default(),
        }
    }
}

/// [`super::generate`] with speculation: the same output, token for token, and what speculation did.
pub fn generate_spec(
    gen: &mut Generator<'_>,
    tok: &Tokenizer,
    sampler: &mut Sampler,
    prompt: &[u32],
    opts: &GenOptions,
    speculator: &mut Speculator<'_>,
    on_text: impl FnMut(&str) -> bool,
) -> Result<(GenOutput, SpecStats)> {
    let (drafter, spec, lengths) = (&mut *speculator.drafter, &speculator.opts, &mut speculator.lengths);
    let mut emit = Emitter::new(tok, opts, prompt, on_text);
    let mut stats = SpecStats::default();
    if drafter.needs_aux_hidden() && !gen.outputs.aux_hidden {
        return Err(crate::error::Error::Invalid(format!(
            "the {} drafter needs the hidden states entering three of the target's layers (StepOutputs::aux_hidden)",
            drafter.name()
        )));
    }
    if drafter.needs_hidden() && !gen.outputs.hidden {
        return Err(crate::error::Error::Invalid(format!(
            "the {} drafter needs the target's hidden states (StepOutputs::hidden)",
            drafter.name()
        )));
    }
    let t0 = Instant::now();
    // Chunk by chunk, so that the drafter sees every chunk's outputs.
    for chunk in prompt.chunks(gen.chunk.max(1)) {
        let pos = gen.tokens.len();
        gen.feed(chunk)?;
        drafter.observe(pos, &gen.result);
    }
    emit.out.prefill_time = t0.elapsed();
    let t1 = Instant::now();
    let mut history: Vec<u32> = gen.tokens.clone();
    let mut drafts = Vec::with_capacity(MAX_DRAFT);
    let mut step_ids = Vec::with_capacity(MAX_TOKENS);
    let mut recent: VecDeque<usize> = VecDeque::with_capacity(spec.window);
    let mut on = spec.max_draft > 0;
    // Chains of one draft until a draft is kept: a draft that is never right then costs two 2-row verifications
    // before speculation turns off, instead of two of max_draft + 1 rows.
    let mut probing = true;
    let mut tree = DraftTree::default();
    if let Some(shape) = spec.tree {
        shape.check()?;
    }
    if !emit.done() {
        let mut next = choose(gen, sampler, 0, &history, &mut emit.out)?;
        loop {
            history.push(next);
            if !emit.push(next)? {
                break;
            }
            let base = gen.tokens.len();
            if base >= gen.max_ctx() {
                emit.context_full();
                break;
            }
            // Drafts after `next`: within the step, the context, and the tokens still allowed (the target's own
            // token after them takes one more).
            let room = (gen.max_ctx() - base).min(MAX_TOKENS) - 1;
            let wanted = match (probing, spec.adaptive) {
                (true, _) => PROBE_DRAFTS,
                (false, true) => lengths.choose(spec.max_draft),
                (false, false) => MAX_DRAFT,
            };
            let k = spec
                .max_draft
                .min(wanted)
                .min(room)
                .min(emit.budget().saturating_sub(1));
            tree.reset(next);
            // A tree step must attend as plain decoding would at each row's position: on an InfLLM-v2 model the tree
            // is cut short of its dense length, or of a second window of a kind completing within it, and where not
            // even one level can run the step verifies a chain.
            let tree_shape = spec.tree.and_then(|s| {
                let depth = gen.tree_depth(base, s.depth)?;
                Some(TreeShape { depth, ..s })
            });
            // Greedy tree steps accept on the device; a draft model may then grow the tree in the same submission.
            let accepts_on_device = greedy_on_device(sampler, gen);
            let mut tree_verified = false;
            if let (true, Some(shape)) = (on, tree_shape) {
                let t = Instant::now();
                let max_nodes = (gen.max_ctx() - base).min(MAX_TREE_ROWS).min(shape.size + 1);
                if max_nodes > 1 {
                    let grown = if accepts_on_device {
                        let (grown, verified) =
                            drafter.propose_tree_verified(gen, &history, shape, max_nodes, &mut tree)?;
                        tree_verified = verified;
                        grown
                    } else {
                        drafter.propose_tree(&history, shape, max_nodes, &mut tree)?
                    };
                    stats.trees_grown_on_device += usize::from(grown);
                    stats.one_submission += usize::from(tree_verified);
                }
                // Drafting in the verification's submission counts as verification.
                match tree_verified {
                    true => stats.verify_time += t.elapsed(),
                    false => stats.draft_time += t.elapsed(),
                }
            }
            drafts.clear();
            let mut verified = false;
            // The chain step's whole time (drafting, verification, acceptance), for the draft length's cost model.
            let t_step = Instant::now();
            if tree.len() > 1 {
                let t = Instant::now();
                let (path, stopped, on_device) = verify_tree(
                    gen,
                    sampler,
                    (&tree, tree_verified),
                    (&mut history, &mut next),
                    &mut emit,
                )?;
                stats.tree_on_device += usize::from(on_device);
                drafter.observe_path(base, &gen.result, &path);
                let accepted = path.len() - 1;
                stats.verify_time += t.elapsed();
                stats.record_tree(tree.len() - 1, tree.max_depth(), accepted);
                probing &= accepted == 0;
                if stopped {
                    break;
                }
                on = keep_on(spec, &mut recent, accepted, &mut stats, on);
                continue;
            } else if on && k > 0 && tree_shape.is_none() {
                let t = Instant::now();
                verified = drafter.propose_verified(gen, &history, k, &mut drafts)?;
                if verified {
                    stats.one_submission += 1;
                    stats.verify_time += t.elapsed();
                } else {
                    drafter.propose(&history, k, &mut drafts)?;
                    drafts.truncate(k);
                    stats.draft_time += t.elapsed();
                }
            }
            if drafts.is_empty() {
                let t = Instant::now();
                gen.feed(&[next])?;
                drafter.observe(base, &gen.result);
                stats.plain_steps += 1;
                next = choose(gen, sampler, 0, &history, &mut emit.out)?;
                stats.plain_time += t.elapsed();
                continue;
            }
            let t = Instant::now();
            if !verified {
                step_ids.clear();
                step_ids.push(next);
                step_ids.extend_from_slice(&drafts);
                gen.verify(&step_ids)?;
            }
            drafter.observe(base, &gen.result);
            // Row i holds the target's outputs after `next` and drafts[..i]: keep drafts while they are its choice
            // (sample-and-match), or, for drafts sampled from a known distribution, while they pass speculative
            // sampling's acceptance test.
            let sampled = drafter.draft_dists().filter(|_| !sampler.params.is_greedy());
            let mut accepted = 0;
            let mut stopped = false;
            loop {
                let (choice, keep) = match sampled.and_then(|q| q.get(accepted)) {
                    Some(q) => {
                        record_topk(gen, accepted, &mut emit.out);
                        let pos = history.len();
                        let (ua, ur) = (sampler.uniform(pos, 1), sampler.uniform(pos, 2));
                        let p = sampler.probs(row_logits(gen, accepted)?, &history);
                        accept_or_resample(p, q, drafts[accepted], ua, ur)
                    }
                    None => {
                        let c = choose(gen, sampler, accepted, &history, &mut emit.out)?;
                        (c, drafts.get(accepted) == Some(&c))
                    }
                };
                if !keep {
                    next = choice;
                    break;
                }
                history.push(choice);
                accepted += 1;
                if !emit.push(choice)? {
                    stopped = true;
                    break;
                }
            }
            stats.verify_time += t.elapsed();
            stats.record(drafts.len(), accepted);
            lengths.record(drafts.len(), accepted, t_step.elapsed());
            probing &= accepted == 0;
            // The cache keeps what plain decoding would hold: every chosen token but the last one emitted.
            gen.truncate(base + 1 + accepted - usize::from(stopped));
            if stopped {
                break;
            }
            on = keep_on(spec, &mut recent, accepted, &mut stats, on);
        }
    }
    emit.out.decode_time = t1.elapsed();
    Ok((emit.finish()?, stats))
}

/// Whether speculation stays on after a verification that kept `accepted` drafts: judged over the window's last
/// half or more, or already after 2 steps that kept nothing; the reason is recorded when it turns off.
fn keep_on(spec: &SpecOptions, recent: &mut VecDeque<usize>, accepted: usize, stats: &mut SpecStats, on: bool) -> bool {
    if recent.len() == spec.window {
        recent.pop_front();
    }
    recent.push_back(accepted);
    let judged = recent.len() >= spec.window.div_ceil(2) || (recent.len() >= 2 && recent.iter().all(|&a| a == 0));
    if on && judged && spec.min_accepted > 0.0 {
        let mean = recent.iter().sum::<usize>() as f32 / recent.len() as f32;
        if mean < spec.min_accepted {
            stats.turned_off = Some(format!(
                "{mean:.2} drafts accepted per step over the last {} steps (below {})",
                recent.len(),
                spec.min_accepted
            ));
            return false;
        }
    }
    on
}

/// Verify `tree` (its root `next`, the last chosen token) in one tree step and keep the path the target chooses:
/// from the root, the child whose token is the target's choice at the current node (sample-and-match), until no
/// child is. The accepted tokens go to `history` and `emit`; `next` becomes the target's choice after them. The
/// cache then holds the root and the accepted path (the last emitted token excepted when the emitter stopped).
/// Greedy choices over the full vocabulary are accepted on the device, the path's K/V moved in the same submission.
/// With `fed`, that tree step (accepting on the device) already ran in the draft's submission
/// (`Drafter::propose_tree_verified`).
/// Returns the accepted path (its nodes from the root), whether the emitter stopped, and whether the device
/// accepted.
fn verify_tree(
    gen: &mut Generator<'_>,
    sampler: &mut Sampler,
    (tree, fed): (&DraftTree, bool),
    (history, next): (&mut Vec<u32>, &mut u32),
    emit: &mut Emitter<'_, impl FnMut(&str) -> bool>,
) -> Result<(Vec<u32>, bool, bool)> {
    let base = gen.tokens.len();
    // Greedy choices are the rows' argmaxes: the step accepts and moves the path's K/V itself, one submission.
    let on_device = greedy_on_device(sampler, gen);
    match (fed, on_device) {
        (true, true) => {}
        (true, false) => {
            return Err(crate::error::Error::Invalid(
                "a draft tree verified in its draft's submission needs greedy acceptance on the device".into(),
            ))
        }
        (false, true) => gen.feed_tree_accepting(base, &tree.tokens, &tree.table()?)?,
        (false, false) => gen.feed_tree(base, &tree.tokens, &tree.table()?, None)?,
    }
    let mut path = vec![0u32];
    let mut stopped = false;
    loop {
        let node = *path.last().expect("the root") as usize;
        let c = choose(gen, sampler, node, history, &mut emit.out)?;
        let Some(child) = tree.child(node, c) else {
            *next = c;
            break;
        };
        history.push(c);
        path.push(child as u32);
        if !emit.push(c)? {
            stopped = true;
            break;
        }
    }
    let kept = path.len() - usize::from(stopped);
    let tokens: Vec<u32> = path[..kept].iter().map(|&i| tree.tokens[i as usize]).collect();
    if on_device {
        // The host's walk over the same argmaxes must find the device's path (the emitter may stop it early).
        if !gen.result.tree_path.starts_with(&path) || (!stopped && gen.result.tree_path != path) {
            return Err(crate::error::Error::Invalid(format!(
                "the device accepted the draft-tree path {:?} where the host finds {path:?} (a bug; please report it)",
                gen.result.tree_path
            )));
        }
        gen.keep_moved_path(base, &tokens)?;
    } else {
        gen.accept_path(base, &tokens, &path[..kept])?;
    }
    Ok((path, stopped, on_device))
}

/// Whether the target's tree steps accept on the device: greedy choices (the rows' argmaxes) over the full head.
fn greedy_on_device(sampler: &Sampler, gen: &Generator<'_>) -> bool {
    sampler.params.is_greedy() && !sampler.params.needs_logits() && gen.can_accept_on_device()
}

/// Speculative sampling's acceptance test (Leviathan et al., Chen et al. 2023) for a draft `d` drawn from `q`,
/// against the target's distribution `p` (both (id, probability) lists summing to 1): `d` is kept when `u_accept <
/// p(d) / q(d)`; otherwise the token is drawn from the residual `max(0, p - q)`, normalized, at cumulative
/// probability `u_resample`. Whatever `q` is, the token returned is distributed as `p`. Returns (token, kept).
pub fn accept_or_resample(p: &[(u32, f32)], q: &[(u32, f32)], d: u32, u_accept: f32, u_resample: f32) -> (u32, bool) {
    let prob = |dist: &[(u32, f32)], id: u32| dist.iter().find(|x| x.0 == id).map_or(0.0, |x| x.1);
    let (pd, qd) = (prob(p, d), prob(q, d));
    if qd > 0.0 && u_accept * qd < pd {
        return (d, true);
    }
    let qs: HashMap<u32, f32> = q.iter().copied().collect();
    let residual: Vec<(u32, f32)> = p
        .iter()
        .map(|&(id, pp)| (id, (pp - qs.get(&id).copied().unwrap_or(0.0)).max(0.0)))
        .filter(|x| x.1 > 0.0)
        .collect();
    let total: f32 = residual.iter().map(|x| x.1).sum();
    if total <= 0.0 {
        return (pick(p, u_resample), false);
    }
    (pick(&residual, u_resample * total), false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::rand_core::{Rng, SeedableRng};

    /// The rejection rule's output is distributed as the target's p, whatever the draft's q: a chi-square test over
    /// 40,000 draws for pairs of p and q that disagree in every way (q wider, narrower, disjoint in part, equal).
    #[test]
    fn rejection_rule_output_is_distributed_as_the_target() {
        let p = [(0u32, 0.05f32), (1, 0.40), (2, 0.25), (3, 0.20), (4, 0.10)];
        let qs: [&[(u32, f32)]; 4] = [
            &[(0, 0.2), (1, 0.2), (2, 0.2), (3, 0.2), (5, 0.2)],
            &[(1, 0.9), (6, 0.1)],
            &[(4, 0.5), (5, 0.5)],
            &p,
        ];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        let mut u = || (rng.next_u64() >> 40) as f32 / (1u32 << 24) as f32;
        let n = 40_000;
        for q in qs {
            let mut counts = [0usize; 7];
            let mut kept = 0;
            for _ in 0..n {
                let d = pick(q, u());
                let (tok, keep) = accept_or_resample(&p, q, d, u(), u());
                counts[tok as usize] += 1;
                kept += usize::from(keep);
            }
            // Tokens outside p never appear; chi-square over p's 5 tokens (4 degrees of freedom): 18.5 is the 0.1%
            // critical value.
            assert_eq!(counts[5] + counts[6], 0, "{q:?}: {counts:?}");
            let chi2: f64 = p
                .iter()
                .map(|&(id, pp)| {
                    let want = pp as f64 * n as f64;
                    (counts[id as usize] as f64 - want).powi(2) / want
                })
                .sum();
            assert!(chi2 < 18.5, "q {q:?}: counts {counts:?}, chi-square {chi2:.1}");
            // The acceptance rate is sum_x min(p(x), q(x)): all of it when q = p.
            let rate = kept as f64 / n as f64;
            let want: f32 = p
                .iter()
                .map(|&(id, pp)| pp.min(q.iter().find(|x| x.0 == id).map_or(0.0, |x| x.1)))
                .sum();
            assert!(
                (rate - want as f64).abs() < 0.02,
                "q {q:?}: acceptance {rate:.3}, expected {want:.3}"
            );
        }
    }
}
