// attention_sparse: InfLLM-v2 sparse attention (stage 6): causal GQA softmax attention of each query token over the
// keys of its selected KV blocks only. The selection is per (token, KV head), shared by the group's query heads.
// Source: Zhao et al., "InfLLM-V2: Dense-Sparse Switchable Attention for Seamless Short-to-Long Adaptation"
// (arXiv 2509.24663), sparse attention over the blocks chosen by block_topk; flash-style online softmax (Dao et
// al., FlashAttention) and, for decode, a split of the blocks across workgroups combined by a second dispatch
// (Flash-Decoding), laid out like attention_decode.
//
// Cache layout: [n_kv, max_ctx, HD] f32 or (KV_F16) f16 pairs (lib/kv_cache.wgsl), each head's positions
// contiguous (see kv_write). Query t sits at position
// pos + t and sees keys < kv_end = min(pos + t + 1, max_ctx). Block b covers keys [b * block_size, (b + 1) *
// block_size); a selected block contributes its keys below kv_end. Slots holding a block past the query's last
// visible block (EMPTY padding included) are skipped. Scores are in the log2 domain (q pre-scaled by
// scale * log2(e)).
//
// Dispatch 1 (default, or DIRECT): bindings 0 q [n_tokens, n_heads, HD] | 1 k_cache [n_kv, max_ctx, HD]
//   | 2 v_cache [n_kv, max_ctx, HD] | 3 sel [n_tokens, n_kv, budget] u32 (ascending block ids, EMPTY-padded)
//   | default: 4 part_o [n_tokens, n_heads, splits, HD] (written: unnormalized sum p * v) | 5 part_ml [n_tokens,
//   n_heads, splits, 2] (written: running max m and sum l); DIRECT: 4 out [n_tokens, n_heads, HD] (written).
//   Grid (splits, n_kv, n_tokens * row_blocks), workgroups of 64 (DIRECT: splits = 1). Workgroup (s, h, z) serves
//   selection slots [s * slots_per_split, (s + 1) * slots_per_split) of token z / row_blocks and kv head h, for up
//   to ROWS query heads of its group (row r: head h * group + r), so every row shares each key and value read.
//   Per block, per tile of up to TK = 64 of its keys (lib/attn_tile.wgsl): (1) invocation t computes the scores
//   of key t for every row (its K row streamed once, q rows in workgroup memory); (2) invocation r < rows updates
//   row r's running max and sum and turns scores into weights; (3) invocation (rsub, c) accumulates p * V for
//   column c (a vec4 of HD) of rows rsub, rsub + NSUB, ...: consecutive invocations read consecutive vec4s of one
//   V row.
// Dispatch 2 (COMBINE): bindings 0 part_o | 1 part_ml | 2 out [n_tokens, n_heads, HD] (written). Grid
//   ceil(n_tokens * n_heads * HD / 4 / 64) workgroups of 64 (folded into y), one invocation per output vec4.
// A row without any visible selected key (an empty selection) gets output 0.
// TREE (dispatch 1 without DIRECT: a speculative draft tree's step, lib/attn_tree.wgsl): binding 6 tree [n_tokens,
//   TREE_W] u32; token t sits at position pos + its depth and reads the keys at positions >= pos through its path's
//   slots, so each row equals the one-query step at that position over a cache holding its path in order.

const HD4: u32 = HD / 4u;
const WG: u32 = 64u;
const NEG: f32 = -1.0e30;

#if COMBINE
#include "lib/attn_combine.wgsl"
#else
const EMPTY: u32 = 0xffffffffu;

#include "lib/kv_cache.wgsl"

struct Params {
    n_tokens: u32,
    n_heads: u32,
    n_kv: u32,
    group: u32,
    max_ctx: u32,
    pos: u32,
    budget: u32,          // selection slots per (token, kv head)
    block_size: u32,
    splits: u32,          // stride of the partials (1 when DIRECT)
    slots_per_split: u32,
    row_blocks: u32,      // ceil(group / ROWS)
    scale: f32,
}

@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;             // [n_tokens, n_heads, HD]
@group(0) @binding(1) var<storage, read> kc: array<kv4>;                  // [n_kv, max_ctx, HD] f32 or (KV_F16) f16
@group(0) @binding(2) var<storage, read> vc: array<kv4>;                  // [n_kv, max_ctx, HD] f32 or (KV_F16) f16
@group(0) @binding(3) var<storage, read> sel: array<u32>;                 // [n_tokens, n_kv, budget]
#if DIRECT
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;     // [n_tokens, n_heads, HD]
#else
@group(0) @binding(4) var<storage, read_write> part_o: array<vec4<f32>>;  // [n_tokens, n_heads, splits, HD]
@group(0) @binding(5) var<storage, read_write> part_ml: array<vec2<f32>>; // [n_tokens, n_heads, splits, 2]
#endif
@group(1) @binding(0) var<uniform> p: Params;

#include "lib/attn_tree.wgsl"

#include "lib/attn_tile.wgsl"

// [2] block id of the current slot, posted by invocation 0; alternating entries, so that posting the next slot's
// id never meets a read of this one (workgroupUniformLoad has a barrier before its load).
var<workgroup> blk: array<u32, 2>;
#if DIRECT
var<workgroup> lsum: array<f32, ROWS>;            // [ROWS] final softmax sums, for the normalization
#endif

// Absolute position of query token t.
fn position(t: u32) -> u32 {
#if TREE
    return p.pos + tree_row_depth(t);
#else
    return p.pos + t;
#endif
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let split = wg.x;
    let kvh = wg.y;
    let tok = wg.z / p.row_blocks;
    let r0 = (wg.z % p.row_blocks) * ROWS;
    let nr = min(ROWS, p.group - r0);
    set_tree_row(tok);
    let kv_end = min(position(tok) + 1u, p.max_ctx);
    let last_block = (kv_end - 1u) / p.block_size;  // selected ids past it hold no visible key
    let s_begin = min(split * p.slots_per_split, p.budget);
    let s_end = min(s_begin + p.slots_per_split, p.budget);
    let sbase = (tok * p.n_kv + kvh) * p.budget;
    let cbase = kvh * p.max_ctx * HD4;
    let head0 = kvh * p.group + r0;  // query head of row 0

    let qscale = p.scale * LOG2E;
    for (var i = lid; i < nr * HD4; i += WG) {
        qs[i] = q[(tok * p.n_heads + head0) * HD4 + i] * qscale;
    }
    // Row statistics, held by invocation lid for row lid (lid < nr).
    var m = NEG;
    var l = 0.0;
    // Step 3 layout: invocation lid owns column c (a vec4 of HD) of rows rsub, rsub + NSUB, ... (rsub < NSUB).
    let c = lid % HD4;
    let rsub = lid / HD4;
    var acc: array<vec4<f32>, OWNR>;
    for (var k = 0u; k < OWNR; k++) {
        acc[k] = vec4<f32>(0.0);
    }

    for (var slot = s_begin; slot < s_end; slot++) {
        if (lid == 0u) {
            blk[slot & 1u] = sel[sbase + slot];
        }
        let b = workgroupUniformLoad(&blk[slot & 1u]);
        if (b > last_block) {
            continue;  // EMPTY padding, or a block after the query's
        }
        let k_lo = b * p.block_size;
        let k_hi = min(k_lo + p.block_size, kv_end);
        // Every key of the tile is visible (k_hi <= kv_end).
        for (var t0 = k_lo; t0 < k_hi; t0 += TK) {
            let n = min(TK, k_hi - t0);
            attn_tile(t0, n, nr, cbase, lid, 0u, n, &m, &l, &acc);
        }
    }
#if DIRECT
    if (lid < nr) {
        lsum[lid] = l;
    }
    workgroupBarrier();
    if (rsub < NSUB) {
        for (var k = 0u; k < OWNR; k++) {
            let r = rsub + k * NSUB;
            if (r < nr) {
                let ls = lsum[r];
                out[(tok * p.n_heads + head0 + r) * HD4 + c] = select(vec4<f32>(0.0), acc[k] / ls, ls > 0.0);
            }
        }
    }
#else
    if (rsub < NSUB) {
        for (var k = 0u; k < OWNR; k++) {
            let r = rsub + k * NSUB;
            if (r < nr) {
                let slot = (tok * p.n_heads + head0 + r) * p.splits + split;
                part_o[slot * HD4 + c] = acc[k];
            }
        }
    }
    if (lid < nr) {
        let slot = (tok * p.n_heads + head0 + lid) * p.splits + split;
        part_ml[slot] = vec2<f32>(m, l);
    }
#endif
}
#endif
