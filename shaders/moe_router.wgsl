// moe_router: the BlockFFN router after its projection (Song et al. 2025, "BlockFFN: Towards End-Side
// Acceleration-Friendly Mixture-of-Experts with Chunk-Level Activation Sparsity", arXiv 2507.08771; `BlockMLP` in
// thunlp/BlockFFN): per token, r = norm(ReLU(logits)) over the E experts, and for the whole chunk of tokens the
// union of the experts with r != 0, as a compact list the sparse up/down kernels read.
// Norms (the model's `norm_after_router`):
//   RMS:  r = v / sqrt(mean(v^2) + eps) * weight      (router_norm, an RMSNorm over E)
//   SUM:  r = v / (sum(v) * scale + eps)               (BlockFFN adds eps = 1e-5 and multiplies by norm_scale)
//   none: r = v
// An expert is active for a token when its r is nonzero (with a zero or negative RMS weight an expert with v > 0
// can still be 0 or negative; the dense reference counts every nonzero r, so this does too).
// One workgroup of 8 (one llvmpipe SIMD chunk: no coroutine switch at the barriers; the work is tiny): invocation
// t handles tokens t, t + 8, ... (two passes over the token's E logits), marking its nonzero experts in a
// workgroup bitmask; then invocation 0 writes the list.
// Bindings: 0 logits [M, E] f32 | 1 weight [E] f32 (RMS only) | then r [M, E] f32 (written) | then alist
//   [1 + E] u32 (written: the count c, then c expert ids ascending; entries past c are left as they were).
// Defs: RMS or SUM (neither: no norm). Grid: 1 x 1 x 1. E <= 1024.

struct Params {
    m: u32,      // tokens
    e: u32,      // experts
    eps: f32,
    scale: f32,  // SUM: norm_scale
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;          // [M, E]
#if RMS
@group(0) @binding(1) var<storage, read> weight: array<f32>;          // [E]
@group(0) @binding(2) var<storage, read_write> r: array<f32>;         // [M, E]
@group(0) @binding(3) var<storage, read_write> alist: array<u32>;    // [1 + E]
#else
@group(0) @binding(1) var<storage, read_write> r: array<f32>;         // [M, E]
@group(0) @binding(2) var<storage, read_write> alist: array<u32>;    // [1 + E]
#endif
@group(1) @binding(0) var<uniform> p: Params;

const WG = 8u;
const MASK_WORDS = 32u;  // bitmask of up to 1024 experts

var<workgroup> mask: array<atomic<u32>, MASK_WORDS>;

@compute @workgroup_size(8)
fn main(@builtin(local_invocation_index) li: u32) {
    for (var i = li; i < MASK_WORDS; i += WG) {
        atomicStore(&mask[i], 0u);
    }
    workgroupBarrier();
    for (var t = li; t < p.m; t += WG) {
        let base = t * p.e;
        var s = 0.0;
        for (var e = 0u; e < p.e; e++) {
            let v = max(logits[base + e], 0.0);
#if RMS
            s += v * v;
#else
            s += v;
#endif
        }
#if RMS
        let f = inverseSqrt(s / f32(p.e) + p.eps);
#else
#if SUM
        let f = 1.0 / (s * p.scale + p.eps);
#else
        let f = 1.0;
#endif
#endif
        for (var e = 0u; e < p.e; e++) {
#if RMS
            let v = max(logits[base + e], 0.0) * f * weight[e];
#else
            let v = max(logits[base + e], 0.0) * f;
#endif
            r[base + e] = v;
            if (v != 0.0) {
                atomicOr(&mask[e / 32u], 1u << (e % 32u));
            }
        }
    }
    workgroupBarrier();
    if (li == 0u) {
        var c = 0u;
        for (var w = 0u; w < (p.e + 31u) / 32u; w++) {
            var bits = atomicLoad(&mask[w]);
            while (bits != 0u) {
                alist[1u + c] = w * 32u + firstTrailingBit(bits);
                c++;
                bits &= bits - 1u;
            }
        }
        alist[0] = c;
    }
}
