//! Steps over a speculative draft tree (EAGLE-2, SpecInfer): every node of the tree as one row, each at its own
//! depth and attending only to the cached prefix and its own path (the tree forms of `rope_kv` and
//! `attention_decode`), and the K/V moves that put the accepted path where plain decoding would have cached it.

use super::config::SparseConfig;
use super::llama::{Llama, StepContext};
use super::sparse::CompressedKeys;
use super::step::{Step, StepOutputs};
use super::KvCache;
use crate::error::{Error, Result};
use crate::gpu::{DType, Gpu};
use crate::graph::{Graph, Plan, StepVars, TensorId};
use crate::ops::attention_decode::{MAX_TREE_DEPTH, MAX_TREE_ROWS, TREE_W};
use crate::ops::kv_move::{moves_list, MAX_MOVES};

impl Llama {
    /// A step over the `n_tokens` nodes of a draft tree ([`Step::run_tree`]): row r at position `pos + depth(r)`,
    /// its K/V cached in slot `pos + slot(r)`, attending to the keys before `pos` and to its path. Outputs cover
    /// every row, each equal bit for bit to the one-token step of plain decoding along that path (the kernels are
    /// batch invariant, and the attention walks the path in order). InfLLM-v2's compressed keys are updated for the
    /// root (row 0, at `pos`) alone (the other rows' windows assume a sequence, not a tree's slots):
    /// [`Llama::key_compressor`] brings them up to date once the accepted path is in place. With `sparse` (a model
    /// with a `sparse_config`, every row past `dense_len`) the rows attend sparsely over those compressed keys, each
    /// row with its own copy of the next C1 and C2 window its path completes (`kv_compress_tree`): equal to plain
    /// decoding where at most one window of each kind completes at the positions of the nodes past the root (`pos +
    /// 1 ..= pos + depth`; the caller's condition). At most `MAX_TREE_ROWS` rows.
    ///
    /// With `accept`, the step also accepts greedily on the device (`tree_accept` over the rows' argmax) and moves
    /// the accepted path's K/V to consecutive positions in every layer, in the same submission; the path is read
    /// back into `StepResult::tree_path`. It needs the argmax read back over the full vocabulary (no restricted
    /// head). InfLLM-v2's compressed keys are then updated as a step of the longest path would update them: the
    /// windows the kept path completes come out right, and those past it (from keys not kept) lie past the cached
    /// tokens, unseen until the step that completes them rewrites them.
    pub fn tree_step(
        &self,
        gpu: &Gpu,
        cache: &KvCache,
        n_tokens: usize,
        out: StepOutputs,
        accept: bool,
        sparse: bool,
    ) -> Result<Step> {
        if n_tokens == 0 || n_tokens > MAX_TREE_ROWS || n_tokens > cache.max_ctx {
            return Err(Error::Invalid(format!(
                "a tree step of {n_tokens} nodes (1..={MAX_TREE_ROWS}, context {})",
                cache.max_ctx
            )));
        }
        let mut g = Graph::new();
        g.set_invariant_rows(MAX_TREE_ROWS);
        let ids = g.input("ids", &[n_tokens], DType::U32);
        let tree = g.input("tree", &[n_tokens, TREE_W], DType::U32);
        let ctx = StepContext {
            tree: Some(tree),
            sparse,
            sparse_keys: self.sparse_keys(cache, sparse)?,
            ..StepContext::dense(gpu, vec![self.seq_context(&mut g, cache)], n_tokens)
        };
        let features = self
            .is_eagle()
            .then(|| g.input("features", &[n_tokens, self.cfg.hidden], DType::F32));
        if accept && (!out.argmax || self.head_ids().is_some()) {
            return Err(Error::Invalid(
                "a tree step accepts on the device only with the argmax read back and the full vocabulary's head"
                    .into(),
            ));
        }
        let sparse_keys = self.sparse_keys(cache, false)?;
        let then = |g: &mut Graph, argmax: Option<TensorId>| -> Result<Option<TensorId>> {
            let Some(choice) = argmax.filter(|_| accept) else {
                return Ok(None);
            };
            let (path, moves) = g.tree_accept(ids, tree, choice)?;
            move_kv(g, cache, moves)?;
            if let Some(sparse) = sparse_keys {
                compress_keys(g, sparse, cache, (MAX_TREE_DEPTH + 1).min(cache.max_ctx))?;
            }
            g.output(path);
            Ok(Some(path))
        };
        let mut step = self.plan_step_then(gpu, g, &ctx, (ids, features), out, true, then)?;
        step.tree = Some(tree);
        Ok(step)
    }

    /// The plan that updates `cache`'s InfLLM-v2 compressed keys in every layer as a step of `n` tokens at `vars.pos`
    /// does (the windows ending in `(pos, pos + n]`, from the K cache as it is): what an accepted draft-tree path
    /// needs once its K/V are in place. None when the model or the cache keeps no compressed keys.
    pub fn key_compressor(&self, gpu: &Gpu, cache: &KvCache, n: usize) -> Result<Option<Plan>> {
        let Some((sc, keys)) = self.sparse_keys(cache, false)? else {
            return Ok(None);
        };
        let mut g = Graph::new();
        compress_keys(&mut g, (sc, keys), cache, n)?;
        Ok(Some(Plan::new(gpu, g)?))
    }

    /// The plan that moves K/V entries within `cache`, every layer at once ([`KvMover::run`]).
    pub fn kv_mover(&self, gpu: &Gpu, cache: &KvCache) -> Result<KvMover> {
        let mut g = Graph::new();
        let moves = g.input("moves", &[1 + 2 * MAX_MOVES], DType::U32);
        move_kv(&mut g, cache, moves)?;
        Ok(KvMover {
            plan: Plan::new(gpu, g)?,
            moves,
        })
    }
}

/// Records `kv_move` of `moves` (u32 `[1 + 2 * MAX_MOVES]`) in every layer of `cache`.
fn move_kv(g: &mut Graph, cache: &KvCache, moves: TensorId) -> Result<()> {
    for (k, v) in &cache.layers {
        let (k, v) = (g.external(k), g.external(v));
        g.kv_move(k, v, moves)?;
    }
    Ok(())
}

/// Records every layer's InfLLM-v2 compressed-key update of a step of `n` tokens (the windows ending in `(pos, pos
/// + n]`, from `cache`'s K as it is then).
fn compress_keys(
    g: &mut Graph,
    (sc, keys): (&SparseConfig, &[CompressedKeys]),
    cache: &KvCache,
    n: usize,
) -> Result<()> {
    for ((k, _), layer_keys) in cache.layers.iter().zip(keys) {
        let kc = g.external(k);
        super::sparse::compress(g, sc, layer_keys, kc, n)?;
    }
    Ok(())
}

/// Moves of K/V entries in every layer of one cache, in one submission.
pub struct KvMover {
    plan: Plan,
    /// `[1 + 2 * MAX_MOVES]` u32: the count, then (source, destination) positions.
    moves: TensorId,
}

impl KvMover {
    /// Move each (source, destination) position pair's keys and values, in order, in every layer.
    pub fn run(&mut self, gpu: &Gpu, pairs: &[(u32, u32)]) -> Result<()> {
        if pairs.is_empty() {
            return Ok(());
        }
        self.plan
            .write_input(gpu, self.moves, bytemuck::cast_slice(&moves_list(pairs)?))?;
        self.plan.run(gpu, &StepVars::default())
    }
}
