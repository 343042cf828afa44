//! GGUF reader/writer and ggml block formats: round trips, hand-computed blocks, and every malformed-file case.

mod common;

use common::rng::Rng;
use shaderlm::loader::gguf::{GgufFile, TensorInfo, Value, ValueType, DEFAULT_ALIGNMENT};
use shaderlm::loader::gguf_write::{put_header, put_kv, put_tensor_info, GgufWriter};
use shaderlm::quant::{self, bf16_to_f32, f16_to_f32, q4_0, q4_1, q8_0, GgmlType};
use shaderlm::Error;
use std::path::PathBuf;

fn tmp(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("gguf-{}-{name}", std::process::id()))
}

/// The message of an error that must be `Error::File` naming `name`.
fn file_err(r: shaderlm::Result<GgufFile>, name: &str) -> String {
    match r {
        Ok(f) => panic!("{name}: expected an error, the file opened: {f:?}"),
        Err(e @ Error::File { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(name), "error does not name the file {name}: {msg}");
            msg
        }
        Err(e) => panic!("{name}: expected Error::File, got {e:?}"),
    }
}

/// Asserts that `bytes` fails to parse, with a message containing `needle`.
fn rejects(case: &str, bytes: Vec<u8>, needle: &str) {
    let name = format!("{case}.gguf");
    let msg = file_err(GgufFile::from_bytes(&name, bytes), &name);
    assert!(msg.contains(needle), "{case}: expected {needle:?} in: {msg}");
}

fn all_types_metadata() -> Vec<(&'static str, Value)> {
    let strs = |v: &[&str]| {
        Value::Array(
            ValueType::String,
            v.iter().map(|s| Value::String(s.to_string())).collect(),
        )
    };
    vec![
        ("general.architecture", Value::String("llama".into())),
        ("t.u8", Value::U8(250)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(65000)),
        ("t.i16", Value::I16(-32000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.f32", Value::F32(-1.5e-3)),
        ("t.bool_true", Value::Bool(true)),
        ("t.bool_false", Value::Bool(false)),
        ("t.string", Value::String("héllo, ✓ \"quoted\"\n".into())),
        ("t.empty_string", Value::String(String::new())),
        ("t.u64", Value::U64(u64::MAX)),
        ("t.i64", Value::I64(i64::MIN)),
        ("t.f64", Value::F64(std::f64::consts::PI)),
        ("t.str_array", strs(&["a", "", "ü", "<|im_end|>"])),
        (
            "t.f32_array",
            Value::Array(ValueType::F32, vec![Value::F32(0.5), Value::F32(-2.0)]),
        ),
        (
            "t.i32_array",
            Value::Array(ValueType::I32, vec![Value::I32(1), Value::I32(-3)]),
        ),
        ("t.empty_array", Value::Array(ValueType::U64, vec![])),
        (
            "t.nested",
            Value::Array(
                ValueType::Array,
                vec![
                    Value::Array(ValueType::U8, vec![Value::U8(1), Value::U8(2)]),
                    Value::Array(ValueType::Bool, vec![Value::Bool(true)]),
                    Value::Array(ValueType::String, vec![]),
                ],
            ),
        ),
    ]
}

#[test]
fn metadata_round_trip_every_type() {
    let mut w = GgufWriter::new();
    let kvs = all_types_metadata();
    for (k, v) in &kvs {
        w.add_metadata(*k, v.clone()).unwrap();
    }
    let path = tmp("metadata.gguf");
    w.write(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), DEFAULT_ALIGNMENT);
    assert!(f.tensors().is_empty());
    let read: Vec<(&str, &Value)> = f.metadata_entries().collect();
    assert_eq!(read.len(), kvs.len());
    for ((k, v), (rk, rv)) in kvs.iter().zip(&read) {
        assert_eq!(k, rk);
        assert_eq!(v, *rv, "{k}");
    }

    // Typed getters: integers convert when the value fits, otherwise the error names file, key and type.
    assert_eq!(f.architecture().unwrap(), "llama");
    assert_eq!(f.get_u32("t.u8").unwrap(), 250);
    assert_eq!(f.get_u32("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(f.get_i32("t.i8").unwrap(), -100);
    assert_eq!(f.get_u64("t.u64").unwrap(), u64::MAX);
    assert_eq!(f.get::<i64>("t.i64").unwrap(), i64::MIN);
    assert_eq!(f.get_f32("t.f32").unwrap(), -1.5e-3);
    assert_eq!(f.get::<f64>("t.f64").unwrap(), std::f64::consts::PI);
    assert!(f.get_bool("t.bool_true").unwrap());
    assert!(!f.get_bool("t.bool_false").unwrap());
    assert_eq!(f.get_str("t.string").unwrap(), "héllo, ✓ \"quoted\"\n");
    assert_eq!(f.get_str_array("t.str_array").unwrap(), ["a", "", "ü", "<|im_end|>"]);
    assert_eq!(f.get_f32_array("t.f32_array").unwrap(), [0.5, -2.0]);
    assert_eq!(f.get_i32_array("t.i32_array").unwrap(), [1, -3]);
    assert_eq!(f.get::<Vec<u64>>("t.empty_array").unwrap(), Vec::<u64>::new());
    assert_eq!(
        f.get::<Vec<Vec<u8>>>("t.nested").ok(),
        None,
        "mixed nested arrays are not all u8 arrays"
    );
    assert_eq!(f.get_opt::<u32>("t.missing").unwrap(), None);
    assert_eq!(f.get_opt::<u32>("t.u16").unwrap(), Some(65000));

    let name = path.file_name().unwrap().to_str().unwrap();
    for (key, needle) in [
        ("t.i8", "expected an integer in u32 range"),
        ("t.missing", "missing metadata key \"t.missing\""),
        ("t.string", "expected an integer in u32 range"),
        ("t.u64", "expected an integer in u32 range"),
    ] {
        let msg = f.get_u32(key).unwrap_err().to_string();
        assert!(msg.contains(name) && msg.contains(needle) && msg.contains(key), "{msg}");
    }
    let msg = f.get_str("t.u32").unwrap_err().to_string();
    assert!(msg.contains("\"t.u32\" is U32 4000000000, expected a string"), "{msg}");
    let msg = f.get_str_array("t.f32_array").unwrap_err().to_string();
    assert!(msg.contains("expected an array of strings"), "{msg}");
    std::fs::remove_file(path).ok();
}

#[test]
fn tensor_round_trip_every_type() {
    let mut rng = Rng::new(7);
    let types = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
    ];
    // Odd sizes so the data section needs padding between tensors: 3 rows of 96, 1 row of 32, a 2x2x1x64 4-D one.
    let shapes: [&[usize]; 3] = [&[3, 96], &[32], &[2, 2, 1, 64]];
    for align in [32u32, 64, 4096] {
        let mut w = GgufWriter::new();
        w.add_metadata("general.alignment", Value::U32(align)).unwrap();
        let mut expected = vec![];
        for ty in types {
            for (i, shape) in shapes.iter().enumerate() {
                let n: usize = shape.iter().product();
                let x = rng.normal(n);
                let name = format!("{ty}.{i}");
                w.add_tensor(&name, shape, ty, &x).unwrap();
                expected.push((name, shape.to_vec(), ty, x));
            }
        }
        let path = tmp(&format!("tensors-{align}.gguf"));
        w.write(&path).unwrap();
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.alignment(), align as u64);
        assert_eq!(f.data_offset() % align as u64, 0);
        assert_eq!(f.tensors().len(), expected.len());
        for ((name, shape, ty, x), info) in expected.iter().zip(f.tensors()) {
            assert_eq!(&info.name, name);
            assert_eq!(&info.shape(), shape);
            assert_eq!(
                info.dims,
                shape.iter().rev().copied().collect::<Vec<_>>(),
                "ggml order is reversed"
            );
            assert_eq!(info.ggml_type, *ty);
            assert_eq!(info.offset % align as u64, 0);
            assert_eq!(info.row_len(), *shape.last().unwrap());
            assert_eq!(info.n_rows() * info.row_len(), x.len());
            let bytes = f.tensor_data(info).unwrap();
            assert_eq!(
                bytes,
                quant::quantize(*ty, x).unwrap(),
                "{name}: bytes differ from the writer's"
            );
            let y = f.tensor_f32(name).unwrap();
            check_quantization_error(name, *ty, x, bytes, &y);
        }
        std::fs::remove_file(path).ok();
    }
}

/// Per-element bound on `|x - dequant(quant(x))|`, from each block's stored constants. Round-to-nearest is off by
/// at most half a step `|d|` (a whole step at Q4_0's clamped end); `d` and `m` are stored as f16 (relative error 2^-11) while the quants were chosen with
/// the exact f32 `d`, so each element can also be off by `|q| * |d| * 2^-11 + |m| * 2^-11` (|q| <= 16 for 4 bits,
/// <= 128 for Q8_0). Float types: f16/bf16 round to nearest, relative 2^-11 / 2^-8.
fn check_quantization_error(name: &str, ty: GgmlType, x: &[f32], bytes: &[u8], y: &[f32]) {
    assert_eq!(x.len(), y.len());
    let eps = 2f32.powi(-11);
    let bound = |i: usize| -> f32 {
        let h = |b: &[u8], at: usize| f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]])).abs();
        match ty {
            GgmlType::F32 => 0.0,
            GgmlType::F16 => x[i].abs() * eps,
            GgmlType::BF16 => x[i].abs() * 2f32.powi(-8),
            GgmlType::Q4_0 => {
                // ggml maps the largest magnitude to q = 0 (-8 d) and clamps the other end at q = 15 (+7 d), so a
                // value near +8 d on that side is off by up to a whole step.
                let b = &bytes[i / 32 * q4_0::BLOCK_BYTES..];
                let (j, k) = (i % 32 % 16, i % 32 / 16);
                let q = (b[q4_0::QS_OFFSET + j] >> (4 * k)) & 15;
                let d = h(b, q4_0::D_OFFSET);
                (if q == 15 { d } else { 0.5 * d }) + 16.0 * d * eps
            }
            GgmlType::Q4_1 => {
                let b = &bytes[i / 32 * q4_1::BLOCK_BYTES..];
                let (d, m) = (h(b, q4_1::D_OFFSET), h(b, q4_1::M_OFFSET));
                0.5 * d + 16.0 * d * eps + m * eps
            }
            GgmlType::Q8_0 => {
                let d = h(&bytes[i / 32 * q8_0::BLOCK_BYTES..], q8_0::D_OFFSET);
                0.5 * d + 128.0 * d * eps
            }
            _ => unreachable!(),
        }
    };
    for i in 0..x.len() {
        // 1e-6 absorbs the f32 rounding of `d * q + m` itself.
        let err = (x[i] - y[i]).abs();
        assert!(
            err <= bound(i) * 1.001 + 1e-6,
            "{name}[{i}]: {} -> {}, error {err} > {}",
            x[i],
            y[i],
            bound(i)
        );
    }
    // The bound must not be vacuous: 4-bit blocks of normal data have steps around 0.3 and errors up to ~0.15.
    if ty.is_quantized() {
        let max_err = x.iter().zip(y).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        let limit = if ty == GgmlType::Q8_0 { 0.02 } else { 0.3 };
        assert!(max_err < limit && max_err > 0.0, "{name}: max error {max_err}");
    }
}

fn f16(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}

#[test]
fn dequantize_hand_computed_blocks() {
    // Q4_0, d = 0.5: byte j = j | (15 - j) << 4, so weight j = (j - 8) / 2 and weight 16 + j = (7 - j) / 2.
    let mut b = f16(0.5).to_vec();
    b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let want: Vec<f32> = (0..16)
        .map(|j| (j as f32 - 8.0) * 0.5)
        .chain((0..16).map(|j| (7.0 - j as f32) * 0.5))
        .collect();
    assert_eq!(quant::dequantize(GgmlType::Q4_0, &b).unwrap(), want);
    assert_eq!(want[0], -4.0);
    assert_eq!(want[15], 3.5);
    assert_eq!(want[16], 3.5);
    assert_eq!(want[31], -4.0);

    // Q4_1, d = 0.25, m = -1: byte j = (j % 16) | 0xF0: weight j = j/4 - 1, weight 16 + j = 15/4 - 1 = 2.75.
    let mut b = [f16(0.25), f16(-1.0)].concat();
    b.extend((0..16u8).map(|j| j | 0xF0));
    let got = quant::dequantize(GgmlType::Q4_1, &b).unwrap();
    assert_eq!(&got[..4], [-1.0, -0.75, -0.5, -0.25]);
    assert_eq!(got[15], 2.75);
    assert!(got[16..].iter().all(|&v| v == 2.75));

    // Q8_0, d = 2: the quants are signed bytes, including the -128 quantization never produces.
    let qs: [i8; 32] = std::array::from_fn(|j| [-128, -1, 0, 1, 127][j % 5]);
    let mut b = f16(2.0).to_vec();
    b.extend(qs.iter().map(|&q| q as u8));
    let got = quant::dequantize(GgmlType::Q8_0, &b).unwrap();
    assert_eq!(&got[..5], [-256.0, -2.0, 0.0, 2.0, 254.0]);
    assert_eq!(got[31], -2.0, "31 % 5 = 1 -> q = -1");

    // Two blocks in a row: the second block's scale applies to weights 32..64 only.
    let mut two = [f16(1.0).to_vec(), vec![0x88; 16]].concat();
    two.extend([f16(-3.0).to_vec(), vec![0x9A; 16]].concat());
    let got = quant::dequantize(GgmlType::Q4_0, &two).unwrap();
    assert!(got[..32].iter().all(|&v| v == 0.0));
    assert!(
        got[32..48].iter().all(|&v| v == -6.0),
        "low nibble 0xA = 10 -> (10 - 8) * -3"
    );
    assert!(got[48..].iter().all(|&v| v == -3.0), "high nibble 9 -> (9 - 8) * -3");

    // F16 and BF16 bit patterns: one, minus two, the f16 maximum, the smallest f16 subnormal, infinity.
    for (bits, v) in [
        (0x3C00, 1.0),
        (0xC000, -2.0),
        (0x7BFF, 65504.0),
        (0x0001, 2f32.powi(-24)),
        (0x7C00, f32::INFINITY),
    ] {
        assert_eq!(f16_to_f32(bits), v);
    }
    for (bits, v) in [
        (0x3F80, 1.0),
        (0xC0A0, -5.0),
        (0x0001, f32::from_bits(0x0001_0000)),
        (0xFF80, f32::NEG_INFINITY),
    ] {
        assert_eq!(bf16_to_f32(bits), v);
    }
    let bytes = [0x80, 0x3F, 0xA0, 0xC0];
    assert_eq!(quant::dequantize(GgmlType::BF16, &bytes).unwrap(), [1.0, -5.0]);
    assert_eq!(
        quant::dequantize(GgmlType::F16, &bytes[..2]).unwrap(),
        [f16_to_f32(0x3F80)]
    );

    // Not a whole block, or an unsupported type: errors, not panics.
    assert!(quant::dequantize(GgmlType::Q4_0, &b[..17]).is_err());
    assert!(quant::dequantize(GgmlType::IQ3_S, &[0; 110]).is_err());
    assert!(quant::dequantize_into(GgmlType::Q8_0, &b, &mut [0.0; 31]).is_err());
}

#[test]
fn quantize_follows_ggml_reference_rules() {
    // Q4_0: x_j = j - 16. The largest magnitude is -16, so d = -16 / -8 = 2 and q = trunc(x / 2 + 8.5), clamped to
    // 15: j = 0 -> 0, 1 -> 1 (8.5 - 8 + 0.5 = 1.0), 2 -> 1, 3 -> 2, ..., 31 -> 16 -> 15.
    let x: Vec<f32> = (0..32).map(|j| j as f32 - 16.0).collect();
    let b = q4_0::quantize(&x).unwrap();
    assert_eq!(b[..2], f16(2.0));
    let q = |j: usize| if j < 16 { b[2 + j] & 15 } else { b[2 + j - 16] >> 4 };
    let want: Vec<u8> = (0..32)
        .map(|j| (((j as f32 - 16.0) / 2.0 + 8.5) as u8).min(15))
        .collect();
    assert_eq!((0..32).map(q).collect::<Vec<_>>(), want);
    assert_eq!([q(0), q(1), q(2), q(3), q(31)], [0, 1, 1, 2, 15]);
    // The sign of the largest magnitude is kept: max = +16 gives d = -2 (so +16 maps to q = 0).
    let neg: Vec<f32> = x.iter().map(|v| -v).collect();
    let b = q4_0::quantize(&neg).unwrap();
    assert_eq!(b[..2], f16(-2.0));
    assert_eq!(b[2] & 15, 0);

    // Q4_1: min -1, max 2 -> d = 0.2, m = -1; q = trunc((x + 1) / 0.2 + 0.5).
    let mut x = vec![0.5f32; 32];
    x[0] = -1.0;
    x[1] = 2.0;
    x[17] = 0.09; // (1.09 / 0.2) = 5.45 -> 5
    let b = q4_1::quantize(&x).unwrap();
    assert_eq!(b[..2], f16(0.2));
    assert_eq!(b[2..4], f16(-1.0));
    assert_eq!(
        [b[4] & 15, b[5] & 15, b[6] & 15, b[5] >> 4],
        [0, 15, 8, 5],
        "0.5 -> 7.5 + 0.5 -> 8"
    );

    // Q8_0: amax 127 -> d = 1; ties round away from zero as C's roundf.
    let mut x = vec![0.0f32; 32];
    x[0] = 127.0;
    x[1] = 2.5;
    x[2] = -2.5;
    x[3] = -127.0;
    x[4] = 0.49;
    let b = q8_0::quantize(&x).unwrap();
    assert_eq!(b[..2], f16(1.0));
    assert_eq!(
        b[2..7].iter().map(|&q| q as i8).collect::<Vec<_>>(),
        [127, 3, -3, -127, 0]
    );

    // All-zero and constant blocks: d = 0 (and id = 0), no division by zero.
    let z = [0f32; 32];
    assert_eq!(q4_0::quantize(&z).unwrap()[2..], [0x88; 16], "zero maps to q = 8");
    assert!(q8_0::quantize(&z).unwrap().iter().all(|&v| v == 0));
    let c = q4_1::quantize(&[3.0; 32]).unwrap();
    assert_eq!(c[..4], [f16(0.0), f16(3.0)].concat());
    assert_eq!(quant::dequantize(GgmlType::Q4_1, &c).unwrap(), [3.0; 32]);

    // Lengths that are not whole blocks are errors.
    assert!(q4_0::quantize(&[0.0; 33]).is_err());
    assert!(quant::quantize(GgmlType::IQ3_S, &[0.0; 256]).is_err());
}

#[test]
fn writer_rejects_bad_tensors() {
    let mut w = GgufWriter::new();
    assert!(
        w.add_tensor("a", &[2, 33], GgmlType::Q4_0, &[0.0; 66]).is_err(),
        "row not a whole block"
    );
    assert!(
        w.add_tensor("a", &[2, 32], GgmlType::Q4_0, &[0.0; 63]).is_err(),
        "value count"
    );
    assert!(
        w.add_tensor("a", &[1, 1, 1, 1, 32], GgmlType::F32, &[0.0; 32]).is_err(),
        "5 dims"
    );
    assert!(
        w.add_tensor("a", &[256], GgmlType::IQ3_S, &[0.0; 256]).is_err(),
        "unsupported type"
    );
    assert!(
        w.add_tensor_bytes("a", &[32], GgmlType::Q8_0, vec![0; 33]).is_err(),
        "byte count"
    );
    w.add_tensor("a", &[32], GgmlType::Q8_0, &[0.0; 32]).unwrap();
    assert!(
        w.add_tensor("a", &[32], GgmlType::F32, &[0.0; 32]).is_err(),
        "duplicate"
    );
    assert!(w.add_metadata("general.alignment", Value::U32(24)).is_err());
    assert!(w.add_metadata("general.alignment", Value::U64(32)).is_err());
    assert!(w
        .add_metadata("x", Value::Array(ValueType::U8, vec![Value::I8(1)]))
        .is_err());
}

/// One tensor info in a hand-built file: name, ggml dims, type id, offset.
type RawTensor<'a> = (&'a str, &'a [u64], u32, u64);

/// A file built item by item (no validation), with the data section padded to 32 and `data_len` zero bytes.
fn raw(version: u32, kvs: &[(&str, Value)], tensors: &[RawTensor], data_len: usize) -> Vec<u8> {
    let mut b = vec![];
    put_header(&mut b, version, tensors.len() as u64, kvs.len() as u64);
    for (k, v) in kvs {
        put_kv(&mut b, k, v);
    }
    for (name, dims, ty, offset) in tensors {
        put_tensor_info(&mut b, name, dims, *ty, *offset);
    }
    b.resize(b.len().next_multiple_of(32) + data_len, 0);
    b
}

fn arch() -> (&'static str, Value) {
    ("general.architecture", Value::String("llama".into()))
}

#[test]
fn raw_builder_makes_valid_files() {
    // The baseline the malformed cases below each break in one way.
    let f = GgufFile::from_bytes(
        "ok.gguf",
        raw(3, &[arch()], &[("a", &[32, 2], 8, 0), ("b", &[4], 0, 96)], 112),
    );
    let f = f.unwrap();
    assert_eq!(f.tensor("a").unwrap().n_bytes, 68);
    assert_eq!(f.tensor("b").unwrap().shape(), [4]);
    assert_eq!(f.version(), 3);
    let v2 = GgufFile::from_bytes("v2.gguf", raw(2, &[arch()], &[("a", &[4], 0, 0)], 16)).unwrap();
    assert_eq!(v2.version(), 2);
    assert_eq!(v2.tensor_f32("a").unwrap(), [0.0; 4]);
}

#[test]
fn malformed_files_are_errors_naming_the_file() {
    let ok = raw(3, &[arch()], &[("a", &[32, 2], 8, 0)], 68);
    let set = |mut b: Vec<u8>, at: usize, bytes: &[u8]| {
        b[at..at + bytes.len()].copy_from_slice(bytes);
        b
    };

    rejects("empty", vec![], "not a GGUF file");
    rejects("magic", set(ok.clone(), 0, b"GGML"), "not a GGUF file");
    rejects(
        "version1",
        set(ok.clone(), 4, &1u32.to_le_bytes()),
        "unsupported GGUF version 1",
    );
    rejects(
        "version4",
        set(ok.clone(), 4, &4u32.to_le_bytes()),
        "unsupported GGUF version 4",
    );
    rejects("big_endian", set(ok.clone(), 4, &3u32.to_be_bytes()), "big-endian");
    rejects(
        "cut_in_header",
        ok[..12].to_vec(),
        "truncated: the tensor count needs 8 bytes at offset 8",
    );
    rejects(
        "header_only",
        ok[..24].to_vec(),
        "the tensor count is 1, more than the 0 bytes left",
    );
    rejects(
        "tensor_count",
        set(ok.clone(), 8, &u64::MAX.to_le_bytes()),
        "the tensor count is 18446744073709551615",
    );
    rejects(
        "kv_count",
        set(ok.clone(), 16, &(1u64 << 40).to_le_bytes()),
        "the metadata count is",
    );
    rejects(
        "cut_in_value",
        ok[..66].to_vec(),
        "metadata value \"general.architecture\" is 5, more than the 2 bytes left",
    );
    // The first key's length field is at byte 24.
    rejects(
        "key_length",
        set(ok.clone(), 24, &u64::MAX.to_le_bytes()),
        "length of metadata key #0 is",
    );
    rejects(
        "key_length_plus_one",
        set(ok.clone(), 24, &(ok.len() as u64 - 31).to_le_bytes()),
        "more than the",
    );
    let mut bad_utf8 = ok.clone();
    bad_utf8[32] = 0xFF;
    rejects("key_utf8", bad_utf8, "not valid UTF-8");

    let one_kv = |k: &str, v: Value| raw(3, &[(k, v)], &[], 0);
    rejects(
        "value_type",
        set(one_kv("k", Value::U8(0)), 33, &13u32.to_le_bytes()),
        "unknown value type id 13",
    );
    rejects(
        "bool_byte",
        set(one_kv("k", Value::Bool(true)), 37, &[2]),
        "byte value 2",
    );
    let arr = one_kv("k", Value::Array(ValueType::U32, vec![Value::U32(1)]));
    rejects(
        "array_count",
        set(arr.clone(), 41, &(1u64 << 62).to_le_bytes()),
        "element count of metadata value",
    );
    rejects(
        "array_elem_type",
        set(arr, 37, &77u32.to_le_bytes()),
        "unknown element type id 77",
    );
    let mut deep = Value::Array(ValueType::U8, vec![]);
    for _ in 0..9 {
        deep = Value::Array(ValueType::Array, vec![deep]);
    }
    rejects("deep_array", one_kv("k", deep), "deeper than 8");
    let two = |a: (&str, Value), b: (&str, Value)| raw(3, &[a, b], &[], 0);
    rejects(
        "duplicate_key",
        two(("k", Value::U8(1)), ("k", Value::U8(2))),
        "\"k\" appears twice",
    );
    for (case, v, needle) in [
        ("align_zero", Value::U32(0), "general.alignment is U32 0"),
        ("align_odd", Value::U32(48), "power of two"),
        ("align_type", Value::U64(32), "general.alignment is U64"),
    ] {
        rejects(case, one_kv("general.alignment", v), needle);
    }

    let one = |dims: &[u64], ty: u32, offset: u64, data: usize| raw(3, &[arch()], &[("w", dims, ty, offset)], data);
    rejects(
        "unknown_type",
        one(&[32], 99, 0, 128),
        "tensor \"w\" has unknown ggml type id 99",
    );
    rejects(
        "removed_type",
        one(&[32], 4, 0, 128),
        "tensor \"w\" has unknown ggml type id 4",
    );
    rejects(
        "five_dims",
        one(&[1, 1, 1, 1, 1], 0, 0, 128),
        "tensor \"w\" has 5 dimensions",
    );
    rejects(
        "dims_overflow",
        one(&[1 << 32, 1 << 32], 0, 0, 128),
        "tensor \"w\": the element count overflows",
    );
    rejects(
        "bytes_overflow",
        one(&[1 << 62], 0, 0, 128),
        "tensor \"w\": the byte size overflows",
    );
    rejects(
        "partial_block",
        one(&[33, 2], 2, 0, 128),
        "row length 33 is not a multiple of the block size 32",
    );
    rejects(
        "misaligned",
        one(&[4], 0, 16, 128),
        "tensor \"w\" has offset 16, not a multiple of the alignment 32",
    );
    rejects(
        "past_end",
        one(&[32, 2], 8, 64, 68),
        "tensor \"w\" (68 bytes at data offset 64) runs past the end",
    );
    rejects("data_truncated", one(&[32, 2], 8, 0, 67), "runs past the end");
    rejects("huge_offset", one(&[4], 0, u64::MAX - 31, 16), "runs past the end");

    let pair = |b_off: u64, b_name: &str| raw(3, &[], &[("a", &[16], 0, 0), (b_name, &[16], 0, b_off)], 128);
    rejects(
        "overlap",
        pair(32, "b"),
        "tensors \"a\" (bytes 0..64) and \"b\" (from 32) overlap",
    );
    rejects("same_offset", pair(0, "b"), "overlap");
    rejects("duplicate_tensor", pair(64, "a"), "tensor name \"a\" appears twice");
    assert!(
        GgufFile::from_bytes("adjacent.gguf", pair(64, "b")).is_ok(),
        "touching is not overlapping"
    );
}

#[test]
fn every_truncation_is_an_error() {
    // Cutting a valid file anywhere before the end of its last tensor's data must give an error, never a panic.
    let mut w = GgufWriter::new();
    for (k, v) in all_types_metadata() {
        w.add_metadata(k, v).unwrap();
    }
    w.add_tensor("q", &[2, 32], GgmlType::Q4_1, &Rng::new(3).normal(64))
        .unwrap();
    w.add_tensor("f", &[3], GgmlType::F16, &[1.0, 2.0, 3.0]).unwrap();
    let bytes = w.to_bytes();
    let f = GgufFile::from_bytes("full.gguf", bytes.clone()).unwrap();
    let last = f.tensor("f").unwrap();
    let end = (f.data_offset() + last.offset) as usize + last.n_bytes;
    assert_eq!(f.tensor_f32("f").unwrap(), [1.0, 2.0, 3.0]);
    for cut in 0..end {
        let name = format!("cut{cut}.gguf");
        file_err(GgufFile::from_bytes(&name, bytes[..cut].to_vec()), &name);
    }
    assert!(
        GgufFile::from_bytes("exact.gguf", bytes[..end].to_vec()).is_ok(),
        "trailing padding is optional"
    );
}

#[test]
fn unsupported_types_open_but_refuse_use() {
    // An IQ3_S tensor (256-weight blocks of 110 bytes): the file opens, its layout is checked, using it is an error.
    let bytes = raw(3, &[arch()], &[("blk.0.ffn_down.weight", &[256, 2], 21, 0)], 220);
    let f = GgufFile::from_bytes("iq3s.gguf", bytes).unwrap();
    let info = f.tensor("blk.0.ffn_down.weight").unwrap();
    assert_eq!((info.ggml_type, info.n_bytes), (GgmlType::IQ3_S, 220));
    assert_eq!(f.tensor_data(info).unwrap().len(), 220);
    for e in [
        f.check_supported(info).unwrap_err(),
        f.tensor_f32(&info.name).unwrap_err(),
    ] {
        let msg = e.to_string();
        assert!(
            msg.contains("iq3s.gguf")
                && msg.contains("tensor \"blk.0.ffn_down.weight\" has type IQ3_S, not supported yet")
                && msg.contains("Q4_K, Q5_K, Q6_K"),
            "{msg}"
        );
    }
}

#[test]
fn lookups_of_missing_things_are_errors() {
    let path = tmp("lookups.gguf");
    std::fs::write(&path, raw(3, &[arch()], &[("a", &[4], 0, 0)], 16)).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let name = path.file_name().unwrap().to_str().unwrap();
    let msg = f.tensor_f32("nope").unwrap_err().to_string();
    assert!(msg.contains(name) && msg.contains("no tensor named \"nope\""), "{msg}");
    assert!(f.tensor("nope").is_none() && f.metadata("nope").is_none());
    // An info that does not belong to this file (same name, other offset) is refused rather than read.
    let foreign = TensorInfo {
        offset: 1 << 40,
        ..f.tensor("a").unwrap().clone()
    };
    let msg = f.tensor_data(&foreign).unwrap_err().to_string();
    assert!(msg.contains("not a tensor of this file"), "{msg}");

    // Opening: a missing file is an I/O error naming it; an empty or short file is a File error naming it.
    let missing = tmp("missing.gguf");
    let e = GgufFile::open(&missing).unwrap_err();
    assert!(
        matches!(e, Error::Io { .. }) && e.to_string().contains("missing.gguf"),
        "{e}"
    );
    std::fs::write(&path, b"").unwrap();
    file_err(GgufFile::open(&path), name);
    std::fs::write(&path, b"GGUF\x03\0\0\0").unwrap();
    let msg = file_err(GgufFile::open(&path), name);
    assert!(msg.contains("truncated"), "{msg}");
    std::fs::remove_file(path).ok();
}
