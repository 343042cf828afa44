//! The Llama family (Llama, SmolLM2, Mistral, Qwen2 with q/k/v biases, Qwen3 with q/k norms, MiniCPM with muP
//! scalings and longrope), one implementation over any weight format: loading, per-session KV caches and the types a
//! step graph shares; the graph of one forward pass is in `forward`, the planning of steps in `plans`.

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
use crate::graph::{Graph, Tap, TensorId};
use crate::ops::kv_compress::Window;
use crate::ops::rope::{RopeConfig, RopeStyle};
use crate::ops::rope_kv::QkvSource;
use crate::quant::pack::Layout;

mod forward;
mod plans;

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

    /// The restricted head's token ids on the device `[n]` u32, in logit order.
    pub(super) fn head_ids_on_device(&self) -> Option<&GpuTensor> {
        self.head_subset.as_ref().map(|s| &s.ids_on_device)
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
