//! Tokenizers: from `tokenizer.json` or built from GGUF vocabularies (`gpt2` byte-level BPE with the
//! pre-tokenizer rules llama.cpp uses for each `tokenizer.ggml.pre`, and `llama` SentencePiece-style vocabularies),
//! plus special tokens, the BOS rule, and a streaming detokenizer that never emits half a UTF-8 character.

pub mod chat;
mod pre;

use crate::error::{Error, Result};
use std::path::Path;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, DecoderWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

/// GGUF token types (`tokenizer.ggml.token_type`).
pub const TOKEN_NORMAL: i32 = 1;
pub const TOKEN_CONTROL: i32 = 3;
pub const TOKEN_USER_DEFINED: i32 = 4;

/// A vocabulary as GGUF metadata describes it.
#[derive(Clone, Debug, Default)]
pub struct VocabSpec {
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE) or `llama` (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre` (gpt2 only): selects the split rules.
    pub pre: String,
    pub tokens: Vec<String>,
    pub token_types: Vec<i32>,
    pub scores: Vec<f32>,
    /// `"left right"` pairs, highest priority first (gpt2).
    pub merges: Vec<String>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub add_bos: bool,
    /// `tokenizer.ggml.add_space_prefix` (llama only): a space before the text, as SentencePiece's
    /// `add_dummy_prefix`. `None` takes SentencePiece's default, true (Gemma's vocabularies say false).
    pub add_space_prefix: Option<bool>,
    pub chat_template: Option<String>,
}

/// A ready tokenizer with the ids generation needs.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// Tokens that end a turn besides EOS (e.g. `<|im_end|>`, `<|eot_id|>`).
    pub end_of_turn: Vec<u32>,
    pub add_bos: bool,
    pub chat_template: Option<String>,
    /// Text of every token id (for templates and diagnostics).
    pub vocab_size: usize,
}

fn tok_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("tokenizer: {what}: {e}"))
}

/// Texts of the turn-ending tokens of common chat templates. A token with one of these texts ends a turn only when
/// the vocabulary marks it special (GGUF token type CONTROL, or a `special` added token in `tokenizer.json`): Qwen's
/// vocabulary also holds an ordinary text token `</s>` that answers about HTML or XML write.
const END_OF_TURN: [&str; 8] = [
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "</s>",
];

/// The end-of-turn ids among `(id, text)` pairs of special tokens: those whose text is in [`END_OF_TURN`], less EOS.
fn end_of_turn_ids<'a>(special: impl Iterator<Item = (u32, &'a str)>, eos: Option<u32>) -> Vec<u32> {
    let mut ids: Vec<u32> = special
        .filter(|(id, text)| END_OF_TURN.contains(text) && Some(*id) != eos)
        .map(|(id, _)| id)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

impl Tokenizer {
    /// Build from GGUF-style vocabulary data.
    pub fn from_vocab(spec: &VocabSpec) -> Result<Tokenizer> {
        let n = spec.tokens.len();
        if n == 0 {
            return Err(tok_err("vocabulary", "no tokens"));
        }
        for (what, id) in [("bos", spec.bos), ("eos", spec.eos)] {
            if id.is_some_and(|i| i as usize >= n) {
                return Err(tok_err(what, format!("id {id:?} outside a vocabulary of {n}")));
            }
        }
        let vocab: Vocab = spec
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let mut inner = match spec.model.as_str() {
            "gpt2" => {
                let merges = spec
                    .merges
                    .iter()
                    .map(|m| {
                        m.split_once(' ')
                            .map(|(a, b)| (a.to_string(), b.to_string()))
                            .ok_or_else(|| tok_err("merges", format!("{m:?} is not a pair")))
                    })
                    .collect::<Result<Vec<_>>>()?;
                let bpe = BPE::builder()
                    .vocab_and_merges(vocab, merges)
                    .ignore_merges(pre::ignore_merges(&spec.pre))
                    .build()
                    .map_err(|e| tok_err("BPE", e))?;
                let mut t = tokenizers::Tokenizer::new(bpe);
                let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
                for re in pre::regexes(&spec.pre) {
                    let split = Split::new(
                        SplitPattern::Regex(re.to_string()),
                        SplitDelimiterBehavior::Isolated,
                        false,
                    )
                    .map_err(|e| tok_err("pre-tokenizer regex", e))?;
                    steps.push(split.into());
                }
                steps.push(ByteLevel::new(false, false, false).into());
                t.with_pre_tokenizer(Some(Sequence::new(steps)));
                t.with_decoder(Some(ByteLevel::new(false, false, false)));
                t
            }
            "llama" => {
                if spec.scores.len() != n {
                    return Err(tok_err(
                        "scores",
                        format!("{} scores for {n} tokens", spec.scores.len()),
                    ));
                }
                let merges = spm_merges(&spec.tokens, &spec.scores, &vocab);
                let bpe = BPE::builder()
                    .vocab_and_merges(vocab, merges)
                    .byte_fallback(true)
                    .fuse_unk(true)
                    .build()
                    .map_err(|e| tok_err("BPE", e))?;
                let mut t = tokenizers::Tokenizer::new(bpe);
                let prefix = spec.add_space_prefix.unwrap_or(true);
                let scheme = if prefix {
                    PrependScheme::First
                } else {
                    PrependScheme::Never
                };
                t.with_pre_tokenizer(Some(Metaspace::new('▁', scheme, false)));
                // As transformers' Llama tokenizer: ▁ back to spaces, bytes back to text, drop the prepended space.
                let replace = Replace::new("▁", " ").map_err(|e| tok_err("decoder", e))?;
                let mut decoders: Vec<DecoderWrapper> =
                    vec![replace.into(), ByteFallback::new().into(), Fuse::new().into()];
                if prefix {
                    decoders.push(Strip::new(' ', 1, 0).into());
                }
                t.with_decoder(Some(DecoderSequence::new(decoders)));
                t
            }
            other => {
                return Err(tok_err(
                    "tokenizer.ggml.model",
                    format!("{other:?} is not supported (gpt2, llama)"),
                ))
            }
        };
        let specials: Vec<AddedToken> = spec
            .tokens
            .iter()
            .zip(&spec.token_types)
            .filter(|(_, ty)| matches!(**ty, TOKEN_CONTROL | TOKEN_USER_DEFINED))
            .map(|(t, _)| AddedToken::from(t.clone(), true))
            .collect();
        inner.add_special_tokens(&specials);
        let control = spec
            .tokens
            .iter()
            .zip(&spec.token_types)
            .enumerate()
            .filter(|(_, (_, ty))| **ty == TOKEN_CONTROL)
            .map(|(i, (t, _))| (i as u32, t.as_str()));
        let end_of_turn = end_of_turn_ids(control, spec.eos);
        Ok(Tokenizer {
            inner,
            bos: spec.bos,
            eos: spec.eos,
            end_of_turn,
            add_bos: spec.add_bos,
            chat_template: spec.chat_template.clone(),
            vocab_size: n,
        })
    }

    /// Load `tokenizer.json` (and BOS/EOS/template from `tokenizer_config.json` and `chat_template.jinja` beside it).
    pub fn from_hf_dir(dir: &Path) -> Result<Tokenizer> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Err(Error::File {
                path,
                message: "missing: a Hugging Face model directory needs tokenizer.json".into(),
            });
        }
        let text = crate::loader::read_text(&path)?;
        // The tokenizers crate panics on some malformed files (decoder and merge entries); that is a bad file too.
        let parsed = std::panic::catch_unwind(|| tokenizers::Tokenizer::from_bytes(text.as_bytes()));
        let inner = match parsed {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err("malformed (the tokenizers crate could not read it)".to_string()),
        }
        .map_err(|message| Error::File {
            path: path.clone(),
            message,
        })?;
        let config = chat::HfTokenizerConfig::read(dir)?;
        let id = |t: &Option<String>| t.as_ref().and_then(|t| inner.token_to_id(t));
        let (bos, eos) = (id(&config.bos_token), id(&config.eos_token));
        let added = inner.get_added_tokens_decoder();
        let special = added
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(id, t)| (*id, t.content.as_str()));
        let mut end_of_turn = end_of_turn_ids(special, eos);
        // `eos_token_id` of config.json and generation_config.json (a number or a list) ends generation too.
        let vocab_size = inner.get_vocab_size(true);
        for extra in chat::hf_eos_ids(dir)? {
            if Some(extra) != eos && !end_of_turn.contains(&extra) && (extra as usize) < vocab_size {
                end_of_turn.push(extra);
            }
        }
        let eos = eos.or_else(|| end_of_turn.first().copied());
        end_of_turn.retain(|i| Some(*i) != eos);
        Ok(Tokenizer {
            bos,
            eos,
            end_of_turn,
            add_bos: config.add_bos_token,
            chat_template: config.chat_template,
            vocab_size,
            inner,
        })
    }

    /// Token ids of `text`; special-token text (e.g. `<|im_start|>`) maps to its id. Adds BOS when the model asks.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>> {
        let enc = self.inner.encode_fast(text, false).map_err(|e| tok_err("encode", e))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if add_bos && self.add_bos {
            if let Some(b) = self.bos {
                ids.push(b);
            }
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner.decode(ids, skip_special).map_err(|e| tok_err("decode", e))
    }

    /// The tokenizer as a Hugging Face `tokenizer.json` document.
    pub fn to_json(&self) -> Result<String> {
        self.inner.to_string(false).map_err(|e| tok_err("serialize", e))
    }

    /// Tokens in the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_text(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    /// Whether `id` ends generation (EOS or an end-of-turn token).
    pub fn is_stop(&self, id: u32) -> bool {
        Some(id) == self.eos || self.end_of_turn.contains(&id)
    }
}

/// Merges for a SentencePiece vocabulary: every split of a piece into two pieces, ranked by the piece's score.
fn spm_merges(tokens: &[String], scores: &[f32], vocab: &Vocab) -> Vec<(String, String)> {
    let mut ranked: Vec<(f32, u32, u32, String, String)> = Vec::new();
    for (piece, &score) in tokens.iter().zip(scores) {
        let cuts: Vec<usize> = piece.char_indices().map(|(i, _)| i).skip(1).collect();
        for c in cuts {
            let (l, r) = piece.split_at(c);
            if let (Some(&li), Some(&ri)) = (vocab.get(l), vocab.get(r)) {
                ranked.push((score, li, ri, l.to_string(), r.to_string()));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    ranked.into_iter().map(|(_, _, _, l, r)| (l, r)).collect()
}

/// Streaming detokenizer: feeds ids one at a time, returns text only once it is whole UTF-8.
#[derive(Default)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    prefix: String,
    prefix_index: usize,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// New complete text after `id`, if any.
    pub fn step(&mut self, tok: &Tokenizer, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let text = tok.decode(&self.ids, false)?;
        if text.len() > self.prefix.len() && !text.ends_with('\u{FFFD}') {
            let new = text.get(self.prefix.len()..).unwrap_or_default().to_string();
            let keep_from = self.prefix_index;
            self.ids.drain(..keep_from);
            self.prefix = tok.decode(&self.ids, false)?;
            self.prefix_index = self.ids.len();
            return Ok(Some(new));
        }
        Ok(None)
    }

    /// Whatever is pending at the end (possibly with replacement characters).
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<String> {
        let text = tok.decode(&self.ids, false)?;
        let rest = text.get(self.prefix.len()..).unwrap_or_default().to_string();
        *self = Self::default();
        Ok(rest)
    }
}
