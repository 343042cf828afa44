// tree_select_rerank: EAGLE-2's rerank on the device. From the NC candidates of every expansion round (rows of
// [score bits, token, parent row or ROOT], parents before their children: tree_select_collect's list), the SIZE best
// by score (descending in f32's total order, then by row) are kept; a kept candidate whose parent was not kept goes,
// and so do its descendants. The draft tree's nodes are then the spine (from the root, the best kept child each
// time) followed by the other kept candidates in row order, each after its parent. Node m (1 ..) gets token
// ids[m - 1] and table row m (attention_decode's TREE_W form: depth, the path's slots from the root, then its own
// slot m repeated); row 0 is the root's (zeros; its token is the caller's). Rows past the nodes (candidates dropped
// as orphans) are padding: depth 0 in their own slot, token 0, never on an accepted path.
// Source: Li et al., "EAGLE-2" (2024), the rerank phase; the host's form is ops::tree_select::reference.
// Bindings: 0 cands [NC, 3] u32 | 1 ids [SIZE] u32 (written) | 2 table [SIZE + 1, TREE_W] u32 (written).
// Method: SIZE passes, each taking the best candidate after the last one taken (a strided scan per invocation,
// then a tree reduction in workgroup memory); invocation 0 then builds the tree from the SIZE kept (SIZE <= 63).
// Grid: one workgroup of 64 invocations.

const ROOT: u32 = 0xffffffffu;
const NONE: u32 = 0xffffffffu;
const MAX_DEPTH: u32 = TREE_W - 2u;

struct Params {
    nc: u32,    // candidates
    size: u32,  // candidates kept (at most NC and 63)
}

@group(0) @binding(0) var<storage, read> cands: array<u32>;         // [NC, 3]
@group(0) @binding(1) var<storage, read_write> ids: array<u32>;     // [SIZE]
@group(0) @binding(2) var<storage, read_write> table: array<u32>;   // [SIZE + 1, TREE_W]
@group(1) @binding(0) var<uniform> p: Params;

var<workgroup> part_key: array<u32, 64>;
var<workgroup> part_row: array<u32, 64>;
var<workgroup> kept: array<u32, 64>;  // the kept candidates' rows, best first

// An order key of f32 bits: unsigned comparison of keys is f32's total order (-NaN < -inf < ... < +inf < +NaN).
fn order_key(b: u32) -> u32 {
    return select(b ^ 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

// Whether (key a, row ra) comes before (key b, row rb): a better score, or an equal one and a lower row.
fn before(a: u32, ra: u32, b: u32, rb: u32) -> bool {
    return rb == NONE || (ra != NONE && (a > b || (a == b && ra < rb)));
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) t: u32) {
    var last_key = 0u;
    var last = NONE;
    for (var i = 0u; i < p.size; i++) {
        var best = NONE;
        var best_key = 0u;
        for (var c = t; c < p.nc; c += 64u) {
            let key = order_key(cands[c * 3u]);
            let after = last == NONE || key < last_key || (key == last_key && c > last);
            if (after && before(key, c, best_key, best)) {
                best = c;
                best_key = key;
            }
        }
        part_key[t] = best_key;
        part_row[t] = best;
        workgroupBarrier();
        for (var s = 32u; s > 0u; s >>= 1u) {
            if (t < s && before(part_key[t + s], part_row[t + s], part_key[t], part_row[t])) {
                part_key[t] = part_key[t + s];
                part_row[t] = part_row[t + s];
            }
            workgroupBarrier();
        }
        last = part_row[0];
        last_key = part_key[0];
        if (t == 0u) {
            kept[i] = last;
        }
        workgroupBarrier();
    }
    if (t != 0u) {
        return;
    }
    let n = p.size;
    // The kept rows in row order (ord), and which survive: the root's children, and those whose parent survives
    // (a parent's row is below its child's).
    var ord: array<u32, 64>;
    var live: array<bool, 64>;
    var node: array<u32, 64>;  // the node each one became (0: none yet)
    for (var i = 0u; i < n; i++) {
        var j = i;
        while (j > 0u && ord[j - 1u] > kept[i]) {
            ord[j] = ord[j - 1u];
            j--;
        }
        ord[j] = kept[i];
    }
    for (var i = 0u; i < n; i++) {
        let parent = cands[ord[i] * 3u + 2u];
        var ok = parent == ROOT;
        for (var j = 0u; j < i; j++) {
            ok = ok || (ord[j] == parent && live[j]);
        }
        live[i] = ok;
        node[i] = 0u;
    }
    // The spine: from the root, the best surviving child each time (kept is best first).
    var spine: array<u32, 64>;
    var spine_len = 0u;
    var at = ROOT;
    for (var s = 0u; s < n; s++) {
        var next = NONE;
        for (var i = 0u; i < n && next == NONE; i++) {
            let c = kept[i];
            var ok = false;
            for (var j = 0u; j < n; j++) {
                ok = ok || (ord[j] == c && live[j]);
            }
            if (ok && cands[c * 3u + 2u] == at) {
                next = c;
            }
        }
        if (next == NONE) {
            break;
        }
        spine[spine_len] = next;
        spine_len++;
        at = next;
    }
    for (var w = 0u; w < TREE_W; w++) {
        table[w] = 0u;
    }
    // Place the spine, then the others in row order, each under its parent's node.
    var count = 0u;
    for (var q = 0u; q < spine_len + n; q++) {
        var i = 0u;
        if (q < spine_len) {
            while (ord[i] != spine[q]) {
                i++;
            }
        } else {
            i = q - spine_len;
            if (!live[i] || node[i] != 0u) {
                continue;
            }
        }
        let parent = cands[ord[i] * 3u + 2u];
        var pn = NONE;
        if (parent == ROOT) {
            pn = 0u;
        } else {
            for (var j = 0u; j < n; j++) {
                if (ord[j] == parent && node[j] != 0u) {
                    pn = node[j];
                }
            }
        }
        if (pn == NONE || table[pn * TREE_W] >= MAX_DEPTH) {
            continue;
        }
        count++;
        node[i] = count;
        let d = table[pn * TREE_W];
        let o = count * TREE_W;
        table[o] = d + 1u;
        for (var s = 1u; s <= d + 1u; s++) {
            table[o + s] = table[pn * TREE_W + s];
        }
        for (var s = d + 2u; s < TREE_W; s++) {
            table[o + s] = count;
        }
        ids[count - 1u] = cands[ord[i] * 3u + 1u];
    }
    for (var m = count + 1u; m <= n; m++) {
        table[m * TREE_W] = 0u;
        for (var s = 1u; s < TREE_W; s++) {
            table[m * TREE_W + s] = m;
        }
        ids[m - 1u] = 0u;
    }
}
