//! `shaderlm info MODEL`: architecture, sizes, quantization, tokenizer, template and metadata, without a GPU.

use std::path::Path;

pub fn run(path: &Path) -> anyhow::Result<()> {
    print!("{}", shaderlm::model::load::describe(path)?);
    Ok(())
}
