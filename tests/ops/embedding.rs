//! embedding vs CPU: exact (a gather; f16 -> f32 conversion is exact), compared bit for bit.
//!
//! The split path runs on a device whose binding limit is pretended to be 16 KiB, so small tables split into 3+
//! row parts with an uneven last part; ids at part edges and ids >= vocab (zero rows) are included.

use crate::common::{exact, Case, Rng};
use shaderlm::gpu::{DType, Gpu, GpuOptions, GpuTensor};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::embedding;
use std::sync::OnceLock;

/// A device whose storage binding limit is pretended to be 16 KiB.
fn gpu_small_bindings() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| {
        let opts = GpuOptions {
            max_binding_override: Some(16 << 10),
            ..Default::default()
        };
        crate::common::new_gpu(&opts)
    })
}

/// Gather `ids` from a random [v, d] table; `min_parts` guards that the table really split.
fn check(
    gpu: &Gpu,
    v: usize,
    d: usize,
    half: bool,
    ids: &[u32],
    min_parts: usize,
) -> shaderlm::Result<crate::common::Check> {
    let mut rng = Rng::new((v * 7 + d) as u64);
    let mut table = rng.vec(v * d, 3.0);
    let t = if half {
        table.iter_mut().for_each(|x| *x = half::f16::from_f32(*x).to_f32());
        GpuTensor::upload_f16(gpu, "table", &[v, d], &table)?
    } else {
        GpuTensor::upload_f32(gpu, "table", &[v, d], &table)?
    };
    if t.parts.len() < min_parts {
        return Err(shaderlm::Error::Invalid(format!(
            "table split into {} parts, want {min_parts}+",
            t.parts.len()
        )));
    }
    let mut g = Graph::new();
    let ti = g.input("ids", &[ids.len()], DType::U32);
    let tt = g.external(&t);
    let y = g.embedding(ti, tt)?;
    g.output(y);
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, ti, bytemuck::cast_slice(ids))?;
    plan.run(gpu, &StepVars::default())?;
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
    Ok(exact(
        &bits(&plan.read_f32(y)?),
        &bits(&embedding::reference(ids, &table, d)),
    ))
}

/// `m` ids below `v`, starting with 0 and v - 1.
fn random_ids(m: usize, v: usize) -> Vec<u32> {
    let mut rng = Rng::new(m as u64 * 3 + v as u64);
    let mut ids: Vec<u32> = (0..m).map(|_| rng.below(v as u32)).collect();
    ids[0] = 0;
    if m > 1 {
        ids[1] = v as u32 - 1;
    }
    ids
}

pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for half in [false, true] {
        let tag = if half { "f16" } else { "f32" };
        for d in [1usize, 7, 64, 576, 1000, 4096] {
            for m in [1usize, 3, 17] {
                v.push(Case::new("embedding", format!("{tag}/m{m}_d{d}"), move |gpu| {
                    check(gpu, 50, d, half, &random_ids(m, 50), 1)
                }));
            }
        }
        // id 0 and vocab - 1 alone (first and last row), and a repeated id.
        v.push(Case::new(
            "embedding",
            format!("{tag}/first_last_repeated"),
            move |gpu| check(gpu, 301, 33, half, &[0, 300, 300, 0, 7, 7], 1),
        ));
        // Ids >= vocab give zero rows, and nothing reads past the table.
        v.push(Case::new(
            "embedding",
            format!("{tag}/ids_out_of_range_zero"),
            move |gpu| check(gpu, 40, 9, half, &[39, 40, 0, u32::MAX, 41, 1 << 31], 1),
        ));
    }
    // Every f16 bit pattern (zeros, subnormals, normals, infinities, NaNs) as a [32768, 2] table, all rows gathered.
    v.push(Case::new("embedding", "f16/all_bit_patterns", |gpu| {
        let bits: Vec<u16> = (0..=u16::MAX).collect();
        let t = GpuTensor::upload(gpu, "table", &[32768, 2], DType::F16, bytemuck::cast_slice(&bits))?;
        let ids: Vec<u32> = (0..32768).collect();
        let mut g = Graph::new();
        let ti = g.input("ids", &[ids.len()], DType::U32);
        let tt = g.external(&t);
        let y = g.embedding(ti, tt)?;
        g.output(y);
        let mut plan = Plan::new(gpu, g)?;
        plan.write_input(gpu, ti, bytemuck::cast_slice(&ids))?;
        plan.run(gpu, &StepVars::default())?;
        // NaN payloads may be quieted on either side: any NaN matches any NaN, everything else bit for bit.
        let key = |x: f32| if x.is_nan() { u32::MAX } else { x.to_bits() };
        let got: Vec<u32> = plan.read_f32(y)?.into_iter().map(key).collect();
        let want: Vec<u32> = bits.iter().map(|&b| key(half::f16::from_bits(b).to_f32())).collect();
        Ok(exact(&got, &want))
    }));
    // The table as a graph input rather than an external tensor (one part, bound whole).
    v.push(Case::new("embedding", "f32/table_as_input", |gpu| {
        let (vocab, d) = (37, 5);
        let table = Rng::new(5).vec(vocab * d, 3.0);
        let ids = [36u32, 0, 17, 37];
        let mut g = Graph::new();
        let ti = g.input("ids", &[ids.len()], DType::U32);
        let tt = g.input("table", &[vocab, d], DType::F32);
        let y = g.embedding(ti, tt)?;
        g.output(y);
        let mut plan = Plan::new(gpu, g)?;
        plan.write_input(gpu, ti, bytemuck::cast_slice(&ids))?;
        plan.write_input(gpu, tt, bytemuck::cast_slice(&table))?;
        plan.run(gpu, &StepVars::default())?;
        Ok(exact(&plan.read_f32(y)?, &embedding::reference(&ids, &table, d)))
    }));
    // Split tables: f32 [150, 64] (256-byte rows) -> parts of 64, 64, 22 rows.
    v.push(Case::new("embedding", "split/f32_3_parts_uneven", |_| {
        check(
            gpu_small_bindings(),
            150,
            64,
            false,
            &[0, 63, 64, 127, 128, 149, 150, u32::MAX, 5, 100, 140],
            3,
        )
    }));
    // f16 [700, 33] (odd d: 17 words, 68-byte rows) -> parts of 240, 240, 220 rows.
    v.push(Case::new("embedding", "split/f16_odd_d_3_parts", |_| {
        let mut ids = random_ids(17, 700);
        ids.extend([239, 240, 479, 480, 699, 700]);
        check(gpu_small_bindings(), 700, 33, true, &ids, 3)
    }));
    // f16 [10000, 1] (one word per row) -> parts of 4096, 4096, 1808 rows.
    v.push(Case::new("embedding", "split/f16_d1_3_parts", |_| {
        let mut ids = random_ids(17, 10000);
        ids.extend([4095, 4096, 8191, 8192, 9999, 10000]);
        check(gpu_small_bindings(), 10000, 1, true, &ids, 3)
    }));
    // Many ids: the grid folds into y past 65535 workgroups.
    v.push(Case::new("embedding", "f32/folded_grid_70000_ids", |gpu| {
        check(gpu, 1000, 3, false, &random_ids(70_000, 1000), 1)
    }));
    v
}
