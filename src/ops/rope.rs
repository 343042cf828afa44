//! Rotary position embedding (RoPE) of `[n_tokens, n_heads, head_dim]` at positions `StepVars.pos + token`:
//! rotate-half (NeoX / HF Llama) or interleaved (GPT-J / GGML) pairs, partial rotation, linear position scaling,
//! per-frequency divisors (llama3, longrope) and an attention factor on cos and sin (longrope).

use crate::error::{Error, Result};
use crate::gpu::{Caps, DType, ShaderKey};
use crate::graph::check::{expect, Expected, HostIo};
use crate::graph::{grid, Bind, Cost, Dispatch, Kernel, Params, StepVars};
use crate::graph::{Graph, TensorId};

/// Which dims of a head form the rotated pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// NeoX / HF Llama: pairs `(j, j + rot_dim/2)`.
    RotateHalf,
    /// GPT-J / GGML "normal": pairs `(2j, 2j + 1)`.
    Interleaved,
}

/// How positions become angles: pair `j` of a token at position `p` turns by
/// `(p * freq_scale) * theta^(-2j / rot_dim) / factors[j]`, and cos/sin are multiplied by `attn_factor`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeConfig {
    pub style: RopeStyle,
    /// Frequency base (10000 for Llama 2, 500000 for Llama 3).
    pub theta: f32,
    /// Leading dims that rotate (even, at most head_dim); the rest pass through.
    pub rot_dim: usize,
    /// Linear position scaling (1 / the HF "linear" factor).
    pub freq_scale: f32,
    /// Per-frequency divisors, f32 `[rot_dim / 2]` (llama3 / longrope scaled frequencies).
    pub factors: Option<TensorId>,
    /// Multiplies cos and sin (longrope's attention scaling).
    pub attn_factor: f32,
}

impl RopeStyle {
    /// The shaders' `style` parameter (lib/rope_angle.wgsl).
    pub(crate) fn code(self) -> u32 {
        match self {
            RopeStyle::RotateHalf => 0,
            RopeStyle::Interleaved => 1,
        }
    }
}

impl RopeConfig {
    /// The shaders' `log2_theta` parameter.
    pub(crate) fn log2_theta(&self) -> f32 {
        (self.theta as f64).log2() as f32
    }

    /// Plain RoPE over `rot_dim` dims: no scaling, no factors.
    pub fn new(style: RopeStyle, theta: f32, rot_dim: usize) -> Self {
        RopeConfig {
            style,
            theta,
            rot_dim,
            freq_scale: 1.0,
            factors: None,
            attn_factor: 1.0,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct RopeParams {
    n_tokens: u32,
    n_heads: u32,
    head_dim: u32,
    rot_dim: u32,
    pos: u32,
    style: u32,
    log2_theta: f32,
    freq_scale: f32,
    attn_factor: f32,
    n_heads2: u32,
}

#[derive(Debug)]
pub struct Rope {
    /// [n_tokens, n_heads, head_dim]
    shape: [usize; 3],
    cfg: RopeConfig,
    /// Heads of a second tensor rotated in the same dispatch (keys beside queries), 0 for none.
    heads2: usize,
}

impl Rope {
    /// Invocations per token: one per rotated pair, one per pass-through dim.
    fn per_token(&self) -> usize {
        self.cfg.rot_dim / 2 + self.shape[2] - self.cfg.rot_dim
    }
}

fn key(factors: bool, pair: bool) -> ShaderKey {
    ShaderKey::new("rope").flag("FACTORS", factors).flag("PAIR", pair)
}

impl Kernel for Rope {
    fn name(&self) -> &'static str {
        "rope"
    }
    fn dispatches(&self, caps: &Caps) -> Vec<Dispatch> {
        // Node tensors: inputs (x, [x2], [factors]) then outputs (y, [y2]), which is the binding order.
        let n = 2 + usize::from(self.cfg.factors.is_some()) + 2 * usize::from(self.heads2 > 0);
        let bindings = (0..n).map(Bind::Tensor).collect();
        vec![Dispatch {
            shader: key(self.cfg.factors.is_some(), self.heads2 > 0),
            bindings,
            workgroups: grid(self.shape[0] * self.per_token(), 64, caps.max_workgroups_per_dim),
        }]
    }
    fn params(&self, _: usize, vars: &StepVars) -> Params {
        let [n_tokens, n_heads, head_dim] = self.shape;
        Params::of(&RopeParams {
            n_tokens: n_tokens as u32,
            n_heads: n_heads as u32,
            head_dim: head_dim as u32,
            rot_dim: self.cfg.rot_dim as u32,
            pos: vars.pos,
            style: self.cfg.style.code(),
            log2_theta: self.cfg.log2_theta(),
            freq_scale: self.cfg.freq_scale,
            attn_factor: self.cfg.attn_factor,
            n_heads2: self.heads2 as u32,
        })
    }
    fn cost(&self) -> Cost {
        let n = (self.shape[0] * (self.shape[1] + self.heads2) * self.shape[2]) as u64;
        let pairs = (self.shape[0] * self.cfg.rot_dim / 2) as u64;
        let factors = if self.cfg.factors.is_some() {
            2 * self.cfg.rot_dim as u64
        } else {
            0
        };
        Cost {
            bytes_read: 4 * n + factors,
            bytes_written: 4 * n,
            // 6 per rotated pair and head; ~20 per (token, pair) for the angle, its reduction, cos and sin.
            flops: 3 * (n / self.shape[2] as u64) * self.cfg.rot_dim as u64 + 20 * pairs,
        }
    }
    /// Node tensors: q, (k), (factors), then the rotated q, (k).
    fn reference(&self, io: &[HostIo], vars: &StepVars) -> Option<Result<Vec<Expected>>> {
        expect(|| {
            let xs = 1 + usize::from(self.heads2 > 0);
            let factors = match self.cfg.factors {
                Some(_) => Some(io[xs].f32()?),
                None => None,
            };
            let n_in = xs + usize::from(factors.is_some());
            let mut out = Vec::new();
            for (i, heads) in [self.shape[1], self.heads2][..xs].iter().enumerate() {
                let shape = [self.shape[0], *heads, self.shape[2]];
                let y = reference(&io[i].f32()?, shape, &self.cfg, factors.as_deref(), vars.pos);
                out.push(Expected::at(n_in + i, y));
            }
            Ok(out)
        })
    }
}

impl Graph {
    /// RoPE of `x` [n_tokens, n_heads, head_dim] (f32); token `t` is at position `StepVars.pos + t`.
    pub fn rope(&mut self, x: TensorId, cfg: RopeConfig) -> Result<TensorId> {
        let shape = self.rope_check(x, &cfg)?;
        let k = Rope { shape, cfg, heads2: 0 };
        let mut inputs = vec![x];
        inputs.extend(cfg.factors);
        Ok(self.add_node(k, &inputs, &[("rope", &shape, DType::F32)])?[0])
    }

    /// RoPE of queries `q` [n_tokens, n_heads, head_dim] and keys `k` [n_tokens, n_kv, head_dim] in one dispatch
    /// (the angles are shared); returns the rotated `(q, k)`.
    pub fn rope_pair(&mut self, q: TensorId, k: TensorId, cfg: RopeConfig) -> Result<(TensorId, TensorId)> {
        let qs = self.rope_check(q, &cfg)?;
        let ks = self.rope_check(k, &cfg)?;
        if ks[0] != qs[0] || ks[2] != qs[2] {
            return Err(Error::shape(
                "rope",
                format!("q {qs:?} and k {ks:?} must share tokens and head_dim"),
            ));
        }
        let kernel = Rope {
            shape: qs,
            heads2: ks[1],
            cfg,
        };
        let mut inputs = vec![q, k];
        inputs.extend(cfg.factors);
        let o = self.add_node(
            kernel,
            &inputs,
            &[("rope_q", &qs, DType::F32), ("rope_k", &ks, DType::F32)],
        )?;
        Ok((o[0], o[1]))
    }

    /// Shape `[n_tokens, n_heads, head_dim]` of a valid RoPE input under `cfg`.
    fn rope_check(&self, x: TensorId, cfg: &RopeConfig) -> Result<[usize; 3]> {
        let shape = self.shape(x).to_vec();
        let bad = |why: String| Error::shape("rope", format!("x {shape:?}, {cfg:?}: {why}"));
        let [n_tokens, n_heads, head_dim] = shape[..] else {
            return Err(bad("want x [n_tokens, n_heads, head_dim]".into()));
        };
        if n_tokens == 0 || n_heads == 0 || self.dtype(x) != DType::F32 {
            return Err(bad(format!("want a non-empty f32 tensor, got {:?}", self.dtype(x))));
        }
        self.rope_config_check(cfg, head_dim).map_err(bad)?;
        Ok([n_tokens, n_heads, head_dim])
    }

    /// Why `cfg` cannot rotate heads of `head_dim` dims (rope and rope_kv), if it cannot.
    pub(crate) fn rope_config_check(&self, cfg: &RopeConfig, head_dim: usize) -> std::result::Result<(), String> {
        if cfg.rot_dim < 2 || !cfg.rot_dim.is_multiple_of(2) || cfg.rot_dim > head_dim {
            return Err("rot_dim must be even, at least 2 and at most head_dim".into());
        }
        if !(cfg.theta.is_finite() && cfg.theta > 0.0 && cfg.freq_scale.is_finite() && cfg.attn_factor.is_finite()) {
            return Err("theta must be finite and positive; freq_scale and attn_factor finite".into());
        }
        if let Some(f) = cfg.factors {
            if self.shape(f) != [cfg.rot_dim / 2] || self.dtype(f) != DType::F32 {
                return Err(format!(
                    "factors must be f32 [rot_dim / 2], got {:?} {:?}",
                    self.shape(f),
                    self.dtype(f)
                ));
            }
        }
        Ok(())
    }
}

/// CPU reference. The angle is formed in f32 as HF does (inv_freq rounded once from f64, then
/// `((pos + t) * freq_scale) * inv_freq` in f32); cos, sin and the rotation are computed in f64.
pub fn reference(x: &[f32], shape: [usize; 3], cfg: &RopeConfig, factors: Option<&[f32]>, pos: u32) -> Vec<f32> {
    let [n_tokens, n_heads, head_dim] = shape;
    let half = cfg.rot_dim / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|j| {
            let f = (cfg.theta as f64).powf(-((2 * j) as f64) / cfg.rot_dim as f64) as f32;
            factors.map_or(f, |fs| f / fs[j])
        })
        .collect();
    let mut y = x.to_vec();
    for t in 0..n_tokens {
        let p = pos.wrapping_add(t as u32) as f32 * cfg.freq_scale;
        for (j, &inv) in inv_freq.iter().enumerate() {
            let a = (p * inv) as f64;
            let (s, c) = (a.sin() * cfg.attn_factor as f64, a.cos() * cfg.attn_factor as f64);
            let (i0, i1) = match cfg.style {
                RopeStyle::RotateHalf => (j, j + half),
                RopeStyle::Interleaved => (2 * j, 2 * j + 1),
            };
            for h in 0..n_heads {
                let b = (t * n_heads + h) * head_dim;
                let (x0, x1) = (x[b + i0] as f64, x[b + i1] as f64);
                y[b + i0] = (x0 * c - x1 * s) as f32;
                y[b + i1] = (x0 * s + x1 * c) as f32;
            }
        }
    }
    y
}

pub fn variants() -> Vec<ShaderKey> {
    vec![key(false, false), key(true, false), key(false, true), key(true, true)]
}
