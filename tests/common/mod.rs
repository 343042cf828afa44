//! Helpers shared by the integration tests.

pub mod blockffn;
pub mod cli;
pub mod golden;
pub mod gpu;
pub mod minicpm;
pub mod rng;
pub mod spec_runs;
pub mod steps;
pub mod tiny;
pub mod torch;
