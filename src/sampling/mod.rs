//! Token sampling on the host: penalties, then greedy or temperature with top-k, top-p and min-p, from a seeded
//! generator so that a seed makes a run reproducible. The order follows llama.cpp's default chain. The random draw
//! of the token at position p comes from the seed's stream p, so it depends on the seed and the position alone:
//! speculative decoding, which samples verified positions out of order, reproduces the plain run token for token.

use rand_chacha::rand_core::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// What a user sets. `temperature <= 0` means greedy (argmax after penalties).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = off).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches p (1.0 = off).
    pub top_p: f32,
    /// Drop tokens whose probability is below min_p times the top one's (0 = off).
    pub min_p: f32,
    /// CTRL-style penalty on tokens seen in the last `penalty_last_n` tokens (1.0 = off).
    pub repetition_penalty: f32,
    /// OpenAI-style: logit -= count * frequency + (count > 0) * presence.
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    pub penalty_last_n: usize,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// True when logits must come back to the host (penalties or randomness); false when argmax on the GPU suffices.
    pub fn needs_logits(&self) -> bool {
        !self.is_greedy() || self.has_penalties()
    }

    fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0 || self.frequency_penalty != 0.0 || self.presence_penalty != 0.0
    }
}

/// A sampler with its own generator and reusable scratch (no allocation per token after the first).
pub struct Sampler {
    pub params: SamplingParams,
    /// The seed's generator; the draw for position p uses its stream p.
    rng: ChaCha8Rng,
    candidates: Vec<(u32, f32)>,
    counts: Vec<(u32, u32)>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = ChaCha8Rng::seed_from_u64(params.seed);
        Sampler {
            params,
            rng,
            candidates: Vec::new(),
            counts: Vec::new(),
        }
    }

    /// Apply the penalties for the recent `history` to `logits` in place.
    pub fn apply_penalties(&mut self, logits: &mut [f32], history: &[u32]) {
        let p = &self.params;
        if !p.has_penalties() {
            return;
        }
        let recent = &history[history.len().saturating_sub(p.penalty_last_n)..];
        self.counts.clear();
        for &t in recent {
            match self.counts.iter_mut().find(|(id, _)| *id == t) {
                Some(c) => c.1 += 1,
                None => self.counts.push((t, 1)),
            }
        }
        for &(t, count) in &self.counts {
            let Some(l) = logits.get_mut(t as usize) else { continue };
            if p.repetition_penalty != 1.0 {
                *l = if *l > 0.0 {
                    *l / p.repetition_penalty
                } else {
                    *l * p.repetition_penalty
                };
            }
            *l -= count as f32 * p.frequency_penalty + p.presence_penalty;
        }
    }

    /// Pick the next token from raw logits given the tokens so far (the token's position is `history.len()`, which
    /// keys the random draw). Ties in greedy go to the lower id.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        let u = self.uniform(history.len(), 0);
        pick(self.probs(logits, history), u)
    }

    /// The distribution the next token is drawn from (penalties, temperature, top-k, top-p, min-p), as (id,
    /// probability) pairs, most likely first, summing to 1; greedy: the argmax alone. NaN logits never appear.
    pub fn probs(&mut self, logits: &mut [f32], history: &[u32]) -> &[(u32, f32)] {
        self.apply_penalties(logits, history);
        let p = self.params.clone();
        let c = &mut self.candidates;
        c.clear();
        if p.is_greedy() {
            c.push((argmax(logits), 1.0));
            return c;
        }
        c.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| !l.is_nan())
                .map(|(i, &l)| (i as u32, l)),
        );
        if c.is_empty() {
            c.push((0, 1.0));
            return c;
        }
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < c.len() {
            c.select_nth_unstable_by(p.top_k - 1, by_logit);
            c.truncate(p.top_k);
        }
        c.sort_unstable_by(by_logit);
        // Probabilities at the sampling temperature.
        let max = c[0].1;
        let mut sum = 0f64;
        for x in c.iter_mut() {
            x.1 = (((x.1 - max) / p.temperature) as f64).exp() as f32;
            sum += x.1 as f64;
        }
        for x in c.iter_mut() {
            x.1 = (x.1 as f64 / sum) as f32;
        }
        if p.top_p < 1.0 {
            let mut acc = 0f32;
            let keep = c
                .iter()
                .position(|x| {
                    acc += x.1;
                    acc >= p.top_p
                })
                .map_or(c.len(), |i| i + 1);
            c.truncate(keep.max(1));
        }
        if p.min_p > 0.0 {
            let floor = c[0].1 * p.min_p;
            let keep = c.iter().take_while(|x| x.1 >= floor).count();
            c.truncate(keep.max(1));
        }
        let total: f64 = c.iter().map(|x| x.1 as f64).sum();
        for x in c.iter_mut() {
            x.1 = (x.1 as f64 / total) as f32;
        }
        c
    }

    /// A uniform draw in [0, 1) that depends on the seed, the position `pos` and `k` alone: draw k of the seed's
    /// stream `pos` (k = 0 picks the token at `pos`; speculative decoding's acceptance tests use the next ones).
    pub fn uniform(&self, pos: usize, k: usize) -> f32 {
        let mut rng = self.rng.clone();
        rng.set_stream(pos as u64);
        let mut v = 0;
        for _ in 0..=k {
            v = rng.next_u64();
        }
        ((v >> 40) as f32) / (1u32 << 24) as f32
    }
}

/// The token at cumulative probability `u` of `dist` ((id, probability) pairs summing to about 1); the last one
/// when rounding leaves `u` past the total.
pub fn pick(dist: &[(u32, f32)], u: f32) -> u32 {
    let mut acc = 0f32;
    for &(id, p) in dist {
        acc += p;
        if u < acc {
            return id;
        }
    }
    dist.last().map_or(0, |x| x.0)
}

/// Index of the largest value; NaN never wins; the lowest index wins ties.
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, v) in values.iter().enumerate() {
        if values[best].is_nan() || *v > values[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_maximum_and_ignores_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5, 0.7]), 2);
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&mut [0.1, 0.9, 0.2], &[]), 1);
    }

    #[test]
    fn a_seed_reproduces_a_run_and_another_seed_differs() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let params = |seed| SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed,
            ..Default::default()
        };
        let history: Vec<u32> = (0..64).collect();
        let run = |seed| {
            let mut s = Sampler::new(params(seed));
            (0..64)
                .map(|i| s.sample(&mut logits.clone(), &history[..i]))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        // The draw depends on the position alone: positions sampled out of order give the same tokens.
        let mut s = Sampler::new(params(7));
        let backwards: Vec<u32> = (0..64)
            .rev()
            .map(|i| s.sample(&mut logits.clone(), &history[..i]))
            .collect();
        assert_eq!(backwards.into_iter().rev().collect::<Vec<_>>(), run(7));
    }

    #[test]
    fn top_k_one_is_greedy_and_top_p_min_p_cut_the_tail() {
        let logits = [0.0f32, 5.0, 4.9, -3.0];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 1,
            ..Default::default()
        });
        for _ in 0..20 {
            assert_eq!(s.sample(&mut logits.clone(), &[]), 1);
        }
        // top_p 0.9: tokens 1 and 2 hold 99.9% between them, so 0 and 3 (tiny mass) never appear.
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.9,
            min_p: 0.0,
            ..Default::default()
        });
        let mut seen = [0; 4];
        let positions = vec![0u32; 400];
        for i in 0..400 {
            seen[s.sample(&mut logits.clone(), &positions[..i]) as usize] += 1;
        }
        assert_eq!((seen[0], seen[3]), (0, 0), "{seen:?}");
        assert!(seen[1] > 100 && seen[2] > 100, "{seen:?}");
        // min_p 0.5: token 2 has p2/p1 = e^-0.1 = 0.9 and stays; 0 and 3 go.
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.5,
            ..Default::default()
        });
        let positions = vec![0u32; 100];
        for i in 0..100 {
            assert!(matches!(s.sample(&mut logits.clone(), &positions[..i]), 1 | 2));
        }
    }

    #[test]
    fn penalties_follow_their_definitions() {
        let mut s = Sampler::new(SamplingParams {
            repetition_penalty: 2.0,
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            ..SamplingParams::greedy()
        });
        let mut l = [4.0f32, -1.0, 3.0];
        s.apply_penalties(&mut l, &[0, 0, 1, 7]);
        // token 0: 4/2 - 2*0.5 - 0.25; token 1: -1*2 - 0.5 - 0.25; token 2 untouched; id 7 out of range ignored.
        assert_eq!(l, [0.75, -2.75, 3.0]);
        // Greedy now picks token 2, where without penalties it picked 0.
        assert_eq!(s.sample(&mut [4.0, -1.0, 3.0], &[0, 0, 1]), 2);
    }
}
