// Reading a draft tree's table (attention_decode's TREE_W form): per row its depth, then the cache slots (relative
// to the step's position p.pos) of its path at depths 0 ..= depth, the last its own; entries past the depth repeat
// its own slot. A row's slot is its row index: the tree step writes row r's K/V at pos + r (rope_kv's TREE form).
// The including shader declares `tree` (array<u32>, [rows, TREE_W]), TREE_W and Params p with `pos`.

// Row r's depth, clamped to the deepest a table holds.
fn tree_row_depth(r: u32) -> u32 {
    return min(tree[r * TREE_W], TREE_W - 2u);
}

// The slot (relative to p.pos) of row r's path at depth d (clamped): the row of its ancestor there.
fn tree_path_slot(r: u32, d: u32) -> u32 {
    return tree[r * TREE_W + 1u + min(d, TREE_W - 2u)];
}

// The cache slot of the key at absolute position t on row r's path: the cached prefix before p.pos, the path's own
// slots from there.
fn tree_key_slot(r: u32, t: u32) -> u32 {
    if (t < p.pos) {
        return t;
    }
    return p.pos + tree_path_slot(r, t - p.pos);
}
