//! BlockFFN sparsity statistics (`--stats`): per layer, the share of experts a token leaves inactive (token-level
//! sparsity) and the share no token of a chunk of [`CHUNK`] consecutive tokens activates (chunk-level sparsity,
//! what the chunk kernels can skip), from the router weights each step reads back.

/// Tokens per chunk for chunk-level sparsity.
pub const CHUNK: usize = 8;

#[derive(Clone, Debug, Default)]
struct Layer {
    tokens: u64,
    active: u64,
    chunks: u64,
    chunk_active: u64,
    /// Union of the current, incomplete chunk.
    union: Vec<bool>,
    in_chunk: usize,
}

/// Counts over every token fed since creation.
#[derive(Clone, Debug)]
pub struct MoeStats {
    experts: usize,
    layers: Vec<Layer>,
}

/// One layer's figures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerSparsity {
    /// Share of inactive experts per token, averaged.
    pub token: f64,
    /// Share of experts no token of a chunk activates, averaged over complete chunks (None before the first).
    pub chunk: Option<f64>,
}

impl MoeStats {
    pub fn new(layers: usize, experts: usize) -> MoeStats {
        let layer = Layer {
            union: vec![false; experts],
            ..Default::default()
        };
        MoeStats {
            experts,
            layers: vec![layer; layers],
        }
    }

    /// Adds the router weights `r` `[n_tokens, E]` of BlockFFN layer `layer` (the i-th such layer), in token order.
    pub fn add(&mut self, layer: usize, r: &[f32]) {
        let e = self.experts;
        let Some(l) = self.layers.get_mut(layer) else { return };
        for row in r.chunks_exact(e) {
            let active = row.iter().filter(|&&v| v != 0.0).count();
            l.tokens += 1;
            l.active += active as u64;
            for (u, &v) in l.union.iter_mut().zip(row) {
                *u |= v != 0.0;
            }
            l.in_chunk += 1;
            if l.in_chunk == CHUNK {
                l.chunks += 1;
                l.chunk_active += l.union.iter().filter(|&&u| u).count() as u64;
                l.union.iter_mut().for_each(|u| *u = false);
                l.in_chunk = 0;
            }
        }
    }

    pub fn layers(&self) -> Vec<LayerSparsity> {
        let e = self.experts.max(1) as f64;
        self.layers
            .iter()
            .map(|l| LayerSparsity {
                token: 1.0 - l.active as f64 / (l.tokens.max(1) as f64 * e),
                chunk: (l.chunks > 0).then(|| 1.0 - l.chunk_active as f64 / (l.chunks as f64 * e)),
            })
            .collect()
    }

    /// A Markdown table: layer, token-level and chunk-level sparsity, and the mean over layers.
    pub fn report(&self) -> String {
        let rows = self.layers();
        let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.1}%", 100.0 * v));
        let mut s =
            format!("| layer | token-level sparsity | chunk-level sparsity ({CHUNK} tokens) |\n|---:|---:|---:|\n");
        for (i, r) in rows.iter().enumerate() {
            s += &format!("| {i} | {} | {} |\n", pct(Some(r.token)), pct(r.chunk));
        }
        let n = rows.len().max(1) as f64;
        let chunk: Vec<f64> = rows.iter().filter_map(|r| r.chunk).collect();
        let mean_chunk = (!chunk.is_empty()).then(|| chunk.iter().sum::<f64>() / chunk.len() as f64);
        s += &format!(
            "| mean | {} | {} |\n",
            pct(Some(rows.iter().map(|r| r.token).sum::<f64>() / n)),
            pct(mean_chunk)
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_and_chunk_sparsity_count_what_they_say() {
        // 4 experts; 8 tokens: token t activates expert t % 2 only, and token 7 also expert 3.
        let mut st = MoeStats::new(1, 4);
        let mut r = [0f32; 8 * 4];
        for t in 0..8 {
            r[t * 4 + t % 2] = 0.5;
        }
        r[7 * 4 + 3] = 0.1;
        st.add(0, &r[..3 * 4]);
        st.add(0, &r[3 * 4..]);
        let l = st.layers()[0];
        // 9 activations over 8 tokens x 4 experts.
        assert!((l.token - (1.0 - 9.0 / 32.0)).abs() < 1e-12);
        // Union of the chunk: experts 0, 1, 3 -> one of four inactive.
        assert_eq!(l.chunk, Some(0.25));
        let mut partial = MoeStats::new(1, 4);
        partial.add(0, &r[..4]);
        assert_eq!(partial.layers()[0].chunk, None);
        assert!(st.report().contains("| 0 | 71.9% | 25.0% |"), "{}", st.report());
    }
}
