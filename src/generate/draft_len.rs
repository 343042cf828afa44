//! Adaptive draft length: each chain step's number of drafts, chosen from the acceptance seen so far and the measured
//! cost of verification steps of each size (what the output is never depends on it, only how fast it comes).
//!
//! Drafts are modelled as accepted one after another with a probability `a` each until the first rejection (the
//! geometric model: a step of k drafts then yields `1 + a + ... + a^k` tokens on average), `a` estimated from
//! recent steps with decaying counts. A verification step's cost depends on its rows as the adapter's kernels
//! do (on lavapipe a 4-row step cost 1.8x a 2-row one's 1.25x, an 8-row step 2.7x, against a one-token step), so
//! it is measured per size: the median of its recent steps. Each step takes the length, among the candidates up
//! to the cap, with the most expected tokens per unit of measured time. A size not yet measured is assumed to cost
//! what the next smaller measured one does, or with only larger ones measured, the smallest of those scaled by
//! rows: both optimistic, so an untried size gets tried once acceptance makes it look worth it, longer or shorter.

use crate::ops::attention_decode::MAX_TOKENS;
use std::collections::VecDeque;
use std::time::Duration;

/// Draft counts a step may take (besides the cap): verification steps of 2, 4 and 8 rows, the sizes at which
/// the tiled GEMM's token blocks (2, 4 and 8 rows per invocation) are full.
const CANDIDATES: [usize; 3] = [1, 3, 7];
/// Weight of the past in the acceptance counts, per verification step.
const DECAY: f64 = 0.9;
/// Timed steps kept per size.
const SAMPLES: usize = 8;

/// The chooser of draft lengths: what it has learned of acceptance and of each step size's cost.
#[derive(Clone, Debug)]
pub struct DraftLength {
    /// Decayed counts of drafts kept and of rejections (a step of k drafts that kept j < k has one).
    kept: f64,
    rejected: f64,
    /// Per number of drafts (index 0 unused): its recent verification steps' times in seconds, and whether its
    /// first step (which builds the step's plan) has been left out.
    times: Vec<(VecDeque<f64>, bool)>,
}

impl Default for DraftLength {
    /// Nothing timed yet; acceptance starts at one half.
    fn default() -> Self {
        DraftLength {
            kept: 1.0,
            rejected: 1.0,
            times: vec![(VecDeque::with_capacity(SAMPLES), false); MAX_TOKENS],
        }
    }
}

/// The draft counts a step of at most `cap` drafts may take: the candidates below it, then `cap`.
fn sizes(cap: usize) -> impl Iterator<Item = usize> {
    CANDIDATES.into_iter().filter(move |&k| k < cap).chain([cap])
}

impl DraftLength {
    /// The estimated probability that a draft is accepted, given the ones before it were.
    pub fn acceptance(&self) -> f64 {
        self.kept / (self.kept + self.rejected)
    }

    /// Record a verification step of `drafted` drafts that kept `accepted` of them and took `time` (drafting,
    /// verification and acceptance).
    pub fn record(&mut self, drafted: usize, accepted: usize, time: Duration) {
        if drafted == 0 || drafted >= self.times.len() {
            return;
        }
        self.kept = self.kept * DECAY + accepted as f64;
        self.rejected = self.rejected * DECAY + f64::from(u8::from(accepted < drafted));
        let (times, warm) = &mut self.times[drafted];
        if !*warm {
            *warm = true;
            return;
        }
        if times.len() == SAMPLES {
            times.pop_front();
        }
        times.push_back(time.as_secs_f64());
    }

    /// The median recent time of steps of `k` drafts, if any were timed.
    fn cost(&self, k: usize) -> Option<f64> {
        let times = &self.times.get(k)?.0;
        let mut t = [0.0; SAMPLES];
        for (to, &from) in t.iter_mut().zip(times) {
            *to = from;
        }
        let t = &mut t[..times.len()];
        t.sort_by(f64::total_cmp);
        t.get(t.len() / 2).copied()
    }

    /// The cost assumed for `k` drafts (of at most `cap`): its own measured cost; untimed, the largest smaller timed
    /// size's (it costs at least as much, so this is optimistic and the size gets tried), or with only larger sizes
    /// timed, the smallest of them scaled by rows (verification cost grows at most that fast), so shorter drafts get
    /// tried too.
    fn estimate(&self, k: usize, cap: usize) -> Option<f64> {
        if let Some(c) = self.cost(k) {
            return Some(c);
        }
        let below = sizes(cap).filter(|&j| j < k).filter_map(|j| self.cost(j)).last();
        let above = || {
            sizes(cap)
                .filter(|&j| j > k)
                .find_map(|j| Some(self.cost(j)? * (k + 1) as f64 / (j + 1) as f64))
        };
        below.or_else(above)
    }

    /// Drafts for the next step of at most `cap` (1..`MAX_TOKENS`): the candidate with the most expected tokens
    /// per second. Before any step of the candidates is timed, the cap.
    pub fn choose(&self, cap: usize) -> usize {
        let cap = cap.clamp(1, MAX_TOKENS - 1);
        let a = self.acceptance();
        let mut best: Option<(f64, usize)> = None;
        for k in sizes(cap) {
            let Some(cost) = self.estimate(k, cap) else {
                continue;
            };
            let tokens: f64 = (0..=k as i32).map(|i| a.powi(i)).sum();
            let rate = tokens / cost.max(1e-9);
            if best.is_none_or(|(r, _)| rate > r) {
                best = Some((rate, k));
            }
        }
        best.map_or(cap, |(_, k)| k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: f64) -> Duration {
        Duration::from_secs_f64(v * 1e-3)
    }

    /// Times steps of each candidate size (lavapipe's SmolLM2 ratios: 2 rows 41 ms, 4 rows 57, 8 rows 81), the
    /// first of each left out.
    fn timed() -> DraftLength {
        let mut d = DraftLength::default();
        for (k, t) in [(1, 41.0), (3, 57.0), (7, 81.0)] {
            for _ in 0..3 {
                d.record(k, 0, ms(if d.times[k].1 { t } else { 900.0 }));
            }
        }
        d
    }

    #[test]
    fn long_drafts_when_they_are_accepted_short_ones_when_not() {
        let mut d = timed();
        for _ in 0..30 {
            d.record(7, 7, ms(81.0));
        }
        assert!(d.acceptance() > 0.95, "{}", d.acceptance());
        assert_eq!(d.choose(7), 7);
        // Two drafts in three right: 4 rows pay best (2.41 tokens per 57 ms against 1.67 per 41 and 2.88 per 81).
        let mut d = timed();
        for _ in 0..60 {
            d.record(3, 2, ms(57.0));
        }
        assert!((d.acceptance() - 2.0 / 3.0).abs() < 0.02, "{}", d.acceptance());
        assert_eq!(d.choose(7), 3);
        // Half of them: 2 rows (1.5 tokens per 41 ms against 1.88 per 57).
        for _ in 0..60 {
            d.record(3, 1, ms(57.0));
        }
        assert_eq!(d.choose(7), 1);
        // Rarely right: still the 2-row step.
        for _ in 0..60 {
            d.record(1, 0, ms(41.0));
        }
        assert_eq!(d.choose(7), 1);
    }

    #[test]
    fn the_cap_bounds_the_choice_and_untimed_sizes_get_tried() {
        let mut d = timed();
        for _ in 0..30 {
            d.record(5, 5, ms(81.0));
        }
        assert_eq!(d.choose(5), 5);
        // Only 2-row steps timed so far: with every draft accepted the larger (untimed) sizes look as cheap.
        let mut d = DraftLength::default();
        assert_eq!(d.choose(7), 7, "nothing timed: the cap");
        for _ in 0..3 {
            d.record(1, 1, ms(41.0));
        }
        assert_eq!(d.choose(7), 7);
        // Only the longest chains timed (1019 ms, a draft model's 7 steps included): shorter ones are assumed to
        // cost in proportion to their rows, so 1 draft gets tried (1.8 tokens per 255 ms); timed at 350 ms, 3 drafts
        // are assumed to cost as much and get tried; timed at 554 ms they stay the best (3.4 tokens per 554 ms
        // against 1.9 per 350 and 5.7 per 1019).
        let mut d = DraftLength::default();
        for _ in 0..4 {
            d.record(7, 5, ms(1019.0));
        }
        assert_eq!(d.choose(7), 1, "acceptance {}", d.acceptance());
        for _ in 0..2 {
            d.record(1, 1, ms(350.0));
        }
        assert_eq!(d.choose(7), 3, "acceptance {}", d.acceptance());
        for _ in 0..2 {
            d.record(3, 3, ms(554.0));
        }
        assert_eq!(d.choose(7), 3, "acceptance {}", d.acceptance());
        // A size's first step (which builds its plan) is left out: one step of 7 drafts does not count yet.
        let mut d = DraftLength::default();
        d.record(7, 0, ms(5000.0));
        assert!(d.cost(7).is_none());
        d.record(7, 0, ms(80.0));
        assert_eq!(d.cost(7), Some(0.08));
    }
}
