//! `shaderlm quantize`: rewrite a model the engine runs (GGUF of any supported type, or Hugging Face f32 / f16 /
//! bf16 / GPTQ safetensors) as a GGUF file with Q4_0 or Q8_0 matrices, or as a 4-bit GPTQ Hugging Face checkpoint;
//! by round-to-nearest or by GPTQ's Hessian-based error compensation over a short calibration text; and report the
//! RMSE every tensor picked up.
//!
//! What is stored how:
//! ```text
//!                   GGUF q4_0 / q8_0                        GPTQ (Hugging Face)
//! decoder linears   the format (F16 if a row is not 32-wide)   qweight / qzeros / scales / g_idx, 4 bits
//! embedding         the format; Q8_0 when tied to the head     f16
//! output head       Q8_0 (llama.cpp keeps it finer, too)       f16
//! norms, biases     F32                                        f16
//! ```
//! Inputs are dequantized to f32 first (a Q4_1 file is re-quantized from its own values, so the RMSE is measured
//! against those, not against the model it was once made from). Architectures: the Llama family (Llama, Qwen2,
//! Qwen3) from and to either format; MiniCPM within its input's format; Gemma 3 and sliding-window models GGUF to
//! GGUF (`Source::check_output` and the writers name what they refuse).

mod calib;
mod gguf_out;
mod hf_out;
pub mod solve;
pub mod source;

use crate::error::{Error, Result};
use crate::model::Names;
use crate::quant::gptq::{self, Scheme};
use crate::quant::{self, f16_to_f32, f32_to_f16, GgmlType};
use solve::{GptqGrid, Grid, InverseHessian, Q4_0Grid, Q8_0Grid};
use source::{ModelTensor, Role, Source};
use std::path::Path;

/// A default calibration text for the GPTQ method: prose of several registers, a dialogue, numbers and code.
pub const CALIBRATION_TEXT: &str = "The river had been rising for three days before anyone in the village thought to \
move the grain. By the fourth morning the water stood a hand's width below the mill door, brown and quick, carrying \
branches, a broken cart wheel and, once, a bewildered goat. The miller, a patient man who distrusted hurry, walked \
the bank twice and then sent his daughter to ring the bell.

\"How long do we have?\" asked the schoolteacher, who had come running with her sleeves still chalky.
\"Until tonight, if the rain keeps on,\" the miller said. \"Perhaps tomorrow, if it doesn't.\"

In economics, a market is said to clear when the quantity supplied equals the quantity demanded at the prevailing \
price. Shortages arise when prices are held below that level, and surpluses when they are held above it. In 2019 the \
average household spent roughly 13% of its income on food, compared with 17.5% in 1984.

Photosynthesis converts light energy into chemical energy: carbon dioxide and water become glucose and oxygen. The \
light-dependent reactions take place in the thylakoid membranes, while the Calvin cycle runs in the stroma.

def fibonacci(n: int) -> list[int]:
    \"\"\"Return the first n Fibonacci numbers.\"\"\"
    seq = [0, 1]
    while len(seq) < n:
        seq.append(seq[-1] + seq[-2])
    return seq[:n]

SELECT name, COUNT(*) AS orders FROM customers JOIN orders USING (customer_id) GROUP BY name ORDER BY orders DESC;

Dear Ms. Alvarez, thank you for your letter of 12 March. I am pleased to confirm that the committee has approved \
your proposal, subject to the revised budget we discussed. Please find the signed agreement enclosed.";

/// The output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A GGUF file with Q4_0 matrices.
    Q4_0,
    /// A GGUF file with Q8_0 matrices.
    Q8_0,
    /// A Hugging Face directory with 4-bit GPTQ linear layers (v1 checkpoint format, no act-order); `group_size`
    /// `None` is one group over each row.
    Gptq4 { group_size: Option<usize>, sym: bool },
}

impl Format {
    /// From the command line: `q4_0`, `q8_0` or `gptq4`, with GPTQ's group size (-1: one group) and symmetry.
    pub fn parse(name: &str, group_size: i64, sym: bool) -> Result<Format> {
        match name.to_ascii_lowercase().as_str() {
            "q4_0" => Ok(Format::Q4_0),
            "q8_0" => Ok(Format::Q8_0),
            "gptq4" | "gptq" => {
                let gs = match group_size {
                    -1 => None,
                    g if g > 0 => Some(g as usize),
                    g => {
                        return Err(Error::Invalid(format!(
                            "group size {g}: want -1 or a positive multiple of 32"
                        )))
                    }
                };
                Scheme::gptq(4, gs).check()?;
                Ok(Format::Gptq4 { group_size: gs, sym })
            }
            other => Err(Error::Invalid(format!(
                "unknown format {other:?}: the formats are q4_0, q8_0 (GGUF files) and gptq4 (a Hugging Face \
                 GPTQ directory)"
            ))),
        }
    }

    /// The naming convention of the output.
    pub fn names(self) -> Names {
        match self {
            Format::Gptq4 { .. } => Names::Hf,
            _ => Names::Gguf,
        }
    }

    pub fn describe(self) -> String {
        match self {
            Format::Q4_0 => "GGUF Q4_0".into(),
            Format::Q8_0 => "GGUF Q8_0".into(),
            Format::Gptq4 { group_size, sym } => format!(
                "GPTQ 4-bit {} {}",
                group_size.map_or("per-channel".into(), |g| format!("g{g}")),
                if sym { "sym" } else { "asym" }
            ),
        }
    }
}

/// How weights are put on the grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// Round to nearest, tensor by tensor.
    Rtn,
    /// GPTQ: the model runs on the CPU over the calibration tokens layer by layer; each decoder linear layer is
    /// quantized with its inputs' Hessian, and later layers see the quantized layers' outputs.
    Gptq,
}

/// What to do.
#[derive(Clone, Debug)]
pub struct Options {
    pub format: Format,
    pub method: Method,
    /// Calibration text for the GPTQ method, tokenized with the model's tokenizer ([`CALIBRATION_TEXT`] is a
    /// default), and the most tokens of it used.
    pub calib_text: String,
    pub calib_tokens: usize,
    /// GPTQ's damping, a fraction of the Hessian's mean diagonal added to it.
    pub damp: f64,
    /// Replace an existing output.
    pub force: bool,
}

/// What one tensor became.
#[derive(Clone, Debug)]
pub struct TensorStat {
    /// Name in the output.
    pub name: String,
    pub shape: Vec<usize>,
    /// How it is stored: `Q4_0`, `GPTQ4`, `F16`, ...
    pub stored: String,
    /// Root mean square of (stored - input) and of the input.
    pub rmse: f64,
    pub rms: f64,
}

impl TensorStat {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// The outcome of a run.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub tensors: Vec<TensorStat>,
    /// Bytes written.
    pub bytes: u64,
    /// Things the user should know (tensors kept unquantized, group sizes some kernels dislike).
    pub notes: Vec<String>,
}

impl Report {
    /// Over the matrices (2-D tensors): (RMSE over all their weights, that divided by their RMS).
    pub fn total(&self) -> (f64, f64) {
        let (mut se, mut ss, mut n) = (0f64, 0f64, 0f64);
        for t in self.tensors.iter().filter(|t| t.shape.len() == 2) {
            let c = t.numel() as f64;
            se += t.rmse * t.rmse * c;
            ss += t.rms * t.rms * c;
            n += c;
        }
        let rmse = (se / n.max(1.0)).sqrt();
        (rmse, rmse / (ss / n.max(1.0)).sqrt().max(f64::MIN_POSITIVE))
    }
}

/// A tensor as the output stores it.
pub enum Stored {
    F32(Vec<f32>),
    /// f16 bits.
    F16(Vec<u16>),
    Ggml(GgmlType, Vec<u8>),
    Gptq(gptq::GptqTensors),
}

/// Where tensors go.
trait Sink {
    fn add(&mut self, name: &str, shape: &[usize], stored: Stored) -> Result<()>;
    /// Write everything under `out` (a path that does not exist yet); returns the bytes written.
    fn finish(self: Box<Self>, out: &Path) -> Result<u64>;
}

/// How one tensor is stored.
enum Plan {
    F32,
    F16,
    Ggml(GgmlType),
    Gptq { group_size: Option<usize>, sym: bool },
}

impl Plan {
    fn grid(&self) -> Option<Box<dyn Grid>> {
        match *self {
            Plan::Ggml(GgmlType::Q4_0) => Some(Box::new(Q4_0Grid)),
            Plan::Ggml(GgmlType::Q8_0) => Some(Box::new(Q8_0Grid)),
            Plan::Gptq { group_size, sym } => Some(Box::new(GptqGrid { group_size, sym })),
            _ => None,
        }
    }
}

/// The run's state: the input, where tensors go, and what happened to each.
struct Run<'a> {
    src: &'a Source,
    opts: &'a Options,
    sink: Box<dyn Sink>,
    report: Report,
}

impl Run<'_> {
    fn plan(&mut self, t: &ModelTensor, name: &str, shape: &[usize]) -> Result<Plan> {
        if shape.len() != 2 {
            return Ok(match self.opts.format {
                Format::Gptq4 { .. } => Plan::F16,
                _ => Plan::F32,
            });
        }
        let (n, k) = (shape[0], shape[1]);
        let head = t.role == Role::Head || (t.role == Role::Embed && self.src.cfg.tie_embeddings);
        Ok(match self.opts.format {
            Format::Q4_0 | Format::Q8_0 if !k.is_multiple_of(32) => {
                self.report
                    .notes
                    .push(format!("{name}: rows of {k} are not whole 32-weight blocks; kept F16"));
                Plan::F16
            }
            Format::Q4_0 | Format::Q8_0 if head => Plan::Ggml(GgmlType::Q8_0),
            Format::Q4_0 => Plan::Ggml(GgmlType::Q4_0),
            Format::Q8_0 => Plan::Ggml(GgmlType::Q8_0),
            Format::Gptq4 { group_size, sym } if t.role.is_linear() => {
                if !k.is_multiple_of(32) || !n.is_multiple_of(8) {
                    return Err(Error::Invalid(format!(
                        "{name} [{n}, {k}]: GPTQ packs 8 outputs per word and shaderlm runs 32-input blocks, so N \
                         must be a multiple of 8 and K of 32"
                    )));
                }
                if let Some(gs) = group_size.filter(|&gs| !k.is_multiple_of(gs)) {
                    let note = format!(
                        "K = {k} is not a multiple of the group size {gs}: the last group is shorter (AutoGPTQ and \
                         shaderlm read it; kernels that need whole groups, such as Marlin, do not)"
                    );
                    if !self.report.notes.contains(&note) {
                        self.report.notes.push(note);
                    }
                }
                Plan::Gptq { group_size, sym }
            }
            Format::Gptq4 { .. } => Plan::F16,
        })
    }

    /// Store one tensor (GPTQ with `hinv`, else round-to-nearest); returns its values as stored.
    fn store(
        &mut self,
        t: &ModelTensor,
        shape: Vec<usize>,
        v: Vec<f32>,
        hinv: Option<&InverseHessian>,
    ) -> Result<Vec<f32>> {
        let name = t.name(self.opts.format.names());
        let plan = self.plan(t, &name, &shape)?;
        let (n, k) = (
            shape.first().copied().unwrap_or(1),
            shape.iter().skip(1).product::<usize>(),
        );
        let to_f16 = |v: &[f32]| -> Result<Vec<u16>> {
            match v
                .iter()
                .find(|x| x.is_finite() && !f16_to_f32(f32_to_f16(**x)).is_finite())
            {
                Some(x) => Err(Error::Invalid(format!("{name}: {x} does not fit f16"))),
                None => Ok(v.iter().map(|&x| f32_to_f16(x)).collect()),
            }
        };
        let solved = match (hinv, plan.grid()) {
            (Some(h), Some(grid)) => Some(solve::solve(&v, n, k, grid.as_ref(), Some(h))?),
            _ => None,
        };
        let (stored, kind, values) = match plan {
            Plan::F32 => (Stored::F32(v.clone()), "F32".to_string(), v.clone()),
            Plan::F16 => {
                let h = to_f16(&v)?;
                let back = h.iter().map(|&b| f16_to_f32(b)).collect();
                (Stored::F16(h), "F16".into(), back)
            }
            Plan::Ggml(ty) => {
                let raw = match &solved {
                    Some(s) => solve::pack_ggml(ty, s)?,
                    None => quant::quantize(ty, &v)?,
                };
                let back = quant::dequantize(ty, &raw)?;
                (Stored::Ggml(ty, raw), ty.to_string(), back)
            }
            Plan::Gptq { group_size, sym } => {
                let gt = match &solved {
                    Some(s) => solve::pack_gptq(s, group_size)?,
                    None => gptq::quantize_rtn(&v, n, k, group_size.map_or(-1, |g| g as i64), sym)?,
                };
                let back = gptq::dequantize(&Scheme::gptq(4, group_size), &gt);
                (Stored::Gptq(gt), "GPTQ4".into(), back)
            }
        };
        let se: f64 = values.iter().zip(&v).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
        let ss: f64 = v.iter().map(|&x| (x as f64).powi(2)).sum();
        let count = v.len().max(1) as f64;
        self.report.tensors.push(TensorStat {
            name: name.clone(),
            shape: shape.clone(),
            stored: kind,
            rmse: (se / count).sqrt(),
            rms: (ss / count).sqrt(),
        });
        self.sink.add(&name, &shape, stored)?;
        Ok(values)
    }
}

/// Whether `out` may be written: absent, or `force`.
fn check_output(out: &Path, format: Format, force: bool) -> Result<()> {
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty() && !p.is_dir()) {
        return Err(Error::File {
            path: parent.into(),
            message: "the output's directory does not exist".into(),
        });
    }
    let exists = out.symlink_metadata().is_ok();
    if exists && !force {
        return Err(Error::File {
            path: out.into(),
            message: "the output already exists; pass --force to replace it".into(),
        });
    }
    if out.join("model.safetensors.index.json").exists() {
        return Err(Error::File {
            path: out.into(),
            message: "holds a sharded checkpoint (model.safetensors.index.json), which would shadow the new \
                      model.safetensors: choose a new directory"
                .into(),
        });
    }
    if exists && out.is_dir() != matches!(format, Format::Gptq4 { .. }) {
        let (is, want) = if out.is_dir() {
            ("a directory", "a GGUF file")
        } else {
            ("a file", "a directory")
        };
        return Err(Error::File {
            path: out.into(),
            message: format!("is {is}; {} writes {want}", format.describe()),
        });
    }
    Ok(())
}

/// Quantize the model at `input` into `output`; `log` gets a line per stage.
pub fn quantize_model(input: &Path, output: &Path, opts: &Options, log: &mut dyn FnMut(&str)) -> Result<Report> {
    check_output(output, opts.format, opts.force)?;
    if input
        .canonicalize()
        .ok()
        .is_some_and(|i| output.canonicalize().ok() == Some(i))
    {
        return Err(Error::File {
            path: output.into(),
            message: "the output is the input".into(),
        });
    }
    let src = Source::open(input)?;
    src.check_output(opts.format.names())?;
    let sink: Box<dyn Sink> = match opts.format {
        Format::Q4_0 | Format::Q8_0 => Box::new(gguf_out::GgufSink::new(&src, opts.format)?),
        Format::Gptq4 { group_size, sym } => Box::new(hf_out::HfSink::new(&src, group_size, sym, opts.damp)?),
    };
    let mut run = Run {
        src: &src,
        opts,
        sink,
        report: Report::default(),
    };
    let to = opts.format.names();
    log(&format!(
        "{}: {} layers, {} tensors -> {}",
        input.display(),
        src.cfg.n_layers,
        src.tensors().len(),
        opts.format.describe()
    ));
    match opts.method {
        Method::Rtn => {
            for t in src.tensors() {
                let (shape, v) = src.read(&t, to)?;
                run.store(&t, shape, v, None)?;
            }
        }
        Method::Gptq => {
            let mut tokens = src.tokenizer()?.encode(&opts.calib_text, true)?;
            tokens.truncate(opts.calib_tokens.min(src.cfg.context));
            if tokens.len() < 2 {
                return Err(Error::Invalid(format!(
                    "GPTQ needs a calibration text of at least 2 tokens (got {})",
                    tokens.len()
                )));
            }
            log(&format!("GPTQ: calibrating on {} tokens", tokens.len()));
            calib::run(&src, to, &tokens, opts.damp, log, &mut |t, shape, v, h| {
                run.store(&t, shape, v, h)
            })?;
        }
    }
    let Run { sink, mut report, .. } = run;
    report.bytes = sink.finish(output)?;
    Ok(report)
}

/// Build the output at a temporary sibling of `out` with `write` (which returns the bytes written), then move it
/// into place; a failed build leaves nothing behind.
fn write_then_commit(out: &Path, write: impl FnOnce(&Path) -> Result<u64>) -> Result<u64> {
    let tmp = temp_path(out);
    match write(&tmp) {
        Ok(bytes) => {
            commit(&tmp, out)?;
            Ok(bytes)
        }
        Err(e) => {
            let _ = if tmp.is_dir() {
                std::fs::remove_dir_all(&tmp)
            } else {
                std::fs::remove_file(&tmp)
            };
            Err(e)
        }
    }
}

/// Move a finished temporary output into place (replacing what `--force` allows).
fn commit(tmp: &Path, out: &Path) -> Result<()> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    if out.is_dir() && tmp.is_dir() {
        // Replace the files we wrote, leaving others in the directory alone.
        for e in std::fs::read_dir(tmp).map_err(io(tmp))? {
            let e = e.map_err(io(tmp))?;
            std::fs::rename(e.path(), out.join(e.file_name())).map_err(io(out))?;
        }
        return std::fs::remove_dir(tmp).map_err(io(tmp));
    }
    std::fs::rename(tmp, out).map_err(io(out))
}

/// A sibling of `out` to build into.
fn temp_path(out: &Path) -> std::path::PathBuf {
    let name = out
        .file_name()
        .map_or("out".into(), |n| n.to_string_lossy().to_string());
    out.with_file_name(format!(".{name}.partial-{}", std::process::id()))
}
