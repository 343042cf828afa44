//! GPTQ's calibration pass: `model::reference`'s forward over the calibration tokens, a layer at a time, reading
//! its tensors through a hook that stores each one as the output will hold it and returns those values. Each
//! decoder linear layer is quantized there from the Hessian of the inputs it is about to multiply, in AutoGPTQ's
//! true-sequential order (q/k/v, then o, then gate/up, then down): later layers see the quantized layers' outputs,
//! so they compensate for the error already made.

use super::solve::InverseHessian;
use super::source::{ModelTensor, Role, Source};
use crate::error::{Error, Result};
use crate::model::config::MoeConfig;
use crate::model::reference::{Forward, Tensors, TokenFn};
use crate::model::{LlamaConfig, Names};

/// Stores one tensor (quantizing it, with GPTQ when an inverse Hessian is given) and returns its stored values.
pub type Store<'a> = dyn FnMut(ModelTensor, Vec<usize>, Vec<f32>, Option<&InverseHessian>) -> Result<Vec<f32>> + 'a;

/// `H = 2 X Xᵀ / T` of `x [t, k]` (f64, symmetric) as GPTQ's inverse Hessian factor.
fn inverse_hessian(x: &[f32], k: usize, damp: f64) -> Result<InverseHessian> {
    let t = x.len() / k;
    let mut h = vec![0f64; k * k];
    for row in x.chunks_exact(k) {
        for i in 0..k {
            let xi = row[i] as f64;
            if xi == 0.0 {
                continue;
            }
            for (hij, &xj) in h[i * k + i..(i + 1) * k].iter_mut().zip(&row[i..]) {
                *hij += xi * xj as f64;
            }
        }
    }
    let scale = 2.0 / t.max(1) as f64;
    for i in 0..k {
        for j in i..k {
            let v = h[i * k + j] * scale;
            h[i * k + j] = v;
            h[j * k + i] = v;
        }
    }
    InverseHessian::new(&h, k, damp)
}

/// The linear layers of a decoder layer that multiply the same inputs share one Hessian: q/k/v, o, gate/up, down.
fn input_site(role: Role) -> u8 {
    match role {
        Role::Q | Role::K | Role::V => 0,
        Role::O => 1,
        Role::Gate | Role::Up => 2,
        _ => 3,
    }
}

/// The forward's tensors: each read from the input in the output's convention and stored on first use.
struct Calibration<'a, 'b> {
    src: &'a Source,
    to: Names,
    damp: f64,
    present: Vec<ModelTensor>,
    store: &'a mut Store<'b>,
    /// The inverse Hessian of the inputs last seen, by (layer, input site).
    hessian: Option<((usize, u8), InverseHessian)>,
}

impl Calibration<'_, '_> {
    fn put(&mut self, t: ModelTensor, h: Option<&InverseHessian>) -> Result<Vec<f32>> {
        let (shape, v) = self.src.read(&t, self.to)?;
        (self.store)(t, shape, v, h)
    }
}

impl Tensors for Calibration<'_, '_> {
    fn get(&mut self, role: Role, layer: Option<usize>) -> Result<Option<Vec<f32>>> {
        let t = ModelTensor { role, layer };
        self.present.contains(&t).then(|| self.put(t, None)).transpose()
    }

    fn linear(&mut self, layer: usize, role: Role, x: &[f32], k: usize) -> Result<Vec<f32>> {
        let t = ModelTensor {
            role,
            layer: Some(layer),
        };
        if !self.present.contains(&t) {
            return self.require(role, Some(layer));
        }
        let site = (layer, input_site(role));
        let h = match self.hessian.take() {
            Some((at, h)) if at == site => h,
            _ => inverse_hessian(x, k, self.damp)?,
        };
        let stored = self.put(t, Some(&h));
        self.hessian = Some((site, h));
        stored
    }

    fn experts(&mut self, _: &LlamaConfig, _: &MoeConfig, _: usize) -> Result<TokenFn> {
        Err(Error::Invalid("quantize does not calibrate BlockFFN experts".into()))
    }
}

/// Run the model over `tokens`, storing every tensor through `store`: decoder linear layers with their inputs'
/// Hessians, everything else by round-to-nearest. Weights come in the `to` convention, and so does the RoPE the
/// forward applies to them.
pub fn run(
    src: &Source,
    to: Names,
    tokens: &[u32],
    damp: f64,
    log: &mut dyn FnMut(&str),
    store: &mut Store<'_>,
) -> Result<()> {
    let cfg = LlamaConfig {
        rope_style: src.rope_style(to),
        ..src.cfg.clone()
    };
    if let Some(bad) = tokens.iter().find(|&&t| t as usize >= cfg.vocab) {
        return Err(Error::Invalid(format!(
            "calibration token {bad} is outside the vocabulary of {}",
            cfg.vocab
        )));
    }
    let mut cal = Calibration {
        src,
        to,
        damp,
        present: src.tensors(),
        store,
        hessian: None,
    };
    // The session is as long as the text (longrope picks its factors by it, as the calibration always has).
    let mut forward = Forward::new(&mut cal, &cfg, tokens, tokens.len(), &[tokens.len()])?;
    for i in 0..cfg.n_layers {
        forward.layer(&mut cal, i)?;
        log(&format!("GPTQ: layer {}/{} done", i + 1, cfg.n_layers));
    }
    for role in [Role::FinalNorm, Role::Head] {
        cal.get(role, None)?;
    }
    Ok(())
}
