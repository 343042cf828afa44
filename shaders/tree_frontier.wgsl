// tree_frontier: one round of EAGLE-2's draft-tree expansion on the device. Each row r of the last round's frontier
// (a node of the draft tree, cumulative log-probability scores[r]) proposes its K best children (their tokens and
// logits from topk, the row's log-sum-exp lse[r]); a child's score is scores[r] + (logit - lse[r]), in f32. The
// KEEP best children of all, by score (descending, in f32's total order) and then by candidate index c = r K + j
// (ascending), become the next frontier, in that order: their tokens, their tree-table rows (the parent's path with
// the child's own slot SLOT0 + i appended: attention_decode's TREE_W form) and scores, and each one's parent row
// (which row's predicted feature an EAGLE head feeds it) and candidate index (where tree_select finds it).
// Source: Li et al., "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees" (2024), the
// expansion phase; the host's form is generate::tree::expand, which takes the same choices from the same numbers.
// Bindings: 0 scores [F] f32 | 1 table [F, TREE_W] u32 | 2 cand_ids [F, K] u32 | 3 cand_vals [F, K] f32
//   | 4 lse [F] f32 | 5 next_ids [KEEP] u32 (written) | 6 next_table [KEEP, TREE_W] u32 (written)
//   | 7 next_scores [KEEP] f32 (written) | 8 parents [KEEP] u32 (written) | 9 chosen [KEEP] u32 (written).
// Method: KEEP passes, each taking the best candidate that comes after the last one taken in the order (so no
// candidate is taken twice and no marks are kept): O(KEEP F K) comparisons, at most 64 x 64 x 64.
// Grid: one workgroup of one invocation.

struct Params {
    f: u32,      // rows of the last frontier
    k: u32,      // children proposed per row
    keep: u32,   // children kept
    slot0: u32,  // the first kept child's slot (relative to the step's position)
}

@group(0) @binding(0) var<storage, read> scores: array<f32>;            // [F]
@group(0) @binding(1) var<storage, read> table: array<u32>;             // [F, TREE_W]
@group(0) @binding(2) var<storage, read> cand_ids: array<u32>;          // [F, K]
@group(0) @binding(3) var<storage, read> cand_vals: array<f32>;         // [F, K]
@group(0) @binding(4) var<storage, read> lse: array<f32>;               // [F]
@group(0) @binding(5) var<storage, read_write> next_ids: array<u32>;     // [KEEP]
@group(0) @binding(6) var<storage, read_write> next_table: array<u32>;   // [KEEP, TREE_W]
@group(0) @binding(7) var<storage, read_write> next_scores: array<f32>;  // [KEEP]
@group(0) @binding(8) var<storage, read_write> parents: array<u32>;      // [KEEP]
@group(0) @binding(9) var<storage, read_write> chosen: array<u32>;       // [KEEP]
@group(1) @binding(0) var<uniform> p: Params;

// Candidate c's score.
fn score_of(c: u32) -> f32 {
    let r = c / p.k;
    return scores[r] + (cand_vals[c] - lse[r]);
}

// An order key of f32 bits: unsigned comparison of keys is f32's total order (-NaN < -inf < ... < +inf < +NaN).
fn order_key(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    return select(b ^ 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

@compute @workgroup_size(1)
fn main() {
    let n = p.f * p.k;
    var last_key = 0u;
    var last = n;  // none taken yet
    for (var i = 0u; i < p.keep; i++) {
        // The best candidate after (last_key, last) in the order: key below last_key, or equal with a higher index.
        var best = n;
        var best_key = 0u;
        for (var c = 0u; c < n; c++) {
            let key = order_key(score_of(c));
            let after = last == n || key < last_key || (key == last_key && c > last);
            if (after && (best == n || key > best_key)) {
                best = c;
                best_key = key;
            }
        }
        if (best == n) {
            best = last;  // fewer candidates than KEEP (the host refuses that shape)
        }
        last = best;
        last_key = best_key;
        let r = best / p.k;
        let d = min(table[r * TREE_W], TREE_W - 3u);  // the parent's depth; the child is at most TREE_W - 2 deep
        let own = p.slot0 + i;
        next_ids[i] = cand_ids[best];
        next_scores[i] = score_of(best);
        parents[i] = r;
        chosen[i] = best;
        let o = i * TREE_W;
        next_table[o] = d + 1u;
        for (var s = 0u; s <= d; s++) {
            next_table[o + 1u + s] = table[r * TREE_W + 1u + s];
        }
        for (var s = d + 2u; s < TREE_W; s++) {
            next_table[o + s] = own;
        }
    }
}
