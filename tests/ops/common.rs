//! Shared test helpers: the device, a seeded generator, error metrics, and the case type.

#![allow(dead_code)]

use shaderlm::gpu::{Gpu, GpuOptions};
use std::sync::OnceLock;

/// A new device with `opts`. Without an adapter the tests fail (never skip) and say how to get one.
pub fn new_gpu(opts: &GpuOptions) -> Gpu {
    Gpu::new(opts).unwrap_or_else(|e| panic!("the GPU tests need an adapter: {e}"))
}

/// The adapter for the tests.
pub fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| new_gpu(&GpuOptions::default()))
}

/// A second device with subgroups and f16 turned off, to test the fallback variants on adapters that have them.
pub fn gpu_fallback() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| {
        let opts = GpuOptions {
            no_f16: true,
            no_subgroups: true,
            ..Default::default()
        };
        new_gpu(&opts)
    })
}

#[path = "../common/rng.rs"]
mod rng;
pub use rng::Rng;

/// The outcome of one case: a metric, its bound, and what it means.
#[derive(Debug)]
pub enum Check {
    /// Normalized mean squared error: sum((a-b)^2) / sum(b^2).
    Nmse { value: f64, max: f64 },
    /// Largest |a-b| / (atol + rtol*|b|); passes when <= 1.
    RelAbs { worst: f64, at: usize },
    /// Exact equality of integers (indices, token ids); count of mismatches.
    Exact { mismatches: usize, first: Option<usize> },
}

impl Check {
    pub fn passed(&self) -> bool {
        match *self {
            Check::Nmse { value, max } => value.is_finite() && value <= max,
            Check::RelAbs { worst, .. } => worst.is_finite() && worst <= 1.0,
            Check::Exact { mismatches, .. } => mismatches == 0,
        }
    }
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Check::Nmse { value, max } => write!(f, "nmse {value:.2e} (max {max:.0e})"),
            Check::RelAbs { worst, at } => write!(f, "rel+abs {worst:.3} of bound at {at}"),
            Check::Exact { mismatches, first } => {
                write!(f, "{mismatches} mismatches (first at {first:?})")
            }
        }
    }
}

pub fn nmse(got: &[f32], want: &[f32], max: f64) -> Check {
    if got.len() != want.len() {
        return Check::Nmse {
            value: f64::INFINITY,
            max,
        };
    }
    let (mut num, mut den) = (0f64, 0f64);
    for (a, b) in got.iter().zip(want) {
        num += (*a as f64 - *b as f64).powi(2);
        den += (*b as f64).powi(2);
    }
    Check::Nmse {
        value: if den == 0.0 { num } else { num / den },
        max,
    }
}

pub fn rel_abs(got: &[f32], want: &[f32], rtol: f64, atol: f64) -> Check {
    if got.len() != want.len() {
        return Check::RelAbs {
            worst: f64::INFINITY,
            at: 0,
        };
    }
    let mut worst = 0f64;
    let mut at = 0;
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        let e = (*a as f64 - *b as f64).abs() / (atol + rtol * (*b as f64).abs());
        if e.is_nan() || e > worst {
            worst = e;
            at = i;
        }
    }
    Check::RelAbs { worst, at }
}

pub fn exact<T: PartialEq>(got: &[T], want: &[T]) -> Check {
    let mut mismatches = got.len().abs_diff(want.len());
    let mut first = (mismatches > 0).then_some(got.len().min(want.len()));
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        if a != b {
            mismatches += 1;
            first.get_or_insert(i);
        }
    }
    Check::Exact { mismatches, first }
}

pub type CaseFn = Box<dyn Fn(&Gpu) -> shaderlm::Result<Check> + Send + Sync>;

pub struct Case {
    pub op: &'static str,
    pub name: String,
    pub run: CaseFn,
}

impl Case {
    pub fn new(
        op: &'static str,
        name: impl Into<String>,
        run: impl Fn(&Gpu) -> shaderlm::Result<Check> + Send + Sync + 'static,
    ) -> Case {
        Case {
            op,
            name: format!("{op}/{}", name.into()),
            run: Box::new(run),
        }
    }
}
