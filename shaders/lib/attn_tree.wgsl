// Tree-masked attention for attention_decode's split kernels (TREE: a speculative draft tree verified in one step,
// as EAGLE-2 and SpecInfer do). Row r of the step sits at position pos + depth(r) and sees the keys 0 .. pos - 1
// (the cached prefix) and its own path: the key at position pos + j (j <= depth) is in cache slot pos + slot_j,
// not pos + j, because the tree's nodes were written side by side (rope_kv's TREE form). The kernels walk the keys
// by position and fetch each through key_slot: every split, tile and group of keys falls where it would for a
// one-query step at that position over a cache holding the path in order, so each row equals that step bit for
// bit. Without TREE, key_slot is the identity.
// Binding (TREE): 6 tree [n_q, TREE_W] u32: row r's depth, then the slots (relative to pos) of its path at depth
// 0 .. depth, the last its own; entries past the depth repeat its own slot. The including shader defines Params p.

#if TREE
@group(0) @binding(6) var<storage, read> tree: array<u32>;  // [n_q, TREE_W]

// The row whose path key_slot follows.
var<private> tree_row: u32;

fn tree_depth(tok: u32) -> u32 {
    return tree[tok * TREE_W];
}

#include "lib/tree_table.wgsl"
#endif

fn set_tree_row(tok: u32) {
#if TREE
    tree_row = tok;
#endif
}

// The cache slot of the key at position t, for the row set by set_tree_row.
fn key_slot(t: u32) -> u32 {
#if TREE
    return tree_key_slot(tree_row, t);
#else
    return t;
#endif
}
