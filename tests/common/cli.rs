//! Running the built binary from the integration tests with a time limit, so a hang fails a test instead of
//! stalling the suite.

#![allow(dead_code)]
use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Runs `shaderlm args` in `cwd` with stdin closed; `None` when it was still running after `secs` (it is then
/// killed). Its output is read while it runs, so a chatty run never blocks on a full pipe.
pub fn run_within(args: &[&str], cwd: &Path, secs: u64) -> Option<Output> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_shaderlm"))
        .args(args)
        .current_dir(cwd)
        .env_remove("SHADERLM_MODEL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run shaderlm");
    fn drain(pipe: Option<impl Read + Send + 'static>) -> JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut bytes);
            }
            bytes
        })
    }
    let (stdout, stderr) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let deadline = Instant::now() + Duration::from_secs(secs);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            child.kill().ok();
            child.wait().ok();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(Output {
        status: child.wait().expect("wait"),
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    })
}
