//! Recording matmul_q nodes in a graph: the plain product (GEMV or GEMM, any arithmetic), the GLU epilogue, and
//! the fused forms of a decode step (the norm prologue, the residual add, the post-norm, the rope epilogue, two
//! weights in one dispatch), with the shape and layout checks each needs.

use super::*;

impl Graph {
    /// `x[.., K] · W[N, K]^T (+ bias[N])` → `[.., N]` f32, W quantized and packed ([`PackedWeight`]).
    pub fn matmul_q(&mut self, x: TensorId, w: &PackedWeight, bias: Option<TensorId>) -> Result<TensorId> {
        self.matmul_q_with(x, w, bias, QPath::Auto)
    }

    /// [`Graph::matmul_q`] with the kernel chosen by the caller (tests and benches cover each path this way).
    pub fn matmul_q_with(
        &mut self,
        x: TensorId,
        w: &PackedWeight,
        bias: Option<TensorId>,
        path: QPath,
    ) -> Result<TensorId> {
        self.matmul_q_math(x, w, bias, path, QMath::Auto)
    }

    /// [`Graph::matmul_q_with`] with the arithmetic chosen by the caller too.
    pub fn matmul_q_math(
        &mut self,
        x: TensorId,
        w: &PackedWeight,
        bias: Option<TensorId>,
        path: QPath,
        math: QMath,
    ) -> Result<TensorId> {
        self.matmul_q_node(x, w, bias, path, math, None, Fused::default(), &[]).map(|o| o[0])
    }

    /// The tiled GEMV of `x` `[m, K]` (m <= TILED_GEMV_MAX_M) with `x` first RMSNorm'ed by `norm` (weight `[K]`, epsilon) and/or
    /// `res + alpha * (x · W^T)` written for `add` (`res` `[m, N]`, alpha), and a GLU epilogue when `glu`: a layer's
    /// norm, projection and residual add in one dispatch. Only where [`can_fuse`] says so (the plan fails
    /// otherwise); the result equals the unfused `rms_norm` / `matmul_q` / `add` bit for bit on those adapters.
    pub fn matmul_q_fused(
        &mut self,
        x: TensorId,
        w: &PackedWeight,
        bias: Option<TensorId>,
        glu: Option<Glu>,
        norm: Option<(TensorId, f32)>,
        add: Option<(TensorId, f32)>,
    ) -> Result<TensorId> {
        let fused = Fused {
            norm: norm.map(|n| n.1),
            add: add.map(|a| a.1),
            ..Default::default()
        };
        self.check_norm_prologue(w, norm)?;
        if let Some((_, alpha)) = add {
            if glu.is_some() || !alpha.is_finite() {
                return Err(Error::shape("matmul_q", format!("{}: a residual add with a GLU", w.name)));
            }
        }
        let extra: Vec<TensorId> = add.map(|a| a.0).into_iter().chain(norm.map(|n| n.0)).collect();
        self.matmul_q_node(x, w, bias, QPath::Gemv, QMath::Auto, glu, fused, &extra).map(|o| o[0])
    }

    /// [`Graph::matmul_q_fused`] with the norm prologue over `h = x + alpha * rms_norm(r, r_weight)` (Gemma's
    /// post-norm of a branch `r` `[1, K]` and the residual add): returns `(y, h)`, y the GEMV of `rms_norm(h, norm)`
    /// (with the GLU epilogue when `glu`), h `[1, K]` the residual stream. Equals `add_post_rms_norm` then
    /// `matmul_q` bit for bit where [`can_fuse`] says so (the plan fails elsewhere).
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_q_post_norm(
        &mut self,
        x: TensorId,
        w: &PackedWeight,
        bias: Option<TensorId>,
        glu: Option<Glu>,
        (r, r_weight, alpha): (TensorId, TensorId, f32),
        (norm, eps): (TensorId, f32),
    ) -> Result<(TensorId, TensorId)> {
        self.check_norm_prologue(w, Some((norm, eps)))?;
        self.check_post(x, w, (r, r_weight, alpha))?;
        let fused = Fused {
            norm: Some(eps),
            post: Some(alpha),
            ..Default::default()
        };
        let o = self.matmul_q_node(x, w, bias, QPath::Gemv, QMath::Auto, glu, fused, &[norm, r, r_weight])?;
        Ok((o[0], o[1]))
    }

    /// A decode step's q|k|v in one dispatch per weight (one for two weights with the norm: [`two`]): the tiled GEMVs
    /// of `x` `[m, K]` (m tokens of a chain, 1 to [`ROPE_MAX_M`]; the GEMM for more than one; RMSNorm'ed first by
    /// `norm`, one token only) with the q|k|v weights `ws` (one part each, in order: each weight with its bias
    /// `[rows]` and how many of q, k and v it stacks, like [`super::rope_kv::QkvSource`]), whose epilogue is
    /// rope_kv's: q rotated and returned `[m, n_heads * head_dim]`, k rotated and v written into `k_cache` /
    /// `v_cache` (`[n_kv, max_ctx, head_dim]`, both f32 or both f16) at `vars.pos + row`. Interleaved RoPE pairs only, no q/k norms; the results equal
    /// `matmul_q_fused` then `rope_kv` bit for bit where [`can_fuse`] says so (the plan fails elsewhere).
    pub fn matmul_q_qkv_rope(
        &mut self,
        x: TensorId,
        ws: &[(&PackedWeight, Option<TensorId>, usize)],
        norm: Option<(TensorId, f32)>,
        cfg: RopeConfig,
        (k_cache, v_cache): (TensorId, TensorId),
    ) -> Result<TensorId> {
        let cs = self.shape(k_cache).to_vec();
        let name = ws.first().map_or("q|k|v", |w| w.0.name.as_str()).to_string();
        let bad = |why: String| Error::shape("matmul_q", format!("{name} with a rope epilogue: {why}"));
        let Some(([n_kv, max_ctx, head_dim], kv_f16)) = self.kv_cache_pair(k_cache, v_cache) else {
            return Err(bad(format!("caches {cs:?}: {KV_CACHE_PAIR}")));
        };
        if !head_dim.is_multiple_of(4) {
            return Err(bad(format!("caches {cs:?}: head_dim is not a multiple of 4")));
        }
        let rows: usize = ws.iter().map(|w| w.0.n).sum();
        let q_rows = rows.checked_sub(2 * n_kv * head_dim).filter(|&q| q > 0 && q.is_multiple_of(head_dim));
        let (Some(q_rows), 3) = (q_rows, ws.iter().map(|w| w.2).sum::<usize>()) else {
            return Err(bad(format!("{rows} rows are not (n_heads + 2 x {n_kv}) x {head_dim} in q, k and v")));
        };
        if cfg.style != RopeStyle::Interleaved || ws.iter().any(|w| w.0.parts().len() != 1) {
            return Err(bad("interleaved RoPE pairs and weights in one part only".into()));
        }
        self.rope_config_check(&cfg, head_dim).map_err(|e| bad(format!("{cfg:?}: {e}")))?;
        // The tokens of a chain (a verification step) at positions pos + m; the norm prologue takes one.
        let m = match self.shape(x) {
            [m, _] if *m >= 1 && *m <= ROPE_MAX_M && (norm.is_none() || *m == 1) => *m,
            xs => return Err(bad(format!("x {xs:?}: 1 to {ROPE_MAX_M} rows (one with the norm)"))),
        };
        let sizes = [q_rows, n_kv * head_dim, n_kv * head_dim];
        let q_out = self.uninit("q_rope", &[m, q_rows], DType::F32);
        let (mut p, mut qkv0) = (0, 0);
        let mut ropes = Vec::new();
        for &(w, _, count) in ws {
            if w.n != sizes[p..p + count].iter().sum::<usize>() {
                return Err(bad(format!("{}: {} rows for {count} of q, k and v", w.name, w.n)));
            }
            let rope = FusedRope {
                dims: QkvDims {
                    n_tokens: m,
                    n_heads: q_rows / head_dim,
                    n_kv,
                    head_dim,
                    max_ctx,
                },
                cfg,
                kv_f16,
                qkv0,
            };
            self.check_norm_prologue(w, norm)?;
            ropes.push(rope);
            (p, qkv0) = (p + count, qkv0 + w.n);
        }
        if let ([a, b], Some(norm), true) = (ws, norm, ws.iter().all(|w| w.1.is_some() == ws[0].1.is_some())) {
            // Two weights (v, or k and v, in another format) with biases alike: one dispatch.
            let mut mid = vec![k_cache, v_cache];
            mid.extend(cfg.factors);
            mid.push(q_out);
            self.matmul_q_two(x, ((a.0, a.1), (b.0, b.1)), norm, two::Tail::Rope(ropes[0]), &mid)?;
            return Ok(q_out);
        }
        for (&(w, bias, _), rope) in ws.iter().zip(ropes) {
            let fused = Fused {
                norm: norm.map(|n| n.1),
                rope: Some(rope),
                ..Default::default()
            };
            let mut extra: Vec<TensorId> = norm.map(|n| n.0).into_iter().collect();
            extra.extend([k_cache, v_cache]);
            extra.extend(cfg.factors);
            extra.push(q_out);
            self.matmul_q_node(x, w, bias, QPath::Auto, QMath::Auto, None, fused, &extra)?;
        }
        Ok(q_out)
    }

    /// The GEMVs of two weights (q|k and v stored in different formats; each with its bias or neither) over x
    /// `[1, K]` with the norm prologue in one dispatch: y `[1, a.n + b.n]`, a's columns then b's. With `post` (r
    /// `[1, K]`, its norm weight `[K]`, alpha) the prologue is [`Graph::matmul_q_post_norm`]'s and its h is returned
    /// too. Equals a fused GEMV per weight bit for bit where [`can_fuse`] says so (the plan fails elsewhere).
    pub fn matmul_q_two_normed(
        &mut self,
        x: TensorId,
        (a, b): (BiasedWeight<'_>, BiasedWeight<'_>),
        norm: (TensorId, f32),
        post: Option<(TensorId, TensorId, f32)>,
    ) -> Result<(TensorId, Option<TensorId>)> {
        let mid: Vec<TensorId> = post.map(|(r, rw, _)| [r, rw]).into_iter().flatten().collect();
        if let Some((r, rw, alpha)) = post {
            self.check_post(x, a.0, (r, rw, alpha))?;
        }
        let tail = two::Tail::Y { post: post.map(|p| p.2) };
        let o = self.matmul_q_two(x, (a, b), norm, tail, &mid)?;
        Ok((o[0], o.get(1).copied()))
    }

    /// [`two::MatmulQTwo`]'s node: weights `a` and `b` (b's rows after a's) with the norm prologue and `tail`,
    /// whose inputs `mid` follow the norm weight (the caches, factors and q_out; or r and its norm weight). Returns
    /// the node's outputs: none with the rope epilogue, else y and (post) h.
    fn matmul_q_two(
        &mut self,
        x: TensorId,
        (a, b): (BiasedWeight<'_>, BiasedWeight<'_>),
        (norm, eps): (TensorId, f32),
        tail: two::Tail,
        mid: &[TensorId],
    ) -> Result<Vec<TensorId>> {
        let k = a.0.k;
        let bad = |why: &str| Error::shape("matmul_q", format!("{} and {} in one GEMV: {why}", a.0.name, b.0.name));
        if self.shape(x) != [TILED_GEMV_MAX_M, k] || self.dtype(x) != DType::F32 || b.0.k != k || !k.is_multiple_of(QK) {
            return Err(bad(&format!("x must be f32 [1, {k}] (K a multiple of 32) for both")));
        }
        for (w, bias) in [a, b] {
            let packed = w.parts_cover_rows() && w.mins.is_some() == w.format.third_buffer(w.layout);
            if w.layout != Layout::Tiled || w.parts().len() != 1 || !packed {
                return Err(bad("a fused GEMV needs tiled weights in one part"));
            }
            if bias.is_some_and(|t| self.shape(t) != [w.n] || self.dtype(t) != DType::F32) {
                return Err(bad("each bias must be f32 [its rows]"));
            }
            self.check_norm_prologue(w, Some((norm, eps)))?;
        }
        if a.1.is_some() != b.1.is_some() {
            return Err(bad("both weights with a bias or neither"));
        }
        let half = |w: &PackedWeight| two::Half {
            format: w.format,
            n: w.n,
            wbytes: w.bytes(),
        };
        let buffers = |g: &mut Graph, w: &PackedWeight| -> Vec<TensorId> { w.buffers().map(|t| g.external(t)).collect() };
        let mut inputs = vec![x];
        inputs.extend(buffers(self, a.0));
        inputs.extend(a.1);
        inputs.push(norm);
        inputs.extend_from_slice(mid);
        inputs.extend(buffers(self, b.0));
        inputs.extend(b.1);
        let kernel = two::MatmulQTwo {
            k,
            a: half(a.0),
            b: half(b.0),
            bias: a.1.is_some(),
            eps,
            tail,
        };
        match tail {
            two::Tail::Rope(_) => self.add_effect(kernel, &inputs).map(|_| Vec::new()),
            two::Tail::Y { post } => {
                let mut outs = vec![("matmul_q", vec![1, a.0.n + b.0.n], DType::F32)];
                outs.extend(post.map(|_| ("residual", vec![1, k], DType::F32)));
                let outs: Vec<(&str, &[usize], DType)> = outs.iter().map(|(n, s, t)| (*n, s.as_slice(), *t)).collect();
                self.add_node(kernel, &inputs, &outs)
            }
        }
    }

    /// The post-norm prologue's inputs: x and r f32 `[1, K]`, r's norm weight f32 `[K]`, a finite alpha.
    fn check_post(&self, x: TensorId, w: &PackedWeight, (r, r_weight, alpha): (TensorId, TensorId, f32)) -> Result<()> {
        let k = w.k;
        if self.shape(x) != [1, k]
            || self.shape(r) != [1, k]
            || self.shape(r_weight) != [k]
            || [x, r, r_weight].iter().any(|&t| self.dtype(t) != DType::F32)
            || !alpha.is_finite()
        {
            let why = format!(
                "{}: x {:?} + alpha {alpha} * rms_norm(r {:?}, weight {:?}): want f32 [1, {k}], [1, {k}], [{k}]",
                w.name,
                self.shape(x),
                self.shape(r),
                self.shape(r_weight)
            );
            return Err(Error::shape("matmul_q", why));
        }
        Ok(())
    }

    /// The RMSNorm of a fused GEMV's prologue: a weight f32 `[K]` and a finite epsilon >= 0.
    fn check_norm_prologue(&self, w: &PackedWeight, norm: Option<(TensorId, f32)>) -> Result<()> {
        if norm.is_some() && w.k > NORM_PROLOGUE_K {
            let why = format!("{}: K {} past the norm prologue's {NORM_PROLOGUE_K}", w.name, w.k);
            return Err(Error::shape("matmul_q", why));
        }
        match norm {
            Some((nw, eps)) if self.shape(nw) != [w.k] || self.dtype(nw) != DType::F32 || !(eps.is_finite() && eps >= 0.0) => {
                Err(Error::shape("matmul_q", format!("{}: norm weight must be f32 [{}]", w.name, w.k)))
            }
            _ => Ok(()),
        }
    }

    /// `act(x · W_gate^T) * (x · W_up^T)` → `[.., N / 2]` in one dispatch per part: W's rows are (gate, up) pairs
    /// (row 2i the gate of output i, row 2i + 1 its up: [`crate::model::weights::Linear::load_paired`]).
    pub fn matmul_q_glu(&mut self, x: TensorId, w: &PackedWeight, act: Glu) -> Result<TensorId> {
        self.matmul_q_node(x, w, None, QPath::Auto, QMath::Auto, Some(act), Fused::default(), &[]).map(|o| o[0])
    }

    /// [`Graph::matmul_q_glu`] with the kernel and arithmetic chosen by the caller.
    pub fn matmul_q_glu_with(
        &mut self,
        x: TensorId,
        w: &PackedWeight,
        path: QPath,
        math: QMath,
        act: Glu,
    ) -> Result<TensorId> {
        self.matmul_q_node(x, w, None, path, math, Some(act), Fused::default(), &[]).map(|o| o[0])
    }

    /// The matmul_q node: y (a rope epilogue's q_out, the last of `extra`), then the post-norm's h.
    #[allow(clippy::too_many_arguments)]
    fn matmul_q_node(
        &mut self,
        x: TensorId,
        w: &PackedWeight,
        bias: Option<TensorId>,
        path: QPath,
        math: QMath,
        glu: Option<Glu>,
        fused: Fused,
        extra: &[TensorId],
    ) -> Result<Vec<TensorId>> {
        let xs = self.shape(x).to_vec();
        let bs = bias.map(|b| self.shape(b).to_vec());
        let (n, k) = (w.n, w.k);
        let bad = |why: &str| {
            Error::shape(
                "matmul_q",
                format!(
                    "x {xs:?} · {} {} [{n}, {k}]^T + bias {bs:?}: {why}",
                    w.name, w.format.ty
                ),
            )
        };
        let Some(&xk) = xs.last() else {
            return Err(bad("x needs a last dim"));
        };
        let m = xs[..xs.len() - 1].iter().product::<usize>();
        if xk != k {
            return Err(bad("K differs"));
        }
        if m == 0 || n == 0 || k == 0 || !k.is_multiple_of(QK) {
            return Err(bad("empty, or K not a multiple of 32"));
        }
        if self.dtype(x) != DType::F32 {
            return Err(bad("x must be f32"));
        }
        if let Some(b) = bias {
            if self.shape(b) != [n] || self.dtype(b) != DType::F32 {
                return Err(bad("bias must be f32 [N]"));
            }
        }
        if m > MAX_GROUPS || m * k > u32::MAX as usize || m * n > u32::MAX as usize {
            return Err(bad("too large for one dispatch grid"));
        }
        let parts = w.parts();
        if !w.parts_cover_rows() || (w.mins.is_some() != w.format.third_buffer(w.layout)) {
            return Err(bad("the packed buffers' row parts do not cover W's rows"));
        }
        if glu.is_some() && (bias.is_some() || !n.is_multiple_of(2) || parts.iter().any(|p| p.0 % 2 == 1)) {
            return Err(bad("a GLU epilogue needs (gate, up) row pairs: N even, parts at even rows, no bias"));
        }
        let kernel = MatmulQ {
            m,
            k,
            n,
            format: w.format,
            layout: w.layout,
            bias: bias.is_some(),
            parts,
            wbytes: w.bytes(),
            path,
            math,
            glu,
            fused,
        };
        let cols = kernel.y_cols();
        if fused.add.is_some() {
            let want = [m, cols];
            let res = extra[0];
            if self.shape(res).iter().product::<usize>() != m * cols || self.dtype(res) != DType::F32 {
                return Err(bad(&format!("the residual must be f32 {want:?}")));
            }
        }
        let one_row = fused.add.is_some() || fused.norm.is_some();
        if (one_row && m > TILED_GEMV_MAX_M) || ((one_row || fused.rope.is_some()) && w.layout != Layout::Tiled) {
            return Err(bad("a fused norm or add needs the tiled GEMV (CPU adapters, one row), a rope epilogue the tiled layout"));
        }
        if fused.post.is_some() && (fused.norm.is_none() || fused.add.is_some() || fused.rope.is_some()) {
            return Err(bad("a post-norm prologue needs the norm, and neither a residual add nor a rope epilogue"));
        }
        let mut inputs = vec![x];
        for t in w.buffers() {
            inputs.push(self.external(t));
        }
        inputs.extend(bias);
        inputs.extend_from_slice(extra);
        if fused.rope.is_some() {
            // The rope epilogue writes q into a given tensor (the last input), shared by the weights of a split q|k|v.
            let q_out = *extra.last().expect("the rope epilogue's q");
            self.add_effect(kernel, &inputs)?;
            return Ok(vec![q_out]);
        }
        let mut out = xs.clone();
        *out.last_mut().expect("x has a last dim") = cols;
        if fused.post.is_some() {
            return self.add_node(kernel, &inputs, &[("matmul_q", &out, DType::F32), ("residual", &[1, k], DType::F32)]);
        }
        self.add_node(kernel, &inputs, &[("matmul_q", &out, DType::F32)])
    }
}
