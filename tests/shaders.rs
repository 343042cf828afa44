//! CPU-only portability check: every shader variant the ops can request is validated by naga and translated to
//! SPIR-V (Vulkan), MSL (Metal) and HLSL (DX12), so all three back ends are exercised on every test run.

use naga::back::{hlsl, msl, spv};
use naga::valid::Capabilities;
use shaderlm::gpu::{pipelines::reflect, shaders, ShaderKey};

/// Capabilities a variant may use: only what its flags ask for, so fallbacks never use f16 or subgroups.
/// `unpack2x16float` (f16 data in f32 math) is assumed everywhere: every native API and GLES 3 have it.
fn caps_for(key: &ShaderKey) -> Capabilities {
    let on = |n: &str| key.defs.iter().any(|(k, v)| *k == n && v != "false");
    let mut c = Capabilities::SHADER_FLOAT16_IN_FLOAT32;
    if on("F16") {
        c |= Capabilities::SHADER_FLOAT16;
    }
    if on("SUBGROUPS") {
        c |= Capabilities::SUBGROUP;
    }
    c
}

fn translate(key: &ShaderKey) -> Result<(), String> {
    let (module, info) = shaders::validate(key, caps_for(key)).map_err(|e| e.to_string())?;
    reflect(key, &module).map_err(|e| e.to_string())?;
    let entry = (naga::ShaderStage::Compute, "main".to_string());

    spv::write_vec(
        &module,
        &info,
        &spv::Options::default(),
        Some(&spv::PipelineOptions {
            shader_stage: naga::ShaderStage::Compute,
            entry_point: "main".into(),
        }),
    )
    .map_err(|e| format!("SPIR-V: {e}"))?;

    let msl_options = msl::Options {
        lang_version: (2, 4),
        fake_missing_bindings: true,
        ..Default::default()
    };
    let msl_pipeline = msl::PipelineOptions {
        entry_point: Some(entry.clone()),
        ..Default::default()
    };
    msl::write_string(&module, &info, &msl_options, &msl_pipeline).map_err(|e| format!("MSL: {e}"))?;

    let hlsl_options = hlsl::Options {
        shader_model: hlsl::ShaderModel::V6_2,
        fake_missing_bindings: true,
        ..Default::default()
    };
    let hlsl_pipeline = hlsl::PipelineOptions {
        entry_point: Some(entry),
    };
    let mut out = String::new();
    hlsl::Writer::new(&mut out, &hlsl_options, &hlsl_pipeline)
        .write(&module, &info, None)
        .map_err(|e| format!("HLSL: {e}"))?;
    Ok(())
}

#[test]
fn every_variant_validates_and_translates_to_spirv_msl_hlsl() {
    let variants = shaderlm::ops::all_variants();
    // Spread over the machine's threads (tens of thousands of variants; each translation is independent).
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = variants.len().div_ceil(threads).max(1);
    let failures: Vec<String> = std::thread::scope(|s| {
        let workers: Vec<_> = variants
            .chunks(chunk)
            .map(|keys| {
                s.spawn(move || {
                    keys.iter()
                        .filter_map(|key| translate(key).err().map(|e| format!("{key}: {e}")))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a translation thread panicked"))
            .collect()
    });
    println!("{} variants checked", variants.len());
    assert!(
        failures.is_empty(),
        "{} variants failed:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn every_op_shader_file_has_a_variant() {
    let variants = shaderlm::ops::all_variants();
    let missing: Vec<&str> = shaders::op_shaders()
        .filter(|name| !variants.iter().any(|k| k.name == *name))
        .collect();
    assert!(
        missing.is_empty(),
        "shaders without any variant in ops::all_variants(): {missing:?}"
    );
}

#[test]
fn every_op_shader_belongs_to_a_registered_op_and_every_op_has_one() {
    let names = shaderlm::ops::NAMES;
    // The longest registered name the stem is or starts with (`matmul_q_rows` is matmul_q's, not matmul's).
    let owner = |stem: &str| {
        names
            .iter()
            .filter(|op| stem == **op || stem.starts_with(&format!("{op}_")))
            .max_by_key(|op| op.len())
            .copied()
    };
    let stems: Vec<&str> = shaders::op_shaders().collect();
    let orphans: Vec<&&str> = stems.iter().filter(|s| owner(s).is_none()).collect();
    assert!(orphans.is_empty(), "shaders of no registered op: {orphans:?}");
    let without: Vec<&&str> = names
        .iter()
        .filter(|op| !stems.iter().any(|s| owner(s) == Some(**op)))
        .collect();
    assert!(without.is_empty(), "registered ops without a shader: {without:?}");
}

#[test]
fn preprocessor_handles_defs_includes_and_nesting() {
    // A broken variant must come back as an error naming the shader and variant, not a panic.
    let key = ShaderKey::new("no_such_shader").def("X", "1u");
    let err = shaders::render(&key).unwrap_err().to_string();
    assert!(err.contains("no_such_shader") && err.contains("X=1u"), "{err}");
    let add = shaders::render(&ShaderKey::new("add").def("N_MAX", "4u")).unwrap();
    assert!(add.starts_with("const N_MAX = 4u;\n"), "{add}");
}

#[test]
fn q2_k_and_q3_k_have_every_matmul_and_embedding_variant() {
    // The super formats' flags reach each kernel family (naga checks them with the rest above).
    let variants = shaderlm::ops::all_variants();
    for fmt in ["Q2K", "Q3K"] {
        for name in ["matmul_q_tiled", "matmul_q_tiled_mm", "matmul_q_rows", "embedding_q"] {
            let n = variants
                .iter()
                .filter(|k| k.name == name && k.defs.iter().any(|(d, _)| *d == fmt))
                .count();
            assert!(n > 0, "{name} has no {fmt} variant");
        }
    }
}
