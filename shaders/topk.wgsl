// topk: the k largest entries of each row of x, as indices and values sorted by value descending, ties to the lower
// index. NaN counts as smaller than every number (-inf included); -0 and +0 are equal. argmax is k = 1.
// Bindings: 0 x [rows, n] f32 | 1 ids [rows, k] u32 (written) | 2 vals [rows, k] f32 (written)
//           | 3 part [rows, slices, k, 2] u32: (key, index) winners of each slice (written by phase 0, read by 2)
// Params: n, k, slices, slice_len, phase, groups.
// Phases: 0 scans slice s of row r and writes its top-k to part; 1 scans a whole row into ids/vals; 2 merges the
//   slices' candidates in part into ids/vals. Grid: phase 0 rows * slices workgroups (workgroup w: row w / slices,
//   slice w % slices), phases 1 and 2 rows workgroups, all of WG invocations, folded into y past the dimension limit.
// Method: each invocation scans groups of 4 elements strided by 4 * WG (so its indices rise, and a strict `>` keeps
//   ties at the lower index) into a private top-k list sorted by (value desc, index asc), skipping what cannot beat
//   the best list bar in its subgroup; then k rounds of a workgroup argmax over the lists' heads pop the winners in
//   order. KMAX = 1 (ARGMAX) keeps one best per invocation instead of a list.
//   Values compare as u32 keys (a monotone map of the bits), so subnormals, signed zeros and NaN order the same on
//   every adapter, flushing subnormals or not. Values written are re-read from x (exact bits, NaN payloads kept).
// Defs: KMAX (list capacity >= k: 1, 8, 16, 32 or 64), ARGMAX (KMAX = 1), WG (workgroup size, a power of two),
//   SUBGROUPS (subgroup reductions in the merge; else a workgroup-shared tree).

struct Params {
    n: u32,         // row length
    k: u32,         // entries kept per row, 1..=KMAX
    slices: u32,    // slices per row (phases 0 and 2)
    slice_len: u32, // elements per slice, a multiple of 4 (phase 0); n when unsplit
    phase: u32,     // 0, 1 or 2 (above)
    groups: u32,    // workgroups that hold work (the folded grid may have a few more)
}

@group(0) @binding(0) var<storage, read> x: array<f32>;          // [rows, n]
@group(0) @binding(1) var<storage, read_write> ids: array<u32>;  // [rows, k]
@group(0) @binding(2) var<storage, read_write> vals: array<f32>; // [rows, k]
@group(0) @binding(3) var<storage, read_write> part: array<u32>; // [rows, slices, k, 2] (key, index)
@group(1) @binding(0) var<uniform> p: Params;

// An empty list slot: key 0 is below every real key (NaN maps to 1), so it never wins while a real entry is left.
const EMPTY_IDX = 0xffffffffu;

// Monotone map of f32 bits to u32 (a larger value gives a larger key): NaN -> 1, -0 -> the key of +0.
fn key4(v: vec4<f32>) -> vec4<u32> {
    let b = bitcast<vec4<u32>>(v);
    let mag = b & vec4<u32>(0x7fffffffu);
    let neg = (b >> vec4<u32>(31u)) == vec4<u32>(1u);
    var k = select(b | vec4<u32>(0x80000000u), ~b, neg);
    k = select(k, vec4<u32>(0x80000000u), mag == vec4<u32>(0u));
    return select(k, vec4<u32>(1u), mag > vec4<u32>(0x7f800000u));
}

// Keys of row elements i..i+3 (row starting at `base`); positions at or past `end` give key 0 and are never kept.
fn load_keys(base: u32, i: u32, end: u32) -> vec4<u32> {
    let last = end - 1u;
    let v = vec4<f32>(
        x[base + min(i, last)],
        x[base + min(i + 1u, last)],
        x[base + min(i + 2u, last)],
        x[base + min(i + 3u, last)],
    );
    let inside = (vec4<u32>(i) + vec4<u32>(0u, 1u, 2u, 3u)) < vec4<u32>(end);
    return select(vec4<u32>(0u), key4(v), inside);
}

// Is (ka, ia) ahead of (kb, ib): larger key, or the same key at a lower index.
fn better(ka: u32, ia: u32, kb: u32, ib: u32) -> bool {
    return ka > kb || (ka == kb && ia < ib);
}

#if SUBGROUPS
// Per-subgroup winners, at most WG / 4 subgroups (4 is the smallest subgroup size WebGPU allows). Two buffers,
// alternating rounds, so that one barrier per round suffices (a round's writes never meet the last round's reads).
const NSG = WG / 4u;
var<workgroup> sk: array<u32, 2u * NSG>; // [2, NSG] keys
var<workgroup> si: array<u32, 2u * NSG>; // [2, NSG] indices

// The subgroup's best (key, index): max of keys, then min index among the invocations holding it.
fn sg_best(k: u32, i: u32) -> vec2<u32> {
    let mk = subgroupMax(k);
    return vec2<u32>(mk, subgroupMin(select(EMPTY_IDX, i, k == mk)));
}

// The workgroup's best from each subgroup's: the subgroups' first invocations post theirs, then every invocation
// folds them (one barrier per call). Call in uniform control flow, alternating `buf`.
fn wg_fold(b: vec2<u32>, buf: u32, lane: u32, sg: u32, n_sg: u32) -> vec2<u32> {
    let o = buf * NSG;
    if (lane == 0u && sg < NSG) {
        sk[o + sg] = b.x;
        si[o + sg] = b.y;
    }
    workgroupBarrier();
    var bk = sk[o];
    var bi = si[o];
    for (var s = 1u; s < min(n_sg, NSG); s++) {
        let ck = sk[o + s];
        let ci = si[o + s];
        if (better(ck, ci, bk, bi)) {
            bk = ck;
            bi = ci;
        }
    }
    return vec2<u32>(bk, bi);
}
#else
// Tree reduction in workgroup memory. Two buffers, alternating rounds: every invocation reads slot 0 at the end of a
// round while the next round may already be writing, so that round writes the other buffer.
var<workgroup> tk: array<u32, 2u * WG>; // [2, WG] keys
var<workgroup> ti: array<u32, 2u * WG>; // [2, WG] indices

fn wg_best(k: u32, i: u32, buf: u32, lid: u32) -> vec2<u32> {
    let o = buf * WG;
    tk[o + lid] = k;
    ti[o + lid] = i;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let ck = tk[o + lid + s];
            let ci = ti[o + lid + s];
            if (better(ck, ci, tk[o + lid], ti[o + lid])) {
                tk[o + lid] = ck;
                ti[o + lid] = ci;
            }
        }
        workgroupBarrier();
    }
    return vec2<u32>(tk[o], ti[o]);
}
#endif

// Write winner r of (row, slice): to part in phase 0, else to ids and vals (the value re-read from x).
fn emit(row: u32, slice: u32, r: u32, w: vec2<u32>) {
    if (p.phase == 0u) {
        let o = 2u * ((row * p.slices + slice) * p.k + r);
        part[o] = w.x;
        part[o + 1u] = w.y;
    } else {
        ids[row * p.k + r] = w.y;
        vals[row * p.k + r] = x[row * p.n + w.y];
    }
}

#if ARGMAX
// (the argmax path keeps a single best per invocation, no list)
#else
var<private> lk: array<u32, KMAX>; // this invocation's list: keys, sorted descending
var<private> li: array<u32, KMAX>; // indices (ascending among equal keys)

// Insert (key, idx) into the list of length kk; the caller checked that it beats the last slot.
fn insert(kk: u32, key: u32, idx: u32) {
    var j = kk - 1u;
    loop {
        if (j == 0u) {
            break;
        }
        let pk = lk[j - 1u];
        let pi = li[j - 1u];
        if (!better(key, idx, pk, pi)) {
            break;
        }
        lk[j] = pk;
        li[j] = pi;
        j -= 1u;
    }
    lk[j] = key;
    li[j] = idx;
}
#endif

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
#if SUBGROUPS
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) n_sg: u32,
#endif
) {
    let w = wid.x + wid.y * nwg.x;
    if (w >= p.groups) {
        return;
    }
    var row = w;
    var slice = 0u;
    if (p.phase == 0u) {
        row = w / p.slices;
        slice = w % p.slices;
    }
    let base = row * p.n;
    let lo = slice * p.slice_len;
    let end = min(lo + p.slice_len, p.n);
    let kk = p.k;
#if ARGMAX
    var bk = 0u;
    var bi = EMPTY_IDX;
    if (p.phase == 2u) {
        let cb = row * p.slices;
        for (var j = lid; j < p.slices; j += WG) {
            let ck = part[2u * (cb + j)];
            let ci = part[2u * (cb + j) + 1u];
            if (better(ck, ci, bk, bi)) {
                bk = ck;
                bi = ci;
            }
        }
    } else {
        for (var i = lo + 4u * lid; i < end; i += 4u * WG) {
            let kv = load_keys(base, i, end);
            let m = max(max(kv.x, kv.y), max(kv.z, kv.w));
            if (m > bk) {
                bk = m;
                bi = i + select(select(select(3u, 2u, kv.z == m), 1u, kv.y == m), 0u, kv.x == m);
            }
        }
    }
#if SUBGROUPS
    let best = wg_fold(sg_best(bk, bi), 0u, lane, sg, n_sg);
#else
    let best = wg_best(bk, bi, 0u, lid);
#endif
    if (lid == 0u) {
        emit(row, slice, 0u, best);
    }
#else
    for (var j = 0u; j < kk; j++) {
        lk[j] = 0u;
        li[j] = EMPTY_IDX;
    }
    var tkey = 0u; // key of the last slot: the bar a new entry must beat
    var tidx = EMPTY_IDX;
    if (p.phase == 2u) {
        let cb = row * p.slices * kk;
        let count = p.slices * kk;
        for (var j = lid; j < count; j += WG) {
            let ck = part[2u * (cb + j)];
            let ci = part[2u * (cb + j) + 1u];
            if (better(ck, ci, tkey, tidx)) {
                insert(kk, ck, ci);
                tkey = lk[kk - 1u];
                tidx = li[kk - 1u];
            }
        }
    } else {
        // Indices rise along this loop, past every index already in a list: a key equal to a list's bar never
        // beats it. The trip count is the same for the whole workgroup (lanes past `end` see empty keys), which
        // keeps the subgroup op in uniform control flow.
        for (var g = lo; g < end; g += 4u * WG) {
            let i = g + 4u * lid;
            let kv = load_keys(base, i, end);
#if SUBGROUPS
            // Any list's bar in the subgroup bounds the row's k-th key from below (that list holds k entries at or
            // above it, all at lower indices), so a key not above it can be skipped even if it beats this list's.
            let shared_bar = subgroupMax(tkey);
#else
            let shared_bar = 0u;
#endif
            let bar = max(shared_bar, tkey) + 1u;
            if (any(kv >= vec4<u32>(bar))) {
                if (kv.x >= max(bar, tkey + 1u)) {
                    insert(kk, kv.x, i);
                    tkey = lk[kk - 1u];
                }
                if (kv.y >= max(bar, tkey + 1u)) {
                    insert(kk, kv.y, i + 1u);
                    tkey = lk[kk - 1u];
                }
                if (kv.z >= max(bar, tkey + 1u)) {
                    insert(kk, kv.z, i + 2u);
                    tkey = lk[kk - 1u];
                }
                if (kv.w >= max(bar, tkey + 1u)) {
                    insert(kk, kv.w, i + 3u);
                    tkey = lk[kk - 1u];
                }
            }
        }
    }
    // k rounds: the workgroup's best head wins round r; its owner moves to its next entry.
    var h = 0u;
    for (var r = 0u; r < kk; r++) {
        var hk = 0u;
        var hi = EMPTY_IDX;
        if (h < kk) {
            hk = lk[h];
            hi = li[h];
        }
#if SUBGROUPS
        let best = wg_fold(sg_best(hk, hi), r & 1u, lane, sg, n_sg);
#else
        let best = wg_best(hk, hi, r & 1u, lid);
#endif
        if (hi == best.y && hk == best.x) {
            h += 1u;
        }
        if (lid == 0u) {
            emit(row, slice, r, best);
        }
    }
#endif
}
