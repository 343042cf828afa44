//! Speculative-decoding options shared by `generate`, `chat` and `bench`: which draft source, how many drafts per
//! step, and loading a draft model onto the target's device.

use super::common::ModelArgs;
use anyhow::Context;
use clap::{Args, ValueEnum};
use shaderlm::generate::draft::{check_same_vocab, DraftModel, Drafter, Lookup};
use shaderlm::generate::eagle::EagleDraft;
use shaderlm::generate::spec::{SpecOptions, MAX_DRAFT};
use shaderlm::generate::tree::TreeShape;
use shaderlm::generate::Generator;
use shaderlm::gpu::Gpu;
use shaderlm::model::frspec;
use shaderlm::model::load::LoadedModel;
use shaderlm::model::{Llama, LoadOptions, StepOutputs};
use shaderlm::sampling::{Sampler, SamplingParams};
use std::path::PathBuf;

/// Draft tokens per verification step unless --draft-max or --draft-adaptive says otherwise.
const FIXED_DRAFTS: usize = 3;

/// Where drafts come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SpecKind {
    /// Prompt lookup: the tokens that followed the latest earlier occurrence of the last n-gram.
    Lookup,
    /// A smaller model with the same vocabulary (--draft-model).
    Draft,
    /// An EAGLE-1 head predicting from the target's hidden states (--eagle).
    Eagle,
}

/// A loaded draft source that has weights: a draft model, or an EAGLE head (over the target's `ctx` positions).
pub enum LoadedDraft {
    Model(Box<LoadedModel>),
    Eagle { head: Box<Llama>, ctx: usize },
}

#[derive(Args, Debug, Clone, Default)]
pub struct SpecArgs {
    /// Speculative decoding with drafts from prompt lookup or a draft model; the output stays token for token what
    /// plain decoding gives (greedy, or sampled with the same --seed).
    #[arg(long, value_enum)]
    pub spec: Option<SpecKind>,
    /// A draft model with the target's vocabulary (implies --spec draft).
    #[arg(long, value_name = "PATH")]
    pub draft_model: Option<PathBuf>,
    /// An EAGLE-1 head directory (config.json + model.safetensors, SafeAILab's layout) for the target (implies
    /// --spec eagle).
    #[arg(long, value_name = "DIR", conflicts_with = "draft_model")]
    pub eagle: Option<PathBuf>,
    /// The draft model keeps only its first N layers; without --draft-model the draft is the target's own file so
    /// cut (a layer-skipping self-draft; implies --spec draft; all its layers: a draft that is always accepted).
    #[arg(long, value_name = "N")]
    pub draft_layers: Option<usize>,
    /// Draft tokens per verification step (1..=7), or the most with --draft-adaptive. The default, 3, makes a
    /// 4-token verification step, which the tiled 4-token GEMM serves (measured cheapest per accepted token on
    /// lavapipe); with --draft-adaptive, 7.
    #[arg(long, value_name = "N")]
    pub draft_max: Option<usize>,
    /// Each chain step drafts 1, 3 or --draft-max tokens, whichever has given the most tokens per second so far
    /// (from the acceptance seen and each step size's measured time): for adapters where a verification step's
    /// cost grows slowly with its rows (GPUs). On lavapipe it measured no faster than 3 drafts per step (prompt
    /// lookup 1.33x to 1.44x against 1.42x to 1.50x, three alternating pairs).
    #[arg(long)]
    pub draft_adaptive: bool,
    /// Run a greedy draft model's chain and the target's verification as two submissions per step instead of one,
    /// an EAGLE head's drafts one head step per submission, and a draft tree's rounds one submission each instead
    /// of all in one (to measure what the single submission saves).
    #[arg(long)]
    pub draft_apart: bool,
    /// The draft model stops a draft where its top token's probability falls below P.
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    pub draft_p_min: f32,
    /// With --temp > 0: the draft model samples its drafts too, and speculative sampling's acceptance test keeps
    /// the output distributed as the target's (more drafts accepted; a seeded run then differs from a plain one,
    /// which greedy drafts reproduce token for token).
    #[arg(long)]
    pub draft_sample: bool,
    /// FR-Spec: the draft model's or EAGLE head's LM head scores only the N most frequent tokens (and the stop
    /// tokens).
    #[arg(long, value_name = "N")]
    pub frspec_vocab: Option<usize>,
    /// The token ranking for --frspec-vocab: a JSON list of ids, most frequent first (`shaderlm frspec` writes
    /// one) [default: vocabulary order].
    #[arg(long, value_name = "FILE", requires = "frspec_vocab")]
    pub frspec_freq: Option<PathBuf>,
    /// Speculation turns itself off when fewer drafts than this are accepted per step over the last 8 steps (0:
    /// never).
    #[arg(long, default_value_t = 0.5, value_name = "N")]
    pub spec_min_accepted: f32,
    /// Verify a draft tree in one step instead of a chain: DEPTH,TOPK,SIZE as CPM.cu's num_iter, topk_per_iter
    /// and tree_size, e.g. 6,10,60. A draft model grows EAGLE-2's dynamic tree (top-k expansion by cumulative
    /// log-probability, reranked to SIZE nodes); prompt lookup merges up to TOPK matches of DEPTH tokens; an
    /// EAGLE head drafts its chain of up to DEPTH.
    #[arg(long, value_name = "DEPTH,TOPK,SIZE")]
    pub spec_tree: Option<String>,
}

impl SpecArgs {
    /// The draft source asked for, if any.
    pub fn kind(&self) -> anyhow::Result<Option<SpecKind>> {
        anyhow::ensure!(
            self.draft_max.is_none_or(|n| (1..=MAX_DRAFT).contains(&n)),
            "--draft-max must be in 1..={MAX_DRAFT}"
        );
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.draft_p_min),
            "--draft-p-min must be in [0, 1]"
        );
        anyhow::ensure!(
            self.spec_min_accepted.is_finite() && self.spec_min_accepted >= 0.0,
            "--spec-min-accepted must be >= 0"
        );
        if let Some(t) = &self.spec_tree {
            TreeShape::parse(t)?;
            anyhow::ensure!(
                self.spec.is_some()
                    || self.draft_model.is_some()
                    || self.draft_layers.is_some()
                    || self.eagle.is_some(),
                "--spec-tree grows a tree of drafts: it needs a draft source (--spec lookup, --draft-model or --eagle)"
            );
            anyhow::ensure!(
                !self.draft_sample && self.draft_p_min == 0.0,
                "--spec-tree ranks deterministic drafts by probability: leave out --draft-sample and --draft-p-min \
                 (sampled output stays lossless by sample-and-match)"
            );
        }
        anyhow::ensure!(
            self.draft_layers.is_none() || self.eagle.is_none(),
            "--draft-layers cuts a draft model, not an EAGLE head"
        );
        anyhow::ensure!(
            self.frspec_vocab.is_none()
                || self.draft_model.is_some()
                || self.draft_layers.is_some()
                || self.eagle.is_some(),
            "--frspec-vocab restricts a draft head: it needs --draft-model PATH, --draft-layers N or --eagle DIR"
        );
        // A draft model: --draft-model, or --draft-layers alone (the target's own file, cut).
        let model = self.draft_model.is_some() || self.draft_layers.is_some();
        match (self.spec, model, &self.eagle) {
            (Some(SpecKind::Draft), false, _) => {
                anyhow::bail!("--spec draft needs --draft-model PATH or --draft-layers N")
            }
            (Some(SpecKind::Eagle), _, None) => anyhow::bail!("--spec eagle needs --eagle DIR"),
            (Some(SpecKind::Lookup | SpecKind::Eagle), true, _) => {
                anyhow::bail!(
                    "--draft-model and --draft-layers draft with a model: use --spec draft (or leave --spec out)"
                )
            }
            (Some(SpecKind::Lookup | SpecKind::Draft), _, Some(_)) => {
                anyhow::bail!("--eagle drafts with an EAGLE head: use --spec eagle (or leave --spec out)")
            }
            (None, true, _) => Ok(Some(SpecKind::Draft)),
            (None, _, Some(_)) => Ok(Some(SpecKind::Eagle)),
            (kind, _, _) => Ok(kind),
        }
    }

    pub fn options(&self) -> anyhow::Result<SpecOptions> {
        Ok(SpecOptions {
            max_draft: self
                .draft_max
                .unwrap_or(if self.draft_adaptive { MAX_DRAFT } else { FIXED_DRAFTS }),
            min_accepted: self.spec_min_accepted,
            tree: self.tree_shape()?,
            adaptive: self.draft_adaptive,
            ..Default::default()
        })
    }

    /// The draft tree `--spec-tree` asks for, if any.
    fn tree_shape(&self) -> anyhow::Result<Option<TreeShape>> {
        Ok(self.spec_tree.as_deref().map(TreeShape::parse).transpose()?)
    }

    /// Whether the target's steps must read back their final hidden states (an EAGLE-1 head drafts from them).
    pub fn needs_hidden(draft: Option<&LoadedDraft>) -> bool {
        matches!(draft, Some(LoadedDraft::Eagle { head, .. }) if !head.is_eagle3())
    }

    /// Whether the target's steps must read back the hidden states entering three of its layers (an EAGLE-3 head's
    /// features).
    pub fn needs_aux_hidden(draft: Option<&LoadedDraft>) -> bool {
        matches!(draft, Some(LoadedDraft::Eagle { head, .. }) if head.is_eagle3())
    }

    /// Load the draft model or EAGLE head (when one is asked for) onto `gpu`: a draft model with the target's
    /// context and attention options and its vocabulary checked against the target's; a head checked against the
    /// target's sizes.
    pub fn load_draft(
        &self,
        gpu: &Gpu,
        model: &ModelArgs,
        target: &LoadedModel,
    ) -> anyhow::Result<Option<LoadedDraft>> {
        if let (Some(SpecKind::Eagle), Some(dir)) = (self.kind()?, &self.eagle) {
            let mut head = Llama::load_eagle(gpu, dir, &target.model)?;
            if let Some(n) = self.frspec_vocab {
                // FR-Spec on the head: the target's head rows for the most frequent tokens.
                let ids = self.frspec_ids(n, target)?;
                head = head.with_head_subset(frspec::subset_of(gpu, target, ids)?);
            }
            return Ok(Some(LoadedDraft::Eagle {
                head: Box::new(head),
                ctx: target.ctx,
            }));
        }
        Ok(self
            .load_draft_model(gpu, model, target)?
            .map(|d| LoadedDraft::Model(Box::new(d))))
    }

    fn load_draft_model(
        &self,
        gpu: &Gpu,
        model: &ModelArgs,
        target: &LoadedModel,
    ) -> anyhow::Result<Option<LoadedModel>> {
        if self.kind()? != Some(SpecKind::Draft) {
            return Ok(None);
        }
        // --draft-layers alone: the target's own file.
        let path = self.draft_model.as_ref().unwrap_or(&target.path);
        let opts = LoadOptions {
            ctx: target.ctx,
            layers: self.draft_layers,
            reserved: target.memory.total(),
            ..model.options(Some(&gpu.caps))
        };
        let draft = LoadedModel::open(gpu, path, &opts, |_, _| {})
            .with_context(|| format!("loading the draft model {}", path.display()))?;
        check_same_vocab(
            (
                &target.tokenizer,
                target.model.cfg.vocab,
                &target.path.display().to_string(),
            ),
            (&draft.tokenizer, draft.model.cfg.vocab, &path.display().to_string()),
        )?;
        let Some(n) = self.frspec_vocab else {
            return Ok(Some(draft));
        };
        let ids = self.frspec_ids(n, &draft)?;
        Ok(Some(frspec::restrict(gpu, draft, ids)?))
    }

    /// The `n` token ids FR-Spec keeps for `model`'s vocabulary: the --frspec-freq ranking's first (else vocabulary
    /// order), plus the stop tokens.
    fn frspec_ids(&self, n: usize, model: &LoadedModel) -> anyhow::Result<Vec<u32>> {
        let ranking = match &self.frspec_freq {
            Some(p) => Some(frspec::read_ranking(p)?),
            None => None,
        };
        Ok(frspec::subset_ids(
            ranking.as_deref(),
            n,
            model.model.cfg.vocab,
            &model.tokenizer,
        )?)
    }

    /// The draft source: prompt lookup, or the loaded draft model with its own session, sampling its drafts with
    /// the target's `params` (and another seed) under --draft-sample.
    pub fn drafter<'a>(
        &self,
        gpu: &'a Gpu,
        draft: Option<&'a LoadedDraft>,
        chunk: usize,
        params: &SamplingParams,
    ) -> anyhow::Result<Option<Box<dyn Drafter + 'a>>> {
        Ok(match (self.kind()?, draft) {
            (None, _) => None,
            (Some(SpecKind::Lookup), _) => Some(Box::new(Lookup::default())),
            (Some(SpecKind::Eagle), Some(LoadedDraft::Eagle { head, ctx })) => {
                let mut d = match self.tree_shape()? {
                    Some(shape) => EagleDraft::for_trees(gpu, head, *ctx, shape.topk)?,
                    None => EagleDraft::new(gpu, head, *ctx)?,
                };
                d.set_chunk(chunk);
                d.chained = !self.draft_apart;
                Some(Box::new(d))
            }
            (Some(SpecKind::Eagle), _) => anyhow::bail!("--spec eagle: the head is not loaded"),
            (Some(SpecKind::Draft), Some(LoadedDraft::Model(d))) => {
                let sample = self.draft_sample && !params.is_greedy();
                // A tree grows from the draft's log-probabilities: each row's top-k and log-sum-exp, from the device.
                let tree_topk = self.tree_shape()?.map_or(0, |s| s.topk);
                let outputs = StepOutputs {
                    logits: self.draft_p_min > 0.0 || sample,
                    argmax: true,
                    topk: tree_topk,
                    lse: tree_topk > 0,
                    ..Default::default()
                };
                let mut gen = Generator::new(gpu, &d.model, d.ctx, outputs)?;
                gen.chunk = chunk;
                Some(Box::new(if sample {
                    let draft_params = SamplingParams {
                        seed: params.seed ^ 0x9e37_79b9_7f4a_7c15,
                        ..params.clone()
                    };
                    DraftModel::sampling(gen, Sampler::new(draft_params))
                } else {
                    let mut d = DraftModel::greedy(gen, self.draft_p_min);
                    d.one_submission = !self.draft_apart;
                    d
                }))
            }
            (Some(SpecKind::Draft), _) => anyhow::bail!("--spec draft: the draft model is not loaded"),
        })
    }
}
