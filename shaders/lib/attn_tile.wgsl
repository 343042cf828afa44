// The key-tile step of the split attention kernels (attention_decode, attention_sparse; flash-decoding layout):
// one tile of up to TK keys of one kv head added to the online softmax (running max m, sum l) and the P * V
// accumulators of a workgroup's rows. Provides the tile constants (LOG2E, TK, NSUB, OWNR), the workgroup arrays
// qs / sc / alpha and attn_tile. Source: Dao et al., "FlashAttention" (2022), online softmax; Dao, Haziza, Massa,
// Sizov, "Flash-Decoding" (2023), the split over keys.
// The including shader defines HD4, WG (64), NEG and ROWS (rows per workgroup) and declares kc and vc
// (array<kv4> of lib/kv_cache.wgsl, [n_kv, max_ctx, HD]) and key_slot (the cache slot of the key at a position: lib/attn_tree.wgsl). Scores are in the log2 domain: qs holds q pre-scaled by scale * log2(e).

const LOG2E: f32 = 1.4426950408889634;
const TK: u32 = 64u;                          // keys per tile (one per invocation in step 1)
const NSUB: u32 = WG / HD4;                   // row subsets in step 3 (HD4 invocations each)
const OWNR: u32 = (ROWS + NSUB - 1u) / NSUB;  // rows per invocation in step 3

var<workgroup> qs: array<vec4<f32>, ROWS * HD4>;  // [ROWS, HD] pre-scaled queries of the workgroup's rows
var<workgroup> sc: array<f32, ROWS * TK>;         // [ROWS, TK] scores, then weights, of the current tile
var<workgroup> alpha: array<f32, ROWS>;           // [ROWS] rescale of each row's accumulator for this tile

// Keys t0 .. t0 + n (n <= TK) of the kv head whose cache rows start at vec4 index cbase, for the workgroup's nr
// rows (queries in qs). Invocation lid < nr holds row lid's running max m and sum l and sees the tile's keys
// [lo, vis) (tile-relative; 0 and n where all are visible; masked keys get weight 0); invocation (rsub, c) =
// (lid / HD4, lid % HD4), rsub < NSUB, holds in acc[k] column c (a vec4 of HD) of row rsub + k * NSUB.
// Per tile: (1) invocation t computes the scores of key t0 + t for every row (its K row streamed once); (2)
// invocation r < nr updates row r's running max and sum and turns its scores into weights; (3) invocation
// (rsub, c) accumulates p * V for its column: consecutive invocations read consecutive vec4s of one V row, each
// load serving several rows. Call from uniform control flow with every invocation (barriers inside; the first
// one also orders qs written before the first tile, and the previous tile's weights consumed).
fn attn_tile(
    t0: u32,
    n: u32,
    nr: u32,
    cbase: u32,
    lid: u32,
    lo: u32,
    vis: u32,
    m: ptr<function, f32>,
    l: ptr<function, f32>,
    acc: ptr<function, array<vec4<f32>, OWNR>>,
) {
    workgroupBarrier();
    // (1) scores of key t0 + lid for every row.
    if (lid < n) {
        var kr: array<vec4<f32>, HD4>;
        let kb = cbase + key_slot(t0 + lid) * HD4;
        for (var d = 0u; d < HD4; d++) {
            kr[d] = kv_load(kc[kb + d]);
        }
        for (var r = 0u; r < nr; r++) {
            var dt = vec4<f32>(0.0);
            for (var d = 0u; d < HD4; d++) {
                dt += qs[r * HD4 + d] * kr[d];
            }
            sc[r * TK + lid] = dt.x + dt.y + dt.z + dt.w;
        }
    }
    workgroupBarrier();
    // (2) online softmax of row lid over this tile; masked keys get weight 0.
    if (lid < nr) {
        var tmax = NEG;
        for (var j = lo; j < vis; j++) {
            tmax = max(tmax, sc[lid * TK + j]);
        }
        let m_new = max(*m, tmax);
        let a = exp2(*m - m_new);
        var sum = 0.0;
        // Weights of keys past the tile's end are 0 too: step 3 reads them in groups of 4.
        for (var j = 0u; j < TK; j++) {
            let pj = select(0.0, exp2(sc[lid * TK + j] - m_new), j >= lo && j < vis);
            sc[lid * TK + j] = pj;
            sum += pj;
        }
        *l = *l * a + sum;
        *m = m_new;
        alpha[lid] = a;
    }
    workgroupBarrier();
    // (3) acc(row, c) = acc * alpha + sum_j p_j * V[j][c] for this invocation's column c and rows rsub + k * NSUB:
    // one load of V[j][c] serves all its rows; keys go 4 per iteration.
    let c = lid % HD4;
    let rsub = lid / HD4;
    if (rsub < NSUB) {
        for (var k = 0u; k < OWNR; k++) {
            (*acc)[k] *= alpha[min(rsub + k * NSUB, ROWS - 1u)];
        }
        let vb = cbase + c;
        for (var j = 0u; j < n; j += 4u) {
            // Keys past the tile's end may be NaN (never written) or past the buffer: their weight is 0 and
            // select drops whatever was loaded.
            let z = vec4<f32>(0.0);
            let v0 = kv_load(vc[vb + key_slot(t0 + j) * HD4]);
            let v1 = select(z, kv_load(vc[vb + key_slot(t0 + j + 1u) * HD4]), j + 1u < n);
            let v2 = select(z, kv_load(vc[vb + key_slot(t0 + j + 2u) * HD4]), j + 2u < n);
            let v3 = select(z, kv_load(vc[vb + key_slot(t0 + j + 3u) * HD4]), j + 3u < n);
            for (var k = 0u; k < OWNR; k++) {
                let r = rsub + k * NSUB;
                if (r < nr) {
                    let pb = r * TK + j;
                    (*acc)[k] += sc[pb] * v0 + sc[pb + 1u] * v1 + sc[pb + 2u] * v2 + sc[pb + 3u] * v3;
                }
            }
        }
    }
}
