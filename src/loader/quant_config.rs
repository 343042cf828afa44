//! The quantization a Hugging Face checkpoint declares: `quantization_config` in config.json, or the separate
//! file older tools wrote beside it (AutoGPTQ's `quantize_config.json`, AutoAWQ's `quant_config.json`), read into
//! a [`Scheme`] for the GPTQ / AWQ loader.
//!
//! Keys (with the synonyms the tools use): `quant_method` (gptq, awq; absent: AWQ when AWQ's own keys are there,
//! else GPTQ), `bits` / `w_bit`, `group_size` / `q_group_size` (-1: one group), `desc_act`, `sym`,
//! `checkpoint_format` / `format` (GPTQ: "gptq" = v1, zeros stored minus one, the default; "gptq_v2"),
//! `version` / `format` (AWQ: "gemm"), `zero_point` (AWQ), `pack_dtype` (int32 only), `dynamic` (per-module
//! overrides: only `-:` exclusions, whose modules are stored unquantized anyway).

use crate::error::{Error, Result};
use crate::quant::gptq::{Method, Scheme};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A checkpoint's quantization.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantConfig {
    pub scheme: Scheme,
    /// GPTQ act-order: `g_idx` is not `k / group_size`, so every layer must carry it.
    pub desc_act: bool,
    /// Symmetric quantization (informational: the repack looks at the zeros themselves).
    pub sym: bool,
    /// The file that declared it.
    pub path: PathBuf,
}

fn bad(path: &Path, message: impl Into<String>) -> Error {
    Error::File {
        path: path.into(),
        message: message.into(),
    }
}

use super::read_json;

impl QuantConfig {
    /// The quantization of the model in `dir`, or `None` for an unquantized checkpoint. config.json's
    /// `quantization_config` wins over the separate files.
    pub fn from_dir(dir: &Path) -> Result<Option<QuantConfig>> {
        let config = dir.join("config.json");
        if config.is_file() {
            if let Some(q) = read_json(&config)?.get("quantization_config").filter(|q| !q.is_null()) {
                return QuantConfig::from_json(q, &config).map(Some);
            }
        }
        for name in ["quantize_config.json", "quant_config.json"] {
            let path = dir.join(name);
            if path.is_file() {
                return QuantConfig::from_json(&read_json(&path)?, &path).map(Some);
            }
        }
        Ok(None)
    }

    /// From one quantization object; `path` is the file it came from (for errors).
    pub fn from_json(v: &Value, path: &Path) -> Result<QuantConfig> {
        if !v.is_object() {
            return Err(bad(path, "the quantization config is not a JSON object"));
        }
        let get = |keys: &[&str]| keys.iter().find_map(|k| v.get(*k).filter(|x| !x.is_null()));
        let int = |keys: &[&str], default: i64| -> Result<i64> {
            match get(keys) {
                None => Ok(default),
                Some(x) => x
                    .as_i64()
                    .ok_or_else(|| bad(path, format!("quantization {} is {x}, not an integer", keys[0]))),
            }
        };
        let flag = |keys: &[&str], default: bool| -> Result<bool> {
            match get(keys) {
                None => Ok(default),
                Some(x) => x
                    .as_bool()
                    .ok_or_else(|| bad(path, format!("quantization {} is {x}, not true or false", keys[0]))),
            }
        };
        let text = |keys: &[&str]| get(keys).and_then(|x| x.as_str()).map(str::to_ascii_lowercase);
        let awq_keys = ["w_bit", "q_group_size", "zero_point", "version"]
            .iter()
            .any(|k| v.get(*k).is_some());
        let method = match text(&["quant_method"]).as_deref() {
            Some("gptq") => Method::Gptq,
            Some("awq") => Method::Awq,
            None if awq_keys => Method::Awq,
            None => Method::Gptq,
            Some(other) => {
                return Err(bad(
                    path,
                    format!("quant_method {other:?} is not supported (shaderlm reads gptq and awq checkpoints)"),
                ))
            }
        };
        let bits = int(&["bits", "w_bit"], 4)?;
        let group_size = match int(&["group_size", "q_group_size"], 128)? {
            -1 => None,
            g if g > 0 => Some(g as usize),
            g => {
                return Err(bad(
                    path,
                    format!("quantization group_size {g}: want -1 or a positive size"),
                ))
            }
        };
        let mut scheme = Scheme {
            method,
            bits: u32::try_from(bits).unwrap_or(0),
            group_size,
            zeros_minus_one: false,
        };
        match method {
            Method::Gptq => {
                let format = text(&["checkpoint_format", "format"]);
                scheme.zeros_minus_one = match format.as_deref() {
                    None | Some("gptq") => true,
                    Some("gptq_v2") => false,
                    Some(other) => {
                        return Err(bad(
                            path,
                            format!("GPTQ checkpoint format {other:?} is not supported (gptq and gptq_v2 are)"),
                        ))
                    }
                };
                if flag(&["is_marlin_format"], false)? {
                    return Err(bad(path, "GPTQ Marlin-format checkpoints are not supported"));
                }
            }
            Method::Awq => {
                match text(&["version", "format"]).as_deref() {
                    None | Some("gemm") => {}
                    Some(other) => {
                        return Err(bad(
                            path,
                            format!("AWQ version {other:?} is not supported (the GEMM layout is)"),
                        ))
                    }
                }
                if !flag(&["zero_point"], true)? {
                    return Err(bad(
                        path,
                        "AWQ without zero points (zero_point: false) is not supported",
                    ));
                }
            }
        }
        if let Some(p) = text(&["pack_dtype"]) {
            if p.trim_start_matches("torch.") != "int32" {
                return Err(bad(path, format!("pack_dtype {p:?}: only int32 packing is supported")));
            }
        }
        if let Some(d) = get(&["dynamic"]).and_then(|d| d.as_object()) {
            if let Some(k) = d.keys().find(|k| !k.starts_with("-:")) {
                return Err(bad(
                    path,
                    format!("per-module quantization overrides (dynamic {k:?}) are not supported"),
                ));
            }
        }
        scheme.check().map_err(|e| bad(path, e.to_string()))?;
        Ok(QuantConfig {
            scheme,
            desc_act: method == Method::Gptq && flag(&["desc_act"], false)?,
            sym: flag(&["sym"], true)?,
            path: path.into(),
        })
    }

    /// e.g. "GPTQ 4-bit g128 act-order" (for `shaderlm info` and the loaded model's format).
    pub fn describe(&self) -> String {
        let s = &self.scheme;
        let mut out = format!(
            "{} {}-bit {}",
            if s.method == Method::Gptq { "GPTQ" } else { "AWQ" },
            s.bits,
            s.group_size.map_or("per-channel".to_string(), |g| format!("g{g}"))
        );
        if self.desc_act {
            out.push_str(" act-order");
        }
        if s.method == Method::Gptq && !s.zeros_minus_one {
            out.push_str(" v2");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<QuantConfig> {
        QuantConfig::from_json(&v, Path::new("config.json"))
    }

    #[test]
    fn gptq_and_awq_configs_parse_with_their_defaults_and_synonyms() {
        let q = parse(json!({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": true})).unwrap();
        assert_eq!(q.scheme, Scheme::gptq(4, Some(128)));
        assert!(q.desc_act && q.sym);
        assert_eq!(q.describe(), "GPTQ 4-bit g128 act-order");
        let v2 = parse(json!({"bits": 8, "group_size": -1, "sym": false, "checkpoint_format": "gptq_v2"})).unwrap();
        assert_eq!(
            (v2.scheme.bits, v2.scheme.group_size, v2.scheme.zeros_minus_one),
            (8, None, false)
        );
        let awq = parse(json!({"w_bit": 4, "q_group_size": 64, "zero_point": true, "version": "GEMM"})).unwrap();
        assert_eq!(awq.scheme, Scheme::awq(Some(64)));
    }

    #[test]
    fn unsupported_gptq_and_awq_configs_are_errors_naming_the_file() {
        for (v, what) in [
            (json!({"quant_method": "gptq", "bits": 3, "group_size": 128}), "bits 3"),
            (
                json!({"quant_method": "gptq", "bits": 4, "group_size": 48}),
                "group size 48",
            ),
            (json!({"quant_method": "gptq", "checkpoint_format": "marlin"}), "marlin"),
            (json!({"quant_method": "awq", "version": "gemv"}), "gemv"),
            (json!({"quant_method": "awq", "zero_point": false}), "zero_point"),
            (json!({"quant_method": "bitsandbytes"}), "bitsandbytes"),
            (json!({"quant_method": "gptq", "pack_dtype": "int16"}), "int16"),
            (
                json!({"quant_method": "gptq", "dynamic": {"+:.*down.*": {"bits": 8}}}),
                "dynamic",
            ),
        ] {
            let e = parse(v).unwrap_err().to_string();
            assert!(e.contains("config.json") && e.contains(what), "{e}");
        }
        assert!(parse(json!({"quant_method": "gptq", "dynamic": {"-:.*lm_head": {}}})).is_ok());
    }
}
