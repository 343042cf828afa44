//! The graph of one forward pass of a Llama-family model: embedding, per layer the attention block (plain, with
//! fused q|k|v, norm and rope where the adapter takes them, sparse or over a draft tree) and the FFN block (SwiGLU or
//! BlockFFN), then the final norm and the head.

use super::*;

impl Llama {
    /// Record the forward pass of `ids` `[n]` (with an EAGLE head's features `[n, hidden]`): the logits `[rows,
    /// vocab]` of the last row, or of every row when `all_rows`, the BlockFFN router weights asked for, and every
    /// row's hidden state `[n, hidden]` marked for read-back when asked for.
    pub(in crate::model) fn forward(
        &self,
        g: &mut Graph,
        gpu: &Gpu,
        ctx: &StepContext<'_>,
        (ids, features): (TensorId, Option<TensorId>),
        out: StepOutputs,
        all_rows: bool,
    ) -> Result<Forward> {
        let n_tokens = ctx.n_tokens;
        let mut h = self.embed(g, ids)?; // [n, hidden]
                                         // An EAGLE-3 head's q|k|v takes the embeddings besides the layer's input.
        let mut qkv_extra = None;
        if let (Some(e), Some(f)) = (&self.eagle, features) {
            (h, qkv_extra) = e.input(g, h, f)?;
        }
        g.tap(h, Tap::Embed);
        // EAGLE-3's features: the hidden states entering three layers, each `[n, hidden]`.
        let aux_at = match out.aux_hidden {
            true => crate::model::eagle3::feature_layers(self.cfg.n_layers)?.to_vec(),
            false => Vec::new(),
        };
        let mut aux = Vec::with_capacity(aux_at.len());
        // The FFN output still to be added to `h` (with Gemma's post-norm weight): fused into the next norm (one
        // dispatch for post-norm + add + norm).
        let mut pending: Option<Branch<'_>> = None;
        let mut router = Vec::new();
        let fused = self.eagle.is_none() && self.fusable(gpu, n_tokens);
        for (i, l) in self.layers.iter().enumerate() {
            g.set_prefix(&format!("blk.{i}."));
            if fused {
                if aux_at.contains(&i) {
                    h = self.add_branch(g, h, pending.take())?;
                    g.output(h);
                    aux.push(h);
                }
                (h, pending) = self.fused_layer(g, ctx, i, l, h, pending.take())?;
                continue;
            }
            let own = match (&self.eagle, i) {
                (Some(e), 0) => e.layer_input(g, h)?, // the head's own input norms
                _ => None,
            };
            let x = match own {
                Some(x) => x,
                None => self.add_norm(g, &mut h, pending.take(), &l.attn_norm)?,
            };
            if aux_at.contains(&i) {
                g.output(h); // the residual stream entering layer i
                aux.push(h);
            }
            g.tap(x, Tap::AttnNorm(i));
            let o = self.attention_block(g, ctx, i, l, AttnIn::Normed(x), qkv_extra.take())?;
            g.tap(o, Tap::AttnProj(i));
            let post = l.post_norms.as_ref().map(|(post_attn, _)| post_attn);
            let x = self.add_norm(g, &mut h, Some((o, post)), &l.ffn_norm)?;
            g.tap(x, Tap::FfnNorm(i));
            let (d, r) = self.ffn_block(g, l, x)?;
            g.tap(d, Tap::FfnOut(i));
            if let (true, Some(r)) = (out.router, r) {
                g.output(r);
                router.push(r);
            }
            pending = Some((d, l.post_norms.as_ref().map(|(_, post_ffn)| post_ffn)));
        }
        g.set_prefix("");
        let rows = if all_rows { n_tokens } else { 1 };
        let (x, logits) = self.logits(g, h, pending, (n_tokens, rows), out.hidden)?; // [rows, hidden], [rows, vocab]
        g.tap(logits, Tap::Logits);
        let hidden = out.hidden.then(|| {
            g.output(x);
            x
        });
        Ok(Forward {
            hidden,
            logits,
            router,
            aux,
        })
    }

    /// The sparse settings and the cache's compressed keys, when both exist; an error when `sparse` asks for them
    /// and they do not.
    pub(in crate::model) fn sparse_keys<'a>(&'a self, cache: &'a KvCache, sparse: bool) -> Result<SparseKeys<'a>> {
        match (&self.cfg.sparse, &cache.sparse) {
            (Some(s), Some(keys)) => Ok(Some((s, keys))),
            _ if sparse => Err(Error::Invalid(
                "sparse attention asked for a model or cache without compressed keys".into(),
            )),
            _ => Ok(None),
        }
    }

    /// The token embeddings `[n, hidden]`, times MiniCPM's and Gemma's embedding scale.
    fn embed(&self, g: &mut Graph, ids: TensorId) -> Result<TensorId> {
        let h = self.embed.gather(g, ids)?;
        let emb = self.cfg.mup.emb;
        if emb == 1.0 {
            Ok(h)
        } else {
            g.scale(h, emb)
        }
    }

    /// `norm(h)` with weight `w`, after adding the branch output `d` (times the residual scale; RMSNorm'ed first
    /// where the layer has post-norms) to `h` when there is one: the (post-norm,) add and norm are one dispatch.
    fn add_norm(&self, g: &mut Graph, h: &mut TensorId, d: Option<Branch<'_>>, w: &GpuTensor) -> Result<TensorId> {
        let c = &self.cfg;
        let w = g.external(w);
        let (sum, x) = match d {
            None => return g.rms_norm(*h, w, c.rms_eps),
            Some((d, None)) => g.add_scaled_rms_norm(*h, d, c.mup.residual, w, c.rms_eps)?,
            Some((d, Some(post))) => {
                let post = g.external(post);
                g.add_post_rms_norm(*h, (d, post), c.mup.residual, w, c.rms_eps)?
            }
        };
        *h = sum;
        Ok(x)
    }

    /// `h` plus the branch output (post-normed where the layer has post-norms) times the residual scale.
    fn add_branch(&self, g: &mut Graph, h: TensorId, d: Option<Branch<'_>>) -> Result<TensorId> {
        let c = &self.cfg;
        let d = match d {
            None => return Ok(h),
            Some((d, None)) => d,
            Some((d, Some(post))) => {
                let post = g.external(post);
                g.rms_norm(d, post, c.rms_eps)?
            }
        };
        g.add_scaled(h, d, c.mup.residual)
    }

    /// Layer `i`'s attention over its normed input `x` `[n, hidden]`: projections, q/k norms, rope, the K/V
    /// write (and compressed keys), dense or sparse attention, the output projection and Gemma's post-norm.
    fn attention_block(
        &self,
        g: &mut Graph,
        s: &StepContext<'_>,
        i: usize,
        l: &Layer,
        input: AttnIn,
        extra: Option<TensorId>,
    ) -> Result<TensorId> {
        let c = &self.cfg;
        let n = s.n_tokens;
        let a = match self.rope_in_qkv(s, i, l, input, extra) {
            Some((h, ws, seq)) => {
                // Decode on the fused path: the q|k|v GEMVs norm their input and do rope_kv's work in their epilogue;
                // a chain of tokens (a verification step, its input normed) in the tiled GEMM's epilogue.
                let (kc, vc) = seq.caches(g, i);
                let norm = matches!(input, AttnIn::Residual(_)).then(|| (g.external(&l.attn_norm), c.rms_eps));
                let ws: Vec<_> = ws
                    .into_iter()
                    .map(|(w, b, count)| (w, b.map(|b| g.external(b)), count))
                    .collect();
                let q = g.matmul_q_qkv_rope(h, &ws, norm, self.rope_of(seq, i), (kc, vc))?;
                let q = g.reshape(q, &[n, c.n_heads, c.head_dim])?;
                g.tap(q, Tap::Rope(i));
                self.attend(g, s, i, q, kc, vc)?
            }
            None => self.qkv_attention(g, s, i, l, input, extra)?,
        };
        g.tap(a, Tap::AttnOut(i));
        let a = g.reshape(a, &[n, c.n_heads * c.head_dim])?;
        if let (AttnIn::Residual(h), Linear::Quant { w, .. }) = (input, &l.o) {
            // The o projection writes h + alpha * o: the residual stream after attention.
            return g.matmul_q_fused(a, w, None, None, None, Some((h, c.mup.residual)));
        }
        // Gemma's post-norm is the caller's (Llama::add_norm, with the residual add and the FFN norm).
        l.o.forward(g, a, None)
    }

    /// Layer `i`'s q|k|v projections, q/k norms, rope and K/V write, then its attention: `[n, n_heads, head_dim]`.
    fn qkv_attention(
        &self,
        g: &mut Graph,
        s: &StepContext<'_>,
        i: usize,
        l: &Layer,
        input: AttnIn,
        extra: Option<TensorId>,
    ) -> Result<TensorId> {
        if extra.is_some() && l.qkv.groups.len() != 1 {
            return Err(Error::Graph("an EAGLE-3 head's q|k|v must be one projection".into()));
        }
        let src = match input {
            AttnIn::Residual(h) => self.fused_qkv(g, l, h, None)?.0,
            AttnIn::Normed(x) => {
                let mut src = QkvSource(Vec::new());
                for (w, bias, count) in &l.qkv.groups {
                    let y = w.forward(g, x, bias.as_ref())?; // [n, columns of its projections]
                    let y = match extra {
                        Some(e) => g.add_scaled(y, e, 1.0)?,
                        None => y,
                    };
                    src.0.push((y, *count));
                }
                src
            }
        };
        g.tap(src.0[0].0, Tap::Qkv(i));
        self.rope_attend(g, s, i, l, src)
    }

    /// A fused step's q|k|v GEMVs from the residual stream `h` `[1, hidden]`, the attention norm in their prologues
    /// (with a post-norm layer's `pending` branch, its post-norm and add too): the projections (and how many of q,
    /// k and v each holds) and the residual stream after the add. Two weights run in one dispatch.
    fn fused_qkv(
        &self,
        g: &mut Graph,
        l: &Layer,
        mut h: TensorId,
        pending: Option<Branch<'_>>,
    ) -> Result<(QkvSource, TensorId)> {
        let c = &self.cfg;
        let norm = (g.external(&l.attn_norm), c.rms_eps);
        let mut post = match pending {
            Some((d, Some(w))) => Some((d, g.external(w), c.mup.residual)),
            other => {
                h = self.add_branch(g, h, other)?;
                None
            }
        };
        let mut ws = Vec::new();
        for (w, bias, count) in &l.qkv.groups {
            let Linear::Quant { w, perm: None } = w else {
                return Err(Error::Graph("a fused step with a dense or permuted projection".into()));
            };
            ws.push((&**w, bias.as_ref().map(|b| g.external(b)), *count));
        }
        if let [(a, ba, ca), (b, bb, cb)] = ws[..] {
            if ba.is_some() == bb.is_some() && a.parts().len() == 1 && b.parts().len() == 1 {
                let (y, sum) = g.matmul_q_two_normed(h, ((a, ba), (b, bb)), norm, post)?; // [1, a.n + b.n]
                return Ok((QkvSource(vec![(y, ca + cb)]), sum.unwrap_or(h)));
            }
        }
        let mut src = QkvSource(Vec::new());
        for (w, bias, count) in ws {
            let y = match post.take() {
                Some(branch) => {
                    let (y, sum) = g.matmul_q_post_norm(h, w, bias, None, branch, norm)?;
                    h = sum;
                    y
                }
                None => g.matmul_q_fused(h, w, bias, None, Some(norm), None)?,
            };
            src.0.push((y, count));
        }
        Ok((src, h))
    }

    /// Rope (with the q/k norms) and the K/V write of the projections `src` (`[n, columns]` each), then the
    /// attention: `[n, n_heads, head_dim]`.
    fn rope_attend(&self, g: &mut Graph, s: &StepContext<'_>, i: usize, l: &Layer, src: QkvSource) -> Result<TensorId> {
        let c = &self.cfg;
        let n = s.n_tokens;
        let qk_norm = l.qk_norm.as_ref().map(|w| (g.external(w), c.rms_eps));
        let a = if let [seq] = s.seqs.as_slice() {
            let (kc, vc) = seq.caches(g, i);
            // Norms, rotation and the cache write in one dispatch: q [n, n_heads, head_dim].
            let q = g.rope_kv_tree(src, qk_norm, self.rope_of(seq, i), (kc, vc), s.tree)?;
            g.tap(q, Tap::Rope(i));
            self.attend(g, s, i, q, kc, vc)?
        } else {
            // A batched step: row r is sequence r's token; each writes its row of the attention output.
            let a = g.uninit("attn_out", &[n, c.n_heads, c.head_dim], DType::F32);
            for (r, seq) in s.seqs.iter().enumerate() {
                g.set_seq(r);
                let rows = src.0.iter().map(|&(t, count)| Ok((g.row_view(t, r, 1)?, count)));
                let src = QkvSource(rows.collect::<Result<_>>()?);
                let (kc, vc) = seq.caches(g, i);
                let q = g.rope_kv(src, qk_norm, self.rope_of(seq, i), kc, vc)?; // [1, n_heads, head_dim]
                let out = g.row_view(a, r, 1)?;
                g.attention_decode_into(q, kc, vc, c.attn_scale, c.layer_window(i), out)?;
            }
            g.set_seq(0);
            a
        };
        Ok(a)
    }

    /// The input, the q|k|v weights (with their biases and how many projections each stacks) and the session of a
    /// step whose q|k|v matmuls can take rope_kv as their epilogue (`Graph::matmul_q_qkv_rope`): a one-token step
    /// of one session on the fused path (the residual input, normed in the GEMV's prologue), or a chain of 2 to
    /// `ROPE_MAX_M` tokens (a verification step; the input normed), not a tree, quantized weights in the tiled
    /// layout in one part each, no q/k norms, interleaved RoPE pairs.
    #[allow(clippy::type_complexity)]
    fn rope_in_qkv<'s>(
        &'s self,
        s: &'s StepContext<'_>,
        i: usize,
        l: &'s Layer,
        input: AttnIn,
        extra: Option<TensorId>,
    ) -> Option<(
        TensorId,
        Vec<(&'s PackedWeight, Option<&'s GpuTensor>, usize)>,
        &'s SeqContext<'s>,
    )> {
        let (h, rows) = match input {
            AttnIn::Residual(h) => (h, 1..=1),
            AttnIn::Normed(x) => (x, 2..=crate::ops::matmul_q::ROPE_MAX_M),
        };
        let [seq] = s.seqs.as_slice() else {
            return None;
        };
        let plain = extra.is_none() && l.qk_norm.is_none() && s.tree.is_none() && rows.contains(&s.n_tokens);
        if !plain || self.rope_of(seq, i).style != RopeStyle::Interleaved {
            return None;
        }
        let ws = l.qkv.groups.iter().map(|(w, bias, count)| match w {
            Linear::Quant { w, perm: None } if w.parts().len() == 1 && w.layout == Layout::Tiled => {
                Some((&**w, bias.as_ref(), *count))
            }
            _ => None,
        });
        Some((h, ws.collect::<Option<Vec<_>>>()?, seq))
    }

    /// Layer `i`'s rotation in `seq`: the sliding-window one on a window layer, else the global one.
    fn rope_of(&self, seq: &SeqContext<'_>, i: usize) -> RopeConfig {
        seq.ropes[usize::from(self.cfg.layer_window(i).is_some())]
    }

    /// Whether a step of `n_tokens` runs every layer as fused tiled GEMVs ([`Llama::fused_layer`]): on adapters
    /// where the fused kernels equal the unfused ones bit for bit (`matmul_q::can_fuse`), for plain GLU layers
    /// whose projections are all quantized (no act-order permutation) and whose hidden size the norm prologue
    /// takes.
    fn fusable(&self, gpu: &Gpu, n_tokens: usize) -> bool {
        let quant = |w: &Linear| match w {
            Linear::Quant { w, perm: None } => crate::ops::matmul_q::can_fuse(&gpu.caps, w, n_tokens),
            _ => false,
        };
        let normed = |w: &Linear| quant(w) && matches!(w, Linear::Quant { w, .. } if norm_in_prologue(w));
        self.cfg.sparse.is_none()
            && self.layers.iter().all(|l| {
                l.qkv.groups.iter().all(|(w, _, _)| normed(w))
                    && quant(&l.o)
                    && matches!(&l.ffn, Ffn::SwiGlu { input: FfnIn::Paired(w), down } if normed(w) && quant(down))
            })
    }

    /// Layer `i` on the residual stream `h` `[n, hidden]` in 4 dispatches and the attention's: q|k|v with the
    /// attention norm in its prologue and rope_kv's work in its epilogue (or rope_kv after it), attention, o writing
    /// `h + alpha * o`, gate|up with the FFN norm in its prologue (or after `rms_norm` where that pays,
    /// [`crate::ops::matmul_q::norm_prologue_pays`]) and the GLU epilogue, down writing `h + alpha * down`. Returns
    /// the new `h`, and for a layer with post-norms ([`Llama::fused_post_layer`]) its FFN output still to be added.
    fn fused_layer<'l>(
        &self,
        g: &mut Graph,
        s: &StepContext<'_>,
        i: usize,
        l: &'l Layer,
        h: TensorId,
        pending: Option<Branch<'_>>,
    ) -> Result<(TensorId, Option<Branch<'l>>)> {
        let c = &self.cfg;
        if l.post_norms.is_some() {
            return self.fused_post_layer(g, s, i, l, h, pending);
        }
        let h = self.add_branch(g, h, pending)?;
        let h = self.attention_block(g, s, i, l, AttnIn::Residual(h), None)?;
        g.tap(h, Tap::AttnProj(i));
        let (gu, dw) = l.fused_ffn()?;
        let norm = g.external(&l.ffn_norm);
        // [n, ffn]
        let m = if crate::ops::matmul_q::norm_prologue_pays(gu) {
            g.matmul_q_fused(h, gu, None, Some(c.ffn_act), Some((norm, c.rms_eps)), None)?
        } else {
            let x = g.rms_norm(h, norm, c.rms_eps)?;
            g.matmul_q_fused(x, gu, None, Some(c.ffn_act), None, None)?
        };
        g.tap(m, Tap::FfnAct(i));
        let h = g.matmul_q_fused(m, dw, None, None, None, Some((h, c.mup.residual)))?;
        g.tap(h, Tap::FfnOut(i));
        Ok((h, None))
    }

    /// [`Llama::fused_layer`] for a layer with post-norms (Gemma 3), in 6 dispatches (and the attention's combine
    /// when it splits): q|k|v, whose prologue adds the previous layer's pending FFN output (post-normed) to `h` and
    /// norms the sum ([`Llama::fused_qkv`]), rope_kv with the q/k norms, attention, o, gate|up whose prologue adds o
    /// (post-normed) and norms, down. Returns the residual stream after the attention and the FFN output with its
    /// post-norm weight, pending.
    fn fused_post_layer<'l>(
        &self,
        g: &mut Graph,
        s: &StepContext<'_>,
        i: usize,
        l: &'l Layer,
        h: TensorId,
        pending: Option<Branch<'_>>,
    ) -> Result<(TensorId, Option<Branch<'l>>)> {
        let c = &self.cfg;
        let Some((post_attn, post_ffn)) = &l.post_norms else {
            return Err(Error::Graph("a fused post-norm layer without post-norms".into()));
        };
        let (gu, dw) = l.fused_ffn()?;
        let (src, h) = self.fused_qkv(g, l, h, pending)?;
        g.tap(src.0[0].0, Tap::Qkv(i));
        let a = self.rope_attend(g, s, i, l, src)?;
        g.tap(a, Tap::AttnOut(i));
        let a = g.reshape(a, &[s.n_tokens, c.n_heads * c.head_dim])?;
        let o = l.o.forward(g, a, None)?;
        g.tap(o, Tap::AttnProj(i));
        let (ffn_norm, post_attn) = (g.external(&l.ffn_norm), g.external(post_attn));
        let (m, h) = if crate::ops::matmul_q::norm_prologue_pays(gu) {
            let branch = (o, post_attn, c.mup.residual);
            g.matmul_q_post_norm(h, gu, None, Some(c.ffn_act), branch, (ffn_norm, c.rms_eps))?
        } else {
            let (h, x) = g.add_post_rms_norm(h, (o, post_attn), c.mup.residual, ffn_norm, c.rms_eps)?;
            (g.matmul_q_fused(x, gu, None, Some(c.ffn_act), None, None)?, h)
        };
        g.tap(m, Tap::FfnAct(i));
        let d = g.matmul_q_fused(m, dw, None, None, None, None)?;
        g.tap(d, Tap::FfnOut(i));
        Ok((h, Some((d, Some(post_ffn)))))
    }

    /// Attention of `q` `[n, n_heads, head_dim]` over layer `i`'s caches (this step's keys written): InfLLM-v2 in a
    /// sparse step, else the decode kernel for a few queries and the tiled prefill kernel for more.
    fn attend(
        &self,
        g: &mut Graph,
        s: &StepContext<'_>,
        i: usize,
        q: TensorId,
        kc: TensorId,
        vc: TensorId,
    ) -> Result<TensorId> {
        let c = &self.cfg;
        // A tree step updates the compressed keys for its root alone (row 0, at its position): the other rows sit
        // side by side in slots, not in sequence.
        let compressed_rows = if s.tree.is_some() { 1 } else { s.n_tokens };
        let compressed = match s.sparse_keys {
            Some((sc, keys)) => Some((sc, sparse::compress(g, sc, &keys[i], kc, compressed_rows)?)),
            None => None,
        };
        let max_ctx = s.seqs[0].cache.max_ctx;
        match (s.sparse, compressed, s.tree) {
            (true, Some((sc, cc)), tree) => sparse::attention(g, sc, q, kc, vc, cc, max_ctx, c.attn_scale, tree),
            (_, _, Some(tree)) => g.attention_decode_tree(q, kc, vc, c.attn_scale, c.layer_window(i), tree),
            _ if s.n_tokens <= crate::ops::attention_decode::MAX_TOKENS => {
                g.attention_decode_window(q, kc, vc, c.attn_scale, c.layer_window(i))
            }
            _ if s.cpu_prefill => g.attention_prefill_wide(q, kc, vc, c.attn_scale, c.layer_window(i)),
            _ => g.attention_prefill_window(q, kc, vc, c.attn_scale, c.layer_window(i)),
        }
    }

    /// A layer's feed-forward block over its normed input `x` `[n, hidden]`: the output `[n, hidden]` (before
    /// Gemma's post-norm, which `Llama::add_norm` applies), and BlockFFN's router weights `[n, E]`.
    fn ffn_block(&self, g: &mut Graph, l: &Layer, x: TensorId) -> Result<(TensorId, Option<TensorId>)> {
        let c = &self.cfg;
        match &l.ffn {
            Ffn::SwiGlu { input, down } => {
                let m = match input {
                    FfnIn::Paired(w) => w.forward_glu(g, x, c.ffn_act)?, // [n, ffn]
                    FfnIn::Stacked(w) => {
                        let gu = w.forward(g, x, None)?; // [n, 2 * ffn]: gate then up
                        g.glu_fused(gu, c.ffn_act)?
                    }
                    FfnIn::Split { gate, up } => {
                        let gate = gate.forward(g, x, None)?;
                        let up = up.forward(g, x, None)?;
                        g.glu(gate, up, c.ffn_act)?
                    }
                };
                Ok((down.forward(g, m, None)?, None))
            }
            Ffn::Block(b) => {
                let m = c.moe.as_ref().expect("a BlockFFN layer has a MoE config");
                let (y, r) = b.forward(g, x, m, c.rms_eps)?; // [n, hidden], [n, E]
                Ok((y, Some(r)))
            }
        }
    }

    /// The head's input (final-normed hidden states) `[rows, hidden]` and the logits `[rows, vocab]` of the last
    /// `rows` tokens (1, or all `n_tokens`): the pending FFN output added, the final norm, the head. Every row goes
    /// through the same kernels as a one-token step's.
    fn logits(
        &self,
        g: &mut Graph,
        h: TensorId,
        pending: Option<Branch<'_>>,
        (n_tokens, rows): (usize, usize),
        every_hidden: bool,
    ) -> Result<(TensorId, TensorId)> {
        let c = &self.cfg;
        if let Some(crate::model::eagle::EagleIn::V3(_)) = &self.eagle {
            // EAGLE-3: the layer's output (the next feature, read back as is) normed into its own head.
            let h = self.add_branch(g, h, pending)?;
            let w = g.external(&self.norm);
            let x = g.rms_norm(h, w, c.rms_eps)?;
            let x = if rows < n_tokens {
                g.rows(x, n_tokens - rows, rows)?
            } else {
                x
            };
            return Ok((h, self.lm_head().forward(g, x, None)?));
        }
        if self.eagle.is_some() {
            // EAGLE-1 feeds its layer's output to the target's head with no norm; MiniCPM's head scales it by the
            // logit scale first (vLLM's layout feeds the scaled output forward as the next feature, CPM.cu's the
            // output itself).
            let h = self.add_branch(g, h, pending)?;
            let (h, x) = match &self.eagle {
                Some(crate::model::eagle::EagleIn::MiniCpm(m)) => {
                    let scaled = g.scale(h, c.mup.logit)?;
                    (if m.feeds_scaled { scaled } else { h }, scaled)
                }
                _ => (h, h),
            };
            let x = if rows < n_tokens {
                g.rows(x, n_tokens - rows, rows)?
            } else {
                x
            };
            return Ok((h, self.lm_head().forward(g, x, None)?));
        }
        if every_hidden && rows < n_tokens {
            // Every row normed (the features of a prefill chunk), the head over the last (the same bits per row).
            let x = self.add_norm(g, &mut { h }, pending, &self.norm)?;
            let last = g.rows(x, n_tokens - rows, rows)?;
            return Ok((x, self.lm_head().forward(g, last, None)?));
        }
        let x = if n_tokens == rows {
            self.add_norm(g, &mut { h }, pending, &self.norm)?
        } else {
            let h = self.add_branch(g, h, pending)?;
            let last = if n_tokens > 1 { g.rows(h, n_tokens - 1, 1)? } else { h };
            let w = g.external(&self.norm);
            g.rms_norm(last, w, c.rms_eps)?
        };
        Ok((x, self.lm_head().forward(g, x, None)?))
    }
}

/// Whether a matrix's GEMV can take the RMSNorm in its prologue ([`crate::ops::matmul_q::NORM_PROLOGUE_K`]).
fn norm_in_prologue(w: &crate::gpu::packed::PackedWeight) -> bool {
    w.k <= crate::ops::matmul_q::NORM_PROLOGUE_K
}
