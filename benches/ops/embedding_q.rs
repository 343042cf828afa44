//! embedding_q: gathers from SmolLM2's 49152 x 576 token table (Q8_0 as in its GGUF, and Q4_0) and Qwen2.5-0.5B's
//! 151936 x 896 (Q8_0), for one token and a 512-token chunk, in both layouts.

use crate::common::{plan_of, Bench, MODELS};
use shaderlm::gpu::DType;
use shaderlm::gpu::packed::PackedWeight;
use shaderlm::quant::pack::Layout;
use shaderlm::quant::GgmlType;

/// Deterministic raw GGUF blocks of a [n, k] tensor (scales 2^-6, all quant patterns; k-quants: all sub-block
/// codes, super-block factors 2^-12 for scales, 2^-10 for mins).
pub fn blocks(ty: GgmlType, n: usize, k: usize) -> Vec<u8> {
    let bb = ty.type_size();
    let mut raw = vec![0u8; n * k / ty.block_size() * bb];
    let mut s = 0x9E37_79B9u32;
    let f16_at = |blk: &mut [u8], at: usize, v: f32| {
        blk[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
    };
    for blk in raw.chunks_exact_mut(bb) {
        for b in blk.iter_mut() {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            *b = s as u8;
        }
        match ty {
            GgmlType::Q4_K | GgmlType::Q5_K => {
                f16_at(blk, 0, 1.0 / 4096.0);
                f16_at(blk, 2, 1.0 / 1024.0);
            }
            GgmlType::Q6_K => f16_at(blk, 208, 1.0 / 4096.0),
            _ => {
                f16_at(blk, 0, 1.0 / 64.0);
                if ty == GgmlType::Q4_1 {
                    f16_at(blk, 2, -0.1);
                }
            }
        }
    }
    raw
}

pub fn benches() -> Vec<Bench> {
    let mut v = Vec::new();
    let (s, q) = (MODELS[0], MODELS[1]);
    for (model, vocab, hidden, ty) in [
        (s.0, s.6, s.1, GgmlType::Q8_0),
        (s.0, s.6, s.1, GgmlType::Q4_0),
        (q.0, q.6, q.1, GgmlType::Q8_0),
    ] {
        for layout in [Layout::Tiled, Layout::Rows] {
            let l = if layout == Layout::Tiled { "tiled" } else { "rows" };
            for tokens in [1usize, 512] {
                let name = format!("embedding_q {model} {ty} {l} {tokens}x{vocab}x{hidden}");
                v.push(Bench::new(name, move |gpu| {
                    let w =
                        PackedWeight::upload_with(gpu, "tok", ty, layout, vocab, hidden, &blocks(ty, vocab, hidden))?;
                    plan_of(gpu, |g| {
                        let ids = g.input("ids", &[tokens], DType::U32);
                        g.embedding_q(ids, &w)?;
                        Ok(vec![(ids, tokens, DType::U32)])
                    })
                }));
            }
        }
    }
    v
}
