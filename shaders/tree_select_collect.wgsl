// tree_select_collect: one expansion round's candidates into the list EAGLE-2's rerank takes (tree_select_rerank).
// Row r of the round's frontier (cumulative score scores[r]; candidate chosen[r] of the round before) proposed its
// K best children (tokens and logits from topk, the row's log-sum-exp lse[r]); child c = r K + j scores
// scores[r] + (cand_vals[c] - lse[r]) in f32, as tree_frontier forms it. Candidate row OFFSET + c of the list gets
// (the score's bits, the token, the parent's row in the list: PARENT_BASE + chosen[r], or ROOT for the root's
// children).
// Bindings: 0 cands [NC, 3] u32 (rows OFFSET .. OFFSET + F K written) | 1 scores [F] f32 | 2 chosen [F] u32
//   | 3 cand_ids [F, K] u32 | 4 cand_vals [F, K] f32 | 5 lse [F] f32.
// Grid: one workgroup of 64 invocations, each a stride of the F K candidates.

const ROOT: u32 = 0xffffffffu;

struct Params {
    f: u32,            // rows of the round's frontier
    k: u32,            // children proposed per row
    offset: u32,       // the round's first row in the list
    parent_base: u32,  // the row of the round before's first candidate (ROOT: the root's children)
}

@group(0) @binding(0) var<storage, read_write> cands: array<u32>;  // [NC, 3]
@group(0) @binding(1) var<storage, read> scores: array<f32>;       // [F]
@group(0) @binding(2) var<storage, read> chosen: array<u32>;       // [F]
@group(0) @binding(3) var<storage, read> cand_ids: array<u32>;     // [F, K]
@group(0) @binding(4) var<storage, read> cand_vals: array<f32>;    // [F, K]
@group(0) @binding(5) var<storage, read> lse: array<f32>;          // [F]
@group(1) @binding(0) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) t: u32) {
    let n = p.f * p.k;
    for (var c = t; c < n; c += 64u) {
        let r = c / p.k;
        var parent = ROOT;
        if (p.parent_base != ROOT) {
            parent = p.parent_base + chosen[r];
        }
        let o = (p.offset + c) * 3u;
        cands[o] = bitcast<u32>(scores[r] + (cand_vals[c] - lse[r]));
        cands[o + 1u] = cand_ids[c];
        cands[o + 2u] = parent;
    }
}
