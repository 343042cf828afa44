//! Models: hyper-parameters, weights from any format, and one implementation per architecture family.

pub mod blockffn;
pub mod budget;
pub mod config;
pub mod eagle;
pub mod eagle3;
pub mod eagle_fit;
pub mod eagle_minicpm;
pub mod frspec;
pub mod fused;
pub mod llama;
pub mod load;
pub mod names;
pub mod options;
pub mod reference;
pub mod rope_pairs;
pub mod rope_scaling;
pub mod sparse;
pub mod step;
pub mod synthetic;
pub mod tree_draft;
pub mod tree_step;
pub mod weights;

pub use config::{Arch, LlamaConfig, SparseConfig};
pub use llama::{KvCache, Llama, Names};
pub use load::LoadedModel;
pub use options::{AttentionMode, KvType, LoadOptions, SparseOverrides};
pub use step::{Step, StepInputs, StepOutputs, StepResult};
