//! Several sessions decoding together: one batched step ([`Llama::batch_step`]) runs the next token of each,
//! reading the weights once for all of them; each session's row equals its own one-token step bit for bit, so a
//! session decodes the same text batched or alone.

use super::{Generator, StepResult};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::model::{Llama, Step, StepOutputs};
use std::collections::HashMap;

/// Batched plans kept at once (one per set of sessions seen together), before the oldest are dropped.
const MAX_PLANS: usize = 16;

/// The batched steps of a fixed set of sessions, and the last one's outputs.
pub struct Batch {
    outputs: StepOutputs,
    /// Plans by the callers' keys of their sessions, in row order.
    plans: HashMap<Vec<usize>, Step>,
    /// Each row's position, for the next run.
    positions: Vec<usize>,
    /// Outputs of the last step: row `r` is session `r`'s (`row_argmax[r]`, logits `[r * vocab ..]`).
    pub result: StepResult,
}

impl Batch {
    /// Batched steps reading back `outputs` for every row.
    pub fn new(outputs: StepOutputs) -> Batch {
        Batch {
            outputs,
            plans: HashMap::new(),
            positions: Vec::new(),
            result: StepResult::default(),
        }
    }

    /// Run `ids[r]` after the cached tokens of `gens[r]`, all in one step; `self.result` then holds every row's
    /// outputs. `keys[r]` names the session of `gens[r]` for the plan cache: the same key must always mean the same
    /// session (its cache), as a plan binds the caches it was built for. Every session must share one model and
    /// device.
    pub fn feed(&mut self, keys: &[usize], gens: &mut [&mut Generator<'_>], ids: &[u32]) -> Result<()> {
        let Some(first) = gens.first() else {
            return Err(Error::Invalid("a batched step of no sessions".into()));
        };
        let (gpu, model): (&Gpu, &Llama) = (first.gpu, first.model);
        if keys.len() != gens.len() || ids.len() != gens.len() {
            return Err(Error::Invalid(format!(
                "a batched step of {} sessions with {} keys and {} tokens",
                gens.len(),
                keys.len(),
                ids.len()
            )));
        }
        for (g, &t) in gens.iter().zip(ids) {
            if !std::ptr::eq(g.model, model) || !std::ptr::eq(g.gpu, gpu) {
                return Err(Error::Invalid(
                    "a batched step over sessions of different models".into(),
                ));
            }
            g.check_fits(&[t])?;
        }
        if !self.plans.contains_key(keys) {
            if self.plans.len() >= MAX_PLANS {
                self.plans.clear();
            }
            let caches: Vec<_> = gens.iter().map(|g| &g.cache).collect();
            let step = model.batch_step(gpu, &caches, self.outputs)?;
            self.plans.insert(keys.to_vec(), step);
        }
        let step = self.plans.get_mut(keys).expect("just inserted");
        self.positions.clear();
        self.positions.extend(gens.iter().map(|g| g.tokens.len()));
        step.run_batch(gpu, ids, &self.positions, &mut self.result)?;
        for (g, &t) in gens.iter_mut().zip(ids) {
            g.tokens.push(t);
        }
        Ok(())
    }
}
