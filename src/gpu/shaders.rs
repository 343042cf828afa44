//! Shader sources embedded from `shaders/`, and the small preprocessor that makes variants:
//! `#include "lib/x.wgsl"`, `#if NAME` / `#else` / `#endif`, and one `const NAME = value;` per definition.

use super::pipelines::ShaderKey;
use crate::error::{Error, Result};

include!(concat!(env!("OUT_DIR"), "/shader_files.rs"));

/// Source of `shaders/<path>`.
pub fn file(path: &str) -> Option<&'static str> {
    SHADER_FILES.iter().find(|(p, _)| *p == path).map(|(_, s)| *s)
}

/// Names of the op shaders (top-level files, without `.wgsl`); `lib/` holds includes only.
pub fn op_shaders() -> impl Iterator<Item = &'static str> {
    SHADER_FILES
        .iter()
        .filter(|(p, _)| !p.contains('/'))
        .map(|(p, _)| p.trim_end_matches(".wgsl"))
}

fn truthy(key: &ShaderKey, name: &str) -> bool {
    key.defs
        .iter()
        .any(|(n, v)| *n == name && !matches!(v.as_str(), "false" | "0" | "0u"))
}

/// The full WGSL text of a shader variant.
pub fn render(key: &ShaderKey) -> Result<String> {
    let err = |message: String| Error::Shader {
        shader: key.name.to_string(),
        variant: key.variant(),
        message,
    };
    let path = format!("{}.wgsl", key.name);
    let src = file(&path).ok_or_else(|| err(format!("no file shaders/{path}")))?;
    let mut out = String::new();
    if truthy(key, "F16") {
        out.push_str("enable f16;\n");
    }
    for (name, value) in &key.defs {
        out.push_str(&format!("const {name} = {value};\n"));
    }
    let mut included = Vec::new();
    expand(key, src, &path, &mut included, &mut out).map_err(err)?;
    Ok(out)
}

fn expand(key: &ShaderKey, src: &str, path: &str, included: &mut Vec<String>, out: &mut String) -> Result<(), String> {
    // Stack of (this branch active, some branch already taken) for nested #if.
    let mut stack: Vec<(bool, bool)> = Vec::new();
    let active = |stack: &[(bool, bool)]| stack.iter().all(|s| s.0);
    for (n, line) in src.lines().enumerate() {
        let t = line.trim();
        let at = || format!("{path}:{}", n + 1);
        if let Some(name) = t.strip_prefix("#if ") {
            let parent = active(&stack);
            let on = parent && truthy(key, name.trim());
            stack.push((on, on));
        } else if t == "#else" {
            let parent = active(&stack[..stack.len().saturating_sub(1)]);
            let top = stack.last_mut().ok_or_else(|| format!("{}: #else without #if", at()))?;
            top.0 = parent && !top.1;
        } else if t == "#endif" {
            stack.pop().ok_or_else(|| format!("{}: #endif without #if", at()))?;
        } else if !active(&stack) {
            continue;
        } else if let Some(inc) = t.strip_prefix("#include ") {
            let inc = inc.trim().trim_matches('"');
            if !included.iter().any(|i| i == inc) {
                included.push(inc.to_string());
                let body = file(inc).ok_or_else(|| format!("{}: no file shaders/{inc}", at()))?;
                expand(key, body, inc, included, out)?;
            }
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    if !stack.is_empty() {
        return Err(format!("{path}: #if without #endif"));
    }
    Ok(())
}

/// Parse and validate a variant with naga, as the portability test and the pipeline cache both do.
pub fn validate(key: &ShaderKey, caps: naga::valid::Capabilities) -> Result<(naga::Module, naga::valid::ModuleInfo)> {
    let src = render(key)?;
    let err = |message: String| Error::Shader {
        shader: key.name.to_string(),
        variant: key.variant(),
        message,
    };
    let module = naga::front::wgsl::parse_str(&src).map_err(|e| err(e.emit_to_string(&src)))?;
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
        .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
        .subgroup_operations(naga::valid::SubgroupOperationSet::all())
        .validate(&module)
        .map_err(|e| err(e.emit_to_string(&src)))?;
    Ok((module, info))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(src: &str, key: &ShaderKey) -> String {
        let mut out = String::new();
        expand(key, src, "test.wgsl", &mut Vec::new(), &mut out).unwrap();
        out
    }

    #[test]
    fn if_else_endif_nest_and_follow_defs() {
        let src = "a\n#if X\nb\n#if Y\nc\n#else\nd\n#endif\n#else\ne\n#endif\nf\n";
        assert_eq!(run(src, &ShaderKey::new("t")), "a\ne\nf\n");
        assert_eq!(run(src, &ShaderKey::new("t").def("X", "true")), "a\nb\nd\nf\n");
        assert_eq!(
            run(src, &ShaderKey::new("t").def("X", "1u").def("Y", "true")),
            "a\nb\nc\nf\n"
        );
        assert_eq!(
            run(src, &ShaderKey::new("t").def("X", "false").def("Y", "true")),
            "a\ne\nf\n"
        );
    }

    #[test]
    fn unbalanced_directives_are_errors() {
        let key = ShaderKey::new("t");
        for src in ["#if X\na\n", "#endif\n", "#else\n"] {
            assert!(
                expand(&key, src, "t.wgsl", &mut Vec::new(), &mut String::new()).is_err(),
                "{src:?}"
            );
        }
    }
}
