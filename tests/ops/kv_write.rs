//! kv_write vs CPU: a copy, so the whole cache (written rows and every untouched row) must match bit for bit.
//! The cache starts filled with random values, so a stray or missing write shows up as a mismatch.

use crate::common::{exact, Case, Rng};
use shaderlm::gpu::{DType, Gpu, GpuTensor};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::kv_write;

/// Write `steps` (one `k` of `n_tokens` per step, at each step's pos) through one plan; compare the whole cache.
fn run(
    gpu: &Gpu,
    n_tokens: usize,
    n_kv: usize,
    head_dim: usize,
    max_ctx: usize,
    steps: &[u32],
    seed: u64,
) -> shaderlm::Result<crate::common::Check> {
    let mut rng = Rng::new(seed);
    let init = rng.vec(n_kv * max_ctx * head_dim, 1.0);
    let cache = GpuTensor::upload_f32(gpu, "k_cache", &[n_kv, max_ctx, head_dim], &init)?;
    let mut g = Graph::new();
    let k = g.input("k", &[n_tokens, n_kv, head_dim], DType::F32);
    let c = g.external(&cache);
    g.kv_write(k, c)?;
    let mut plan = Plan::new(gpu, g)?;
    let mut want = init;
    for &pos in steps {
        let kv = rng.vec(n_tokens * n_kv * head_dim, 1.0);
        plan.write_input(gpu, k, bytemuck::cast_slice(&kv))?;
        plan.run(gpu, &StepVars { pos })?;
        kv_write::reference(&kv, &mut want, n_kv, max_ctx, head_dim, pos as usize);
    }
    let got: Vec<u32> = cache.download_f32(gpu)?.iter().map(|x| x.to_bits()).collect();
    let want: Vec<u32> = want.iter().map(|x| x.to_bits()).collect();
    Ok(exact(&got, &want))
}

/// (name, n_tokens, n_kv, head_dim, max_ctx, positions of successive runs of one plan)
type Grid = (&'static str, usize, usize, usize, usize, Vec<u32>);

pub fn cases() -> Vec<Case> {
    let grid: Vec<Grid> = vec![
        ("first_token", 1, 1, 64, 16, vec![0]),
        ("decode_steps_reuse_plan", 1, 3, 64, 40, vec![0, 1, 2, 37, 39]),
        ("chunk_at_pos", 5, 8, 128, 300, vec![100]),
        ("two_chunks", 37, 2, 64, 80, vec![0, 37]),
        ("odd_head_dim", 3, 3, 7, 11, vec![4]),
        ("fills_last_slot", 4, 2, 64, 20, vec![16]),
        // pos + n_tokens > max_ctx: the two tokens that fit are written, the rest must not spill into the next
        // head's first positions.
        ("past_end_dropped", 5, 3, 64, 20, vec![18]),
        ("long_chunk", 130, 2, 128, 130, vec![0]),
    ];
    let mut v: Vec<Case> = grid
        .into_iter()
        .enumerate()
        .map(|(i, (name, n, kv, d, ctx, steps))| {
            Case::new("kv_write", format!("{name}_t{n}_kv{kv}_d{d}_ctx{ctx}"), move |gpu| {
                run(gpu, n, kv, d, ctx, &steps, 1000 + i as u64)
            })
        })
        .collect();
    // Keys and values in one dispatch: both caches must match, including the dropped tail past max_ctx.
    for (name, n, kv, d, ctx, steps) in [
        ("pair_decode_steps", 1, 3, 64, 40, vec![0u32, 1, 39]),
        ("pair_past_end", 5, 2, 7, 20, vec![18]),
    ] {
        v.push(Case::new("kv_write", name, move |gpu| {
            run_pair(gpu, n, kv, d, ctx, &steps, 77)
        }));
    }
    v
}

/// `kv_write_pair` through one plan over `steps`; both whole caches compared bit for bit.
fn run_pair(
    gpu: &Gpu,
    n_tokens: usize,
    n_kv: usize,
    head_dim: usize,
    max_ctx: usize,
    steps: &[u32],
    seed: u64,
) -> shaderlm::Result<crate::common::Check> {
    let mut rng = Rng::new(seed);
    let shape = [n_kv, max_ctx, head_dim];
    let (init_k, init_v) = (
        rng.vec(shape.iter().product(), 1.0),
        rng.vec(shape.iter().product(), 1.0),
    );
    let kc = GpuTensor::upload_f32(gpu, "k_cache", &shape, &init_k)?;
    let vc = GpuTensor::upload_f32(gpu, "v_cache", &shape, &init_v)?;
    let mut g = Graph::new();
    let k = g.input("k", &[n_tokens, n_kv, head_dim], DType::F32);
    let v = g.input("v", &[n_tokens, n_kv, head_dim], DType::F32);
    let (tk, tv) = (g.external(&kc), g.external(&vc));
    g.kv_write_pair(k, v, tk, tv)?;
    let mut plan = Plan::new(gpu, g)?;
    let (mut want_k, mut want_v) = (init_k, init_v);
    for &pos in steps {
        let (kv_k, kv_v) = (
            rng.vec(n_tokens * n_kv * head_dim, 1.0),
            rng.vec(n_tokens * n_kv * head_dim, 1.0),
        );
        plan.write_input(gpu, k, bytemuck::cast_slice(&kv_k))?;
        plan.write_input(gpu, v, bytemuck::cast_slice(&kv_v))?;
        plan.run(gpu, &StepVars { pos })?;
        kv_write::reference(&kv_k, &mut want_k, n_kv, max_ctx, head_dim, pos as usize);
        kv_write::reference(&kv_v, &mut want_v, n_kv, max_ctx, head_dim, pos as usize);
    }
    let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let mut got = bits(kc.download_f32(gpu)?);
    got.extend(bits(vc.download_f32(gpu)?));
    let mut want = bits(want_k);
    want.extend(bits(want_v));
    Ok(exact(&got, &want))
}
