//! The Llama family (Llama, SmolLM2, Mistral, Qwen2 with q/k/v biases, Qwen3 with q/k norms, MiniCPM with muP
//! scalings and longrope), one implementation over any weight format: loading, per-session KV caches, and the
//! graph of one forward step.

use super::blockffn::BlockFfn;
use super::config::{Arch, LlamaConfig, SparseConfig};
use super::eagle::EagleIn;
use super::frspec::HeadSubset;
pub use super::names::Names;
use super::names::Role;
use super::options::KvType;
use super::rope_scaling::RopeSession;
use super::sparse::{self, CompressedKeys};
use super::step::{Step, StepOutputs};
use super::weights::{load_concat, load_vector_with, Linear, WeightSource};
use crate::error::{Error, Result};
use crate::gpu::packed::PackedWeight;
use crate::gpu::{DType, Gpu, GpuTensor};
use crate::graph::{Graph, Plan, Tap, TensorId};
use crate::ops::kv_compress::Window;
use crate::ops::rope::{RopeConfig, RopeStyle};
use crate::ops::rope_kv::QkvSource;
use crate::quant::pack::Layout;

/// The FFN's input projections: when both are stored alike, one matmul over (gate, up) row pairs
/// (`[2 * ffn, hidden]`) whose epilogue applies the activation (one dispatch, no `[n, 2 * ffn]` intermediate); else
/// stacked (gate rows then up rows: one matmul and the activation) where a dense matrix's row parts would split a
/// pair; else two matmuls and the activation.
enum FfnIn {
    Paired(Linear),
    Stacked(Linear),
    Split { gate: Linear, up: Linear },
}

/// The attention's input projections q, k and v in groups of consecutive ones stored alike, each group one matmul
/// over its weights stacked by rows (biases concatenated): q|k|v (`[(n_heads + 2 n_kv) head_dim, hidden]`), or q|k
/// and v, or q and k|v, or three.
struct QkvIn {
    /// (weights, bias, how many of q, k, v the group holds).
    groups: Vec<(Linear, Option<GpuTensor>, usize)>,
}

struct Layer {
    attn_norm: GpuTensor, // [hidden]
    qkv: QkvIn,
    o: Linear, // [hidden, n_heads * head_dim]
    /// Qwen3's and Gemma 3's q and k norms, `[2, head_dim]`: q's weights, then k's.
    qk_norm: Option<GpuTensor>,
    ffn_norm: GpuTensor, // [hidden]
    /// Gemma 3's norms of the attention and FFN outputs, `[hidden]` each.
    post_norms: Option<(GpuTensor, GpuTensor)>,
    ffn: Ffn,
}

impl Layer {
    /// The quantized gate|up (row pairs) and down weights of a fused step's FFN.
    fn fused_ffn(&self) -> Result<(&PackedWeight, &PackedWeight)> {
        match &self.ffn {
            Ffn::SwiGlu {
                input: FfnIn::Paired(Linear::Quant { w: gu, .. }),
                down: Linear::Quant { w: dw, .. },
            } => Ok((gu, dw)),
            _ => Err(Error::Graph("a fused step with an FFN it cannot fuse".into())),
        }
    }
}

/// A layer's feed-forward block.
enum Ffn {
    /// SwiGLU: `down(silu(gate x) * up x)`.
    SwiGlu {
        input: FfnIn,
        down: Linear, /* [hidden, ffn] */
    },
    /// BlockFFN's routed experts.
    Block(BlockFfn),
}

/// A loaded model: weights only. Each session has its own [`KvCache`].
pub struct Llama {
    pub cfg: LlamaConfig,
    embed: Linear,              // [vocab, hidden]
    head: Option<Linear>,       // [vocab, hidden]; None when tied to `embed`
    pub(super) norm: GpuTensor, // [hidden], times MiniCPM's logit scale
    layers: Vec<Layer>,
    /// Element type of the KV caches of this model's sessions.
    kv_type: KvType,
    /// The RoPE pairing of q/k rows as the device holds them: the file's, or interleaved where the loader moved
    /// rotate-half rows ([`super::rope_pairs`]).
    pairs: RopeStyle,
    /// FR-Spec: the head restricted to a subset of the vocabulary (a draft model's), used instead of the full one.
    head_subset: Option<HeadSubset>,
    /// An EAGLE-1 draft head: its input projection over (token embedding, target feature); layer 0 then has no
    /// input norm and the head no final norm ([`super::eagle`]).
    pub(super) eagle: Option<EagleIn>,
}

/// The rotation of one kind of layer for a session, with its divisors on the device.
struct RopeTable {
    session: RopeSession,
    /// f32 `[rope_dim / 2]`.
    divisors: Option<GpuTensor>,
}

/// Keys and values of every layer for `max_ctx` positions, owned by one session.
pub struct KvCache {
    pub max_ctx: usize,
    /// Per layer: K and V, each `[n_kv, max_ctx, head_dim]` of the model's [`KvType`].
    pub(super) layers: Vec<(GpuTensor, GpuTensor)>,
    /// Rope of the global layers, then (with sliding windows) of the local ones, for this context size.
    rope: Vec<RopeTable>,
    /// Per layer: InfLLM-v2 compressed keys (when the model attends sparsely past `dense_len`).
    sparse: Option<Vec<CompressedKeys>>,
}

impl KvCache {
    /// Whether a step ending at KV length `kv_len` attends sparsely (the model's sparse config and this cache).
    pub fn sparse_at(&self, cfg: &LlamaConfig, kv_len: usize) -> bool {
        self.sparse.is_some() && cfg.sparse.is_some_and(|s| s.is_sparse(kv_len))
    }

    /// Every layer's InfLLM-v2 compressed keys of the windows complete within positions `0..len` read back, C1
    /// then C2 per layer, each `[n_kv, count, head_dim]` (None without them): for tests and debugging. Windows
    /// past `len` are not part of the session (a step rewrites them when it completes them).
    pub fn compressed_keys(&self, gpu: &Gpu, windows: [Window; 2], len: usize) -> Result<Option<Vec<f32>>> {
        let Some(layers) = &self.sparse else {
            return Ok(None);
        };
        let mut all = Vec::new();
        for keys in layers {
            for (t, w) in [(&keys.c1, windows[0]), (&keys.c2, windows[1])] {
                let values = t.download_f32(gpu)?;
                let (n, head_dim) = (t.shape[1], t.shape[2]);
                let keep = w.count(len).min(n) * head_dim;
                for head in values.chunks(n * head_dim) {
                    all.extend_from_slice(&head[..keep]);
                }
            }
        }
        Ok(Some(all))
    }

    /// Every layer's cached K then V at positions `0..len` read back (`[n_kv, len, head_dim]` each, f16 caches
    /// converted exactly): for tests and debugging.
    pub fn prefix(&self, gpu: &Gpu, len: usize) -> Result<Vec<f32>> {
        let len = len.min(self.max_ctx);
        let mut all = Vec::new();
        for (k, v) in &self.layers {
            for t in [k, v] {
                let values = t.download_f32(gpu)?;
                let (ctx, head_dim) = (t.shape[1], t.shape[2]);
                for head in values.chunks_exact(ctx * head_dim) {
                    all.extend_from_slice(&head[..len * head_dim]);
                }
            }
        }
        Ok(all)
    }
}

impl Llama {
    /// Load every weight to the device.
    pub fn load(
        gpu: &Gpu,
        src: &dyn WeightSource,
        cfg: LlamaConfig,
        names: Names,
        progress: impl FnMut(usize, usize),
    ) -> Result<Llama> {
        Self::load_sharing(gpu, src, cfg, names, progress, None)
    }

    /// [`Llama::load`], taking the embedding, LM head and final norm from `shared` instead of `src` when given (an
    /// EAGLE head uses its target's).
    pub(super) fn load_sharing(
        gpu: &Gpu,
        src: &dyn WeightSource,
        cfg: LlamaConfig,
        names: Names,
        mut progress: impl FnMut(usize, usize),
        shared: Option<&Llama>,
    ) -> Result<Llama> {
        let c = &cfg;
        let unfused = super::fused::Unfused::of(src, c, names);
        let interleaved = super::rope_pairs::Interleaved::of(&unfused, c, names)?;
        let (src, pairs): (&dyn WeightSource, _) = match &interleaved {
            Some(moved) => (moved, RopeStyle::Interleaved),
            None => (&unfused, c.rope_style),
        };
        let q_dim = c.n_heads * c.head_dim;
        let kv_dim = c.n_kv_heads * c.head_dim;
        let linear = |name: String, n: usize, k: usize| -> Result<Linear> {
            let t = src.require(&name)?;
            if t.shape != [n, k] {
                return Err(Error::shape(
                    "load",
                    format!("{name}: {:?}, expected [{n}, {k}]", t.shape),
                ));
            }
            Linear::load(gpu, &t)
        };
        // Gemma's Hugging Face norms compute x * (1 + w); llama.cpp's converter stores 1 + w, which the kernels use.
        let norm_shift = c.arch == Arch::Gemma3 && names == Names::Hf;
        let stored = move |w: f32| if norm_shift { w + 1.0 } else { w };
        let vector = |name: String, len: usize| load_vector_with(gpu, &src.require(&name)?, len, stored);
        let qkv_in = |i: usize| -> Result<QkvIn> {
            let n = |role| names.layer(c.arch, i, role);
            let with_bias = c.qkv_bias || c.arch == Arch::Qwen2;
            let dims = [
                (Role::Q, Role::QBias, q_dim),
                (Role::K, Role::KBias, kv_dim),
                (Role::V, Role::VBias, kv_dim),
            ];
            let mut ws = Vec::new();
            for (role, _, rows) in dims {
                let t = src.require(&n(role))?;
                if t.shape != [rows, c.hidden] {
                    let want = format!("{}: {:?}, expected [{rows}, {}]", t.name, t.shape, c.hidden);
                    return Err(Error::shape("load", want));
                }
                ws.push(t);
            }
            // From each projection on, the longest run stored alike (a single one always stacks).
            let mut groups = Vec::new();
            let mut p = 0;
            while p < 3 {
                for end in (p + 1..=3).rev() {
                    let name = format!("blk.{i}.attn_{}", ["q", "k", "v"][p..end].concat());
                    let Some(w) = Linear::load_stacked(gpu, &name, &ws[p..end])? else {
                        continue;
                    };
                    let biases = if with_bias {
                        let part = |&(_, b, len)| Ok((src.tensor(&n(b))?, len));
                        dims[p..end].iter().map(part).collect::<Result<Vec<_>>>()?
                    } else {
                        Vec::new()
                    };
                    let bias = load_concat(gpu, &format!("{name}.bias"), &biases, |b| b)?;
                    groups.push((w, bias, end - p));
                    p = end;
                    break;
                }
            }
            Ok(QkvIn { groups })
        };
        let (embed, head) = match shared {
            Some(t) => (t.embed.clone(), t.head.clone()),
            None if c.tie_embeddings => (linear(names.of(c.arch, Role::Embed, None), c.vocab, c.hidden)?, None),
            None => (
                linear(names.of(c.arch, Role::Embed, None), c.vocab, c.hidden)?,
                Some(linear(names.of(c.arch, Role::Head, None), c.vocab, c.hidden)?),
            ),
        };
        let mut layers = Vec::with_capacity(c.n_layers);
        for i in 0..c.n_layers {
            progress(i, c.n_layers);
            let n = |role| names.layer(c.arch, i, role);
            layers.push(Layer {
                attn_norm: vector(n(Role::AttnNorm), c.hidden)?,
                qkv: qkv_in(i)?,
                o: linear(n(Role::O), c.hidden, q_dim)?,
                qk_norm: if c.qk_norm {
                    let parts = [
                        (Some(src.require(&n(Role::QNorm))?), c.head_dim),
                        (Some(src.require(&n(Role::KNorm))?), c.head_dim),
                    ];
                    load_concat(gpu, &format!("blk.{i}.attn_qk_norm"), &parts, stored)?
                } else {
                    None
                },
                ffn_norm: vector(n(Role::FfnNorm), c.hidden)?,
                post_norms: if c.post_norms {
                    Some((
                        vector(n(Role::PostAttnNorm), c.hidden)?,
                        vector(n(Role::PostFfnNorm), c.hidden)?,
                    ))
                } else {
                    None
                },
                ffn: match &c.moe {
                    Some(m) => Ffn::Block(BlockFfn::load(gpu, src, c, m, i)?),
                    None => Ffn::SwiGlu {
                        input: {
                            let (gate, up) = (src.require(&n(Role::Gate))?, src.require(&n(Role::Up))?);
                            for t in [&gate, &up] {
                                if t.shape != [c.ffn, c.hidden] {
                                    let want = format!("{}: {:?}, expected [{}, {}]", t.name, t.shape, c.ffn, c.hidden);
                                    return Err(Error::shape("load", want));
                                }
                            }
                            let name = format!("blk.{i}.ffn_gate_up");
                            if let Some(l) = Linear::load_paired(gpu, &name, &gate, &up)? {
                                FfnIn::Paired(l)
                            } else if let Some(l) = Linear::load_stacked(gpu, &name, &[gate, up])? {
                                FfnIn::Stacked(l)
                            } else {
                                FfnIn::Split {
                                    gate: linear(n(Role::Gate), c.ffn, c.hidden)?,
                                    up: linear(n(Role::Up), c.ffn, c.hidden)?,
                                }
                            }
                        },
                        down: linear(n(Role::Down), c.hidden, c.ffn)?,
                    },
                },
            });
        }
        progress(c.n_layers, c.n_layers);
        // logits = head(norm(h) * logit): MiniCPM's logit scale folded into the norm's weight (exact when 1).
        let logit = c.mup.logit;
        let norm = match shared {
            Some(t) => t.norm.clone(),
            None => load_vector_with(
                gpu,
                &src.require(&names.of(c.arch, Role::FinalNorm, None))?,
                c.hidden,
                |w| stored(w) * logit,
            )?,
        };
        gpu.check("load")?;
        Ok(Llama {
            cfg,
            embed,
            head,
            norm,
            layers,
            kv_type: KvType::F32,
            pairs,
            head_subset: None,
            eagle: None,
        })
    }

    /// The same model scoring only the tokens of `subset` (FR-Spec, for a draft model): its steps' logits are
    /// `[.., subset.ids.len()]` in the subset's order, and their argmax and top-k ids are token ids.
    pub fn with_head_subset(self, subset: HeadSubset) -> Llama {
        Llama {
            head_subset: Some(subset),
            ..self
        }
    }

    /// The token ids the head scores when it is restricted (FR-Spec), in logit order.
    pub fn head_ids(&self) -> Option<&[u32]> {
        self.head_subset.as_ref().map(|s| s.ids.as_slice())
    }

    /// The LM head the steps use: the restricted one if any, else the output matrix, else the tied embedding.
    fn lm_head(&self) -> &Linear {
        match &self.head_subset {
            Some(s) => &s.head,
            None => self.head.as_ref().unwrap_or(&self.embed),
        }
    }

    /// The same model whose sessions keep K and V as `kv_type`.
    pub fn with_kv_type(self, kv_type: KvType) -> Llama {
        Llama { kv_type, ..self }
    }

    /// A zeroed KV cache of `max_ctx` positions (at most the trained context).
    pub fn new_cache(&self, gpu: &Gpu, max_ctx: usize) -> Result<KvCache> {
        let c = &self.cfg;
        if max_ctx == 0 || max_ctx > c.context {
            return Err(Error::Invalid(format!(
                "a context of {max_ctx} positions (the model has 1..={})",
                c.context
            )));
        }
        let shape = [c.n_kv_heads, max_ctx, c.head_dim];
        let layers = (0..c.n_layers)
            .map(|i| {
                Ok((
                    GpuTensor::zeros(gpu, &format!("blk.{i}.k_cache"), &shape, self.kv_type.dtype())?,
                    GpuTensor::zeros(gpu, &format!("blk.{i}.v_cache"), &shape, self.kv_type.dtype())?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut kinds = vec![(c.rope_theta, &c.rope_scaling)];
        if let Some(s) = &c.sliding {
            kinds.push((s.local_theta, &s.local_scaling));
        }
        let rope = kinds
            .into_iter()
            .enumerate()
            .map(|(k, (theta, scaling))| {
                let session = scaling.session(theta, c.rope_dim, max_ctx);
                let divisors = match &session.divisors {
                    Some(d) => Some(GpuTensor::upload_f32(
                        gpu,
                        &format!("rope_divisors{k}"),
                        &[c.rope_dim / 2],
                        d,
                    )?),
                    None => None,
                };
                Ok(RopeTable { session, divisors })
            })
            .collect::<Result<Vec<_>>>()?;
        let sparse = match &c.sparse {
            Some(s) => sparse::new_caches(gpu, s, c.n_layers, c.n_kv_heads, c.head_dim, max_ctx)?,
            None => None,
        };
        Ok(KvCache {
            max_ctx,
            layers,
            rope,
            sparse,
        })
    }

    /// Bytes of weights one decode step reads (every matrix once; the embedding gathers one row).
    pub fn weight_bytes_per_token(&self) -> u64 {
        let head = self.lm_head().bytes();
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| {
                let ffn = match &l.ffn {
                    Ffn::SwiGlu {
                        input: FfnIn::Paired(w) | FfnIn::Stacked(w),
                        down,
                    } => w.bytes() + down.bytes(),
                    Ffn::SwiGlu {
                        input: FfnIn::Split { gate, up },
                        down,
                    } => gate.bytes() + up.bytes() + down.bytes(),
                    Ffn::Block(b) => b.bytes(),
                };
                let qkv: u64 = l.qkv.groups.iter().map(|(w, _, _)| w.bytes()).sum();
                ffn + qkv + l.o.bytes()
            })
            .sum();
        head + layers
    }

    /// The rope op's settings for one of the session's rotations.
    fn rope(&self, g: &mut Graph, t: &RopeTable) -> RopeConfig {
        let c = &self.cfg;
        let mut r = RopeConfig::new(self.pairs, t.session.theta, c.rope_dim);
        r.freq_scale = t.session.freq_scale;
        r.attn_factor = t.session.attn_factor;
        r.factors = t.divisors.as_ref().map(|f| g.external(f));
        r
    }

    /// Record one forward step over `n_tokens` new tokens at positions `vars.pos ..`, writing their K/V into the
    /// cache; the outputs are those of the last token.
    pub fn step(&self, gpu: &Gpu, cache: &KvCache, n_tokens: usize, out: StepOutputs) -> Result<Step> {
        self.step_with(gpu, cache, n_tokens, out, false)
    }

    /// [`Llama::step`] with InfLLM-v2 sparse attention when `sparse` (the cache must have compressed keys: see
    /// [`KvCache::sparse_at`]); the compressed keys are kept up to date in dense steps too.
    pub fn step_with(
        &self,
        gpu: &Gpu,
        cache: &KvCache,
        n_tokens: usize,
        out: StepOutputs,
        sparse: bool,
    ) -> Result<Step> {
        self.build_step(gpu, cache, n_tokens, out, sparse, false)
    }

    /// A verification step: [`Llama::step_with`] whose outputs cover every one of its `n_tokens` rows (logits
    /// `[n, vocab]`, argmax `[n]`, top-k `[n, k]`), each equal bit for bit to what a one-token step at that
    /// position computes (the kernels are batch invariant for up to `attention_decode::MAX_TOKENS` rows).
    pub fn verify_step(
        &self,
        gpu: &Gpu,
        cache: &KvCache,
        n_tokens: usize,
        out: StepOutputs,
        sparse: bool,
    ) -> Result<Step> {
        if n_tokens > crate::ops::attention_decode::MAX_TOKENS {
            return Err(Error::Invalid(format!(
                "a verification step of {n_tokens} tokens (at most {})",
                crate::ops::attention_decode::MAX_TOKENS
            )));
        }
        self.build_step(gpu, cache, n_tokens, out, sparse, true)
    }

    /// Whether [`Llama::batch_step`] serves this model on `gpu`: not an EAGLE head, dense attention (no InfLLM-v2
    /// stages), and rows
    /// of the q|k|v projections and of the attention output that start at the adapter's storage-offset alignment
    /// (each sequence binds its own rows).
    pub fn can_batch(&self, gpu: &Gpu) -> bool {
        let c = &self.cfg;
        let align = gpu.caps.storage_align.max(1) as usize;
        let aligned = |cols: usize| (4 * cols).is_multiple_of(align);
        c.sparse.is_none()
            && self.eagle.is_none()
            && aligned(c.n_heads * c.head_dim)
            && self
                .layers
                .iter()
                .all(|l| l.qkv.groups.iter().all(|(w, _, _)| aligned(w.shape().0)))
    }

    /// One decode step for several sequences at once: row `r` is the next token of the session whose cache is
    /// `caches[r]`, at that session's own position (the run passes one position per row: [`Step::run_batch`]).
    /// The matmuls and norms read each weight once for every row; each row's RoPE, K/V write and attention run
    /// on its own cache. The outputs cover every row, each equal bit for bit to that session's one-token step
    /// (the kernels are batch invariant). At most `MAX_BATCH` rows; see [`Llama::can_batch`].
    pub fn batch_step(&self, gpu: &Gpu, caches: &[&KvCache], out: StepOutputs) -> Result<Step> {
        if caches.is_empty() || caches.len() > MAX_BATCH {
            return Err(Error::Invalid(format!(
                "a batched step of {} sequences (1..={MAX_BATCH})",
                caches.len()
            )));
        }
        if !self.can_batch(gpu) {
            return Err(Error::Invalid(
                "this model cannot batch sessions on this adapter (an EAGLE head, sparse attention, or unaligned rows)"
                    .into(),
            ));
        }
        let n = caches.len();
        let mut g = Graph::new();
        let ids = g.input("ids", &[n], DType::U32);
        let seqs = caches.iter().map(|&cache| self.seq_context(&mut g, cache)).collect();
        let ctx = StepContext::dense(gpu, seqs, n);
        self.plan_step(gpu, g, &ctx, (ids, None), out, true)
    }

    /// A greedy draft loop in one step: `k` decode steps chained on the device (the links, sequence j of the plan:
    /// [`Step::run_chain`]). Link 0 runs `m` given tokens at positions `pos ..` (a draft model catching up with the
    /// accepted tokens); link j > 0 runs the argmax of link j - 1 at position `pos + m + j - 1`. Each link is the
    /// step of its size that [`Llama::step`] builds, so the `k` argmaxes read back are what `k` separate steps would
    /// choose, in one submission. A restricted head's (FR-Spec) argmax, an index into its ids, is mapped to the
    /// token id on the device (`gather_cols` over the ids). An EAGLE head's link 0 takes the target's features
    /// `[m, hidden]` ([`Step::write_features`]) and link j > 0 the feature link j - 1 predicted (its output, on the
    /// device). Not for sparse attention.
    pub fn chain_step(&self, gpu: &Gpu, cache: &KvCache, m: usize, k: usize) -> Result<Step> {
        if !self.can_chain() {
            return Err(Error::Invalid("a chained draft step needs dense attention".into()));
        }
        if k == 0 || k > MAX_CHAIN || m == 0 || m > MAX_CHAIN || m + k - 1 > cache.max_ctx {
            return Err(Error::Invalid(format!(
                "a chain of {k} steps after {m} tokens (1..={MAX_CHAIN} each, context {})",
                cache.max_ctx
            )));
        }
        let mut g = Graph::new();
        let ids = g.input("ids", &[m], DType::U32);
        // A restricted head's token ids `[n]` u32, in logit order.
        let head_ids = self.head_subset.as_ref().map(|s| g.external(&s.ids_on_device));
        let features = self
            .is_eagle()
            .then(|| g.input("features", &[m, self.cfg.hidden], DType::F32));
        let (mut token, mut feature) = (ids, features);
        let mut chain = Vec::with_capacity(k);
        let out = StepOutputs {
            hidden: self.is_eagle(),
            ..StepOutputs::default()
        };
        for j in 0..k {
            let n_tokens = if j == 0 { m } else { 1 };
            g.set_seq(j);
            let ctx = StepContext::dense(gpu, vec![self.seq_context(&mut g, cache)], n_tokens);
            let f = self.forward(&mut g, gpu, &ctx, (token, feature), out, false)?;
            // An EAGLE head's predicted feature `[1, hidden]`: the next link's input.
            if let Some(h) = f.hidden {
                feature = Some(if n_tokens > 1 { g.rows(h, n_tokens - 1, 1)? } else { h });
            }
            let best = g.argmax(f.logits)?; // [1, 1]: the last row's
            let best = match head_ids {
                Some(t) => {
                    let index = g.reshape(best, &[1])?;
                    g.gather_cols(t, index)? // [1]: the token id
                }
                None => best,
            };
            g.output(best);
            chain.push(best);
            token = g.reshape(best, &[1])?;
        }
        g.set_seq(0);
        Ok(Step {
            plan: Plan::new(gpu, g)?,
            n_tokens: m,
            features,
            vars: Vec::with_capacity(k),
            vocab_ids: None,
            ids,
            logits: None,
            argmax: None,
            topk: None,
            lse: None,
            router: Vec::new(),
            hidden: None,
            aux: Vec::new(),
            chain,
            tree: None,
            path: None,
        })
    }

    /// The number of q|k|v projection groups of layer `i` (1 when all three are stored alike).
    pub(super) fn qkv_groups(&self, i: usize) -> usize {
        self.layers.get(i).map_or(0, |l| l.qkv.groups.len())
    }

    /// Whether [`Llama::chain_step`] serves this model.
    pub fn can_chain(&self) -> bool {
        self.cfg.sparse.is_none()
    }

    /// The step graph: outputs of the last token, or of every token when `all_rows`.
    fn build_step(
        &self,
        gpu: &Gpu,
        cache: &KvCache,
        n_tokens: usize,
        out: StepOutputs,
        sparse: bool,
        all_rows: bool,
    ) -> Result<Step> {
        let sparse_keys = self.sparse_keys(cache, sparse)?;
        if n_tokens == 0 || n_tokens > cache.max_ctx {
            return Err(Error::Invalid(format!(
                "a step of {n_tokens} tokens (context {})",
                cache.max_ctx
            )));
        }
        let mut g = Graph::new();
        let ids = g.input("ids", &[n_tokens], DType::U32);
        let ctx = StepContext {
            sparse,
            sparse_keys,
            ..StepContext::dense(gpu, vec![self.seq_context(&mut g, cache)], n_tokens)
        };
        // An EAGLE head's second input: the target's features `[n, hidden]`, one per token.
        let features = self
            .eagle
            .as_ref()
            .map(|_| g.input("features", &[n_tokens, self.cfg.hidden], DType::F32));
        self.plan_step(gpu, g, &ctx, (ids, features), out, all_rows)
    }

    /// A step's view of one session: its cache and its rotations as graph settings.
    pub(super) fn seq_context<'a>(&self, g: &mut Graph, cache: &'a KvCache) -> SeqContext<'a> {
        SeqContext {
            cache,
            ropes: cache.rope.iter().map(|t| self.rope(g, t)).collect(),
        }
    }

    /// Record the forward pass and the read-backs `out` asks for into `g`, and plan it: a step over `ctx`'s rows,
    /// whose inputs are `ids` (and an EAGLE head's features).
    pub(super) fn plan_step(
        &self,
        gpu: &Gpu,
        g: Graph,
        ctx: &StepContext<'_>,
        inputs: (TensorId, Option<TensorId>),
        out: StepOutputs,
        all_rows: bool,
    ) -> Result<Step> {
        self.plan_step_then(gpu, g, ctx, inputs, out, all_rows, |_, _| Ok(None))
    }

    /// [`Llama::plan_step`], then `then` records more nodes after the read-backs (given the argmax tensor, if read
    /// back) and may name a tree path tensor to read back (`StepResult::tree_path`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn plan_step_then(
        &self,
        gpu: &Gpu,
        mut g: Graph,
        ctx: &StepContext<'_>,
        (ids, features): (TensorId, Option<TensorId>),
        out: StepOutputs,
        all_rows: bool,
        then: impl FnOnce(&mut Graph, Option<TensorId>) -> Result<Option<TensorId>>,
    ) -> Result<Step> {
        let f = self.forward(&mut g, gpu, ctx, (ids, features), out, all_rows)?;
        let (logits, argmax, topk, lse) = read_backs(&mut g, f.logits, out)?;
        let path = then(&mut g, argmax)?;
        Ok(Step {
            plan: Plan::new(gpu, g)?,
            n_tokens: ctx.n_tokens,
            features,
            vars: Vec::with_capacity(ctx.seqs.len()),
            vocab_ids: self.head_ids().map(<[u32]>::to_vec),
            ids,
            logits,
            argmax,
            topk,
            lse,
            router: f.router,
            hidden: f.hidden,
            aux: f.aux,
            chain: Vec::new(),
            tree: None,
            path,
        })
    }

    /// Record the forward pass of `ids` `[n]` (with an EAGLE head's features `[n, hidden]`): the logits `[rows,
    /// vocab]` of the last row, or of every row when `all_rows`, the BlockFFN router weights asked for, and every
    /// row's hidden state `[n, hidden]` marked for read-back when asked for.
    fn forward(
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
            true => super::eagle3::feature_layers(self.cfg.n_layers)?.to_vec(),
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
    pub(super) fn sparse_keys<'a>(&'a self, cache: &'a KvCache, sparse: bool) -> Result<SparseKeys<'a>> {
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
        let compressed = match s.sparse_keys {
            Some((sc, keys)) => Some((sc, sparse::compress(g, sc, &keys[i], kc, s.n_tokens)?)),
            None => None,
        };
        if let Some(tree) = s.tree {
            return g.attention_decode_tree(q, kc, vc, c.attn_scale, c.layer_window(i), tree);
        }
        match (s.sparse, compressed) {
            (true, Some((sc, cc))) => sparse::attention(g, sc, q, kc, vc, cc, s.seqs[0].cache.max_ctx, c.attn_scale),
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
        if let Some(super::eagle::EagleIn::V3(_)) = &self.eagle {
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
                Some(super::eagle::EagleIn::MiniCpm(m)) => {
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

/// A branch output `[n, hidden]` still to be added to the residual stream, with the weight of the RMSNorm it takes
/// first (Gemma's post-attention and post-FFN norms).
type Branch<'a> = (TensorId, Option<&'a GpuTensor>);

/// The attention block's input: the normed `[n, hidden]`, or the residual stream `[n, hidden]` that the fused
/// q|k|v matmuls norm themselves (and the o projection adds to).
#[derive(Clone, Copy)]
enum AttnIn {
    Normed(TensorId),
    Residual(TensorId),
}

/// The sparse settings and a cache's compressed keys (per layer).
pub(super) type SparseKeys<'a> = Option<(&'a SparseConfig, &'a [CompressedKeys])>;

/// Most sequences of a batched step ([`Llama::batch_step`]): as many rows as the kernels' batch invariance is
/// tested for.
pub const MAX_BATCH: usize = crate::ops::attention_decode::MAX_TOKENS;

/// Most links of a chained draft step ([`Llama::chain_step`]), and most tokens of its first link.
pub const MAX_CHAIN: usize = 8;

/// A recorded forward pass: the hidden states asked for `[n, hidden]`, the logits `[rows, vocab]`, BlockFFN's router
/// weights, and EAGLE-3's features (the hidden states entering its three layers, `[n, hidden]` each).
pub(super) struct Forward {
    pub(super) hidden: Option<TensorId>,
    pub(super) logits: TensorId,
    pub(super) router: Vec<TensorId>,
    pub(super) aux: Vec<TensorId>,
}

/// What every layer of one step graph shares.
pub(super) struct StepContext<'a> {
    /// The sequences whose tokens the step runs: one, or (a batched step) one per row.
    pub(super) seqs: Vec<SeqContext<'a>>,
    /// Rows of the step.
    pub(super) n_tokens: usize,
    /// Whether this step attends sparsely.
    pub(super) sparse: bool,
    pub(super) sparse_keys: SparseKeys<'a>,
    /// A tree step's table `[n, TREE_W]` u32 (see `attention_decode::TREE_W`): rows are the nodes of a draft tree.
    pub(super) tree: Option<TensorId>,
    /// The adapter runs attention_prefill's CPU kernel, which also serves head dim 256 (`attention_prefill_wide`).
    pub(super) cpu_prefill: bool,
}

impl<'a> StepContext<'a> {
    /// A dense step of `n_tokens` rows over `seqs` on the adapter `gpu`: no sparse attention, no tree.
    pub(super) fn dense(gpu: &Gpu, seqs: Vec<SeqContext<'a>>, n_tokens: usize) -> StepContext<'a> {
        StepContext {
            seqs,
            n_tokens,
            sparse: false,
            sparse_keys: None,
            tree: None,
            cpu_prefill: crate::ops::attention_prefill::cpu_kernel(&gpu.caps),
        }
    }
}

/// One sequence of a step: its session's cache and rotations (global, then sliding-window).
pub(super) struct SeqContext<'a> {
    cache: &'a KvCache,
    ropes: Vec<RopeConfig>,
}

impl SeqContext<'_> {
    /// Layer `i`'s K and V caches in `g`.
    fn caches(&self, g: &mut Graph, i: usize) -> (TensorId, TensorId) {
        let (k_cache, v_cache) = &self.cache.layers[i];
        (g.external(k_cache), g.external(v_cache))
    }
}

/// A step's read-back tensors: logits, argmax, top-k (ids, values), log-sum-exp.
type ReadBacks = (
    Option<TensorId>,
    Option<TensorId>,
    Option<(TensorId, TensorId)>,
    Option<TensorId>,
);

/// Marks the read-backs `out` asks for on the last token's `logits`: the logits, their argmax, their top-k, their
/// log-sum-exp.
fn read_backs(g: &mut Graph, logits: TensorId, out: StepOutputs) -> Result<ReadBacks> {
    let step_logits = if out.logits {
        g.output(logits);
        Some(logits)
    } else {
        None
    };
    let argmax = if out.argmax {
        let a = g.argmax(logits)?;
        g.output(a);
        Some(a)
    } else {
        None
    };
    let topk = if out.topk > 0 {
        let (ti, tv) = g.topk(logits, out.topk)?;
        g.output(ti);
        g.output(tv);
        Some((ti, tv))
    } else {
        None
    };
    let lse = if out.lse {
        let l = g.logsumexp(logits)?;
        g.output(l);
        Some(l)
    } else {
        None
    };
    Ok((step_logits, argmax, topk, lse))
}
