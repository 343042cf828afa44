//! `shaderlm devices`: every adapter, its features and limits, and which one would be chosen.

use super::DeviceArgs;
use shaderlm::gpu::describe_adapters;

pub fn run(args: &DeviceArgs) -> anyhow::Result<()> {
    let reports = describe_adapters(&args.options())?;
    if reports.is_empty() {
        return Err(shaderlm::Error::NoAdapter { detail: String::new() }.into());
    }
    for r in &reports {
        println!("{r}");
    }
    if !reports.iter().any(|r| r.chosen) {
        println!("(no adapter matches the --adapter / WGPU_ADAPTER_NAME filter)");
    }
    Ok(())
}
