//! Speculative generation runs shared by the speculation tests: one generation plain or with a drafter, then a
//! follow-up turn; SmolLM2 with its follow-up message, seeded sampling and a random EAGLE-1 head.

#![allow(dead_code)]

use shaderlm::generate::draft::{DraftModel, Drafter};
use shaderlm::generate::spec::{generate_spec, SpecOptions, SpecStats, Speculator};
use shaderlm::generate::{generate, GenOptions, GenOutput, Generator};
use shaderlm::gpu::Gpu;
use shaderlm::model::eagle_fit::write_head;
use shaderlm::model::load::LoadedModel;
use shaderlm::model::{Llama, StepOutputs};
use shaderlm::sampling::{Sampler, SamplingParams};

/// One generation of `n` tokens after `prompt`, plain or with `drafter`, then a follow-up turn (`follow` fed on
/// top of what the cache holds, `n` more tokens): both outputs, and the speculation stats.
pub fn run(
    gen: &mut Generator<'_>,
    loaded: &LoadedModel,
    params: &SamplingParams,
    prompt: &[u32],
    follow: &[u32],
    n: usize,
    drafter: Option<(&mut dyn Drafter, usize)>,
) -> (GenOutput, GenOutput, SpecStats) {
    let spec = drafter.map(|(d, k)| {
        let opts = SpecOptions {
            max_draft: k,
            min_accepted: 0.0,
            ..Default::default()
        };
        (d, opts)
    });
    run_with(gen, loaded, params, (prompt, follow), n, spec)
}

/// [`run`] with the speculation options given.
pub fn run_with(
    gen: &mut Generator<'_>,
    loaded: &LoadedModel,
    params: &SamplingParams,
    (prompt, follow): (&[u32], &[u32]),
    n: usize,
    drafter: Option<(&mut dyn Drafter, SpecOptions)>,
) -> (GenOutput, GenOutput, SpecStats) {
    let opts = GenOptions {
        max_tokens: n,
        stop_strings: Vec::new(),
        stop_at_eos: false,
    };
    assert!(gen.tokens.is_empty(), "each run starts from an empty cache");
    let tok = &loaded.tokenizer;
    let mut sampler = Sampler::new(params.clone());
    let (first, stats) = match drafter {
        Some((d, spec_opts)) => {
            let mut spec = Speculator::new(d, spec_opts);
            generate_spec(gen, tok, &mut sampler, prompt, &opts, &mut spec, |_| true).unwrap()
        }
        None => (
            generate(gen, tok, &mut sampler, prompt, &opts, |_| true).unwrap(),
            SpecStats::default(),
        ),
    };
    // The follow-up turn: the last generated token and the new message, after what the cache keeps.
    let mut next = vec![*first.generated.last().unwrap()];
    next.extend_from_slice(follow);
    let second = generate(gen, tok, &mut sampler, &next, &opts, |_| true).unwrap();
    (first, second, stats)
}

/// The session's tokens and the K/V its cache holds for them, as bits: after a speculative run they must be the plain
/// run's (rejected drafts rolled back, an accepted tree path moved where plain decoding writes it).
pub fn cache_bits(gen: &Generator<'_>) -> (Vec<u32>, Vec<u32>) {
    let kv = gen.cache_prefix().unwrap();
    let c = &gen.model().cfg;
    let per_token = c.n_layers * 2 * c.n_kv_heads * c.head_dim;
    assert_eq!(
        kv.len(),
        gen.tokens.len() * per_token,
        "K and V of every layer for every token"
    );
    assert!(kv.iter().any(|&v| v != 0.0), "an empty cache");
    (gen.tokens.clone(), kv.iter().map(|v| v.to_bits()).collect())
}

/// A plain run's two turns and the cache it left ([`cache_bits`]): what a speculative run of the same turns must
/// reproduce.
pub struct Plain {
    pub first: GenOutput,
    pub second: GenOutput,
    pub cache: (Vec<u32>, Vec<u32>),
}

impl Plain {
    /// [`run`] without a drafter on `gen`, and the cache it leaves.
    pub fn run(
        gen: &mut Generator<'_>,
        loaded: &LoadedModel,
        params: &SamplingParams,
        (prompt, follow): (&[u32], &[u32]),
        n: usize,
    ) -> Plain {
        let (first, second, _) = run(gen, loaded, params, prompt, follow, n, None);
        let cache = cache_bits(gen);
        Plain { first, second, cache }
    }

    /// Asserts that a speculative run's turns `spec`, on `gen`, and the cache it left equal the plain run's.
    pub fn assert_reproduced(&self, gen: &Generator<'_>, spec: (&GenOutput, &GenOutput), tag: &str) {
        assert_eq!(spec.0.generated, self.first.generated, "{tag}: first turn");
        assert_eq!(spec.1.generated, self.second.generated, "{tag}: follow-up turn");
        assert!(cache_bits(gen) == self.cache, "{tag}: the KV cache differs");
    }
}

/// What the SmolLM2 speculation tests share: the model, the follow-up message, seeded sampling, and an EAGLE-1 head
/// at SmolLM2's shape in the published layout (random fc, its layer an identity).
pub struct Smol {
    pub gpu: Gpu,
    pub loaded: LoadedModel,
    pub follow: Vec<u32>,
    pub seeded: SamplingParams,
    head_dir: tempfile::TempDir,
}

impl Smol {
    pub fn new() -> Smol {
        let (gpu, loaded) = super::golden::load("SmolLM2-135M-Instruct.Q4_1.gguf", "");
        let follow = loaded.tokenizer.encode("\nNow say it again, shorter.", false).unwrap();
        let seeded = SamplingParams {
            temperature: 0.8,
            seed: 7,
            ..Default::default()
        };
        let head_dir = tempfile::tempdir().unwrap();
        let h = loaded.model.cfg.hidden;
        let fc = super::rng::Rng::new(17).vec(2 * h * h, 0.05);
        write_head(head_dir.path(), &loaded.model.cfg, &fc, &vec![0.0; h]).unwrap();
        Smol {
            gpu,
            loaded,
            follow,
            seeded,
            head_dir,
        }
    }

    /// The target's session: logits and argmax, and the hidden states an EAGLE head drafts from.
    pub fn target(&self) -> Generator<'_> {
        let outputs = StepOutputs {
            logits: true,
            argmax: true,
            hidden: true,
            ..Default::default()
        };
        Generator::new(&self.gpu, &self.loaded.model, self.loaded.ctx, outputs).unwrap()
    }

    /// SmolLM2 drafting for itself, its steps reading `outputs`.
    pub fn self_draft(&self, outputs: StepOutputs) -> DraftModel<'_> {
        DraftModel::greedy(
            Generator::new(&self.gpu, &self.loaded.model, self.loaded.ctx, outputs).unwrap(),
            0.0,
        )
    }

    pub fn head(&self) -> Llama {
        Llama::load_eagle(&self.gpu, self.head_dir.path(), &self.loaded.model).unwrap()
    }
}
