//! Running the built binary from the integration tests with a time limit, so a hang fails a test instead of
//! stalling the suite.

#![allow(dead_code)]
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `shaderlm args` in `cwd`; `None` when it was still running after `secs` (it is then killed).
pub fn run_within(args: &[&str], cwd: &Path, secs: u64) -> Option<Output> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_shaderlm"))
        .args(args)
        .current_dir(cwd)
        .env_remove("SHADERLM_MODEL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run shaderlm");
    let deadline = Instant::now() + Duration::from_secs(secs);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            child.kill().ok();
            child.wait().ok();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(child.wait_with_output().expect("output"))
}
