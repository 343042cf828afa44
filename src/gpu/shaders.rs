//! Shader sources embedded from `shaders/`, and the small preprocessor that makes variants:
//! `#include "lib/x.wgsl"`, `#if NAME` / `#else` / `#endif`, and one `const NAME = value;` per definition;
//! `#include "lib/x.wgsl" as B` expands the file again under namespace B's definitions ([`ShaderKey::b`]), with
//! every name it declares at top level (and every definition) suffixed `_B`: one kernel, two weight formats.

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
            if let Some((inc, ns)) = inc.split_once(" as ") {
                if ns.trim() != "B" {
                    return Err(format!("{}: the only namespace is B, not {ns:?}", at()));
                }
                out.push_str(&namespace_b(key, inc.trim().trim_matches('"')).map_err(|e| format!("{}: {e}", at()))?);
                continue;
            }
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

/// `path` expanded under namespace B's definitions (with their consts and its own includes), every top-level name
/// and definition suffixed `_B`; member names (after a `.`) are left as they are.
fn namespace_b(key: &ShaderKey, path: &str) -> Result<String, String> {
    let sub = ShaderKey {
        name: key.name,
        defs: key.b.clone(),
        b: Vec::new(),
    };
    let body = file(path).ok_or_else(|| format!("no file shaders/{path}"))?;
    let mut text = String::new();
    for (name, value) in &sub.defs {
        text.push_str(&format!("const {name} = {value};\n"));
    }
    expand(&sub, body, path, &mut Vec::new(), &mut text)?;
    Ok(suffixed_b(&text))
}

/// `text` with every name it declares at top level suffixed `_B`, uses included (not member names after a `.`).
fn suffixed_b(text: &str) -> String {
    let names: std::collections::HashSet<String> = top_level_names(text).into_iter().collect();
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    let mut rest = text;
    while let Some(start) = rest.find(|c: char| c.is_ascii_alphabetic() || c == '_') {
        let (before, from) = rest.split_at(start);
        out.push_str(before);
        let len = from
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(from.len());
        let (word, after) = from.split_at(len);
        // Digits before a letter (a literal's suffix, 1u) are in `before` and end with a digit: not a name.
        let member = before.ends_with('.') || before.ends_with(|c: char| c.is_ascii_digit());
        out.push_str(word);
        if !member && names.contains(word) {
            out.push_str("_B");
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The names WGSL `text` declares at brace depth 0 (fn, const, override, struct, alias, var), comments skipped.
fn top_level_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut depth = 0usize;
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        if depth == 0 {
            names.extend(declared_name(code));
        }
        depth = (depth + code.matches('{').count()).saturating_sub(code.matches('}').count());
    }
    names
}

/// The name a declaration line declares: the word after its attributes' last `)` and the keyword (and a var's `<..>`).
fn declared_name(code: &str) -> Option<String> {
    let code = code.trim_start();
    let code = if code.starts_with('@') {
        &code[code.rfind(')')? + 1..]
    } else {
        code
    };
    let (kw, rest) = code.trim_start().split_once([' ', '<'])?;
    let rest = match kw {
        "fn" | "const" | "override" | "struct" | "alias" => rest,
        "var" if code.trim_start().starts_with("var<") => rest.split_once('>')?.1,
        "var" => rest,
        _ => return None,
    };
    let name: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
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
    fn namespace_b_suffixes_its_declarations_and_definitions() {
        let lib = "@group(0) @binding(W_AT + 1u) var<storage, read> wq: array<u32>;\nstruct S { a: u32 }\n\
            #if Q8\nfn f(v: S) -> u32 { return v.a * 2u + wq[WB]; }\n#else\nfn f(v: S) -> u32 { return v.a; }\n#endif\n";
        let key = ShaderKey::new("t")
            .def("Q8", "true")
            .with_b(&ShaderKey::new("t").def("W_AT", "4u").def("WB", "3u"));
        assert_eq!(top_level_names(lib), ["wq", "S", "f", "f"]);
        let b = suffixed_b(&run(lib, &ShaderKey::new("t")));
        let want = "@group(0) @binding(W_AT + 1u) var<storage, read> wq_B: array<u32>;\nstruct S_B { a: u32 }\n\
            fn f_B(v: S_B) -> u32 { return v.a; }\n";
        assert_eq!(b, want);
        assert!(namespace_b(&key, "no/such.wgsl").is_err());
        // Namespace B sees only its own definitions: Q8 is A's, so B takes the #else branch.
        let mut out = String::new();
        let src = "#include \"lib/half.wgsl\" as B\n";
        expand(&key, src, "t.wgsl", &mut Vec::new(), &mut out).unwrap();
        assert!(out.starts_with("const W_AT_B = 4u;\nconst WB_B = 3u;\n"), "{out}");
        assert!(
            out.contains("fn half_top4_B(v: vec4<u32>)") && !out.contains("half_top4("),
            "{out}"
        );
        let bad = "#include \"lib/half.wgsl\" as C\n";
        assert!(expand(&key, bad, "t.wgsl", &mut Vec::new(), &mut String::new()).is_err());
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
