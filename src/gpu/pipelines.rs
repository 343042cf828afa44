//! Compute pipelines cached under typed keys; bind group layouts come from naga's reflection of the shader.
//!
//! Convention for every op shader: entry point `main`; `@group(0)` holds the tensors (storage or uniform buffers,
//! bindings 0..n in order); `@group(1) @binding(0)` is the op's parameter block, a uniform at a dynamic offset.

use super::{shaders, Caps, Gpu};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Size in bytes reserved for one dispatch's parameter block (the largest `Params` struct an op may use).
pub const PARAMS_BYTES: u64 = 128;

/// A shader variant: the file stem under `shaders/` and the constants prepended to it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShaderKey {
    pub name: &'static str,
    pub defs: Vec<(&'static str, String)>,
    /// The definitions of namespace B: what `#include "lib/x.wgsl" as B` expands the file with (a second weight
    /// format in one kernel), its top-level names suffixed `_B`.
    pub b: Vec<(&'static str, String)>,
}

impl ShaderKey {
    pub fn new(name: &'static str) -> Self {
        ShaderKey {
            name,
            defs: Vec::new(),
            b: Vec::new(),
        }
    }
    /// Add a definition: a `const` in the shader and a flag for `#if`.
    pub fn def(mut self, name: &'static str, value: impl ToString) -> Self {
        self.defs.push((name, value.to_string()));
        self
    }
    /// Add a boolean flag only when `on` (so variants without it keep the short key).
    pub fn flag(self, name: &'static str, on: bool) -> Self {
        if on {
            self.def(name, "true")
        } else {
            self
        }
    }
    /// Namespace B's definitions: `other`'s.
    pub fn with_b(mut self, other: &ShaderKey) -> Self {
        self.b = other.defs.clone();
        self
    }
    pub fn variant(&self) -> String {
        if self.defs.is_empty() && self.b.is_empty() {
            return "default".into();
        }
        let b = self.b.iter().map(|(n, v)| format!("B.{n}={v}"));
        self.defs
            .iter()
            .map(|(n, v)| format!("{n}={v}"))
            .chain(b)
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl std::fmt::Display for ShaderKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}]", self.name, self.variant())
    }
}

/// How a group-0 binding is declared in the shader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    ReadWrite,
    Uniform,
}

/// A compiled variant with what the executor needs to bind it.
#[derive(Debug)]
pub struct Pipeline {
    pub key: ShaderKey,
    pub pipeline: wgpu::ComputePipeline,
    pub layout0: wgpu::BindGroupLayout,
    /// Access of group-0 bindings 0..n.
    pub bindings: Vec<Access>,
}

/// Pipelines by key, plus the shared layout of the parameter bind group.
#[derive(Default)]
pub struct PipelineCache {
    map: Mutex<HashMap<ShaderKey, Arc<Pipeline>>>,
    params_layout: Mutex<Option<wgpu::BindGroupLayout>>,
}

/// naga capabilities matching the device.
pub fn naga_caps(caps: &Caps) -> naga::valid::Capabilities {
    let mut c = naga::valid::Capabilities::empty();
    if caps.f16_in_f32 {
        c |= naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32;
    }
    if caps.f16 {
        c |= naga::valid::Capabilities::SHADER_FLOAT16;
    }
    if caps.subgroups {
        c |= naga::valid::Capabilities::SUBGROUP;
    }
    c
}

/// Group-0 bindings of a module, in binding order, and whether group 1 holds the params.
pub fn reflect(key: &ShaderKey, module: &naga::Module) -> Result<Vec<Access>> {
    let mut found: Vec<(u32, Access)> = Vec::new();
    for (_, var) in module.global_variables.iter() {
        let Some(rb) = &var.binding else { continue };
        let access = match var.space {
            naga::AddressSpace::Uniform => Access::Uniform,
            naga::AddressSpace::Storage { access } if access.contains(naga::StorageAccess::STORE) => Access::ReadWrite,
            naga::AddressSpace::Storage { .. } => Access::Read,
            _ => continue,
        };
        match rb.group {
            0 => found.push((rb.binding, access)),
            1 if rb.binding == 0 && access == Access::Uniform => {}
            g => {
                return Err(Error::Shader {
                    shader: key.name.into(),
                    variant: key.variant(),
                    message: format!("binding @group({g}) @binding({}) breaks the op convention", rb.binding),
                })
            }
        }
    }
    found.sort_by_key(|b| b.0);
    for (i, b) in found.iter().enumerate() {
        if b.0 as usize != i {
            return Err(Error::Shader {
                shader: key.name.into(),
                variant: key.variant(),
                message: format!("group 0 bindings must be 0..n without gaps, found {}", b.0),
            });
        }
    }
    Ok(found.into_iter().map(|b| b.1).collect())
}

impl PipelineCache {
    pub fn params_layout(&self, device: &wgpu::Device) -> wgpu::BindGroupLayout {
        let mut l = self.params_layout.lock().expect("params layout lock");
        l.get_or_insert_with(|| {
            device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some("params"),
                entries: &[wgpu::BindGroupLayoutEntry {
                    binding: 0,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: true,
                        min_binding_size: wgpu::BufferSize::new(PARAMS_BYTES),
                    },
                    count: None,
                }],
            })
        })
        .clone()
    }

    pub fn len(&self) -> usize {
        self.map.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// The keys compiled so far.
    pub fn keys(&self) -> Vec<ShaderKey> {
        self.map.lock().map(|m| m.keys().cloned().collect()).unwrap_or_default()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Gpu {
    /// The pipeline for `key`, compiled on first use. Errors name the shader and variant.
    pub fn pipeline(&self, key: &ShaderKey) -> Result<Arc<Pipeline>> {
        if let Some(p) = self.pipelines.map.lock().expect("pipeline lock").get(key) {
            return Ok(p.clone());
        }
        let (module, _) = shaders::validate(key, naga_caps(&self.caps))?;
        let bindings = reflect(key, &module)?;
        let source = shaders::render(key)?;
        let entries: Vec<_> = bindings
            .iter()
            .enumerate()
            .map(|(i, a)| wgpu::BindGroupLayoutEntry {
                binding: i as u32,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: match a {
                        Access::Uniform => wgpu::BufferBindingType::Uniform,
                        Access::Read => wgpu::BufferBindingType::Storage { read_only: true },
                        Access::ReadWrite => wgpu::BufferBindingType::Storage { read_only: false },
                    },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            })
            .collect();
        let label = key.to_string();
        // The creation time, logged at debug level (lavapipe and llvmpipe's GL compile at the first dispatch instead).
        let started = std::time::Instant::now();
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let layout0 = self.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(&label),
            entries: &entries,
        });
        let params = self.pipelines.params_layout(&self.device);
        let layout = self.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(&label),
            bind_group_layouts: &[Some(&layout0), Some(&params)],
            immediate_size: 0,
        });
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(&label),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        };
        let module = if self.caps.loop_bounding {
            self.device.create_shader_module(desc)
        } else {
            let mut checks = wgpu::ShaderRuntimeChecks::checked();
            checks.force_loop_bounding = false;
            // SAFETY: the one check dropped is loop bounding, and every loop of the engine's shaders ends
            // (`Caps::loop_bounding`); bounds and integer-division checks stay.
            unsafe { self.device.create_shader_module_trusted(desc, checks) }
        };
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: Some(&layout),
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Shader {
                shader: key.name.into(),
                variant: key.variant(),
                message: e.to_string(),
            });
        }
        log::debug!(
            "pipeline {label}: created in {:.1} ms (drivers may compile it at its first dispatch)",
            started.elapsed().as_secs_f64() * 1e3
        );
        let p = Arc::new(Pipeline {
            key: key.clone(),
            pipeline,
            layout0,
            bindings,
        });
        self.pipelines
            .map
            .lock()
            .expect("pipeline lock")
            .insert(key.clone(), p.clone());
        Ok(p)
    }
}
