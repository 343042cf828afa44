// block_topk: InfLLM-v2 block selection (stage 5). For each query token and KV head, the KV blocks its sparse
// attention reads: the init blocks, the local blocks, and the best-scored other blocks before them, as ascending
// block ids padded with EMPTY. The rule and its sources are in src/ops/block_topk.rs.
// Source: Zhao et al., "InfLLM-V2: Dense-Sparse Switchable Attention for Seamless Short-to-Long Adaptation"
// (arXiv 2509.24663), block selection as in the MiniCPM4 model code.
//
// Bindings: 0 scores [rows, nb] f32 (rows = n_tokens * n_kv, row = token * n_kv + kv head; only blocks < qb - local
//           are read) | 1 sel [rows, budget] u32 (written)
// TREE (a speculative draft tree's step): 2 tree [n_tokens, TREE_W] u32, token t at position pos + its depth
//           tree[t * TREE_W] (attention_decode's tree table) instead of pos + t.
// Params: rows, n_kv, nb, budget, block_size, init_blocks, local_blocks, pos (absolute position of token 0).
// Method: query block qb = min(position / block_size, nb - 1). Forced: b < init_blocks and qb - local_blocks
//   <= b <= qb (clipped to 0 ..= qb). Candidates: init_blocks <= b < qb - local_blocks. k = min(budget - forced,
//   candidates) of them are taken, by (score desc, id asc): a radix select over order keys (a monotone map of the
//   f32 bits to u32, NaN lowest) finds the k-th largest key t in 8 passes of 4 bits (a 16-bin histogram each);
//   keys above t are taken, and of the keys equal to t the `need` lowest ids. Then one ascending pass writes the
//   selected ids, so the output comes out sorted.
// Variants (defs WG, the workgroup size, and SERIAL):
//   default (GPUs): one workgroup per row, folded into y past the dimension limit. Invocation i owns the contiguous
//     block range [i * per, (i + 1) * per) of 0 ..= qb; histograms in workgroup atomics; exclusive scans of the
//     per-invocation counts give each invocation its rank among equal keys and its write offset.
//   SERIAL (CPU adapters, where barriers, workgroup atomics and scattered private writes are expensive): one
//     invocation per row, grid ceil(rows / WG) (folded into y), no barriers; the histogram is 4 private vec4
//     counters, each key compared with all 16 bins (so BINS must stay 16).

const EMPTY: u32 = 0xffffffffu;
const BINS: u32 = 16u;  // radix of one pass (4 bits)

struct Params {
    rows: u32,
    n_kv: u32,
    nb: u32,          // blocks per row of scores
    budget: u32,      // slots per row of sel
    block_size: u32,
    init_blocks: u32,
    local_blocks: u32,
    pos: u32,
}

@group(0) @binding(0) var<storage, read> scores: array<f32>;    // [rows, nb]
@group(0) @binding(1) var<storage, read_write> sel: array<u32>; // [rows, budget]
#if TREE
@group(0) @binding(2) var<storage, read> tree: array<u32>;      // [n_tokens, TREE_W]
#include "lib/tree_table.wgsl"
#endif
@group(1) @binding(0) var<uniform> p: Params;

// Absolute position of query token t.
fn position(t: u32) -> u32 {
#if TREE
    return p.pos + tree_row_depth(t);
#else
    return p.pos + t;
#endif
}

// Monotone map of f32 bits to u32 keys: a larger number gets a larger key; NaN -> 1 (below -inf); -0 -> the key of
// +0. Candidate keys are all >= 1.
fn order_key(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    let mag = b & 0x7fffffffu;
    if (mag > 0x7f800000u) {
        return 1u;
    }
    if (mag == 0u) {
        return 0x80000000u;
    }
    return select(b | 0x80000000u, ~b, (b >> 31u) == 1u);
}

// Where a row's blocks stand: the forced blocks are 0 .. cand_lo and local_lo ..= qb, the candidates cand_lo ..
// local_lo, of which k are taken.
struct Row {
    base: u32,      // offset of the row in scores
    qb: u32,
    local_lo: u32,
    cand_lo: u32,
    n_forced: u32,
    k: u32,
}

fn row_of(row: u32) -> Row {
    let token = row / p.n_kv;
    let qb = min(position(token) / p.block_size, p.nb - 1u);
    let local_lo = qb - min(qb, p.local_blocks);
    let cand_lo = min(p.init_blocks, local_lo);
    let n_cand = local_lo - cand_lo;
    let n_forced = cand_lo + (qb + 1u - local_lo);
    let k = min(select(0u, p.budget - n_forced, p.budget > n_forced), n_cand);
    return Row(row * p.nb, qb, local_lo, cand_lo, n_forced, k);
}

// The threshold when no select is needed: k == 0 takes nothing (a key above all), k == every candidate takes all
// (keys >= 1 > 0).
fn trivial_threshold(r: Row) -> u32 {
    return select(0u, EMPTY, r.k == 0u);
}

// The bin holding the need-th largest key of the current prefix, counting down from the top bin, given the bin
// counts; returns (bin, need left within it).
fn pick_bin(counts: array<u32, BINS>, need: u32) -> vec2<u32> {
    var c = counts;  // a variable, so that it can be indexed at run time
    var cum = 0u;
    var bin = BINS - 1u;
    loop {
        if (cum + c[bin] >= need || bin == 0u) {
            break;
        }
        cum += c[bin];
        bin -= 1u;
    }
    return vec2<u32>(bin, need - cum);
}

// Write the selected blocks of lo .. hi in ascending order from sel[o]: forced blocks, candidate keys above t, and
// keys equal to t while their rank among equal keys (starting at eq_rank) is below need. Returns the next offset.
fn emit(r: Row, lo: u32, hi: u32, t: u32, need: u32, eq_rank: u32, o0: u32) -> u32 {
    var o = o0;
    var rank = eq_rank;
    for (var b = lo; b < hi; b++) {
        var take = true;
        if (b >= r.cand_lo && b < r.local_lo) {
            let key = order_key(scores[r.base + b]);
            let eq = key == t;
            take = key > t || (eq && rank < need);
            rank += select(0u, 1u, eq);
        }
        if (take) {
            sel[o] = b;
            o += 1u;
        }
    }
    return o;
}

#if SERIAL
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = gid.x + gid.y * nwg.x * WG;
    if (row >= p.rows) {
        return;
    }
    let r = row_of(row);
    var t = trivial_threshold(r);
    var need = 0u;
    if (r.k > 0u && r.k < r.local_lo - r.cand_lo) {
        var prefix = 0u;
        var mask = 0u;
        need = r.k;
        for (var d = 0u; d < 8u; d++) {
            let shift = 28u - 4u * d;
            // The 16 bin counts in 4 vectors, each key compared with all bins: no scatter into a private array
            // (per-lane scalar code on SIMD CPUs).
            var c0 = vec4<u32>(0u);
            var c1 = vec4<u32>(0u);
            var c2 = vec4<u32>(0u);
            var c3 = vec4<u32>(0u);
            let lanes = vec4<u32>(0u, 1u, 2u, 3u);
            let zero = vec4<u32>(0u);
            let one = vec4<u32>(1u);
            for (var b = r.cand_lo; b < r.local_lo; b++) {
                let key = order_key(scores[r.base + b]);
                // Keys outside the prefix go to bin 16: no counter.
                let d = vec4<u32>(select(BINS, (key >> shift) & (BINS - 1u), (key & mask) == prefix));
                c0 += select(zero, one, d == lanes);
                c1 += select(zero, one, d == lanes + 4u);
                c2 += select(zero, one, d == lanes + 8u);
                c3 += select(zero, one, d == lanes + 12u);
            }
            let c = array<u32, BINS>(
                c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w, c2.x, c2.y, c2.z, c2.w, c3.x, c3.y, c3.z, c3.w,
            );
            let pick = pick_bin(c, need);
            need = pick.y;
            prefix |= pick.x << shift;
            mask |= (BINS - 1u) << shift;
        }
        t = prefix;
    }
    let o = emit(r, 0u, r.qb + 1u, t, need, 0u, row * p.budget);
    for (var i = o; i < (row + 1u) * p.budget; i++) {
        sel[i] = EMPTY;
    }
}
#else
var<workgroup> hist: array<atomic<u32>, BINS>;  // [BINS] key counts of the current radix pass
var<workgroup> part: array<u32, WG>;            // [WG] per-invocation counts for the scans

// Sum of part[0 .. lid] (call between barriers).
fn prefix_of(lid: u32) -> u32 {
    var s = 0u;
    for (var i = 0u; i < lid; i++) {
        s += part[i];
    }
    return s;
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let r = row_of(row);
    // This invocation's blocks, clipped to the candidates for the select.
    let per = (r.qb + 1u + WG - 1u) / WG;
    let lo = min(lid * per, r.qb + 1u);
    let hi = min(lo + per, r.qb + 1u);
    let c_lo = clamp(lo, r.cand_lo, r.local_lo);
    let c_hi = clamp(hi, r.cand_lo, r.local_lo);

    var t = trivial_threshold(r);
    var need = 0u;
    if (r.k > 0u && r.k < r.local_lo - r.cand_lo) {
        var prefix = 0u;
        var mask = 0u;
        need = r.k;
        for (var d = 0u; d < 8u; d++) {
            let shift = 28u - 4u * d;
            if (lid < BINS) {
                atomicStore(&hist[lid], 0u);
            }
            workgroupBarrier();
            for (var b = c_lo; b < c_hi; b++) {
                let key = order_key(scores[r.base + b]);
                if ((key & mask) == prefix) {
                    atomicAdd(&hist[(key >> shift) & (BINS - 1u)], 1u);
                }
            }
            workgroupBarrier();
            var c: array<u32, BINS>;
            for (var i = 0u; i < BINS; i++) {
                c[i] = atomicLoad(&hist[i]);
            }
            let pick = pick_bin(c, need);
            need = pick.y;
            prefix |= pick.x << shift;
            mask |= (BINS - 1u) << shift;
            workgroupBarrier();  // every invocation has read hist before the next pass clears it
        }
        t = prefix;
    }

    // Rank among the keys equal to t: the count of equal keys in the ranges before this one.
    var n_eq = 0u;
    for (var b = c_lo; b < c_hi; b++) {
        n_eq += select(0u, 1u, order_key(scores[r.base + b]) == t);
    }
    part[lid] = n_eq;
    workgroupBarrier();
    let eq_rank = prefix_of(lid);
    workgroupBarrier();

    // Count this range's selected blocks (the forced ones are the range outside the candidates), then write them
    // at the offset the scan gives.
    var n_sel = (hi - lo) - (c_hi - c_lo);
    var rank = eq_rank;
    for (var b = c_lo; b < c_hi; b++) {
        let key = order_key(scores[r.base + b]);
        let eq = key == t;
        n_sel += select(0u, 1u, key > t || (eq && rank < need));
        rank += select(0u, 1u, eq);
    }
    part[lid] = n_sel;
    workgroupBarrier();
    _ = emit(r, lo, hi, t, need, eq_rank, row * p.budget + prefix_of(lid));
    for (var i = r.n_forced + r.k + lid; i < p.budget; i += WG) {
        sel[row * p.budget + i] = EMPTY;
    }
}
#endif
