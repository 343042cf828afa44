//! Lists every adapter with its features and key limits, marking the one `Gpu::new` would choose.

use super::{choose_adapter, make_instance, parse_backends, GpuOptions};
use crate::error::Result;

/// One adapter as `shaderlm devices` shows it.
#[derive(Debug, Clone)]
pub struct AdapterReport {
    pub info: wgpu::AdapterInfo,
    pub features: wgpu::Features,
    pub limits: wgpu::Limits,
    pub chosen: bool,
}

impl std::fmt::Display for AdapterReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = &self.info;
        let l = &self.limits;
        let mark = if self.chosen { "*" } else { " " };
        writeln!(f, "{mark} {} [{:?}, {:?}]", i.name, i.backend, i.device_type)?;
        writeln!(f, "    driver: {} {}", i.driver, i.driver_info)?;
        let has = |x| {
            if self.features.contains(x) {
                "yes"
            } else {
                "no"
            }
        };
        writeln!(
            f,
            "    shader-f16: {}  subgroups: {} (size {}..{})  timestamps: {} (in passes: {})",
            has(wgpu::Features::SHADER_F16),
            has(wgpu::Features::SUBGROUP),
            i.subgroup_min_size,
            i.subgroup_max_size,
            has(wgpu::Features::TIMESTAMP_QUERY),
            has(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES),
        )?;
        writeln!(
            f,
            "    max storage binding: {} MiB  max buffer: {} MiB  storage buffers/stage: {}",
            l.max_storage_buffer_binding_size >> 20,
            l.max_buffer_size >> 20,
            l.max_storage_buffers_per_shader_stage
        )?;
        write!(
            f,
            "    workgroup storage: {} KiB  invocations/workgroup: {}  uniform binding: {} KiB  offset align: {}",
            l.max_compute_workgroup_storage_size >> 10,
            l.max_compute_invocations_per_workgroup,
            l.max_uniform_buffer_binding_size >> 10,
            l.min_uniform_buffer_offset_alignment
        )
    }
}

/// Every adapter the selected backends offer; `chosen` marks the one `Gpu::new(opts)` takes.
pub fn describe_adapters(opts: &GpuOptions) -> Result<Vec<AdapterReport>> {
    let backends = parse_backends(opts.backend.as_deref())?;
    let instance = make_instance(backends);
    let adapters = pollster::block_on(instance.enumerate_adapters(backends));
    let infos: Vec<_> = adapters.iter().map(|a| a.get_info()).collect();
    let chosen = choose_adapter(&infos, opts.adapter.as_deref()).ok();
    Ok(adapters
        .iter()
        .zip(infos)
        .enumerate()
        .map(|(i, (a, info))| AdapterReport {
            info,
            features: a.features(),
            limits: a.limits(),
            chosen: Some(i) == chosen,
        })
        .collect())
}
