//! embedding_q vs the CPU dequantization of the very blocks that were packed (`pack::dequantize_packed`:
//! super-block types as the 32-weight blocks they are repacked into): every packable type in both layouts, ids at 0
//! and N-1, repeated ids, an id >= N (a zero row), tables split into row parts, and a tied embedding / LM head
//! reading one packed copy in one graph. k-quants need K a multiple of 256: each K is rounded up to one for them.
//!
//! Metric: Q4_0, Q5_0, Q8_0, Q6_K, IQ4_NL and IQ4_XS exact bits (one rounding of `d * (q - c)` or `d * q` on both
//! sides, q the codebook value for IQ4: the kernels' polynomial rounds to it exactly; the f16 constants are decoded
//! exactly). Formats with a min, `d * q + m`: the GPU compiler may fuse it into one FMA where the CPU rounds twice,
//! so the bound is rel+abs with rtol 0 and atol 2^-23 for Q4_1 (at least 2 ulp of the product d * q <= 15 * 2^-4
//! < 1), 2^-21 for Q5_1 (2 ulp of d q + |m| < 31 * 2^-4 + 2^-2 < 4); for k-quants 2 ulp of the largest result,
//! d q + |m| < 2 + 2^-2 for Q4_K (d q <= 15 * 63 * 2^-9), < 4 + 2^-2 for Q5_K (31 * 63 * 2^-9): 2^-21 and 2^-20;
//! a wrong nibble, scale or row is off by at least d >= 2^-5 (k-quants: by a sub-block scale, 2^-10 or more unless
//! its 6-bit code is 0, and most of the 256 codes of a row are not). Q2_K, `a q - n` with a = d sc and n = dmin m
//! exact in f32: |a q| <= 45 d < 0.36 and |n| <= 15 |dmin| < 0.06, so results below 0.5 and 2^-23 is 4 ulp of them;
//! a wrong quant or code is off by a = d sc >= 2^-8 (unless sc is 0). Q3_K exact bits: `a (q - 4)` with a = d (sc -
//! 32) (17 significant bits) is an exact product on both sides (zeros signed as a's).

use crate::common::{exact, rel_abs, Case, Check, Rng};
use crate::matmul_q::{gpu_split, k_quant, random_blocks};
use shaderlm::gpu::{DType, Gpu, GpuOptions};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::ops::{embedding_q, matmul_q};
use shaderlm::gpu::packed::PackedWeight;
use shaderlm::quant::pack::{dequantize_packed, Format, Layout, PACKABLE};
use shaderlm::quant::GgmlType;
use std::sync::OnceLock;

const FORMATS: [GgmlType; 12] = PACKABLE;
const LAYOUTS: [Layout; 2] = [Layout::Tiled, Layout::Rows];

/// A device whose storage bindings are capped at 4 KiB.
fn gpu_small_bindings() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| {
        let opts = GpuOptions {
            max_binding_override: Some(4 << 10),
            ..Default::default()
        };
        crate::common::new_gpu(&opts)
    })
}

fn compare(ty: GgmlType, got: &[f32], want: &[f32]) -> Check {
    let atol = match ty {
        GgmlType::Q4_1 => Some(23),
        GgmlType::Q5_1 => Some(21),
        GgmlType::Q4_K => Some(21),
        GgmlType::Q5_K => Some(20),
        GgmlType::Q2_K => Some(23),
        _ => None,
    };
    if let Some(e) = atol {
        return rel_abs(got, want, 0.0, 1.0 / (1u64 << e) as f64);
    }
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
    exact(&bits(got), &bits(want))
}

/// Gather `ids` from a random [n, k] weight; `min_parts` guards that the weight really split.
fn check(
    gpu: &Gpu,
    ty: GgmlType,
    layout: Layout,
    n: usize,
    k: usize,
    ids: &[u32],
    min_parts: usize,
) -> shaderlm::Result<Check> {
    let k = k.next_multiple_of(ty.block_size());
    let raw = random_blocks(ty, n, k, (n * 31 + k) as u64);
    let w = PackedWeight::upload_with(gpu, "table", ty, layout, n, k, &raw)?;
    if w.parts().len() < min_parts {
        return Err(shaderlm::Error::Invalid(format!(
            "weight split into {} parts, want {min_parts}+",
            w.parts().len()
        )));
    }
    let mut g = Graph::new();
    let ti = g.input("ids", &[ids.len()], DType::U32);
    let y = g.embedding_q(ti, &w)?;
    g.output(y);
    let mut plan = Plan::new(gpu, g)?;
    plan.write_input(gpu, ti, bytemuck::cast_slice(ids))?;
    plan.run(gpu, &StepVars::default())?;
    let table = dequantize_packed(ty, &raw)?;
    Ok(compare(ty, &plan.read_f32(y)?, &embedding_q::reference(ids, &table, k)))
}

/// `m` ids below `n`: 0, n - 1, then random with repeats.
fn ids(m: usize, n: usize) -> Vec<u32> {
    let mut rng = Rng::new(m as u64 * 3 + n as u64);
    let mut ids: Vec<u32> = (0..m).map(|_| rng.below(n as u32)).collect();
    ids[0] = 0;
    if m > 1 {
        ids[1] = n as u32 - 1;
    }
    if m > 3 {
        ids[3] = ids[2];
    }
    ids
}

fn name(ty: GgmlType, layout: Layout) -> String {
    format!("{ty}_{}", if layout == Layout::Tiled { "tiled" } else { "rows" })
}

pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    // (n, k, m): one row of one block; a 7-row table (less than a tile) gathered 5 times; 129 rows (a tile
    // remainder); SmolLM2's width with a tail tile (1000 rows).
    for (n, k, m) in [(1, 32usize, 1), (7, 32, 5), (129, 64, 9), (1000, 576, 17)] {
        for ty in FORMATS {
            let k = k.next_multiple_of(ty.block_size());
            for layout in LAYOUTS {
                v.push(Case::new(
                    "embedding_q",
                    format!("{}_n{n}_k{k}_m{m}", name(ty, layout)),
                    move |gpu| check(gpu, ty, layout, n, k, &ids(m, n), 1),
                ));
            }
        }
    }
    // Ids past the table (n, u32::MAX) give zero rows, beside valid ids 0 and n - 1.
    for ty in FORMATS {
        for layout in LAYOUTS {
            v.push(Case::new(
                "embedding_q",
                format!("{}_out_of_range_ids_zero", name(ty, layout)),
                move |gpu| check(gpu, ty, layout, 100, 64, &[99, 100, 0, u32::MAX, 99], 1),
            ));
        }
    }
    // Split tables (4 KiB bindings): ids on both sides of every part edge. 4-bit [1000, 32]: 16 B of quants a row,
    // parts of 256 rows (8 tiles), 4 parts; 5-bit (20 B a row): tiled 192 rows (6 tiles), rows layout 204 (51
    // granules of 4); 6-bit (24 B): 160 / 168 rows; Q8 [300, 32]: 32 B a row, 128 rows a part, 3 parts. Super-block
    // types (K = 256, 8x the bytes a row) on 32 KiB bindings (8x too): the same parts (Q4_K and IQ4_XS pack as
    // 4-bit, Q5_K as 5-bit, Q6_K as 6-bit).
    for ty in FORMATS {
        for layout in LAYOUTS {
            let f = Format::new(ty).expect("packable");
            let tiled = layout == Layout::Tiled;
            // Q2_K (K = 256: 2 KiB of quants a tile, 256 B a row) 16 tiles or 128 granules, 512 rows a part; Q3_K
            // (3 KiB a tile, 384 B a row) 10 tiles (320 rows) or 85 granules (340 rows).
            let (n, k, per): (usize, usize, usize) = match f.high_bits() {
                _ if ty == GgmlType::Q2_K => (1000, 32, 512),
                _ if ty == GgmlType::Q3_K => (1000, 32, if tiled { 320 } else { 340 }),
                _ if f.q8() => (300, 32, 128),
                0 => (1000, 32, 256),
                1 => (1000, 32, if tiled { 192 } else { 204 }),
                _ => (1000, 32, if tiled { 160 } else { 168 }),
            };
            let on: fn() -> &'static Gpu = if k_quant(ty) { gpu_split } else { gpu_small_bindings };
            let parts = n.div_ceil(per);
            v.push(Case::new(
                "embedding_q",
                format!("split{parts}_{}", name(ty, layout)),
                move |_| {
                    let mut edge: Vec<u32> = (1..parts)
                        .flat_map(|p| [(p * per - 1) as u32, (p * per) as u32])
                        .collect();
                    edge.extend([0, n as u32 - 1, n as u32, 5]);
                    check(on(), ty, layout, n, k, &edge, parts)
                },
            ));
        }
    }
    // A tied embedding and LM head: one packed copy feeds embedding_q, then matmul_q of the gathered rows against
    // the same weight (logits of each token against the whole vocabulary). NMSE 1e-9 as in the matmul_q cases.
    for ty in FORMATS {
        for layout in LAYOUTS {
            v.push(Case::new(
                "embedding_q",
                format!("tied_lm_head_{}", name(ty, layout)),
                move |gpu| {
                    let (n, k) = (300, 96usize.next_multiple_of(ty.block_size()));
                    let raw = random_blocks(ty, n, k, 77);
                    let w = PackedWeight::upload_with(gpu, "tok", ty, layout, n, k, &raw)?;
                    let tok = ids(3, n);
                    let mut g = Graph::new();
                    let ti = g.input("ids", &[3], DType::U32);
                    let e = g.embedding_q(ti, &w)?;
                    let logits = g.matmul_q(e, &w, None)?;
                    g.output(logits);
                    let mut plan = Plan::new(gpu, g)?;
                    plan.write_input(gpu, ti, bytemuck::cast_slice(&tok))?;
                    plan.run(gpu, &StepVars::default())?;
                    let table = dequantize_packed(ty, &raw)?;
                    let x = embedding_q::reference(&tok, &table, k);
                    let want = matmul_q::reference(&x, &table, None, 3, k, n);
                    Ok(crate::common::nmse(&plan.read_f32(logits)?, &want, 1e-9))
                },
            ));
        }
    }
    // Bad ids (not u32, not 1-D) are errors, not nodes.
    v.push(Case::new("embedding_q", "bad_ids_are_errors", |gpu| {
        let raw = random_blocks(GgmlType::Q8_0, 4, 32, 1);
        let w = PackedWeight::upload(gpu, "t", GgmlType::Q8_0, 4, 32, &raw)?;
        let mut g = Graph::new();
        let f = g.input("ids", &[3], DType::F32);
        let two_d = g.input("ids", &[3, 1], DType::U32);
        let errors = [
            g.embedding_q(f, &w).is_err(),
            g.embedding_q(two_d, &w).is_err(),
            g.node_count() == 0,
        ];
        Ok(exact(&errors, &[true; 3]))
    }));
    v
}
