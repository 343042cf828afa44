//! Shared helpers of the BlockFFN (moe_*) tests: expert weights in every form the kernels read, activation patterns
//! named after what they break, and the active list a router would write for them.

#![allow(dead_code)]

use crate::common::Rng;
use shaderlm::gpu::packed::PackedWeight;
use shaderlm::gpu::{Gpu, GpuTensor};
use shaderlm::graph::Graph;
use shaderlm::ops::moe_common::MoeWeight;
use shaderlm::quant::pack::{dequantize_packed, Layout};
use shaderlm::quant::GgmlType;

/// The weight forms under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wt {
    F32,
    F16,
    Q(GgmlType, Layout),
}

impl Wt {
    pub fn name(self) -> String {
        match self {
            Wt::F32 => "f32".into(),
            Wt::F16 => "f16".into(),
            Wt::Q(ty, Layout::Tiled) => format!("{ty}_tiled"),
            Wt::Q(ty, Layout::Rows) => format!("{ty}_rows"),
        }
    }
}

/// Every form: dense f32 and f16, and each packable 32-block format in both layouts.
pub fn all_forms() -> Vec<Wt> {
    let mut v = vec![Wt::F32, Wt::F16];
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::IQ4_NL,
    ] {
        for layout in [Layout::Tiled, Layout::Rows] {
            v.push(Wt::Q(ty, layout));
        }
    }
    v
}

/// The super-block forms (packed as 32-weight blocks: Q4_K as nibbles with 16-bit codes and super-block factors,
/// Q5_K as Q5_1, Q6_K as 6-bit blocks with two scales, IQ4_XS as IQ4_NL) in both layouts. Their K must be a multiple of 256.
pub fn kquant_forms() -> Vec<Wt> {
    let mut v = Vec::new();
    for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS] {
        for layout in [Layout::Tiled, Layout::Rows] {
            v.push(Wt::Q(ty, layout));
        }
    }
    v
}

/// A device weight `[n, k]` and the f32 values it holds (f16-rounded or dequantized), for the references.
pub struct Weight {
    pub values: Vec<f32>,
    dense: Option<GpuTensor>,
    packed: Option<PackedWeight>,
}

impl Weight {
    /// Random weights: dense ones uniform in [-scale, scale) (scale a power of two: products with x stay exact in
    /// f64), quantized ones random raw blocks (every quant pattern; see matmul_q's random_blocks) whose values are the
    /// CPU dequantization of the 32-weight blocks the kernels read.
    pub fn new(gpu: &Gpu, wt: Wt, n: usize, k: usize, scale: f32, seed: u64) -> shaderlm::Result<Weight> {
        match wt {
            Wt::F32 | Wt::F16 => {
                let mut values = Rng::new(seed).vec(n * k, scale);
                let t = if wt == Wt::F16 {
                    for v in &mut values {
                        *v = half::f16::from_f32(*v).to_f32();
                    }
                    GpuTensor::upload_f16(gpu, "w", &[n, k], &values)?
                } else {
                    GpuTensor::upload_f32(gpu, "w", &[n, k], &values)?
                };
                Ok(Weight {
                    values,
                    dense: Some(t),
                    packed: None,
                })
            }
            Wt::Q(ty, layout) => {
                let raw = crate::matmul_q::random_blocks(ty, n, k, seed);
                Ok(Weight {
                    values: dequantize_packed(ty, &raw)?,
                    dense: None,
                    packed: Some(PackedWeight::upload_with(gpu, "w", ty, layout, n, k, &raw)?),
                })
            }
        }
    }

    /// The weight as a kernel input of graph `g`.
    pub fn bind<'a>(&'a self, g: &mut Graph) -> MoeWeight<'a> {
        match (&self.dense, &self.packed) {
            (Some(t), _) => MoeWeight::Dense(g.external(t)),
            (_, Some(p)) => MoeWeight::Quant(p),
            _ => unreachable!("a weight is dense or packed"),
        }
    }
}

/// Which experts each token activates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// No token activates any expert: the list is empty.
    None,
    /// Every token activates every expert.
    All,
    /// Only expert `e` (for every token).
    One(usize),
    /// Token t activates the experts e with e % m == t: disjoint sets across the chunk's tokens.
    Disjoint,
    /// Each token activates each expert with probability `pct` percent, independently: overlapping sets.
    Random(u32),
    /// The first `pct` percent of the experts, for every token.
    Share(u32),
}

impl Pattern {
    pub fn name(self) -> String {
        match self {
            Pattern::None => "no_expert_active".into(),
            Pattern::All => "every_expert_active".into(),
            Pattern::One(e) => format!("only_expert{e}"),
            Pattern::Disjoint => "disjoint".into(),
            Pattern::Random(p) => format!("overlapping{p}pct"),
            Pattern::Share(p) => format!("first{p}pct"),
        }
    }

    /// Whether token `t` of `m` activates expert `e` of `experts`.
    pub fn on(self, t: usize, m: usize, e: usize, experts: usize, rng: &mut Rng) -> bool {
        match self {
            Pattern::None => false,
            Pattern::All => true,
            Pattern::One(x) => e == x,
            Pattern::Disjoint => e % m == t,
            Pattern::Random(p) => rng.below(100) < p,
            Pattern::Share(p) => e * 100 < p as usize * experts,
        }
    }
}

/// Router weights `[m, E]` following `pattern`: positive (in [0.25, 1.25)) where active, zero elsewhere.
pub fn router_weights(pattern: Pattern, m: usize, experts: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let mut r = vec![0f32; m * experts];
    for t in 0..m {
        for e in 0..experts {
            if pattern.on(t, m, e, experts, &mut rng) {
                r[t * experts + e] = 0.75 + 0.5 * rng.f32();
            }
        }
    }
    r
}

/// The active list a router writes for router weights `r` [m, E]: `[count, ids ascending..]`, padded to `1 + E`.
pub fn active_list(r: &[f32], m: usize, experts: usize) -> Vec<u32> {
    let ids: Vec<u32> = (0..experts)
        .filter(|&e| (0..m).any(|t| r[t * experts + e] != 0.0))
        .map(|e| e as u32)
        .collect();
    let mut list = vec![ids.len() as u32];
    list.extend(&ids);
    list.resize(1 + experts, 0);
    list
}

/// Columns (of an `[m, E*de]` matrix) that belong to the listed experts.
pub fn active_columns(list: &[u32], de: usize) -> Vec<usize> {
    list[1..=list[0] as usize]
        .iter()
        .flat_map(|&e| e as usize * de..(e as usize + 1) * de)
        .collect()
}

/// `a` [m, cols] restricted to `columns`, row by row.
pub fn gather(a: &[f32], m: usize, cols: usize, columns: &[usize]) -> Vec<f32> {
    (0..m)
        .flat_map(|t| columns.iter().map(move |&c| a[t * cols + c]))
        .collect()
}
