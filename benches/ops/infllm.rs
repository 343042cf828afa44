//! One layer's attention, dense against InfLLM-v2 sparse, at contexts 1K to 32K for a MiniCPM4-0.5B-like shape
//! (16 / 2 heads, d 64) with MiniCPM4's sparse_config (windows 32/16 and 128/64, blocks of 64, budget 96): a decoded
//! token (1 query) and a prefill chunk (128 queries) whose last query sits at the context's end. Dense: the
//! attention_decode / attention_prefill kernels. Sparse: the whole chain a sparse step runs, the compressed-key
//! updates (2 x kv_compress), block_score, block_topk and attention_sparse. The K/V writes are the same in both
//! and left out. Where the budget (96 blocks = 6144 keys) covers the context the sparse chain does the dense work
//! plus the scoring; past it, sparse attention stops growing and only the stage-1 scores do.

use crate::common::{fill_inputs, weight, Bench};
use shaderlm::gpu::{DType, GpuTensor};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::model::sparse::{self, CompressedKeys};
use shaderlm::model::SparseConfig;

const N_HEADS: usize = 16;
const N_KV: usize = 2;
const HD: usize = 64;

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    for n in [1usize, 128] {
        for ctx in [1024usize, 4096, 16384, 32768] {
            for dense in [true, false] {
                let kind = if dense { "dense" } else { "sparse" };
                let name = format!("infllm layer {kind} minicpm4-0.5b {n}tok ctx{ctx}");
                v.push(Bench::new(name, move |gpu| {
                    let s = SparseConfig::MINICPM4;
                    let cache = [N_KV, ctx, HD];
                    let (kc, vc) = (
                        weight(gpu, "k_cache", &cache, DType::F32)?,
                        weight(gpu, "v_cache", &cache, DType::F32)?,
                    );
                    let (fine, coarse) = s.windows();
                    let keys = CompressedKeys {
                        c1: GpuTensor::zeros(gpu, "c1", &[N_KV, fine.count(ctx), HD], DType::F32)?,
                        c2: GpuTensor::zeros(gpu, "c2", &[N_KV, coarse.count(ctx), HD], DType::F32)?,
                    };
                    let mut g = Graph::new();
                    let q = g.input("q", &[n, N_HEADS, HD], DType::F32);
                    let (k, vv) = (g.external(&kc), g.external(&vc));
                    let scale = 1.0 / (HD as f32).sqrt();
                    if dense && n == 1 {
                        g.attention_decode(q, k, vv, scale)?;
                    } else if dense {
                        g.attention_prefill(q, k, vv, scale)?;
                    } else {
                        let cc = sparse::compress(&mut g, &s, &keys, k, n)?;
                        sparse::attention(&mut g, &s, q, k, vv, cc, ctx, scale, None)?;
                    }
                    let plan = Plan::new(gpu, g)?;
                    fill_inputs(gpu, &plan, &[(q, n * N_HEADS * HD, DType::F32)])?;
                    Ok((plan, StepVars { pos: (ctx - n) as u32 }))
                }));
            }
        }
    }
    v
}
