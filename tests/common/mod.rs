//! Helpers shared by the integration tests.

pub mod minicpm;
pub mod tiny;
