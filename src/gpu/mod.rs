//! The GPU context: adapter choice, device with the adapter's real limits, optional features, error capture.

mod adapters;
mod memory;
pub mod packed;
pub mod pipelines;
pub mod shaders;
pub mod tensor;

pub use adapters::{describe_adapters, AdapterReport};
pub use memory::MemoryReport;
pub use pipelines::{PipelineCache, ShaderKey};
pub use tensor::{DType, GpuTensor};

use crate::error::{Error, Result};
use std::sync::{Arc, Mutex};

/// How to choose and configure the adapter. `Default` honours `WGPU_BACKEND` and `WGPU_ADAPTER_NAME`.
#[derive(Clone, Debug, Default)]
pub struct GpuOptions {
    /// `vulkan`, `metal`, `dx12` or `gl` (else `WGPU_BACKEND`, else all).
    pub backend: Option<String>,
    /// Case-insensitive substring of the adapter name (else `WGPU_ADAPTER_NAME`).
    pub adapter: Option<String>,
    /// Turn optional features off, to test the fallback paths on adapters that have them.
    pub no_f16: bool,
    pub no_subgroups: bool,
    pub no_timestamps: bool,
    /// Pretend the storage binding limit is this small (tests the tensor-splitting paths).
    pub max_binding_override: Option<u64>,
    /// Keep naga's loop bounding in every shader (dropped by default: see [`Caps::loop_bounding`]).
    pub loop_bounding: bool,
}

/// What the chosen device can do, as the kernels need to know it.
#[derive(Clone, Debug)]
pub struct Caps {
    pub f16: bool,
    /// `unpack2x16float` and friends (f16 data in f32 math): every native API and GLES 3 have it.
    pub f16_in_f32: bool,
    pub subgroups: bool,
    /// Subgroup size when `subgroups` (the minimum the adapter reports).
    pub subgroup_size: u32,
    pub timestamps: bool,
    pub timestamps_in_passes: bool,
    /// Largest storage buffer binding, bytes.
    pub max_binding: u64,
    pub max_buffer: u64,
    pub max_uniform_binding: u64,
    pub uniform_align: u32,
    pub storage_align: u32,
    pub max_storage_per_stage: u32,
    pub max_workgroup_storage: u32,
    pub max_workgroups_per_dim: u32,
    /// A software (CPU) adapter such as lavapipe: kernels pick CPU-friendly layouts.
    pub cpu_adapter: bool,
    /// Shaders keep naga's loop bounding (a counter and a test per loop iteration that stop a loop the backend
    /// compiler could otherwise assume to end). Every loop of the engine's shaders ends (counted loops over bounds
    /// from validated shapes; the data-driven ones, in block_topk, topk, moe_router and tree_select_rerank, each
    /// shrink or find a value that is there by construction), so by default the modules are created trusted
    /// without it, and with every other check (bounds, integer division) kept: on lavapipe, SmolLM2's decode step
    /// at position 1024 took 34.6 against 38.1 ms with it (attention 40% and the small GEMVs 15 to 30% faster).
    pub loop_bounding: bool,
}

/// A device with its queue, capabilities and pipeline cache. Passed explicitly; there is no global state.
pub struct Gpu {
    pub adapter: wgpu::Adapter,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub caps: Caps,
    pub pipelines: PipelineCache,
    errors: Arc<Mutex<Vec<String>>>,
    lost: Arc<Mutex<Option<String>>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gpu({} on {:?})", self.info.name, self.info.backend)
    }
}

pub(crate) fn parse_backends(name: Option<&str>) -> Result<wgpu::Backends> {
    let from_env = std::env::var("WGPU_BACKEND").ok();
    let Some(name) = name.or(from_env.as_deref()) else {
        return Ok(wgpu::Backends::all());
    };
    let mut backends = wgpu::Backends::empty();
    for part in name.split(',').map(|s| s.trim().to_ascii_lowercase()) {
        backends |= match part.as_str() {
            "vulkan" | "vk" => wgpu::Backends::VULKAN,
            "metal" | "mtl" => wgpu::Backends::METAL,
            "dx12" | "d3d12" => wgpu::Backends::DX12,
            "gl" | "gles" | "opengl" => wgpu::Backends::GL,
            _ => return Err(Error::UnknownBackend(part)),
        };
    }
    Ok(backends)
}

pub(crate) fn make_instance(backends: wgpu::Backends) -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends = backends;
    wgpu::Instance::new(desc)
}

/// Preference order: real GPUs before software ones, native APIs before GL.
pub(crate) fn adapter_rank(info: &wgpu::AdapterInfo) -> (u8, u8) {
    let ty = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    let api = match info.backend {
        wgpu::Backend::Vulkan | wgpu::Backend::Metal | wgpu::Backend::Dx12 => 0,
        _ => 1,
    };
    (ty, api)
}

/// Index of the adapter `opts` selects among `infos`, or the error that explains why none fits.
pub(crate) fn choose_adapter(infos: &[wgpu::AdapterInfo], wanted: Option<&str>) -> Result<usize> {
    if infos.is_empty() {
        return Err(Error::NoAdapter { detail: String::new() });
    }
    let from_env = std::env::var("WGPU_ADAPTER_NAME").ok();
    let wanted = wanted.or(from_env.as_deref()).map(str::to_lowercase);
    let mut order: Vec<usize> = (0..infos.len()).collect();
    order.sort_by_key(|&i| adapter_rank(&infos[i]));
    match wanted {
        None => Ok(order[0]),
        Some(w) => order
            .into_iter()
            .find(|&i| infos[i].name.to_lowercase().contains(&w))
            .ok_or_else(|| Error::AdapterNotFound {
                wanted: w,
                available: infos
                    .iter()
                    .map(|i| format!("{} ({:?})", i.name, i.backend))
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
    }
}

/// The adapter `opts` selects (see [`Gpu::new`]), without creating a device.
fn select_adapter(opts: &GpuOptions) -> Result<wgpu::Adapter> {
    let backends = parse_backends(opts.backend.as_deref())?;
    // Without a choice, try the native APIs first and start GL (slow to start, EGL noise) only if they have none.
    let mut adapters = Vec::new();
    if backends == wgpu::Backends::all() {
        let instance = make_instance(wgpu::Backends::PRIMARY);
        adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::PRIMARY));
    }
    if adapters.is_empty() {
        let instance = make_instance(backends);
        adapters = pollster::block_on(instance.enumerate_adapters(backends));
    }
    let infos: Vec<_> = adapters.iter().map(|a| a.get_info()).collect();
    let index = choose_adapter(&infos, opts.adapter.as_deref()).map_err(|e| match e {
        Error::NoAdapter { .. } => Error::NoAdapter {
            detail: format!(" for backends {backends:?}"),
        },
        e => e,
    })?;
    let adapter = adapters.into_iter().nth(index).expect("index from choose_adapter");
    Ok(adapter)
}

impl Gpu {
    /// Choose an adapter per `opts` and create a device with its real limits and the optional features it has.
    pub fn new(opts: &GpuOptions) -> Result<Gpu> {
        Self::from_adapter(select_adapter(opts)?, opts)
    }

    fn from_adapter(adapter: wgpu::Adapter, opts: &GpuOptions) -> Result<Gpu> {
        let info = adapter.get_info();
        let offered = adapter.features();
        let mut wanted = wgpu::Features::empty();
        if !opts.no_f16 {
            wanted |= wgpu::Features::SHADER_F16;
        }
        if !opts.no_subgroups {
            wanted |= wgpu::Features::SUBGROUP;
        }
        if !opts.no_timestamps {
            wanted |= wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        }
        let features = offered & wanted;
        let limits = adapter.limits();
        let desc = wgpu::DeviceDescriptor {
            label: Some("shaderlm"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        let (device, queue) =
            pollster::block_on(adapter.request_device(&desc)).map_err(|source| Error::RequestDevice {
                adapter: info.name.clone(),
                source,
            })?;
        let errors = Arc::new(Mutex::new(Vec::new()));
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = sink.lock() {
                v.push(e.to_string());
            }
        }));
        let lost = Arc::new(Mutex::new(None));
        let lost_sink = lost.clone();
        device.set_device_lost_callback(move |reason, message| {
            if let Ok(mut l) = lost_sink.lock() {
                *l = Some(format!("{reason:?}: {message}"));
            }
        });
        let mut max_binding = limits.max_storage_buffer_binding_size;
        if let Some(o) = opts.max_binding_override {
            max_binding = max_binding.min(o);
        }
        let subgroups = features.contains(wgpu::Features::SUBGROUP) && info.subgroup_min_size >= 4;
        let downlevel = adapter.get_downlevel_capabilities().flags;
        let caps = Caps {
            f16: features.contains(wgpu::Features::SHADER_F16),
            f16_in_f32: downlevel.contains(wgpu::DownlevelFlags::SHADER_F16_IN_F32),
            subgroups,
            subgroup_size: if subgroups { info.subgroup_min_size } else { 1 },
            timestamps: features.contains(wgpu::Features::TIMESTAMP_QUERY),
            timestamps_in_passes: features.contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES),
            max_binding,
            max_buffer: limits.max_buffer_size,
            max_uniform_binding: limits.max_uniform_buffer_binding_size,
            uniform_align: limits.min_uniform_buffer_offset_alignment,
            storage_align: limits.min_storage_buffer_offset_alignment,
            max_storage_per_stage: limits.max_storage_buffers_per_shader_stage,
            max_workgroup_storage: limits.max_compute_workgroup_storage_size,
            max_workgroups_per_dim: limits.max_compute_workgroups_per_dimension,
            cpu_adapter: info.device_type == wgpu::DeviceType::Cpu,
            loop_bounding: opts.loop_bounding,
        };
        Ok(Gpu {
            adapter,
            device,
            queue,
            info,
            caps,
            pipelines: PipelineCache::default(),
            errors,
            lost,
        })
    }

    /// What the adapter reports about its memory (the default memory budget of a model).
    pub fn memory(&self) -> MemoryReport {
        MemoryReport::of(&self.adapter)
    }

    /// One line naming the adapter, for logs and benchmark tables.
    pub fn describe(&self) -> String {
        format!(
            "{} ({:?}, {:?}, driver {} {})",
            self.info.name, self.info.backend, self.info.device_type, self.info.driver, self.info.driver_info
        )
    }

    /// Return the first GPU error raised since the last check (validation, out of memory, device lost).
    pub fn check(&self, context: &str) -> Result<()> {
        if let Some(reason) = self.lost.lock().ok().and_then(|l| l.clone()) {
            return Err(Error::DeviceLost(reason));
        }
        let mut errors = self.errors.lock().map_err(|_| Error::Gpu {
            context: context.into(),
            message: "error sink poisoned".into(),
        })?;
        if errors.is_empty() {
            return Ok(());
        }
        let message = errors.join("; ");
        errors.clear();
        Err(Error::Gpu {
            context: context.into(),
            message,
        })
    }

    /// Block until the queue is idle, then report any error.
    pub fn wait(&self, context: &str) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Gpu {
                context: context.into(),
                message: e.to_string(),
            })?;
        self.check(context)
    }
}
