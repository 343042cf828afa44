//! Embeds every file under shaders/ into the binary as a table (path, source), so adding a shader needs no edit.

use std::{env, fs, path::Path};

fn collect(dir: &Path, root: &Path, out: &mut Vec<String>) {
    let mut entries: Vec<_> = fs::read_dir(dir).expect("read shaders/").flatten().collect();
    entries.sort_by_key(|e| e.path());
    for e in entries {
        let p = e.path();
        if p.is_dir() {
            collect(&p, root, out);
        } else if p.extension().is_some_and(|x| x == "wgsl") {
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
            out.push(rel);
        }
    }
}

fn main() {
    let root = Path::new(&env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR")).join("shaders");
    println!("cargo:rerun-if-changed=shaders");
    let mut files = Vec::new();
    collect(&root, &root, &mut files);
    let mut code = String::from("/// (path under shaders/, source) for every embedded shader file.\npub static SHADER_FILES: &[(&str, &str)] = &[\n");
    for f in &files {
        println!("cargo:rerun-if-changed=shaders/{f}");
        code.push_str(&format!(
            "    ({f:?}, include_str!(concat!(env!(\"CARGO_MANIFEST_DIR\"), \"/shaders/{f}\"))),\n"
        ));
    }
    code.push_str("];\n");
    let out = Path::new(&env::var("OUT_DIR").unwrap()).join("shader_files.rs");
    fs::write(out, code).expect("write shader table");
}
