//! Bench type and the timing loop shared by every op bench.

#![allow(dead_code)]

use shaderlm::gpu::{DType, Gpu, GpuTensor};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use std::time::Instant;

/// Model shapes the benches use: (name, hidden, ffn, q heads, kv heads, head dim, vocab).
pub const MODELS: [(&str, usize, usize, usize, usize, usize, usize); 3] = [
    ("smollm2-135m", 576, 1536, 9, 3, 64, 49152),
    ("qwen2.5-0.5b", 896, 4864, 14, 2, 64, 151936),
    ("llama3-8b", 4096, 14336, 32, 8, 128, 128256),
];

pub type BuildFn = Box<dyn Fn(&Gpu) -> shaderlm::Result<(Plan, StepVars)>>;

pub struct Bench {
    pub name: String,
    pub build: BuildFn,
}

impl Bench {
    pub fn new(name: impl Into<String>, build: impl Fn(&Gpu) -> shaderlm::Result<(Plan, StepVars)> + 'static) -> Bench {
        Bench {
            name: name.into(),
            build: Box::new(build),
        }
    }
}

pub struct Measured {
    pub ms: f64,
    pub gflops: f64,
    pub gbps: f64,
    pub dispatches: usize,
}

/// Inputs of a graph filled with small deterministic values (so that no NaN slows anything down).
pub fn fill_inputs(
    gpu: &Gpu,
    plan: &Plan,
    inputs: &[(shaderlm::graph::TensorId, usize, DType)],
) -> shaderlm::Result<()> {
    for &(id, n, dtype) in inputs {
        let bytes: Vec<u8> = match dtype {
            DType::U32 => bytemuck::cast_slice(&(0..n as u32).map(|i| i % 7).collect::<Vec<u32>>()).to_vec(),
            _ => bytemuck::cast_slice(&(0..n).map(|i| ((i % 13) as f32 - 6.0) * 0.01).collect::<Vec<f32>>()).to_vec(),
        };
        plan.write_input(gpu, id, &bytes)?;
    }
    Ok(())
}

/// A device tensor of pseudo-random values in [-0.05, 0.05].
pub fn weight(gpu: &Gpu, name: &str, shape: &[usize], dtype: DType) -> shaderlm::Result<GpuTensor> {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n)
        .map(|i| ((i * 2654435761usize) % 1000) as f32 * 1e-4 - 0.05)
        .collect();
    match dtype {
        DType::F16 => GpuTensor::upload_f16(gpu, name, shape, &data),
        _ => GpuTensor::upload_f32(gpu, name, shape, &data),
    }
}

/// Warm up, then time runs until 0.5 s or 50 runs have passed.
pub fn measure(gpu: &Gpu, b: &Bench) -> shaderlm::Result<Measured> {
    let (mut plan, vars) = (b.build)(gpu)?;
    for _ in 0..2 {
        plan.run(gpu, &vars)?;
    }
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 3 || (start.elapsed().as_secs_f64() < 0.5 && times.len() < 50) {
        let t = Instant::now();
        plan.run(gpu, &vars)?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let median = times[times.len() / 2];
    let cost = plan.cost();
    Ok(Measured {
        ms: median * 1e3,
        gflops: cost.flops as f64 / median / 1e9,
        gbps: (cost.bytes_read + cost.bytes_written) as f64 / median / 1e9,
        dispatches: plan.dispatch_count(&vars),
    })
}

/// A one-node graph's plan built by `f`, with its inputs filled.
pub fn plan_of(
    gpu: &Gpu,
    f: impl FnOnce(&mut Graph) -> shaderlm::Result<Vec<(shaderlm::graph::TensorId, usize, DType)>>,
) -> shaderlm::Result<(Plan, StepVars)> {
    let mut g = Graph::new();
    let inputs = f(&mut g)?;
    let plan = Plan::new(gpu, g)?;
    fill_inputs(gpu, &plan, &inputs)?;
    Ok((plan, StepVars::default()))
}
