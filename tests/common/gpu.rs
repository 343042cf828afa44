//! The device every integration test shares, and the normalized error the model tests compare logits with.

#![allow(dead_code)]
use shaderlm::gpu::{Gpu, GpuOptions};
use std::sync::OnceLock;

/// The default adapter, opened once per test binary; without one the test fails saying how to get one.
pub fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| {
        Gpu::new(&GpuOptions::default()).unwrap_or_else(|e| panic!("the GPU tests need an adapter: {e}"))
    })
}

/// Every pipeline `gpu` compiled is a variant the ops list (`ops::all_variants`), so the naga portability test
/// has validated and translated it.
pub fn assert_known_variants(gpu: &Gpu) {
    assert!(!gpu.pipelines.is_empty(), "no pipeline compiled yet");
    let unknown: Vec<String> = shaderlm::ops::unlisted_pipelines(gpu)
        .iter()
        .map(|k| k.to_string())
        .collect();
    assert!(
        unknown.is_empty(),
        "pipelines missing from the ops' variants(): {unknown:?}"
    );
}

/// `sum (a - b)^2 / sum b^2` in f64: `b` is the reference.
pub fn nmse(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    num / den
}
