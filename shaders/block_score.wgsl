// block_score: InfLLM-v2 stage-1 block relevance (stages 3 and 4 of the selection), per query token and KV head.
// Sources: InfLLM-V2 (arXiv 2509.24663) section 3; OpenBMB/infllmv2_cuda_impl (stage-1 kernel with the
// compressed LSE, its torch reference tests/stage1/complse_online_softmax.py, and max_pooling_1d); FastDeploy
// docs/features/infllmv2_attention.md (the same formulas). Conventions and their choice: block_score.rs.
//
// With len = pos + t + 1 keys before and at query token t, a window of (size, stride) is visible when it is
// complete within them: v(len) = len < size ? 0 : (len - size) / stride + 1 windows. In the log2 domain (dot
// products scaled by scale * log2(e)), for each query head h' of KV head h's group:
//   lse[h'] = log2 sum_{j < v2} exp2(q_h' . C2[j])      (C1 instead of C2 while no C2 window is visible)
//   S[i]    = sum_{h' in group} exp2(q_h' . C1[i] - lse[h'])   for i < v1
//   score[b] = max of S[i] over the C1 windows overlapping block b, i in [v1(b * B), ceil((b + 1) * B / stride1)),
//              clipped to i < v1; 0 where no such window (blocks at or past the query's own block mostly).
//
// Both dispatches: workgroups of 64, one compressed key (C2 or C1 window) per invocation held in registers,
// looping over the query rows (token, head of the group) of the workgroup's tokens [t0, t0 + tokens_per_wg);
// every invocation needs the same query element at once. Defs: HD head_dim; LSE dispatch 1; SUBGROUPS (subgroups
// of >= 8): each of 8 lanes loads one of 8 consecutive query vec4s and subgroupBroadcast shares them (on lavapipe
// this halves decode time and quarters prefill time against 8 loads at one address); QU: q in a uniform
// array of 4096 vec4s (the whole q fits one binding, as in decode; without subgroups, uniform buffers load about
// 3x faster than storage at one address on lavapipe).
// Dispatch 1 (LSE): bindings 0 q [n_tokens, n_heads, HD] | 1 c1 [n_kv, n1, HD] | 2 c2 [n_kv, n2, HD]
//   | 3 part [n_tokens, n_heads, tiles, 2] (written: max and sum of exp2 over C2 windows [64 x, 64 x + 64)).
//   Grid (tiles = ceil(n2 / 64), n_kv, ceil(n_tokens / tokens_per_wg)); tiles x >= n_active exit (the host
//   counts the tiles the step's last token sees; later ones hold stale partials that are never read). Rows go in
//   batches of 16: scores to workgroup memory, then invocation r reduces row r over the 64 windows. Tokens with no
//   C2 window (start of a sequence) use the C1 windows instead, all in tile 0 (the host checks they fit in 64).
// Dispatch 2 (default): bindings 0 q | 1 c1 | 2 part (read) | 3 scores [n_tokens, n_kv, n_blocks] (written).
//   Grid (ceil(n_blocks / tile_blocks), n_kv, ceil(n_tokens / tokens_per_wg)). Workgroup (x, h, z) scores blocks
//   [x * tile_blocks, ..) for its tokens: (1) combines each row's tile partials into lse (workgroup memory); (2)
//   invocation i takes C1 window w_lo + i (the host sizes tiles so that their windows fit in 64) and sums the
//   group's terms for each token (0 for a token that does not see it); (3) max-pools the windows into the tile's
//   blocks. A tile none of the workgroup's tokens sees a window of writes zeros and skips (1) and (2).
// TREE (a speculative draft tree's step): binding 4 tree [n_tokens, TREE_W] u32 in both dispatches; token t sits at
//   position pos + its depth tree[t * TREE_W] (attention_decode's tree table) instead of pos + t. Binding 5 x1
//   [n_tokens, n_kv, HD] (both dispatches) and 6 x2 (LSE only): C1 window e1 and C2 window e2, the first ones the
//   root does not complete, along the path of each row at the depth where it completes (kv_compress's tree form); a
//   token that sees window e1 (e2) takes the copy of its ancestor at that depth (its path's) instead of the
//   cache's, which holds another path's or nothing. Windows past e1 (e2) come from the caches: the host keeps trees
//   shallower than a second window.

const HD4: u32 = HD / 4;
const WG: u32 = 64u;
const NEG: f32 = -1.0e30;
const MAX_TOKENS: u32 = 16u;  // = TOKENS_MAX in block_score.rs
const MAX_ROWS: u32 = 256u;   // = ROWS_MAX in block_score.rs
const BATCH: u32 = 16u;       // rows per reduction pass of dispatch 1

struct Params {
    n_tokens: u32,
    n_heads: u32,
    n_kv: u32,
    group: u32,        // n_heads / n_kv
    pos: u32,          // absolute position of token 0
    n1: u32,           // C1 windows in the cache
    size1: u32,
    stride1: u32,
    n2: u32,           // C2 windows in the cache
    size2: u32,
    stride2: u32,
    tiles: u32,        // C2 tiles (partials per row)
    n_active: u32,     // tiles computed this step (the rest are stale)
    block: u32,        // block size B (positions)
    n_blocks: u32,     // blocks per output row
    tile_blocks: u32,  // blocks per workgroup of dispatch 2
    tokens_per_wg: u32,
    scale: f32,        // softmax scale * log2(e)
    e1: u32,           // TREE: the C1 window each token has its own copy of (x1), and the C2 one (x2)
    e2: u32,
}

#if QU
@group(0) @binding(0) var<uniform> q: array<vec4<f32>, 4096>;              // [n_tokens, n_heads, HD], padded to 64 KiB
#else
@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;              // [n_tokens, n_heads, HD]
#endif
@group(0) @binding(1) var<storage, read> c1: array<vec4<f32>>;             // [n_kv, n1, HD]
#if TREE
@group(0) @binding(4) var<storage, read> tree: array<u32>;                 // [n_tokens, TREE_W]
@group(0) @binding(5) var<storage, read> x1: array<vec4<f32>>;             // [n_tokens, n_kv, HD]
#include "lib/tree_table.wgsl"

// The row of token t's ancestor at the depth where a window of (size, stride) with index e completes (t sees it).
fn ancestor(t: u32, e: u32, size: u32, stride: u32) -> u32 {
    return tree_path_slot(t, e * stride + size - 1u - p.pos);
}

// Token t's path's copy of C1 window e1 (KV head kvh) into c.
fn own_x1(t: u32, kvh: u32, c: ptr<function, array<vec4<f32>, HD4>>) {
    let a = ancestor(t, p.e1, p.size1, p.stride1);
    for (var d = 0u; d < HD4; d++) {
        (*c)[d] = x1[(a * p.n_kv + kvh) * HD4 + d];
    }
}
#endif
@group(1) @binding(0) var<uniform> p: Params;

// Absolute position of query token t (clamped to the last token).
fn position(t: u32) -> u32 {
    let tc = min(t, p.n_tokens - 1u);
#if TREE
    return p.pos + tree_row_depth(tc);
#else
    return p.pos + tc;
#endif
}

// Keys the tokens t0 .. t0 + nt see at most (the last one's; TREE: the deepest one's) and at least (the first's).
fn most_keys(t0: u32, nt: u32) -> u32 {
#if TREE
    var m = 0u;
    for (var t = t0; t < t0 + nt; t++) {
        m = max(m, position(t));
    }
    return m + 1u;
#else
    return p.pos + t0 + nt;
#endif
}
fn least_keys(t0: u32, nt: u32) -> u32 {
#if TREE
    var m = 0xffffffffu;
    for (var t = t0; t < t0 + nt; t++) {
        m = min(m, position(t));
    }
    return m + 1u;
#else
    return p.pos + t0 + 1u;
#endif
}

// Windows of (size, stride) complete within the first len positions.
fn complete(len: u32, size: u32, stride: u32) -> u32 {
    if (len < size) {
        return 0u;
    }
    return (len - size) / stride + 1u;
}

// Scaled dot product (log2 domain) of query row `row` (token * n_heads + head) with a key held in registers; `sl`:
// the invocation's lane in its subgroup, mod 8. SUBGROUPS: lane k loads query vec4 d + k of each 8 and broadcasts it to
// the subgroup (one load per 8 vec4s instead of 8: loads are the cost on CPU adapters). Every invocation of the
// subgroup must call it together.
fn qdot(row: u32, c: ptr<function, array<vec4<f32>, HD4>>, sl: u32) -> f32 {
    let qb = row * HD4;
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
#if SUBGROUPS
    var d = 0u;
    for (; d + 8u <= HD4; d += 8u) {
        let m = q[qb + d + sl];
        a0 += subgroupBroadcast(m, 0u) * (*c)[d];
        a1 += subgroupBroadcast(m, 1u) * (*c)[d + 1u];
        a0 += subgroupBroadcast(m, 2u) * (*c)[d + 2u];
        a1 += subgroupBroadcast(m, 3u) * (*c)[d + 3u];
        a0 += subgroupBroadcast(m, 4u) * (*c)[d + 4u];
        a1 += subgroupBroadcast(m, 5u) * (*c)[d + 5u];
        a0 += subgroupBroadcast(m, 6u) * (*c)[d + 6u];
        a1 += subgroupBroadcast(m, 7u) * (*c)[d + 7u];
    }
    if (d < HD4) {  // HD4 % 8 == 4 (head_dim 80)
        let m = q[qb + d + sl % 4u];
        a0 += subgroupBroadcast(m, 0u) * (*c)[d];
        a1 += subgroupBroadcast(m, 1u) * (*c)[d + 1u];
        a0 += subgroupBroadcast(m, 2u) * (*c)[d + 2u];
        a1 += subgroupBroadcast(m, 3u) * (*c)[d + 3u];
    }
#else
    for (var d = 0u; d < HD4; d += 4u) {
        a0 += q[qb + d] * (*c)[d] + q[qb + d + 2u] * (*c)[d + 2u];
        a1 += q[qb + d + 1u] * (*c)[d + 1u] + q[qb + d + 3u] * (*c)[d + 3u];
    }
#endif
    return dot(a0 + a1, vec4<f32>(1.0)) * p.scale;
}

#if LSE
@group(0) @binding(2) var<storage, read> c2: array<vec4<f32>>;             // [n_kv, n2, HD]
@group(0) @binding(3) var<storage, read_write> part: array<vec2<f32>>;     // [n_tokens, n_heads, tiles, 2]
#if TREE
@group(0) @binding(6) var<storage, read> x2: array<vec4<f32>>;             // [n_tokens, n_kv, HD]

// Token t's path's copy of C2 window e2 (KV head kvh) into c.
fn own_x2(t: u32, kvh: u32, c: ptr<function, array<vec4<f32>, HD4>>) {
    let a = ancestor(t, p.e2, p.size2, p.stride2);
    for (var d = 0u; d < HD4; d++) {
        (*c)[d] = x2[(a * p.n_kv + kvh) * HD4 + d];
    }
}
#endif

var<workgroup> sc: array<f32, BATCH * WG>;  // [BATCH rows, 64 windows] scores of the current batch

// Normalizer partials of C2 tile x for the rows (token, group head) of tokens t0 .. t0 + nt, invocation lid
// holding window x * 64 + lid. `fallback` (tile 0 at the start of a sequence, where some token sees no C2 window
// yet): such tokens use the C1 windows instead, invocation lid holding C1 window lid. Called with a constant
// `fallback`, so the common path carries no second key.
fn lse_tile(x: u32, kvh: u32, t0: u32, nt: u32, lid: u32, sl: u32, fallback: bool) {
    let j = x * WG + lid;
    let last = most_keys(t0, nt);  // keys the last (TREE: deepest) token sees
    var c2r: array<vec4<f32>, HD4>;
    if (j < min(complete(last, p.size2, p.stride2), p.n2)) {
        for (var d = 0u; d < HD4; d++) {
            c2r[d] = c2[(kvh * p.n2 + j) * HD4 + d];
        }
    }
    var c1r: array<vec4<f32>, HD4>;
    if (fallback && lid < min(complete(last, p.size1, p.stride1), p.n1)) {
        for (var d = 0u; d < HD4; d++) {
            c1r[d] = c1[(kvh * p.n1 + lid) * HD4 + d];
        }
    }
    // Rows r = tt * group + g in batches of BATCH; (tt, g) and the token's visibility advance row by row.
    var tt = 0u;
    var g = 0u;
    var vis2 = false;  // this invocation's C2 window is visible to token tt
    var vis1 = false;  // token tt sees no C2 window but this invocation's C1 window
    {
        let len = position(t0) + 1u;
        let v2 = min(complete(len, p.size2, p.stride2), p.n2);
        vis2 = j < v2;
        vis1 = fallback && v2 == 0u && lid < min(complete(len, p.size1, p.stride1), p.n1);
#if TREE
        if (vis2 && j == p.e2) {
            own_x2(t0, kvh, &c2r);
        }
        if (vis1 && lid == p.e1) {
            own_x1(t0, kvh, &c1r);
        }
#endif
    }
    let rows = nt * p.group;
    for (var r0 = 0u; r0 < rows; r0 += BATCH) {
        let nr = min(BATCH, rows - r0);
        for (var k = 0u; k < nr; k++) {
            let row = (t0 + tt) * p.n_heads + kvh * p.group + g;
            // Every invocation computes (keys it does not hold are zero), then drops what its token cannot see.
            var s = select(NEG, qdot(row, &c2r, sl), vis2);
            if (fallback) {
                s = select(s, qdot(row, &c1r, sl), vis1);
            }
            sc[k * WG + lid] = s;
            g += 1u;
            if (g == p.group) {
                g = 0u;
                tt += 1u;
                let len = position(t0 + tt) + 1u;
                let v2 = min(complete(len, p.size2, p.stride2), p.n2);
                vis2 = j < v2;
                vis1 = fallback && v2 == 0u && lid < min(complete(len, p.size1, p.stride1), p.n1);
#if TREE
                // The next token's own copies of the windows its path completes (past the last token: unused).
                if (vis2 && j == p.e2 && tt < nt) {
                    own_x2(t0 + tt, kvh, &c2r);
                }
                if (vis1 && lid == p.e1 && tt < nt) {
                    own_x1(t0 + tt, kvh, &c1r);
                }
#endif
            }
        }
        workgroupBarrier();
        if (lid < nr) {
            var m = NEG;
            for (var i = 0u; i < WG; i++) {
                m = max(m, sc[lid * WG + i]);
            }
            var l = 0.0;
            if (m > NEG) {
                for (var i = 0u; i < WG; i++) {
                    l += exp2(sc[lid * WG + i] - m);
                }
            }
            let r = r0 + lid;
            let row = (t0 + r / p.group) * p.n_heads + kvh * p.group + r % p.group;
            part[row * p.tiles + x] = vec2<f32>(m, l);
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
#if SUBGROUPS
    @builtin(subgroup_invocation_id) sgl: u32,
#endif
) {
#if SUBGROUPS
    let sl = sgl % 8u;
#else
    let sl = 0u;
#endif
    let x = wg.x;
    let t0 = wg.z * p.tokens_per_wg;
    let nt = min(p.tokens_per_wg, p.n_tokens - t0);
    if (x >= p.n_active) {
        return;
    }
    if (x == 0u && least_keys(t0, nt) < p.size2) {
        lse_tile(x, wg.y, t0, nt, lid, sl, true);
    } else {
        lse_tile(x, wg.y, t0, nt, lid, sl, false);
    }
}
#else
@group(0) @binding(2) var<storage, read> part: array<vec2<f32>>;           // [n_tokens, n_heads, tiles, 2]
@group(0) @binding(3) var<storage, read_write> scores: array<f32>;         // [n_tokens, n_kv, n_blocks]

var<workgroup> lse: array<f32, MAX_ROWS>;         // [tokens of the workgroup, group] log2 normalizers
var<workgroup> sc: array<f32, MAX_TOKENS * WG>;   // [tokens of the workgroup, 64] S of window w_lo + i

// End (exclusive) of the C1 windows that start inside blocks 0 ..= b: ceil((b + 1) * B / stride1).
fn block_end(b: u32) -> u32 {
    return ((b + 1u) * p.block + p.stride1 - 1u) / p.stride1;
}

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
#if SUBGROUPS
    @builtin(subgroup_invocation_id) sgl: u32,
#endif
) {
#if SUBGROUPS
    let sl = sgl % 8u;
#else
    let sl = 0u;
#endif
    let kvh = wg.y;
    let t0 = wg.z * p.tokens_per_wg;
    let nt = min(p.tokens_per_wg, p.n_tokens - t0);
    let b0 = wg.x * p.tile_blocks;
    let nbt = min(p.tile_blocks, p.n_blocks - b0);
    // The tile's windows [w_lo, w_hi): those overlapping its blocks that the workgroup's last token sees.
    let w_lo = complete(b0 * p.block, p.size1, p.stride1);
    let w_hi = min(min(block_end(b0 + nbt - 1u), p.n1), complete(most_keys(t0, nt), p.size1, p.stride1));
    if (w_lo < w_hi) {
        // (1) Each row's normalizer from the tile partials.
        for (var r = lid; r < nt * p.group; r += WG) {
            let row = ((t0 + r / p.group) * p.n_heads + kvh * p.group + r % p.group) * p.tiles;
            var mx = NEG;
            for (var s = 0u; s < p.n_active; s++) {
                mx = max(mx, part[row + s].x);
            }
            var sum = 0.0;
            for (var s = 0u; s < p.n_active; s++) {
                let ml = part[row + s];
                sum += ml.y * exp2(ml.x - mx);
            }
            lse[r] = select(0.0, mx + log2(sum), sum > 0.0);
        }
        workgroupBarrier();
        // (2) S of window w for every token of the workgroup (0 for tokens that do not see it). Every
        // invocation computes (those past the tile on its last window), then keeps what is visible.
        let w = w_lo + lid;
        var cr: array<vec4<f32>, HD4>;
        for (var d = 0u; d < HD4; d++) {
            cr[d] = c1[(kvh * p.n1 + min(w, w_hi - 1u)) * HD4 + d];
        }
        for (var tt = 0u; tt < nt; tt++) {
            let row = (t0 + tt) * p.n_heads + kvh * p.group;
#if TREE
            // A token that sees window e1 takes its own copy of it.
            if (w == p.e1 && w < complete(position(t0 + tt) + 1u, p.size1, p.stride1)) {
                own_x1(t0 + tt, kvh, &cr);
            }
#endif
            var acc = 0.0;
            for (var g = 0u; g < p.group; g++) {
                acc += exp2(qdot(row + g, &cr, sl) - lse[tt * p.group + g]);
            }
            sc[tt * WG + lid] = select(0.0, acc, w < complete(position(t0 + tt) + 1u, p.size1, p.stride1));
        }
        workgroupBarrier();
    }
    // (3) Block max over its visible windows; 0 where it has none.
    for (var i = lid; i < nt * nbt; i += WG) {
        let tt = i / nbt;
        let b = b0 + i % nbt;
        let end = min(block_end(b), min(w_hi, complete(position(t0 + tt) + 1u, p.size1, p.stride1)));
        var best = 0.0;
        for (var w = complete(b * p.block, p.size1, p.stride1); w < end; w++) {
            best = max(best, sc[tt * WG + w - w_lo]);
        }
        scores[((t0 + tt) * p.n_kv + kvh) * p.n_blocks + b] = best;
    }
}
#endif
