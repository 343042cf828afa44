//! `bench -b B`: B sessions decoding together in batched steps (as `serve` runs its active sessions): each decodes
//! N greedy tokens after the depth's tokens, and the row reports all sessions' tokens per second (`tgN x B`), to
//! set against `tgN` (one session) measured in the same run.

use super::bench::Row;
use shaderlm::generate::batch::Batch;
use shaderlm::generate::Generator;
use shaderlm::gpu::Gpu;
use shaderlm::model::{Llama, StepOutputs};
use std::time::Instant;

/// `tgN x B`: `sessions` fresh sessions of `ctx` positions, each holding `depth` first (untimed), decode `n`
/// tokens each in batched steps, after one warm-up step that builds the plan.
pub fn generation(
    gpu: &Gpu,
    model: &Llama,
    ctx: usize,
    depth: &[u32],
    sessions: usize,
    n: usize,
    repetitions: usize,
) -> anyhow::Result<Row> {
    anyhow::ensure!(
        model.can_batch(gpu),
        "-b: this model cannot batch sessions on this adapter"
    );
    anyhow::ensure!(
        depth.len() + n <= ctx,
        "-n {n} after -d {} is over the context of {ctx} (--ctx)",
        depth.len()
    );
    let outputs = StepOutputs {
        argmax: true,
        ..Default::default()
    };
    let mut gens = (0..sessions)
        .map(|_| Generator::new(gpu, model, ctx, outputs))
        .collect::<shaderlm::error::Result<Vec<_>>>()?;
    for g in &mut gens {
        if !depth.is_empty() {
            g.feed(depth)?;
        }
    }
    let keys: Vec<usize> = (0..sessions).collect();
    let mut batch = Batch::new(outputs);
    let mut tokens = vec![1u32; sessions];
    let mut step = |gens: &mut Vec<Generator<'_>>, tokens: &mut Vec<u32>| -> anyhow::Result<()> {
        let mut refs: Vec<&mut Generator<'_>> = gens.iter_mut().collect();
        batch.feed(&keys, &mut refs, tokens)?;
        tokens.copy_from_slice(&batch.result.row_argmax);
        Ok(())
    };
    step(&mut gens, &mut tokens)?;
    let mut samples = Vec::new();
    for _ in 0..repetitions {
        gens.iter_mut().for_each(|g| g.truncate(depth.len()));
        tokens.fill(1);
        let t = Instant::now();
        for _ in 0..n {
            step(&mut gens, &mut tokens)?;
        }
        samples.push((sessions * n) as f64 / t.elapsed().as_secs_f64());
    }
    let test = match depth.len() {
        0 => format!("tg{n} x {sessions}"),
        d => format!("tg{n} x {sessions} @ d{d}"),
    };
    Ok(Row {
        test,
        tokens: sessions * n,
        samples,
    })
}
