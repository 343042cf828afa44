//! The graph executor: buffer reuse, plan reuse across steps, read-back rules, profiling, limits, adapter errors.

mod common;

use common::gpu::gpu;
use shaderlm::gpu::packed::PackedWeight;
use shaderlm::gpu::{DType, Gpu, GpuOptions, GpuTensor};
use shaderlm::graph::StepVars;
use shaderlm::graph::{Graph, Plan};
use shaderlm::quant::pack::Layout;
use shaderlm::quant::GgmlType;
use shaderlm::Error;

/// x_{i+1} = x_i + a, 40 times: intermediates die one node later, so a handful of buffers must serve all 40.
fn chain(n: usize, len: usize) -> (Graph, shaderlm::graph::TensorId, shaderlm::graph::TensorId) {
    let mut g = Graph::new();
    let a = g.input("a", &[n], DType::F32);
    let mut x = a;
    for _ in 0..len {
        x = g.add(x, a).unwrap();
    }
    g.output(x);
    (g, a, x)
}

#[test]
fn intermediates_share_buffers_and_results_stay_right() {
    let gpu = gpu();
    let (g, a, out) = chain(1000, 40);
    let mut plan = Plan::new(gpu, g).unwrap();
    // 1 input + at most 3 rotating intermediates (the output is kept alive to the end).
    assert!(plan.allocated.0 <= 4, "allocated {:?}", plan.allocated);
    assert_eq!(plan.dispatch_count(&StepVars::default()), 40);
    for step in 0..3 {
        let data: Vec<f32> = (0..1000).map(|i| (i + step) as f32 * 0.5).collect();
        plan.write_input(gpu, a, bytemuck::cast_slice(&data)).unwrap();
        plan.run(gpu, &StepVars { pos: step as u32 }).unwrap();
        let got = plan.read_f32(out).unwrap();
        let want: Vec<f32> = data.iter().map(|x| (0..40).fold(*x, |acc, _| acc + x)).collect();
        assert_eq!(got, want, "step {step}");
    }
}

#[test]
fn only_marked_outputs_can_be_read_and_inputs_are_checked() {
    let gpu = gpu();
    let mut g = Graph::new();
    let a = g.input("a", &[4], DType::F32);
    let b = g.add(a, a).unwrap();
    let c = g.add(b, a).unwrap();
    g.output(c);
    let mut plan = Plan::new(gpu, g).unwrap();
    assert!(matches!(plan.write_input(gpu, a, &[0u8; 12]), Err(Error::Graph(_))));
    assert!(matches!(plan.write_input(gpu, b, &[0u8; 16]), Err(Error::Graph(_))));
    plan.write_input(gpu, a, bytemuck::cast_slice(&[1f32, 2., 3., 4.]))
        .unwrap();
    plan.run(gpu, &StepVars::default()).unwrap();
    assert_eq!(plan.read_f32(c).unwrap(), vec![3., 6., 9., 12.]);
    assert!(plan.read(b).is_err());
}

#[test]
fn shape_mismatch_is_an_error_value() {
    let mut g = Graph::new();
    let a = g.input("a", &[4], DType::F32);
    let b = g.input("b", &[5], DType::F32);
    assert!(matches!(g.add(a, b), Err(Error::Shape { op: "add", .. })));
}

#[test]
fn profile_reports_every_node_with_time_and_traffic() {
    let gpu = gpu();
    let (g, a, _) = chain(4096, 5);
    let mut plan = Plan::new(gpu, g).unwrap();
    plan.write_input(gpu, a, bytemuck::cast_slice(&vec![1f32; 4096]))
        .unwrap();
    let prof = plan.profile(gpu, &StepVars::default()).unwrap();
    assert_eq!(prof.len(), 5);
    for p in &prof {
        assert_eq!(p.label, "add");
        assert_eq!(p.dispatches, 1);
        assert_eq!(p.cost.bytes_read, 8 * 4096);
        assert!(p.micros > 0.0, "{p:?}");
    }
    assert_eq!(prof[0].timed_on_gpu, gpu.caps.timestamps_in_passes);
}

#[test]
fn tensors_over_the_binding_limit_are_split_or_refused_clearly() {
    let opts = GpuOptions {
        max_binding_override: Some(1024),
        ..Default::default()
    };
    let gpu = Gpu::new(&opts).unwrap_or_else(|e| panic!("the GPU tests need an adapter: {e}"));
    // An external weight splits into row parts that each fit one binding, and round-trips exactly.
    let data: Vec<f32> = (0..100 * 7).map(|i| i as f32).collect();
    let t = GpuTensor::upload_f32(&gpu, "w", &[100, 7], &data).unwrap();
    assert!(t.parts.len() >= 3, "{} parts", t.parts.len());
    assert!(t.parts.iter().all(|p| p.bytes <= 1024));
    assert_eq!(t.parts.iter().map(|p| p.rows).sum::<usize>(), 100);
    assert_eq!(t.download_f32(&gpu).unwrap(), data);
    // A single row over the limit cannot be split by rows: a clear error.
    let err = GpuTensor::upload_f32(&gpu, "wide", &[1, 300], &[0.0; 300]).unwrap_err();
    assert!(matches!(err, Error::BindingTooLarge { .. }), "{err}");
    // An intermediate over the limit is refused when the plan is made, naming the tensor.
    let mut g = Graph::new();
    let a = g.input("a", &[300], DType::F32);
    let b = g.input("b", &[300], DType::F32);
    let _ = g.add(a, b);
    let err = Plan::new(&gpu, g).err().expect("over-limit tensor accepted");
    assert!(err.to_string().contains("over the adapter's limit"), "{err}");
    // Binding a split tensor whole is refused too.
    let mut g = Graph::new();
    let w = g.external(&t);
    let _ = g.add(w, w);
    assert!(Plan::new(&gpu, g).is_err());
}

#[test]
fn bad_backend_and_adapter_names_are_clear_errors() {
    let bad = GpuOptions {
        backend: Some("directx9".into()),
        ..Default::default()
    };
    assert!(matches!(Gpu::new(&bad), Err(Error::UnknownBackend(_))));
    let missing = GpuOptions {
        adapter: Some("no-such-adapter-name".into()),
        ..Default::default()
    };
    let err = Gpu::new(&missing).unwrap_err();
    assert!(matches!(err, Error::AdapterNotFound { .. }), "{err}");
}

#[cfg(target_os = "linux")]
#[test]
fn no_adapter_says_how_to_get_one() {
    // There is no DX12 on Linux, so this backend offers no adapter at all.
    let opts = GpuOptions {
        backend: Some("dx12".into()),
        ..Default::default()
    };
    let err = Gpu::new(&opts).unwrap_err();
    assert!(err.to_string().contains("apt-get install mesa-vulkan-drivers"), "{err}");
}

#[test]
fn a_view_keeps_its_root_alive_and_reads_the_same_memory() {
    let gpu = gpu();
    let mut g = Graph::new();
    let a = g.input("a", &[6], DType::F32);
    let o = g.input("o", &[2, 3], DType::F32);
    let b = g.add(a, a).unwrap(); // last direct use of b is here...
    let v = g.reshape(b, &[2, 3]).unwrap();
    let c = g.add(o, o).unwrap(); // ...so a planner that ignored the view could hand b's buffer to c.
    let d = g.add(v, c).unwrap();
    g.output(d);
    assert!(g.reshape(b, &[7]).is_err());
    let mut plan = Plan::new(gpu, g).unwrap();
    plan.write_input(gpu, a, bytemuck::cast_slice(&[1f32, 2., 3., 4., 5., 6.]))
        .unwrap();
    plan.write_input(gpu, o, bytemuck::cast_slice(&[10f32; 6])).unwrap();
    plan.run(gpu, &StepVars::default()).unwrap();
    assert_eq!(plan.read_f32(d).unwrap(), vec![22., 24., 26., 28., 30., 32.]);
}

/// A view bound as a uniform array (x of the tiled GEMV and of the few-row GEMM) spans the whole array from the
/// view's offset, so the root's buffer must reach that far: the last row of a root, and its last two rows, read as
/// the same rows written into inputs of their own.
#[test]
fn uniform_views_at_an_offset_read_their_own_rows() {
    let gpu = gpu();
    let (n, k) = (64, 576);
    let weights: Vec<f32> = (0..n * k).map(|i| ((i * 7) % 17) as f32 - 8.0).collect();
    let raw = shaderlm::quant::quantize(GgmlType::Q8_0, &weights).unwrap();
    let w = PackedWeight::upload_with(gpu, "w", GgmlType::Q8_0, Layout::Tiled, n, k, &raw).unwrap();
    let x: Vec<f32> = (0..3 * k).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
    for rows in [1, 2] {
        let mut g = Graph::new();
        let all = g.input("all", &[3, k], DType::F32);
        let own = g.input("own", &[rows, k], DType::F32);
        let tail = g.row_view(all, 3 - rows, rows).unwrap();
        let via_view = g.matmul_q(tail, &w, None).unwrap();
        let direct = g.matmul_q(own, &w, None).unwrap();
        g.output(via_view);
        g.output(direct);
        let mut plan = Plan::new(gpu, g).unwrap();
        plan.write_input(gpu, all, bytemuck::cast_slice(&x)).unwrap();
        plan.write_input(gpu, own, bytemuck::cast_slice(&x[(3 - rows) * k..]))
            .unwrap();
        plan.run(gpu, &StepVars::default()).unwrap();
        let (a, b) = (plan.read_f32(via_view).unwrap(), plan.read_f32(direct).unwrap());
        assert_eq!(a, b, "{rows} rows");
        assert!(
            a.iter().filter(|v| **v != 0.0).count() > rows * n / 2,
            "{rows} rows: {a:?}"
        );
    }
}

/// A zero tensor is created on the device alone (no host copy), and a shape whose size overflows is an error,
/// not a panic or an abort.
#[test]
fn zero_tensors_need_no_host_copy_and_check_their_size() {
    let gpu = gpu();
    let t = GpuTensor::zeros(gpu, "kv", &[3, 5], DType::F32).unwrap();
    assert_eq!(t.download_f32(gpu).unwrap(), vec![0.0; 15]);
    for shape in [[usize::MAX, 2], [2, usize::MAX], [1 << 40, 1 << 30]] {
        assert!(GpuTensor::zeros(gpu, "kv", &shape, DType::F32).is_err(), "{shape:?}");
    }
}
