//! RoPE frequency scaling as model files describe it (`rope_type` default, linear, llama3, yarn, longrope, dynamic;
//! GGUF `rope_freqs.weight` and `*.rope.scaling.*`), turned into what the rope kernel takes for one session: a
//! base, a linear position scale, per-frequency divisors and an attention factor on cos and sin.
//!
//! Pair `j` of `rot_dim / 2` turns by `p * freq_scale * theta^(-2j / rot_dim) / divisor[j]` at position `p`. Each
//! type's divisors follow transformers' `modeling_rope_utils` (the `_compute_*_parameters` functions), which
//! llama.cpp matches: llama3 keeps high frequencies, divides low ones by `factor` and blends in between; yarn
//! blends interpolation (`/ factor`) and extrapolation over a ramp of dims set by `beta_fast` / `beta_slow` and
//! scales cos and sin by `0.1 ln(factor) + 1`; dynamic NTK raises the base once the context passes the trained
//! one. Choices that depend on the context (longrope's short or long factors, dynamic NTK's base) are made once
//! per session from its KV-cache size, as llama.cpp does: keys in the cache keep the rotation they were written
//! with.

use crate::error::{Error, Result};
use std::f64::consts::PI;
use std::path::Path;

/// `rope_scaling` of type `longrope` (MiniCPM4, Phi-3): per-frequency divisors for short and long contexts, and
/// the attention factor that multiplies cos and sin.
#[derive(Clone, Debug, PartialEq)]
pub struct LongRope {
    /// `[rope_dim / 2]` divisors used while the context fits `original_max`.
    pub short: Vec<f32>,
    /// `[rope_dim / 2]` divisors used for contexts past it.
    pub long: Vec<f32>,
    pub original_max: usize,
    /// `sqrt(1 + ln(s) / ln(original_max))`, `s = max_position_embeddings / original_max` (1 when s <= 1), unless
    /// the config gives `attention_factor`.
    pub attn_factor: f32,
    /// The context the choice of factors is made for, when the model's own code fixes it: MiniCPM's
    /// `MiniCPMLongRoPE` builds its table once for `max_position_embeddings`, so a MiniCPM session uses the long
    /// factors whenever that passes `original_max`, whatever its cache size. `None` (Phi-3): chosen per session
    /// from its cache size, as llama.cpp does.
    pub fixed_ctx: Option<usize>,
}

impl LongRope {
    /// The divisors for a KV cache of `max_ctx` positions.
    pub fn factors(&self, max_ctx: usize) -> &[f32] {
        if self.fixed_ctx.unwrap_or(max_ctx) > self.original_max {
            &self.long
        } else {
            &self.short
        }
    }
}

/// How a model scales its rotary frequencies.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE (`rope_type` default).
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f32,
    },
    /// Llama 3.1's frequency-dependent scaling.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max: usize,
    },
    /// YaRN (Qwen2.5 long context, DeepSeek).
    Yarn {
        factor: f32,
        original_max: usize,
        beta_fast: f32,
        beta_slow: f32,
        /// Multiplies cos and sin: `attention_factor`, else from `mscale` / `mscale_all_dim`, else
        /// `0.1 ln(factor) + 1`.
        attn_factor: f32,
    },
    /// Dynamic NTK: the base grows with the context past `original_max`.
    Dynamic {
        factor: f32,
        original_max: usize,
    },
    LongRope(LongRope),
    /// Divisors stored in the file (GGUF `rope_freqs.weight`, written by llama.cpp for Llama 3.1 / 3.2).
    Divisors(Vec<f32>),
}

/// The rotation of one session: what the rope kernel and the CPU reference take.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeSession {
    pub theta: f32,
    pub freq_scale: f32,
    /// `[rot_dim / 2]`, or none for all ones.
    pub divisors: Option<Vec<f32>>,
    pub attn_factor: f32,
}

impl RopeSession {
    /// The angle per position of pair `j` (f64, for CPU references).
    pub fn inv_freq(&self, j: usize, rot_dim: usize) -> f64 {
        let mut inv = (self.theta as f64).powf(-2.0 * j as f64 / rot_dim as f64) * self.freq_scale as f64;
        if let Some(d) = &self.divisors {
            inv /= d[j] as f64;
        }
        inv
    }
}

fn bad(path: &Path, message: impl Into<String>) -> Error {
    Error::File {
        path: path.into(),
        message: message.into(),
    }
}

/// The types this build understands, for error messages.
pub const SUPPORTED: &str = "default, linear, llama3, yarn, longrope, dynamic";

impl RopeScaling {
    /// The rotation for a session of `max_ctx` positions with base `theta` over `rot_dim` dims.
    pub fn session(&self, theta: f32, rot_dim: usize, max_ctx: usize) -> RopeSession {
        let half = rot_dim / 2;
        let inv = |j: usize| (theta as f64).powf(-2.0 * j as f64 / rot_dim as f64);
        let mut s = RopeSession {
            theta,
            freq_scale: 1.0,
            divisors: None,
            attn_factor: 1.0,
        };
        match self {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => s.freq_scale = 1.0 / factor,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max,
            } => {
                let (f, lo, hi, old) = (
                    *factor as f64,
                    *low_freq_factor as f64,
                    *high_freq_factor as f64,
                    *original_max as f64,
                );
                let (low_wavelen, high_wavelen) = (old / lo, old / hi);
                let d = (0..half)
                    .map(|j| {
                        let wavelen = 2.0 * PI / inv(j);
                        if wavelen < high_wavelen {
                            1.0
                        } else if wavelen > low_wavelen {
                            f as f32
                        } else {
                            let smooth = (old / wavelen - lo) / (hi - lo);
                            (1.0 / ((1.0 - smooth) / f + smooth)) as f32
                        }
                    })
                    .collect();
                s.divisors = Some(d);
            }
            RopeScaling::Yarn {
                factor,
                original_max,
                beta_fast,
                beta_slow,
                attn_factor,
            } => {
                let dim = rot_dim as f64;
                let base = theta as f64;
                let correction =
                    |rotations: f64| dim * (*original_max as f64 / (rotations * 2.0 * PI)).ln() / (2.0 * base.ln());
                let low = correction(*beta_fast as f64).floor().max(0.0);
                let mut high = correction(*beta_slow as f64).ceil().min(dim - 1.0);
                if high == low {
                    high += 0.001;
                }
                let d = (0..half)
                    .map(|j| {
                        let ramp = ((j as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        let extrapolation = 1.0 - ramp;
                        (1.0 / ((1.0 - extrapolation) / *factor as f64 + extrapolation)) as f32
                    })
                    .collect();
                s.divisors = Some(d);
                s.attn_factor = *attn_factor;
            }
            RopeScaling::Dynamic { factor, original_max } => {
                if max_ctx > *original_max && rot_dim > 2 {
                    let f = *factor as f64;
                    let grow = f * max_ctx as f64 / *original_max as f64 - (f - 1.0);
                    s.theta = (theta as f64 * grow.powf(rot_dim as f64 / (rot_dim as f64 - 2.0))) as f32;
                }
            }
            RopeScaling::LongRope(l) => {
                s.divisors = Some(l.factors(max_ctx).to_vec());
                s.attn_factor = l.attn_factor;
            }
            RopeScaling::Divisors(d) => s.divisors = Some(d.clone()),
        }
        s
    }

    /// Checks the values against the rotated dims.
    pub fn check(self, path: &Path, rot_dim: usize) -> Result<Self> {
        let positive = |name: &str, v: f32| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(bad(path, format!("rope scaling {name} {v} is not a positive number")))
            }
        };
        let context = |v: usize| {
            if (2..=1 << 24).contains(&v) {
                Ok(())
            } else {
                Err(bad(
                    path,
                    format!("rope scaling original_max_position_embeddings {v} is out of range"),
                ))
            }
        };
        let divisors = |name: &str, d: &[f32]| {
            if d.len() != rot_dim / 2 || d.iter().any(|f| !f.is_finite() || *f <= 0.0) {
                Err(bad(
                    path,
                    format!("{name}: want {} positive numbers, got {}", rot_dim / 2, d.len()),
                ))
            } else {
                Ok(())
            }
        };
        match &self {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => positive("factor", *factor)?,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max,
            } => {
                positive("factor", *factor)?;
                positive("low_freq_factor", *low_freq_factor)?;
                positive("high_freq_factor", *high_freq_factor)?;
                if high_freq_factor <= low_freq_factor {
                    return Err(bad(
                        path,
                        "llama3 rope scaling needs high_freq_factor > low_freq_factor",
                    ));
                }
                context(*original_max)?;
            }
            RopeScaling::Yarn {
                factor,
                original_max,
                beta_fast,
                beta_slow,
                attn_factor,
            } => {
                positive("factor", *factor)?;
                positive("beta_fast", *beta_fast)?;
                positive("beta_slow", *beta_slow)?;
                positive("attention_factor", *attn_factor)?;
                context(*original_max)?;
            }
            RopeScaling::Dynamic { factor, original_max } => {
                positive("factor", *factor)?;
                context(*original_max)?;
            }
            RopeScaling::LongRope(l) => {
                divisors("rope_scaling.short_factor", &l.short)?;
                divisors("rope_scaling.long_factor", &l.long)?;
                positive("attention_factor", l.attn_factor)?;
                context(l.original_max)?;
            }
            RopeScaling::Divisors(d) => divisors("rope_freqs.weight", d)?,
        }
        Ok(self)
    }

    /// From a Hugging Face `rope_scaling` or `rope_parameters` object (`type` or `rope_type`); `context` is
    /// `max_position_embeddings`, `rot_dim` the rotated dims. Unknown types and fields of known types that change
    /// the math in ways not handled here are errors naming them.
    pub fn from_hf(path: &Path, s: &serde_json::Value, rot_dim: usize, context: usize) -> Result<RopeScaling> {
        let num = |k: &str| s.get(k).and_then(|x| x.as_f64());
        let text = s.get("rope_type").or(s.get("type")).and_then(|t| t.as_str());
        let factor = || -> Result<f32> {
            num("factor")
                .map(|f| f as f32)
                .ok_or_else(|| bad(path, format!("rope_scaling of type {text:?} needs a factor")))
        };
        let original = |default: usize| -> usize {
            s.get("original_max_position_embeddings")
                .and_then(|x| x.as_u64())
                .map_or(default, |x| x as usize)
        };
        let scaling = match text {
            None | Some("default") => RopeScaling::None,
            Some("linear") => RopeScaling::Linear { factor: factor()? },
            Some("llama3") => RopeScaling::Llama3 {
                factor: factor()?,
                low_freq_factor: num("low_freq_factor").unwrap_or(1.0) as f32,
                high_freq_factor: num("high_freq_factor").unwrap_or(4.0) as f32,
                original_max: original(8192),
            },
            Some("yarn") => {
                let f = factor()?;
                let mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
                let attn = match (num("attention_factor"), num("mscale"), num("mscale_all_dim")) {
                    (Some(a), _, _) => a,
                    (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => mscale(f as f64, m) / mscale(f as f64, all),
                    _ => mscale(f as f64, 1.0),
                };
                if s.get("truncate").and_then(|t| t.as_bool()) == Some(false) {
                    return Err(bad(path, "rope_scaling.truncate = false (yarn) is not supported"));
                }
                RopeScaling::Yarn {
                    factor: f,
                    original_max: original(context),
                    beta_fast: num("beta_fast").unwrap_or(32.0) as f32,
                    beta_slow: num("beta_slow").unwrap_or(1.0) as f32,
                    attn_factor: attn as f32,
                }
            }
            Some("dynamic") => RopeScaling::Dynamic {
                factor: factor()?,
                original_max: original(context),
            },
            Some("longrope") => RopeScaling::LongRope(long_rope(path, s, context)?),
            Some(other) => {
                return Err(bad(
                    path,
                    format!("rope type {other:?} is not supported (this build knows {SUPPORTED})"),
                ))
            }
        };
        scaling.check(path, rot_dim)
    }
}

/// `rope_scaling: {"rope_type": "longrope", "long_factor": [..], "short_factor": [..],
/// "original_max_position_embeddings": N}`.
fn long_rope(path: &Path, s: &serde_json::Value, context: usize) -> Result<LongRope> {
    let factors = |key: &str| -> Result<Vec<f32>> {
        let list = s
            .get(key)
            .and_then(|a| a.as_array())
            .ok_or_else(|| bad(path, format!("longrope needs rope_scaling.{key}")))?;
        list.iter()
            .map(|x| x.as_f64().map(|x| x as f32))
            .collect::<Option<Vec<f32>>>()
            .ok_or_else(|| bad(path, format!("rope_scaling.{key} holds a value that is not a number")))
    };
    let original_max =
        s.get("original_max_position_embeddings")
            .and_then(|x| x.as_u64())
            .ok_or_else(|| bad(path, "longrope needs rope_scaling.original_max_position_embeddings"))? as usize;
    if original_max < 2 {
        return Err(bad(
            path,
            "rope_scaling.original_max_position_embeddings must be at least 2",
        ));
    }
    let scale = context as f64 / original_max as f64;
    let attn_factor = match s.get("attention_factor").and_then(|x| x.as_f64()) {
        Some(f) => f,
        None if scale <= 1.0 => 1.0,
        None => (1.0 + scale.ln() / (original_max as f64).ln()).sqrt(),
    };
    Ok(LongRope {
        short: factors("short_factor")?,
        long: factors("long_factor")?,
        original_max,
        attn_factor: attn_factor as f32,
        fixed_ctx: None,
    })
}
