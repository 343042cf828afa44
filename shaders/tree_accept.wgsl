// tree_accept: greedy acceptance of a verified draft tree on the device. From the root (row 0), the path follows the
// child whose token is the current row's choice (the target's argmax there; the lowest such row when several are),
// until no child is. It writes the path and the K/V moves that put the path's entries at consecutive positions
// (kv_move's list), so the acceptance and the moves run in the verification's submission.
// Rows are the tree's nodes, parents before children; a row's table entry (attention_decode's TREE_W form) holds
// its depth, then the slots (relative to pos) of its path from the root, its own last. Row c is a child of row r
// when it is one deeper and its path's slot at r's depth is r's own slot.
// Bindings: 0 ids [n] u32 (each row's token) | 1 table [n, TREE_W] u32 | 2 choice [n] u32 (each row's argmax)
//   | 3 path [1 + TREE_W] u32 (written: the length, then the rows from the root, then zeros) | 4 moves [1 + 2 MAX_MOVES] u32
//   (written: the count, then (source, destination) positions: pos + slot(path[k]) -> pos + k where they differ; then zeros).
// MAX_MOVES >= TREE_W - 1, so every move of a path fits.
// Grid: one workgroup of one invocation (a walk of at most TREE_W - 1 steps over at most 64 rows).

struct Params {
    n: u32,    // rows
    pos: u32,  // the step's position: slot s is cache position pos + s
}

@group(0) @binding(0) var<storage, read> ids: array<u32>;           // [n]
@group(0) @binding(1) var<storage, read> table: array<u32>;         // [n, TREE_W]
@group(0) @binding(2) var<storage, read> choice: array<u32>;        // [n]
@group(0) @binding(3) var<storage, read_write> path: array<u32>;    // [1 + TREE_W]
@group(0) @binding(4) var<storage, read_write> moves: array<u32>;   // [1 + 2 MAX_MOVES]
@group(1) @binding(0) var<uniform> p: Params;

fn depth_of(r: u32) -> u32 {
    return min(table[r * TREE_W], TREE_W - 2u);
}

// Row r's own slot: its path's last entry.
fn slot_of(r: u32) -> u32 {
    return table[r * TREE_W + 1u + depth_of(r)];
}

@compute @workgroup_size(1)
fn main() {
    var node = 0u;
    var len = 1u;
    var n_moves = 0u;
    path[1] = 0u;
    if (slot_of(0u) != 0u) {
        moves[1] = p.pos + slot_of(0u);
        moves[2] = p.pos;
        n_moves = 1u;
    }
    for (var k = 1u; k < TREE_W - 1u; k++) {
        let d = depth_of(node);
        let own = slot_of(node);
        let want = choice[node];
        var next = p.n;
        for (var c = node + 1u; c < p.n; c++) {
            if (depth_of(c) == d + 1u && table[c * TREE_W + 1u + d] == own && ids[c] == want) {
                next = c;
                break;
            }
        }
        if (next == p.n) {
            break;
        }
        node = next;
        path[1u + len] = node;
        len += 1u;
        let s = slot_of(node);
        if (s != k && n_moves < MAX_MOVES) {
            moves[1u + 2u * n_moves] = p.pos + s;
            moves[2u + 2u * n_moves] = p.pos + k;
            n_moves += 1u;
        }
    }
    path[0] = len;
    moves[0] = n_moves;
    // The rest zeroed, so a run leaves nothing of an earlier one.
    for (var i = len; i < TREE_W; i++) {
        path[1u + i] = 0u;
    }
    for (var i = n_moves; i < MAX_MOVES; i++) {
        moves[1u + 2u * i] = 0u;
        moves[2u + 2u * i] = 0u;
    }
}
