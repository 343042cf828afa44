//! The library's one error type: every failure reachable from files, the command line or the device is a value.

use std::path::PathBuf;

/// Result with the library's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "no GPU adapter found{detail}.\n  shaderlm needs a Vulkan, Metal, DX12 or GL adapter. On Linux without a GPU, \
         install the software Vulkan driver lavapipe: `apt-get install mesa-vulkan-drivers`"
    )]
    NoAdapter { detail: String },

    #[error("no adapter matches {wanted:?}; available: {available}")]
    AdapterNotFound { wanted: String, available: String },

    #[error("unknown backend {0:?}: expected vulkan, metal, dx12 or gl")]
    UnknownBackend(String),

    #[error("could not create the device on {adapter}: {source}")]
    RequestDevice {
        adapter: String,
        #[source]
        source: wgpu::RequestDeviceError,
    },

    #[error("shader {shader} (variant {variant}): {message}")]
    Shader {
        shader: String,
        variant: String,
        message: String,
    },

    #[error("GPU error in {context}: {message}")]
    Gpu { context: String, message: String },

    #[error("the GPU device was lost: {0}")]
    DeviceLost(String),

    #[error("tensor {name} needs a binding of {bytes} bytes, over the adapter's limit of {limit} bytes")]
    BindingTooLarge { name: String, bytes: u64, limit: u64 },

    #[error("shape mismatch in {op}: {message}")]
    Shape { op: &'static str, message: String },

    #[error("graph: {0}")]
    Graph(String),

    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },

    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{0}")]
    Invalid(String),

    #[error("{path}: needs {need} of device memory, over the {allowed} allowed by {by}; {advice}")]
    OverBudget {
        path: PathBuf,
        need: crate::model::budget::MemoryNeed,
        allowed: crate::model::budget::Bytes,
        by: String,
        advice: String,
    },
}

impl Error {
    pub fn shape(op: &'static str, message: impl Into<String>) -> Self {
        Error::Shape {
            op,
            message: message.into(),
        }
    }
}
