// gather_cols: y[r, j] = x[r, perm[j]] for every row r of x [rows, k] and j < n, perm [n] u32 column indices into
// x (an index >= k gives 0: nothing reads out of bounds). It runs before matmul_q for GPTQ act-order weights,
// whose K columns were sorted by quantization group at load so that each group fills whole 32-weight blocks
// (Frantar et al. 2022, "GPTQ", act-order; the same permutation vLLM / ExLlama apply to activations); with U32 it
// maps indices to ids (an FR-Spec head's argmax, an index into its subset, to a token id).
// Bindings (VEC4, when n % 4 == 0: perm and y as vec4 units):
//   0 x [rows, k] f32 (U32: u32) | 1 perm [n] u32 | 2 y [rows, n] as x (written)
// Params: units (rows * n, or rows * n / 4 with VEC4), row_units (n, or n / 4), k.
// Grid: ceil(units / 256) workgroups of 256 (folded into y past the per-dimension limit), one unit per invocation.

struct Params {
    units: u32,
    row_units: u32,  // units per row of y
    k: u32,          // columns of x
}

#if U32
alias T = u32;
#else
alias T = f32;
#endif

@group(0) @binding(0) var<storage, read> x: array<T>;              // [rows, k]
#if VEC4
@group(0) @binding(1) var<storage, read> perm: array<vec4<u32>>;   // [n / 4]
@group(0) @binding(2) var<storage, read_write> y: array<vec4<T>>;  // [rows, n / 4]
#else
@group(0) @binding(1) var<storage, read> perm: array<u32>;         // [n]
@group(0) @binding(2) var<storage, read_write> y: array<T>;        // [rows, n]
#endif
@group(1) @binding(0) var<uniform> p: Params;

// x[row, c] (row starting at `base`), or 0 for a column past k.
fn column(base: u32, c: u32) -> T {
    return select(T(0), x[base + min(c, p.k - 1u)], c < p.k);
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.units) {
        return;
    }
    let row = i / p.row_units;
    let j = i - row * p.row_units;
    let base = row * p.k;
#if VEC4
    let c = perm[j];
    y[i] = vec4<T>(column(base, c.x), column(base, c.y), column(base, c.z), column(base, c.w));
#else
    y[i] = column(base, perm[j]);
#endif
}
