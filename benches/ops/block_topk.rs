//! InfLLM-v2 block selection with MiniCPM4's configuration (blocks of 64, 1 init, window 2048, topk 64: budget 96)
//! over the block scores of a 32K cache (nb 512) for 2 KV heads: one decode token, and a prefill chunk of 128, with
//! both kernels (`Serial`, the CPU adapters' default, and `Workgroup`, the GPUs').
//! Cost: the scores read by the radix passes, the selection written.

use crate::common::Bench;
use shaderlm::gpu::DType;
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::block_topk::{BlockSelection, TopkVariant};

/// Score-like values: pseudo-random in [0, 1) (no long runs of ties, unlike the default fill).
pub fn scores(n: usize) -> Vec<f32> {
    let mut s = 0x2545F4914F6CDD1Du64;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32
        })
        .collect()
}

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    let (ctx, n_kv) = (32768usize, 2usize);
    let nb = ctx / 64;
    for variant in [TopkVariant::Serial, TopkVariant::Workgroup] {
        for n_tokens in [1usize, 128] {
            let name = format!("block_topk {variant:?} minicpm4 nb{nb} t{n_tokens} kv{n_kv}");
            v.push(Bench::new(name, move |gpu| {
                let mut g = Graph::new();
                let t = g.input("scores", &[n_tokens, n_kv, nb], DType::F32);
                g.block_topk_variant(t, BlockSelection::infllm_v2(64, 1, 2048, 64), variant)?;
                let plan = Plan::new(gpu, g)?;
                plan.write_input(gpu, t, bytemuck::cast_slice(&scores(n_tokens * n_kv * nb)))?;
                let pos = (ctx - n_tokens) as u32;
                Ok((plan, StepVars { pos }))
            }));
        }
    }
    v
}
