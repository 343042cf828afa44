// embedding_q: y[i, :] = dequantized row ids[i] of a block-quantized [N, K] weight (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// IQ4_NL, and super-block types repacked to 32-weight blocks) packed by src/quant/pack.rs, for the ids that fall in one row part [row0, row0 + rows) (one dispatch per part). The same
// packed copy serves matmul_q, so a tied token embedding and LM head share one device copy. Ids >= n (the host
// rejects them before) give zero rows, written by the last part's dispatch; nothing reads out of bounds.
// Each invocation dequantizes one quant word: 8 weights (4-bit nibbles, with the block's high-bit words for 5- and
// 6-bit quants) or 4 (Q8) of one 32-weight block.
// Q4_0, Q5_0, NL (q the codebook value, QC 0): d * (q - QC); MIN (Q4_1, Q5_1, Q4_K, Q5_K): d * q + m; Q8_0: d * q;
// S16 (Q6_K): d * (q - 32) for weights 0..16 of a block (low nibbles), d2 * (q - 32) for 16..32.
// Bindings: 0 ids [M] u32 | 1 wq quant words (u32; tiled or rows layout, see pack.rs) | 2 ws f16 scale pairs
//   (tiled PAIR: both constants; SUPER: 16-bit sub-block codes) | 3 wm f16 pairs of second constants (rows layout
//   PAIR only), or wd super-block factors (SUPER, both layouts) | then y [M, K] f32 (written).
// SUPER (Q2_K, Q3_K): an invocation dequantizes one 2-bit word, 16 weights of one sub-block: Q2_K d sc q - dmin m,
//   Q3_K d (sc - 32) (q - 4), each constant formed in f32 from its code and super-block factor (exactly).
// Defs: TILED (else the rows layout), Q8, HB1, HB2, NL, MIN, S16, PAIR (MIN or S16), SUPER, Q2K, Q3K, QC, XSUM and
//   XSUM2 (unused here). Grid: one workgroup of 64 per id (folded into y past the
// per-dimension limit); the lanes stride over the row's quant words.

struct Params {
    m: u32,       // ids
    k: u32,       // row length (a multiple of 32)
    row0: u32,    // first row in this part
    rows: u32,    // rows in this part
    n: u32,       // rows in the whole weight
    last: u32,    // 1 for the last part's dispatch: it also writes the zero rows of ids >= n
    groups: u32,  // blocks per row, K / 32
}

@group(0) @binding(0) var<storage, read> ids: array<u32>;      // [M]
@group(0) @binding(1) var<storage, read> wq: array<u32>;       // tiled [tiles, G, WB, 8, 4] | rows [rows, G, WB]
@group(0) @binding(2) var<storage, read> ws: array<u32>;       // tiled [tiles, G, 8, 2 or 4] | rows [rows, ceil(G/2)]
#if FACT
@group(0) @binding(3) var<storage, read> wd: array<u32>;       // tiled [tiles, G/8, 8, 4 or 2] | rows Q2K [rows, G/8], Q3K [rows, ceil(G/16)]
@group(0) @binding(4) var<storage, read_write> y: array<f32>;  // [M, K]
#else
#if TILED
@group(0) @binding(3) var<storage, read_write> y: array<f32>;  // [M, K]
#else
#if PAIR
@group(0) @binding(3) var<storage, read> wm: array<u32>;       // rows [rows, ceil(G/2)]
@group(0) @binding(4) var<storage, read_write> y: array<f32>;  // [M, K]
#else
@group(0) @binding(3) var<storage, read_write> y: array<f32>;  // [M, K]
#endif
#endif
#endif
@group(1) @binding(0) var<uniform> p: Params;

#include "lib/quant_rows.wgsl"

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let i = wid.x + wid.y * nwg.x;
    if (i >= p.m) {
        return;
    }
    let id = ids[i];
    let out = i * p.k;
    let words = p.groups * WQ;  // quant words per row (the high-bit words are read with them)
    if (id >= p.n) {
        if (p.last == 1u) {
            for (var c = li; c < p.k; c += 64u) {
                y[out + c] = 0.0;
            }
        }
        return;
    }
    if (id < p.row0 || id - p.row0 >= p.rows) {
        return;  // another part's row
    }
    let r = id - p.row0;
#if SUPER
    for (var w = li; w < words; w += 64u) {
        let b = w / WQ;
        let hf = w % WQ;  // sub-block of the block
        let sb = b / 8u;
#if TILED
        let tb = (r / 32u) * p.groups + b;
        let lane = (r % 32u) / 4u;
        let j = r % 4u;
        let q = wq[((tb * WB + hf) * 8u + lane) * 4u + j];
        let h = wq[((tb * WB + WB - 1u) * 8u + lane) * 4u + j];
        let code = (ws[(tb * 8u + lane) * 2u + j / 2u] >> (16u * (j & 1u) + 8u * hf)) & 0xffu;
        let tsb = (r / 32u) * (p.groups / 8u) + sb;
#if Q2K
        let fw = ((tsb * 8u + lane) * 4u + j / 2u);
        let d = half_of(wd[fw], (j & 1u) == 1u);
        let dm = half_of(wd[fw + 2u], (j & 1u) == 1u);
#else
        let d = half_of(wd[(tsb * 8u + lane) * 2u + j / 2u], (j & 1u) == 1u);
#endif
#else
        let rb = (r * p.groups + b) * WB;
        let q = wq[rb + hf];
        let h = wq[rb + WB - 1u];
        let code = (ws[r * ((p.groups + 1u) / 2u) + b / 2u] >> (16u * (b & 1u) + 8u * hf)) & 0xffu;
#if Q2K
        let f = wd[r * (p.groups / 8u) + sb];
        let d = half_of(f, false);
        let dm = half_of(f, true);
#else
        let d = half_of(wd[r * ((p.groups / 8u + 1u) / 2u) + sb / 2u], (sb & 1u) == 1u);
#endif
#endif
        let k0 = out + 32u * b + 16u * hf;
#if Q2K
        let a = d * f32(code & 15u);
        let n = dm * f32(code >> 4u);
#else
        let a = d * (f32(code & 63u) - 32.0);
#endif
        for (var i = 0u; i < 4u; i++) {
#if Q2K
            let v = a * q2_field(q, h, hf, i) - n;
#else
            let v = a * (q2_field(q, h, hf, i) - QC);  // as ggml: a zero weight keeps the sign of a
#endif
            y[k0 + 4u * i] = v.x;
            y[k0 + 4u * i + 1u] = v.y;
            y[k0 + 4u * i + 2u] = v.z;
            y[k0 + 4u * i + 3u] = v.w;
        }
    }
#else
    for (var w = li; w < words; w += 64u) {
        let b = w / WQ;
        let i = w % WQ;
        let k0 = out + 32u * b + 4u * i;
#if TILED
        // Row r is component r % 4 of lane (r % 32) / 4 in tile r / 32.
        let tb = (r / 32u) * p.groups + b;
        let lane = (r % 32u) / 4u;
        let j = r % 4u;
        let q = wq[((tb * WB + i) * 8u + lane) * 4u + j];
        let h = wq[((tb * WB + min(WQ, WB - 1u)) * 8u + lane) * 4u + j];
        let h2 = wq[((tb * WB + WB - 1u) * 8u + lane) * 4u + j];
#if K4
        let fw = (((r / 32u) * (p.groups / 8u) + b / 8u) * 8u + lane) * 4u + j / 2u;
        let kc = k4_consts(ws[(tb * 8u + lane) * 2u + j / 2u], (j & 1u) == 1u,
            ((wd[fw] >> (16u * (j & 1u))) & 0xffffu) | ((wd[fw + 2u] >> (16u * (j & 1u))) << 16u));
        let d = kc.x;
        let mn = kc.y;
#else
#if PAIR
        let sw = (tb * 8u + lane) * 4u + j / 2u;
        let d = half_of(ws[sw], (j & 1u) == 1u);
        let mn = half_of(ws[sw + 2u], (j & 1u) == 1u);
#else
        let d = half_of(ws[(tb * 8u + lane) * 2u + j / 2u], (j & 1u) == 1u);
#endif
#endif
#else
        let rb = (r * p.groups + b) * WB;
        let q = wq[rb + i];
        let h = wq[rb + min(WQ, WB - 1u)];
        let h2 = wq[rb + WB - 1u];
        let sw = r * ((p.groups + 1u) / 2u) + b / 2u;
#if K4
        let kc = k4_consts(ws[sw], (b & 1u) == 1u, wd[r * (p.groups / 8u) + b / 8u]);
        let d = kc.x;
        let mn = kc.y;
#else
        let d = half_of(ws[sw], (b & 1u) == 1u);
#if PAIR
        let mn = half_of(wm[sw], (b & 1u) == 1u);
#endif
#endif
#endif
#if Q8
        let v = d * q8_bytes(q);
        y[k0] = v.x;
        y[k0 + 1u] = v.y;
        y[k0 + 2u] = v.z;
        y[k0 + 3u] = v.w;
#else
        // h and h2 are the block's high-bit words with HB1 / HB2 (ignored without them).
#if MIN
        let lo = d * q_lo(q, h, h2, i) + mn;
        let hi = d * q_hi(q, h, h2, i) + mn;
#else
#if S16
        let lo = d * (q_lo(q, h, h2, i) - QC);
        let hi = mn * (q_hi(q, h, h2, i) - QC);
#else
        let lo = d * (q_lo(q, h, h2, i) - QC);
        let hi = d * (q_hi(q, h, h2, i) - QC);
#endif
#endif
        y[k0] = lo.x;
        y[k0 + 1u] = lo.y;
        y[k0 + 2u] = lo.z;
        y[k0 + 3u] = lo.w;
        y[k0 + 16u] = hi.x;
        y[k0 + 17u] = hi.y;
        y[k0 + 18u] = hi.z;
        y[k0 + 19u] = hi.w;
#endif
    }
#endif
}
