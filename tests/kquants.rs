//! GGUF k-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and the other block types shaderlm reads (Q5_0, Q5_1, IQ4_NL, IQ4_XS): tensors
//! through a GGUF file, hand-computed blocks, the bound on the repacking of super-blocks (IQ4_XS too) into the
//! 32-weight blocks the GPU kernels read (each block constant is ggml's, rounded once to f16), bad input, and a tiny Llama in a Q4_K_M-like mix (Q6_K output and ffn_down, Q4_K elsewhere) through the GPU model
//! against the CPU reference forward.

mod common;

use common::gpu::{gpu, nmse};
use common::steps::{prefill_then_decode, run_steps, LOGITS_AND_ARGMAX};

use common::tiny::{write_gguf_typed, Tiny};
use shaderlm::loader::gguf::{GgufFile, Value};
use shaderlm::loader::gguf_write::{put_header, put_kv, put_tensor_info, GgufWriter};
use shaderlm::model::weights::{HostData, HostTensor, WeightSource};
use shaderlm::model::{reference, Llama, LlamaConfig, Names};
use shaderlm::quant::pack::{self, blocks32, dequantize_packed, Layout};
use shaderlm::quant::{self, f16_to_f32, iq4_xs, q4_k, q6_k, GgmlType};

const K_QUANTS: [GgmlType; 3] = [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];

/// Roughly normal values (sum of 4 SplitMix64 uniforms, centred) times `scale`.
fn normal(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut s = seed;
    let mut u = || {
        s = s.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..n).map(|_| ((u() + u() + u() + u()) - 2.0) * scale).collect()
}

fn f16(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}

fn rms(v: impl Iterator<Item = f32>) -> f64 {
    let (mut s, mut n) = (0f64, 0usize);
    for x in v {
        s += (x as f64).powi(2);
        n += 1;
    }
    (s / n as f64).sqrt()
}

#[test]
fn k_quant_tensors_round_trip_through_a_gguf_file() {
    // Shapes: rows of two super-blocks, one super-block alone, a 3-D tensor of 768-weight rows.
    let shapes: [&[usize]; 3] = [&[3, 512], &[256], &[2, 1, 768]];
    let mut w = GgufWriter::new();
    let mut expected = vec![];
    for (t, ty) in K_QUANTS.into_iter().enumerate() {
        for (i, shape) in shapes.iter().enumerate() {
            let x = normal((t * 10 + i) as u64, shape.iter().product(), 0.05);
            let name = format!("{ty}.{i}");
            w.add_tensor(&name, shape, ty, &x).unwrap();
            expected.push((name, ty, x));
        }
    }
    let f = GgufFile::from_bytes("kquants.gguf", w.to_bytes()).unwrap();
    for (name, ty, x) in &expected {
        let info = f.tensor(name).unwrap();
        assert_eq!(info.ggml_type, *ty);
        assert_eq!(info.n_bytes, x.len() / 256 * ty.type_size(), "{name}");
        let bytes = f.tensor_data(info).unwrap();
        assert_eq!(
            bytes,
            quant::quantize(*ty, x).unwrap(),
            "{name}: bytes differ from the writer's"
        );
        let y = f.tensor_f32(name).unwrap();
        // Quantization quality of the RTN quantizers on normal data, relative RMSE: about step / sqrt(12) of the
        // sub-block step (Q4_K: range ~4.1 sigma over 15 steps -> 0.08; Q5_K over 31 -> 0.04; Q6_K: max ~2 sigma
        // per 16 over 32 steps -> 0.02). A wrong nibble order or scale gives 0.5 or more.
        let err = rms(x.iter().zip(&y).map(|(a, b)| a - b)) / rms(x.iter().copied());
        let bound = match ty {
            GgmlType::Q4_K => 0.1,
            GgmlType::Q5_K => 0.05,
            _ => 0.03,
        };
        println!("{name}: relative RMSE {err:.4} (bound {bound})");
        assert!(err < bound && err > 0.0, "{name}: relative RMSE {err}");
    }
}

#[test]
fn hand_computed_super_blocks_through_a_gguf_file() {
    // Q4_K: d = 0.5, dmin = 0.25; 6-bit scales sc = [1, 2, 3, 4, 1, 3, 5, 23] and mins m = [5, 6, 7, 8, 2, 4, 6, 56]
    // packed by hand (sc[7] = 7 | 1 << 4 from bytes 11 and 3; m[7] = 8 | 3 << 4 from bytes 11 and 7); qs[i] = i.
    let mut q4 = [f16(0.5), f16(0.25)].concat();
    q4.extend([1, 2, 3, 0x44, 5, 6, 7, 0xC8, 0x21, 0x43, 0x65, 0x87]);
    q4.extend(0..128u8);
    // Q6_K: ql all 0xFF (both nibbles 15), qh zero but qh[37] = 0xFF (weights 133, 165, 197, 229 get high bits 3),
    // scales 1 but sc[3] = -2, d = 0.5.
    let mut q6 = vec![0xFFu8; 128];
    q6.extend([0u8; 64]);
    q6[128 + 37] = 0xFF;
    q6.extend([1u8; 16]);
    q6[192 + 3] = (-2i8) as u8;
    q6.extend(f16(0.5));
    let mut w = GgufWriter::new();
    w.add_tensor_bytes("q4", &[256], GgmlType::Q4_K, q4.clone()).unwrap();
    w.add_tensor_bytes("q6", &[256], GgmlType::Q6_K, q6.clone()).unwrap();
    let f = GgufFile::from_bytes("hand.gguf", w.to_bytes()).unwrap();
    let y = f.tensor_f32("q4").unwrap();
    // weight: sub-block s = w / 32, byte 32 (s / 2) + w % 32, low nibble for even s: 0.5 sc[s] q - 0.25 m[s].
    assert_eq!(
        [y[0], y[31], y[32], y[69], y[138], y[170], y[255]],
        [-1.25, 6.25, -1.5, 5.75, 4.5, 5.0, 66.5]
    );
    let y = f.tensor_f32("q6").unwrap();
    // weight 128 h + 32 g + l: q = 15 (+ 48 from qh[37] for h = 1, l = 5), value 0.5 sc[w / 16] (q - 32).
    assert_eq!(y[0], -8.5); // 0.5 * 1 * (15 - 32)
    assert_eq!(y[48], 17.0); // sub-block 3: 0.5 * -2 * -17
    assert_eq!([y[133], y[165], y[197], y[229]], [15.5; 4]); // q = 63
    assert_eq!([y[132], y[230]], [-8.5; 2]);
    // The repacked blocks decode to the same values here: every constant is exact in f16.
    for (ty, raw) in [(GgmlType::Q4_K, &q4), (GgmlType::Q6_K, &q6)] {
        assert_eq!(
            dequantize_packed(ty, raw).unwrap(),
            quant::dequantize(ty, raw).unwrap(),
            "{ty}"
        );
    }
}

#[test]
fn hand_computed_32_weight_blocks_and_iq4_xs_through_a_gguf_file() {
    // Q5_0, d = 0.5: qs[j] = j | (15 - j) << 4, qh = 0x0000_FFFF (weights 0..16 get 16): weight j = (j + 16 - 16)
    // / 2 = j / 2, weight 16 + j = (15 - j - 16) / 2.
    let mut q50 = f16(0.5).to_vec();
    q50.extend(0x0000_FFFFu32.to_le_bytes());
    q50.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    // Q5_1, d = 0.25, m = -4: qs all 0xF0 (low 0, high 15), qh = 0x8000_0001 (weights 0 and 31 get 16).
    let mut q51 = [f16(0.25), f16(-4.0)].concat();
    q51.extend(0x8000_0001u32.to_le_bytes());
    q51.extend([0xF0u8; 16]);
    // IQ4_NL, d = 2: qs[j] = j | j << 4: weights j and 16 + j are 2 * KVALUES[j].
    let mut nl = f16(2.0).to_vec();
    nl.extend((0..16u8).map(|j| j | (j << 4)));
    // IQ4_XS, d = 0.125: ls of sub-block ib = 32 + ib - 4 (ib 0..8: 28..35; scales_l nibbles, scales_h 2 bits
    // each: 28 = 0x1C, 35 = 0x23), qs[16 ib + j] = 8 (KVALUES[8] = 1) but qs[16] = 0x0F (sub-block 1: weight 32
    // is KVALUES[15] = 113, weight 48 is KVALUES[0] = -127).
    let codes: Vec<u16> = (0..8).map(|ib| 28 + ib).collect();
    let mut xs = f16(0.125).to_vec();
    let hbits = codes
        .iter()
        .enumerate()
        .fold(0u16, |a, (ib, c)| a | (c >> 4) << (2 * ib));
    xs.extend(hbits.to_le_bytes());
    xs.extend((0..4).map(|i| (codes[2 * i] & 0xf) as u8 | ((codes[2 * i + 1] & 0xf) << 4) as u8));
    xs.extend([0x88u8; 128]);
    xs[8 + 16] = 0x0F;
    let mut w = GgufWriter::new();
    w.add_tensor_bytes("q50", &[32], GgmlType::Q5_0, q50.clone()).unwrap();
    w.add_tensor_bytes("q51", &[32], GgmlType::Q5_1, q51.clone()).unwrap();
    w.add_tensor_bytes("nl", &[32], GgmlType::IQ4_NL, nl.clone()).unwrap();
    w.add_tensor_bytes("xs", &[256], GgmlType::IQ4_XS, xs.clone()).unwrap();
    let f = GgufFile::from_bytes("hand32.gguf", w.to_bytes()).unwrap();
    let y = f.tensor_f32("q50").unwrap();
    assert_eq!([y[0], y[7], y[15], y[16], y[31]], [0.0, 3.5, 7.5, -0.5, -8.0]);
    let y = f.tensor_f32("q51").unwrap();
    assert_eq!(
        [y[0], y[1], y[15], y[16], y[30], y[31]],
        [0.0, -4.0, -4.0, -0.25, -0.25, 3.75]
    );
    let y = f.tensor_f32("nl").unwrap();
    assert_eq!(
        [y[0], y[7], y[8], y[15], y[16], y[31]],
        [-254.0, -20.0, 2.0, 226.0, -254.0, 226.0]
    );
    let y = f.tensor_f32("xs").unwrap();
    // Sub-block ib: dl = 0.125 (ib - 4); weight 32 ib + j = dl * 1 except sub-block 1's weights 32 and 48.
    assert_eq!(
        [y[0], y[31], y[32], y[48], y[33], y[255]],
        [-0.5, -0.5, -42.375, 47.625, -0.375, 0.375]
    );
    for (ty, raw) in [
        (GgmlType::Q5_0, &q50),
        (GgmlType::Q5_1, &q51),
        (GgmlType::IQ4_NL, &nl),
        (GgmlType::IQ4_XS, &xs),
    ] {
        assert_eq!(
            dequantize_packed(ty, raw).unwrap(),
            quant::dequantize(ty, raw).unwrap(),
            "{ty}: the repacked constants are exact here"
        );
    }
}

/// Random raw super-blocks with every sub-block code (6-bit scales and mins, i8 scales, -128 included) and
/// super-block factors spread over many binades (so products land anywhere in f16's normal and subnormal ranges).
fn random_super_blocks(ty: GgmlType, n: usize, seed: u64) -> Vec<u8> {
    let bb = ty.type_size();
    let bytes = normal(seed, n * bb, 1.0);
    let mut raw: Vec<u8> = bytes.iter().map(|v| (v.to_bits() >> 7) as u8).collect();
    let e = normal(seed ^ 0xABCD, 2 * n, 1.0);
    for (i, blk) in raw.chunks_exact_mut(bb).enumerate() {
        let factor = |j: usize| e[2 * i + j] * 2f32.powi(-8 - (i % 16) as i32);
        match ty {
            GgmlType::Q6_K => blk[208..210].copy_from_slice(&f16(factor(0))),
            _ => {
                blk[0..2].copy_from_slice(&f16(factor(0)));
                blk[2..4].copy_from_slice(&f16(factor(1)));
            }
        }
    }
    raw
}

#[test]
fn repacked_constants_are_ggml_constants_rounded_once_to_f16() {
    let eps = 2f64.powi(-11);
    let h = |b: &[u8], at: usize| f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]])) as f64;
    for ty in [GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS] {
        // Realistic blocks (the quantizer's, weights of std 0.02) and random ones.
        let bb = pack::Format::new(ty).unwrap().block_bytes();
        let sets = [
            quant::quantize(ty, &normal(7, 64 * 256, 0.01)).unwrap(),
            random_super_blocks(ty, 64, 3),
        ];
        for raw in &sets {
            let b32 = blocks32(ty, raw).unwrap();
            assert_eq!(b32.len(), raw.len() / ty.type_size() * 8 * bb);
            let (mut worst, mut rounded) = (0f64, 0);
            for (i, sb) in raw.chunks_exact(ty.type_size()).enumerate() {
                for s in 0..8 {
                    let blk = &b32[(8 * i + s) * bb..];
                    // The exact ggml constants of block s (f32 products of an f16 and a small integer are exact).
                    let want: Vec<f64> = match ty {
                        GgmlType::Q6_K => {
                            let sc = |j: usize| sb[q6_k::SCALES_OFFSET + j] as i8 as f64;
                            let d = h(sb, q6_k::D_OFFSET);
                            vec![d * sc(2 * s), d * sc(2 * s + 1)]
                        }
                        GgmlType::IQ4_XS => vec![h(sb, 0) * (iq4_xs::scale_code(sb, s) - 32) as f64],
                        _ => {
                            let (sc, m) = q4_k::scale_min(&sb[4..16], s);
                            vec![h(sb, 0) * sc as f64, -h(sb, 2) * m as f64]
                        }
                    };
                    for (j, want) in want.into_iter().enumerate() {
                        let got = h(blk, 2 * j);
                        let rel = (got - want).abs() / want.abs().max(f64::MIN_POSITIVE);
                        assert!(
                            rel <= eps,
                            "{ty} super-block {i} block {s} constant {j}: {got} for {want}"
                        );
                        worst = worst.max(rel);
                        rounded += usize::from(got != want);
                    }
                }
            }
            // Not vacuous: the rounding happens, and comes close to its bound.
            assert!(
                rounded > 0 && worst > eps / 4.0,
                "{ty}: {rounded} rounded, worst {worst}"
            );
        }
        // Per weight: |packed - ggml| <= 2^-11 (|d q| + |m|) of its block, up to f32 rounding (2^-22 relative).
        let raw = &sets[1];
        let (got, want) = (dequantize_packed(ty, raw).unwrap(), quant::dequantize(ty, raw).unwrap());
        let b32 = blocks32(ty, raw).unwrap();
        for (w, (g, x)) in got.iter().zip(&want).enumerate() {
            let blk = &b32[w / 32 * bb..];
            let (c0, c1) = (h(blk, 0).abs(), h(blk, 2).abs());
            let bound = match ty {
                GgmlType::Q4_K => 15.0 * c0 + c1,
                GgmlType::Q5_K => 31.0 * c0 + c1,
                GgmlType::IQ4_XS => 127.0 * c0,
                _ => 32.0 * c0.max(c1),
            } * (eps + 2f64.powi(-22));
            assert!(
                ((g - x) as f64).abs() <= bound,
                "{ty} weight {w}: {g} vs {x}, bound {bound}"
            );
        }
    }
}

#[test]
fn q4_k_blocks_keep_ggml_codes_and_factors_and_dequantize_exactly() {
    // Q4_K keeps each block's 6-bit scale and min codes and its super-block's f16 d and dmin (no rounding): the
    // kernels form d * sc and dmin * m in f32, exactly ggml's values.
    let ty = GgmlType::Q4_K;
    let bb = pack::Format::new(ty).unwrap().block_bytes();
    for raw in [
        quant::quantize(ty, &normal(7, 64 * 256, 0.01)).unwrap(),
        random_super_blocks(ty, 64, 3),
    ] {
        let b32 = blocks32(ty, &raw).unwrap();
        assert_eq!(b32.len(), raw.len() / ty.type_size() * 8 * bb);
        for (i, sb) in raw.chunks_exact(ty.type_size()).enumerate() {
            for s in 0..8 {
                let blk = &b32[(8 * i + s) * bb..];
                let (sc, m) = q4_k::scale_min(&sb[4..16], s);
                assert_eq!((blk[0], blk[1]), (sc, m), "super-block {i} block {s} codes");
                assert_eq!(blk[2..6], sb[0..4], "super-block {i} block {s} factors");
            }
        }
        assert_eq!(
            dequantize_packed(ty, &raw).unwrap(),
            quant::dequantize(ty, &raw).unwrap()
        );
    }
}

/// A file built item by item (no validation), with the data section padded to 32 and `data_len` zero bytes.
fn raw_file(tensors: &[(&str, &[u64], u32)], data_len: usize) -> Vec<u8> {
    let mut b = vec![];
    put_header(&mut b, 3, tensors.len() as u64, 1);
    put_kv(&mut b, "general.architecture", &Value::String("llama".into()));
    for (name, dims, ty) in tensors {
        put_tensor_info(&mut b, name, dims, *ty, 0);
    }
    b.resize(b.len().next_multiple_of(32) + data_len, 0);
    b
}

#[test]
fn bad_k_quant_tensors_are_errors() {
    let msg = |r: shaderlm::Result<GgufFile>| r.map(|_| ()).unwrap_err().to_string();
    // A row of 288 weights is not whole 256-weight super-blocks: refused when the file opens.
    let e = msg(GgufFile::from_bytes(
        "k288.gguf",
        raw_file(&[("w", &[288, 2], 12)], 1000),
    ));
    assert!(
        e.contains("k288.gguf") && e.contains("not a multiple of the block size 256"),
        "{e}"
    );
    // Truncated data: a [2, 512] Q6_K tensor needs 840 bytes.
    assert!(GgufFile::from_bytes("ok.gguf", raw_file(&[("w", &[512, 2], 14)], 840)).is_ok());
    let e = msg(GgufFile::from_bytes("cut.gguf", raw_file(&[("w", &[512, 2], 14)], 839)));
    assert!(e.contains("cut.gguf") && e.contains("runs past the end"), "{e}");
    // Packing: K not a multiple of 256, bytes that do not match [N, K].
    let raw = quant::quantize(GgmlType::Q4_K, &normal(1, 1024, 0.1)).unwrap();
    let err = |n: usize, k: usize, r: &[u8]| pack::pack(GgmlType::Q4_K, Layout::Rows, n, k, r, 1 << 20).is_err();
    assert!(!err(2, 512, &raw) && !err(4, 256, &raw));
    assert!(err(1, 288, &raw[..162]), "K = 288");
    assert!(err(2, 512, &raw[..raw.len() - 1]) && err(3, 512, &raw), "byte count");
    let e = pack::pack(GgmlType::Q4_K, Layout::Rows, 1, 288, &raw[..162], 1 << 20)
        .unwrap_err()
        .to_string();
    assert!(e.contains("multiple of 256"), "{e}");
    // A super-block factor so large that d * sc overflows f16: the ggml values are finite (f32). Q4_K keeps d and
    // the codes (the kernels multiply in f32), so it packs; Q5_K's repacking for the GPU is an error, not an
    // infinity.
    let mut big = raw.clone();
    big[0..2].copy_from_slice(&f16(60000.0));
    assert!(quant::dequantize(GgmlType::Q4_K, &big)
        .unwrap()
        .iter()
        .all(|v| v.is_finite()));
    assert!(pack::pack(GgmlType::Q4_K, Layout::Tiled, 4, 256, &big, 1 << 20).is_ok());
    let mut big5 = quant::quantize(GgmlType::Q5_K, &normal(1, 1024, 0.1)).unwrap();
    big5[0..2].copy_from_slice(&f16(60000.0));
    let e = pack::pack(GgmlType::Q5_K, Layout::Tiled, 4, 256, &big5, 1 << 20)
        .unwrap_err()
        .to_string();
    assert!(e.contains("Q5_K") && e.contains("f16"), "{e}");
}

/// A GGUF file whose k-quant tensors read as the values the GPU kernels compute (`dequantize_packed`): the CPU
/// reference forward over it measures the engine, not the f16 rounding of the repacked block constants.
struct PackedValues<'a>(&'a GgufFile);

impl WeightSource for PackedValues<'_> {
    fn describe(&self) -> String {
        WeightSource::describe(self.0)
    }
    fn tensor(&self, name: &str) -> shaderlm::Result<Option<HostTensor<'_>>> {
        let Some(t) = WeightSource::tensor(self.0, name)? else {
            return Ok(None);
        };
        let data = match t.data {
            HostData::Quant(ty, raw) if ty.block_size() == 256 => HostData::F32(dequantize_packed(ty, raw)?),
            d => d,
        };
        Ok(Some(HostTensor { data, ..t }))
    }
}

/// GPU logits at every position (prefill `prompt` tokens in one step, then decode one at a time) with their argmax.
fn gpu_logits(src: &dyn WeightSource, cfg: LlamaConfig, tokens: &[u32], prompt: usize) -> Vec<(usize, Vec<f32>, u32)> {
    let gpu = gpu();
    let model = Llama::load(gpu, src, cfg, Names::Gguf, |_, _| {}).unwrap();
    let steps = prefill_then_decode(tokens.len(), prompt, prompt);
    run_steps(gpu, &model, tokens, &steps, 64, LOGITS_AND_ARGMAX)
        .into_iter()
        .map(|(p, r)| (p, r.logits, r.argmax.unwrap()))
        .collect()
}

/// A tiny Llama whose 2-D tensors have the types `ty_of` gives, through the GPU model against the CPU reference.
fn tiny_llama_matches_the_cpu_reference(file: &str, ty_of: &dyn Fn(&str) -> GgmlType) {
    // Widths that are whole super-blocks: hidden 256, ffn 512, 4 heads of 64 (K of attn_output 256).
    let t = Tiny {
        arch: "llama",
        layers: 2,
        hidden: 256,
        ffn: 512,
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        vocab: 101,
        tied: false,
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(file);
    write_gguf_typed(&path, &t, 9, ty_of);
    let f = GgufFile::open(&path).unwrap();
    for name in [
        "token_embd.weight",
        "blk.1.ffn_down.weight",
        "blk.1.attn_q.weight",
        "blk.0.attn_v.weight",
    ] {
        assert_eq!(f.tensor(name).unwrap().ggml_type, ty_of(name), "{name}");
    }
    let cfg = LlamaConfig::from_gguf(&f).unwrap();
    let tokens: Vec<u32> = (0..14u32).map(|i| (i * 37 + 11) % 101).collect();
    let got = gpu_logits(&f, cfg.clone(), &tokens, 10);
    // Against the reference over the kernels' block values: f32 math on both sides, differing only in summation
    // order, as tests/model.rs bounds it (NMSE 1e-8; any indexing, nibble order or scale mistake gives > 1e-3).
    let want = reference::logits(&PackedValues(&f), &cfg, Names::Gguf, &tokens).unwrap();
    // Against ggml's exact dequantization: each block constant is off by at most 2^-11 relative (about 2^-11 / sqrt(3)
    // RMS), so each matmul's output is off by NMSE <= ~2^-22 = 2.4e-7; through 2 layers of 7 matmuls and the head,
    // and the norms that rescale them, the logits stay within ~15x that: bound 1e-5.
    let exact = reference::logits(&f, &cfg, Names::Gguf, &tokens).unwrap();
    for (p, logits, arg) in got {
        let e = nmse(&logits, &want[p]);
        assert!(
            e < 1e-8,
            "position {p}: logits nmse {e:e} vs the packed-value reference"
        );
        let best = shaderlm::sampling::argmax(&want[p]);
        assert_eq!(arg, best, "position {p}: GPU argmax {arg}, reference {best}");
        let e = nmse(&logits, &exact[p]);
        println!(
            "position {p}: nmse vs packed values {:.2e}, vs ggml values {e:.2e}",
            nmse(&logits, &want[p])
        );
        assert!(e < 1e-5, "position {p}: logits nmse {e:e} vs the ggml-value reference");
    }
}

#[test]
fn tiny_llama_in_a_q4_k_m_mix_matches_the_cpu_reference() {
    let q4_k_m = |name: &str| {
        if name == "output.weight" || name.ends_with("ffn_down.weight") {
            GgmlType::Q6_K
        } else {
            GgmlType::Q4_K
        }
    };
    tiny_llama_matches_the_cpu_reference("tiny-q4_k_m.gguf", &q4_k_m);
}

#[test]
fn tiny_llama_in_every_new_type_matches_the_cpu_reference() {
    // Published "Q4_K_M" files of small models are mostly Q5_0 (with Q8_0, Q6_K, and IQ4_NL where a row is not
    // whole super-blocks); here every type read since then, each in some role: the Q5_0 token embedding goes through
    // embedding_q, the others through matmul_q.
    let mix = |name: &str| {
        let roles = [
            ("token_embd", GgmlType::Q5_0),
            ("output", GgmlType::Q6_K),
            ("attn_q", GgmlType::Q5_0),
            ("attn_k", GgmlType::Q5_1),
            ("attn_v", GgmlType::IQ4_NL),
            ("attn_output", GgmlType::IQ4_XS),
            ("ffn_gate", GgmlType::Q5_K),
            ("ffn_up", GgmlType::Q5_0),
            ("ffn_down", GgmlType::Q6_K),
        ];
        let role = name.trim_end_matches(".weight").rsplit('.').next().unwrap_or("");
        roles.iter().find(|r| r.0 == role).map_or(GgmlType::Q8_0, |r| r.1)
    };
    tiny_llama_matches_the_cpu_reference("tiny-new-types.gguf", &mix);
}

#[test]
fn q2_k_and_q3_k_round_trip_through_a_gguf_file() {
    // The writer's RTN quantizers on normal data, through a file, back through the reader's dequantization.
    // Relative RMSE: Q2_K spans a sub-block of 16 (about 3.5 sigma) in 3 steps, RMSE about step / sqrt(12) = 0.34,
    // plus the 4-bit codes of scale and min; Q3_K maps the largest |x| of 16 (about 1.8 sigma) to 4 steps and
    // clamps the other side at 3: about 0.45 / sqrt(12) = 0.13 plus the clamped tails. Bounds 0.45 and 0.2; a
    // wrong bit order or scale gives 0.7 or more.
    let mut w = GgufWriter::new();
    let x = normal(42, 2 * 512, 0.05);
    for ty in [GgmlType::Q2_K, GgmlType::Q3_K] {
        w.add_tensor(format!("{ty}"), &[2, 512], ty, &x).unwrap();
    }
    let f = GgufFile::from_bytes("q23.gguf", w.to_bytes()).unwrap();
    for (ty, bound) in [(GgmlType::Q2_K, 0.45), (GgmlType::Q3_K, 0.2)] {
        let info = f.tensor(&format!("{ty}")).unwrap();
        assert_eq!(info.ggml_type, ty);
        assert_eq!(info.n_bytes, 4 * ty.type_size());
        let y = f.tensor_f32(&format!("{ty}")).unwrap();
        let err = rms(x.iter().zip(&y).map(|(a, b)| a - b)) / rms(x.iter().copied());
        println!("{ty}: relative RMSE {err:.3}");
        assert!(err < bound, "{ty}: relative RMSE {err}");
        // The packed form computes with exactly these values.
        assert_eq!(dequantize_packed(ty, f.tensor_data(info).unwrap()).unwrap(), y);
    }
}

#[test]
fn tiny_llama_in_q2_k_and_q3_k_matches_the_cpu_reference() {
    // Every role in one of the two: the Q2_K token embedding goes through embedding_q, the rest through matmul_q.
    let mix = |name: &str| {
        let q3 = ["output", "attn_k", "attn_output", "ffn_up"];
        let role = name.trim_end_matches(".weight").rsplit('.').next().unwrap_or("");
        if q3.contains(&role) {
            GgmlType::Q3_K
        } else {
            GgmlType::Q2_K
        }
    };
    tiny_llama_matches_the_cpu_reference("tiny-q2_k-q3_k.gguf", &mix);
}
