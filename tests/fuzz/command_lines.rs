//! The command-line corpus: every subcommand (generate with every flag, chat with stdin closed, bench, info,
//! quantize, devices) from a valid command line on tiny models, mutated by adding flags with values of their own
//! kind (paths to good, missing, empty, directory and FIFO files; edge numbers; odd text) or generic edge values,
//! switches, stray and dropped tokens. Each run of the binary must end within [`RUN_SECS`] with an exit code (no
//! signal) and no panic.

use crate::common::cli::run_within;
use crate::common::rng::Rng;
use crate::common::tiny::{write_gguf_chat, write_hf_chat};
use shaderlm::quant::GgmlType;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Longest one run may take.
pub const RUN_SECS: u64 = 60;
/// Runs of at least this long also select the GL adapter (`@gl`), whose first run of a command compiles every
/// pipeline from scratch: 25 s of CPU (51 s on a busy machine) for the tiny model on llvmpipe with a cold shader
/// cache, too slow for the CI run (GL itself is tested by the golden run); such a run may take [`GL_RUN_SECS`].
pub const GL_FROM_SECS: u64 = 300;
pub const GL_RUN_SECS: u64 = 300;

/// Flags and the values of their own kind; `@name` is a file of [`Files`].
type Flags = &'static [(&'static str, &'static [&'static str])];

/// Values any flag may get: number edges, floats, garbage.
const GENERIC: [&str; 17] = [
    "0",
    "-1",
    "1",
    "18446744073709551615",
    "18446744073709551616",
    "4294967297",
    "nan",
    "inf",
    "-inf",
    "1e308",
    "0.5",
    "",
    "x",
    "1,2,3",
    "999999999",
    "65",
    "日本語",
];

/// Flags that keep to their own values: `bench -r 999999999` is work asked for, not a hang.
const OWN_VALUES_ONLY: [&str; 1] = ["-r"];

const DEVICE: Flags = &[
    ("--backend", &["vulkan", "@gl", "metal", "dx12", "vulkan,gl", "x"]),
    ("--adapter", &["llvmpipe", "no such adapter", ""]),
    ("--lp-threads", &["0", "1", "2"]),
];

const MODEL: Flags = &[
    ("-m", &["@model", "@hf", "@missing", "@dir", "@empty", "@fifo"]),
    ("--ctx", &["1", "2", "16", "256", "257"]),
    ("--chunk", &["1", "7", "8", "9", "128", "257"]),
    ("--max-memory", &["1", "1K", "2M", "64M", "1T", "1.5G", "4Q", "0"]),
    ("--sparse-block-size", &["16", "64", "3"]),
    ("--sparse-topk", &["1", "4"]),
    ("--sparse-init-blocks", &["0", "1", "100"]),
    ("--sparse-window", &["0", "32", "64", "33"]),
    ("--sparse-dense-len", &["0", "16", "48"]),
];

const SAMPLING: Flags = &[
    ("--temp", &["0", "0.7", "100"]),
    ("--top-k", &["0", "1", "40"]),
    ("--top-p", &["0", "1", "0.9"]),
    ("--min-p", &["0", "1", "0.05"]),
    ("--repeat-penalty", &["1", "1.3", "1e-30"]),
    ("--frequency-penalty", &["0", "2", "-2"]),
    ("--presence-penalty", &["0", "2", "-2"]),
    ("--repeat-last-n", &["0", "64"]),
    ("--seed", &["0", "3"]),
];

const GENERATE: Flags = &[
    ("--prompt", &["hi", "", " ", "日本語 🙂", "<|im_start|>user", "@long"]),
    (
        "--messages",
        &["@messages", "@bad_json", "@missing", "@dir", "@empty", "@fifo"],
    ),
    ("--prompt-ids", &["1,2,3", "0", "264", "265", "4294967295", "1,,2"]),
    ("--system", &["", "be brief", "@long"]),
    ("-n", &["0", "1", "300"]),
    ("--stop", &["", "o", "\n", "<|im_end|>"]),
];

const CHAT: Flags = &[("--system", &["", "be brief"]), ("-n", &["0", "1", "300"])];

const BENCH: Flags = &[
    ("-p", &["0", "1", "8", "0,8", "8,16,300"]),
    ("-n", &["0", "1", "4", "300"]),
    ("-r", &["0", "1", "2", "-1", "x"]),
    ("-o", &["md", "json", "csv", "x"]),
    ("--synthetic", &["x", "", "smollm2-135m"]),
    ("--synthetic-type", &["q4_0", "Q8_0", "f16", "q2_k", "x"]),
    ("--profile-rows", &["0", "1", "4", "8", "9", "x"]),
];

const QUANTIZE: Flags = &[
    ("-m", &["@quant_in", "@hf", "@missing", "@dir", "@empty", "@fifo"]),
    (
        "-o",
        &["@out", "@out_dir", "@quant_in", "@dir", "@fifo", "@missing_dir/x.gguf"],
    ),
    ("-f", &["q4_0", "q8_0", "gptq4", "Q8_0", "x", ""]),
    ("--group-size", &["-1", "0", "32", "33", "64", "128"]),
    ("--method", &["rtn", "gptq", "x"]),
    ("--calib-text", &["@text", "@missing", "@dir", "@empty", "@fifo"]),
    ("--calib-tokens", &["0", "1", "16"]),
    ("--damp", &["0", "1", "-1", "nan"]),
    ("--eval-text", &["@text", "@missing", "@dir", "@empty", "@fifo"]),
    ("--eval-tokens", &["0", "1", "2", "16"]),
];

/// A subcommand: valid command lines to start from, its flags (with the shared groups), its switches.
struct Command {
    seeds: &'static [&'static [&'static str]],
    flags: &'static [Flags],
    switches: &'static [&'static str],
}

const COMMANDS: [Command; 6] = [
    Command {
        seeds: &[
            &["generate", "-m", "@model", "--prompt", "hi", "-n", "2"],
            &["generate", "-m", "@model", "--prompt-ids", "1,2,3", "-n", "2", "--json"],
            &["generate", "-m", "@model", "--messages", "@messages", "-n", "2"],
            &[
                "generate", "-m", "@hf", "--chat", "--prompt", "hi", "-n", "2", "--temp", "0",
            ],
        ],
        flags: &[DEVICE, MODEL, SAMPLING, GENERATE],
        switches: &[
            "--chat",
            "--stats",
            "--ignore-eos",
            "--check",
            "--json",
            "--sparse-attention",
            "--dense-attention",
        ],
    },
    Command {
        seeds: &[&["chat", "-m", "@model", "-n", "2"], &["chat", "-m", "@hf"]],
        flags: &[DEVICE, MODEL, SAMPLING, CHAT],
        switches: &["--sparse-attention", "--dense-attention"],
    },
    Command {
        seeds: &[&["bench", "-m", "@model", "-p", "8", "-n", "4", "-r", "1"]],
        flags: &[DEVICE, MODEL, BENCH],
        switches: &["--check", "--profile", "--sparse-attention"],
    },
    Command {
        seeds: &[
            &["info", "@model"],
            &["info", "@hf"],
            &["info", "-m", "@model", "--ctx", "64"],
        ],
        flags: &[DEVICE, MODEL],
        switches: &["--sparse-attention", "--dense-attention"],
    },
    Command {
        seeds: &[
            &["quantize", "-m", "@quant_in", "-o", "@out", "-f", "q8_0", "--force"],
            &["quantize", "-m", "@hf", "-o", "@out_dir", "-f", "gptq4", "--force"],
        ],
        flags: &[DEVICE, QUANTIZE],
        switches: &["--sym", "--force", "--eval", "--all", "--json"],
    },
    Command {
        seeds: &[&["devices"]],
        flags: &[DEVICE],
        switches: &[],
    },
];

/// Tokens that are no flag or value of any subcommand.
const STRAY: [&str; 6] = ["--nope", "-", "--", "-zz", "extra", "--help"];

/// The files `@name` values stand for, in one directory.
pub struct Files {
    dir: PathBuf,
    pristine: PathBuf,
    /// Whether `@gl` is `gl` (else `vulkan`).
    gl: bool,
}

impl Files {
    pub fn new(dir: &Path, gl: bool) -> Files {
        let pristine = dir.join("pristine.gguf");
        write_gguf_chat(&pristine, 3, GgmlType::Q8_0);
        std::fs::create_dir_all(dir.join("hf")).unwrap();
        write_hf_chat(&dir.join("hf"), 4, true);
        let files = Files {
            dir: dir.into(),
            pristine,
            gl,
        };
        files.reset();
        files
    }

    /// The path or text `value` stands for (`value` itself unless it starts with `@`).
    fn resolve(&self, value: &str) -> String {
        let Some(name) = value.strip_prefix('@') else {
            return value.into();
        };
        let file = match name {
            "long" => return "word ".repeat(2000),
            "gl" => return if self.gl { "gl" } else { "vulkan" }.into(),
            "model" => "model.gguf",
            "quant_in" => "quant_in.gguf",
            "messages" => "messages.json",
            "bad_json" => "bad.json",
            "text" => "text.txt",
            "out" => "out.gguf",
            "out_dir" => "out_hf",
            "missing" => "missing",
            other => other,
        };
        self.dir.join(file).to_string_lossy().into_owned()
    }

    /// (Re)makes every file a run may use, undoing what the last one wrote (`quantize -o FILE --force` replaces
    /// the model, the FIFO or the directory it is given): the models as they were, the fixtures, no outputs.
    fn reset(&self) {
        let path = |name: &str| self.dir.join(name);
        for name in [
            "model.gguf",
            "quant_in.gguf",
            "dir",
            "empty",
            "fifo",
            "out.gguf",
            "out_hf",
        ] {
            let p = path(name);
            let _ = std::fs::remove_file(&p).or_else(|_| std::fs::remove_dir_all(&p));
        }
        for name in ["model.gguf", "quant_in.gguf"] {
            std::fs::copy(&self.pristine, path(name)).unwrap();
        }
        std::fs::create_dir(path("dir")).unwrap();
        std::fs::write(path("empty"), b"").unwrap();
        let messages = r#"[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]"#;
        std::fs::write(path("messages.json"), messages).unwrap();
        std::fs::write(path("bad.json"), r#"[{"role": "user", "content": 5}"#).unwrap();
        std::fs::write(path("text.txt"), "hello world. ".repeat(40)).unwrap();
        let made = std::process::Command::new("mkfifo").arg(path("fifo")).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo in {}", self.dir.display());
    }
}

/// One mutated command line: a seed of a random subcommand with 1 to 3 mutations, mostly a flag set to a value of
/// its own kind (else a generic one), sometimes a switch, a dropped token or a stray one.
pub fn command_line(rng: &mut Rng, files: &Files) -> Vec<String> {
    let cmd = &COMMANDS[rng.index(COMMANDS.len())];
    let mut args: Vec<String> = rng.pick(cmd.seeds).iter().map(|a| files.resolve(a)).collect();
    for _ in 0..1 + rng.below(3) {
        match rng.below(16) {
            0..=11 => {
                let group = rng.pick(cmd.flags);
                let (flag, own) = rng.pick(group);
                let value = if rng.below(4) != 0 || OWN_VALUES_ONLY.contains(&flag) {
                    rng.pick(own)
                } else {
                    rng.pick(&GENERIC)
                };
                set_flag(&mut args, flag, files.resolve(value));
            }
            12 | 13 if !cmd.switches.is_empty() => {
                let switch = rng.pick(cmd.switches);
                if !args.iter().any(|a| a == switch) {
                    args.push(switch.into());
                }
            }
            14 if args.len() > 1 => {
                let at = 1 + rng.index(args.len() - 1);
                args.remove(at);
            }
            _ => {
                let at = 1 + rng.index(args.len());
                args.insert(at.min(args.len()), rng.pick(&STRAY).into());
            }
        }
    }
    args
}

/// `flag value` in place of any earlier setting of `flag` (a repeated flag is only a usage error); `flag=value`
/// when the value starts with `-`, so that it is read as a value and not as another flag.
fn set_flag(args: &mut Vec<String>, flag: &str, value: String) {
    if let Some(i) = args.iter().position(|a| a == flag) {
        args.drain(i..(i + 2).min(args.len()));
    }
    let joined = format!("{flag}=");
    args.retain(|a| !a.starts_with(&joined));
    if value.starts_with('-') {
        args.push(joined + &value);
    } else {
        args.extend([flag.to_string(), value]);
    }
}

/// What the runs of one subcommand ended in: success, a usage error (clap's exit code 2), another error.
#[derive(Default)]
pub struct Outcomes {
    pub ok: u64,
    pub usage: u64,
    pub error: u64,
}

/// Runs mutated command lines for `secs` (at least 8 of them); returns the outcomes by subcommand and the failures.
pub fn run(seed: u64, secs: u64, dir: &Path) -> (BTreeMap<String, Outcomes>, Vec<String>) {
    let files = Files::new(dir, secs >= GL_FROM_SECS);
    let start = Instant::now();
    let mut rng = Rng::new(seed);
    let (mut n, mut outcomes, mut failures) = (0, BTreeMap::<String, Outcomes>::new(), Vec::new());
    while start.elapsed() < Duration::from_secs(secs) || n < 8 {
        files.reset();
        let args = command_line(&mut rng, &files);
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let shown: Vec<String> = args.iter().map(|s| s.chars().take(80).collect()).collect();
        let tally = outcomes.entry(args[0].clone()).or_default();
        let limit = if args.iter().any(|a| a == "gl") {
            GL_RUN_SECS
        } else {
            RUN_SECS
        };
        match run_within(&argv, dir, limit) {
            None => failures.push(format!("{shown:?}: still running after {limit} s")),
            Some(out) => {
                let err = String::from_utf8_lossy(&out.stderr);
                match out.status.code() {
                    None => failures.push(format!("{shown:?}: killed by a signal: {err}")),
                    Some(_) if err.contains("panicked") => failures.push(format!("{shown:?}: {err}")),
                    Some(0) => tally.ok += 1,
                    Some(2) => tally.usage += 1,
                    Some(_) => tally.error += 1,
                }
            }
        }
        n += 1;
    }
    (outcomes, failures)
}
