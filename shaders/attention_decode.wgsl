// attention_decode: causal GQA attention for a few query tokens (1 in decode, up to 8 for speculative
// verification) against one layer's KV cache, split across workgroups along the keys (flash-decoding).
// Source: Dao, Haziza, Massa, Sizov, "Flash-Decoding for long-context inference" (2023): each split computes a
// partial output with its own running max and sum; a second dispatch combines the splits.
//
// Cache layout: [n_kv, max_ctx, HD] f32 or (KV_F16) f16 pairs (lib/kv_cache.wgsl), each head's positions
// contiguous (see kv_write). Query i sits at position
// pos + i and sees keys 0 ..= pos + i, or with a sliding window (window > 0) keys pos + i + 1 - window ..= pos + i;
// kv_len = pos + n_q. Split s covers the absolute keys [s * chunk, min((s + 1) * chunk, kv_len)) (chunk: a multiple
// of the key tile, fixed per plan), and only splits first .. first + grid x are launched (those holding keys some
// query sees). A row's masked keys and splits add exact zeros (weight 0; a split a row sees nothing of writes m = NEG,
// l = 0, o = 0, which the combine weighs by exp2(NEG - M) = 0), and every boundary depends on key positions alone:
// row r of a many-query step equals the one-query step at its position bit for bit. Scores are in the log2 domain
// (q pre-scaled by scale * log2(e)).
//
// Dispatch 1 (default): bindings 0 q [n_q, n_heads, HD] | 1 k_cache [n_kv, max_ctx, HD] | 2 v_cache [n_kv, max_ctx, HD]
//   | 3 part_o [n_q, n_heads, splits, HD] (written: unnormalized sum p * v) | 4 part_ml [n_q, n_heads, splits, 2]
//   (written: running max m and sum l) | 5 out [n_q, n_heads, HD] (written instead of the partials when only one
//   split is launched: `single`; the combine dispatch then does not run). Grid (splits, n_kv, ceil(n_q * group /
//   ROWS)), workgroups of 64.
//   Workgroup (s, h, z) serves split s of kv head h for up to ROWS rows r = token * group + g (query head
//   h * group + g), so every row of a GQA group shares each key and value read. Per tile of TK = 64 keys
//   (lib/attn_tile.wgsl): (1) invocation t computes the scores of key t for every row (its K row streamed once,
//   q rows in workgroup memory); (2) invocation r < rows updates row r's running max and sum and turns scores into
//   weights; (3) invocation (rsub, c) accumulates p * V for column c (a vec4 of HD) of rows rsub, rsub + NSUB, ...:
//   consecutive invocations read consecutive vec4s of one V row, each load serving several rows.
//   TREE (a draft tree verified in one step, lib/attn_tree.wgsl): binding 6 tree [n_q, TREE_W] u32; a workgroup
//   serves the heads of one query token (grid z: n_q * ceil(group / ROWS)), whose path key_slot follows.
// Dispatch 2 (COMBINE): bindings 0 part_o | 1 part_ml | 2 out [n_q, n_heads, HD] (written).
//   Grid ceil(n_q * n_heads * HD / 4 / 64) workgroups of 64 (folded into y), one invocation per output vec4.

const HD4: u32 = HD / 4;
const WG: u32 = 64u;
const NEG: f32 = -1.0e30;

#if COMBINE
#include "lib/attn_combine.wgsl"
#else
#include "lib/attn_split_io.wgsl"

#include "lib/attn_tree.wgsl"

#include "lib/attn_tile.wgsl"

// Query token and query head of workgroup row r.
fn row_token(r: u32) -> u32 {
    return r / p.group;
}
fn row_head(kvh: u32, r: u32) -> u32 {
    return kvh * p.group + r % p.group;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let split = p.first + wg.x;
    let kvh = wg.y;
#if TREE
    // Rows r0 .. r0 + nr: heads g0 .. of token tok, which sits at position pos + its depth.
    let per_tok = (p.group + ROWS - 1u) / ROWS;
    let tok = wg.z / per_tok;
    let g0 = (wg.z % per_tok) * ROWS;
    let r0 = tok * p.group + g0;
    let nr = min(ROWS, p.group - g0);
    set_tree_row(tok);
    let kv_len = min(p.pos + TREE_W - 1u, p.max_ctx);
#else
    let r0 = wg.z * ROWS;
    let nr = min(ROWS, p.n_q * p.group - r0);
    let kv_len = min(p.pos + p.n_q, p.max_ctx);
#endif
    let k_begin = min(split * p.chunk, kv_len);
    let k_end = min(k_begin + p.chunk, kv_len);
    let cbase = kvh * p.max_ctx * HD4;

    let qscale = p.scale * LOG2E;
    for (var i = lid; i < nr * HD4; i += WG) {
        let r = r0 + i / HD4;
        qs[i] = q[(row_token(r) * p.n_heads + row_head(kvh, r)) * HD4 + i % HD4] * qscale;
    }
    // Row statistics, held by invocation lid for row lid (lid < nr).
    var m = NEG;
    var l = 0.0;
#if TREE
    let my_at = p.pos + tree_depth(tok);  // position of row lid
#else
    let my_at = p.pos + row_token(r0 + min(lid, nr - 1u));
#endif
    let my_end = min(my_at + 1u, k_end);  // keys < my_end visible to row lid
    // Keys >= my_begin visible to row lid.
    let my_begin = select(0u, my_at + 1u - p.window, p.window > 0u && my_at + 1u > p.window);
    // Step 3 layout: invocation lid owns column c (a vec4 of HD) of rows rsub, rsub + NSUB, ... (rsub < NSUB).
    let c = lid % HD4;
    let rsub = lid / HD4;
    var acc: array<vec4<f32>, OWNR>;
    for (var k = 0u; k < OWNR; k++) {
        acc[k] = vec4<f32>(0.0);
    }

    for (var t0 = k_begin; t0 < k_end; t0 += TK) {
        let n = min(TK, k_end - t0);
        // Row lid's visible keys of the tile: [lo, vis).
        let vis = select(0u, min(n, my_end - t0), my_end > t0);
        let lo = min(select(0u, my_begin - t0, my_begin > t0), vis);
        attn_tile(t0, n, nr, cbase, lid, lo, vis, &m, &l, &acc);
    }
    if (p.single == 1u) {
        // Row sums to the invocations that hold the rows' columns, through `alpha` (the last tile has read it).
        workgroupBarrier();
        if (lid < nr) {
            alpha[lid] = l;
        }
        workgroupBarrier();
    }
    if (rsub < NSUB) {
        for (var k = 0u; k < OWNR; k++) {
            let r = rsub + k * NSUB;
            if (r < nr) {
                let gr = r0 + r;
                let row = row_token(gr) * p.n_heads + row_head(kvh, gr);
                if (p.single == 1u) {
                    // The combine's arithmetic for one split (weight exp2(0) = 1): bit for bit the same output.
                    let l_r = alpha[r];
                    out[row * HD4 + c] = select(vec4<f32>(0.0), acc[k] / l_r, l_r > 0.0);
                } else {
                    part_o[(row * p.splits + split) * HD4 + c] = acc[k];
                }
            }
        }
    }
    if (lid < nr && p.single == 0u) {
        let gr = r0 + lid;
        let slot = (row_token(gr) * p.n_heads + row_head(kvh, gr)) * p.splits + split;
        part_ml[slot] = vec2<f32>(m, l);
    }
}
#endif
