//! One request's decoding, a token at a time, so that the worker can interleave sessions: pick the next token (the
//! GPU's argmax when greedy, else the sampler on the logits), detokenize it as a stream, apply the stop rules the
//! way `generate::generate` does, and hold back text that may be the start of a stop string.

use crate::error::{Error, Result};
use crate::model::StepResult;
use crate::sampling::{Sampler, SamplingParams};
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// Why a completion ended, as OpenAI names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-turn token or a stop string.
    Stop,
    /// `max_tokens`, or the context is full.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// What to do after a decoded token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Run the model on this token, then decode again.
    Feed(u32),
    Finish(FinishReason),
}

/// The stop rules of one request.
#[derive(Clone, Debug)]
pub struct StopRules {
    pub max_tokens: usize,
    /// Text that ends the completion; it is cut off, not returned.
    pub strings: Vec<String>,
    /// Stop at EOS and the model's end-of-turn tokens.
    pub at_eos: bool,
}

/// The decoding state of one request.
pub struct Decoding {
    sampler: Sampler,
    /// Greedy without penalties: the GPU's argmax is the choice, as in `generate`.
    use_argmax: bool,
    stream: StreamDecoder,
    rules: StopRules,
    /// Tokens generated so far (the penalties look at these).
    pub generated: Vec<u32>,
    /// The completion's text so far, cut at a stop string.
    text: String,
    /// Bytes of `text` already handed out.
    sent: usize,
}

impl Decoding {
    pub fn new(params: SamplingParams, rules: StopRules) -> Decoding {
        Decoding {
            use_argmax: !params.needs_logits(),
            sampler: Sampler::new(params),
            stream: StreamDecoder::new(),
            rules,
            generated: Vec::new(),
            text: String::new(),
            sent: 0,
        }
    }

    /// Tokens this request may still generate.
    pub fn tokens_left(&self) -> usize {
        self.rules.max_tokens.saturating_sub(self.generated.len())
    }

    /// Choose the next token from row `row` of the outputs of the last step (0 unless it was a verification step
    /// with a row per token), and return the text that is now safe to send with what comes next. `room`: the KV
    /// cache can take one more token.
    pub fn step(&mut self, result: &mut StepResult, row: usize, tok: &Tokenizer, room: bool) -> Result<(String, Next)> {
        let rows = result.row_argmax.len().max(1);
        let next = if self.use_argmax {
            *result
                .row_argmax
                .get(row)
                .ok_or_else(|| Error::Invalid("greedy decoding needs the step's argmax".into()))?
        } else {
            let vocab = result.logits.len() / rows;
            match result.logits.get_mut(row * vocab..(row + 1) * vocab) {
                Some(logits) if vocab > 0 => self.sampler.sample(logits, &self.generated),
                _ => return Err(Error::Invalid("sampling needs the step's logits".into())),
            }
        };
        self.generated.push(next);
        if self.rules.at_eos && tok.is_stop(next) {
            return Ok(self.finish(FinishReason::Stop));
        }
        if let Some(piece) = self.stream.step(tok, next)? {
            self.text.push_str(&piece);
            if let Some(cut) = self.stop_string_at() {
                self.text.truncate(cut);
                return Ok(self.finish(FinishReason::Stop));
            }
        }
        if self.generated.len() >= self.rules.max_tokens || !room {
            let rest = self.stream.flush(tok)?;
            self.text.push_str(&rest);
            return Ok(self.finish(FinishReason::Length));
        }
        let safe = self.text.len() - self.held_back();
        let out = self.text[self.sent..safe].to_string();
        self.sent = safe;
        Ok((out, Next::Feed(next)))
    }

    /// Everything not yet sent, and the end.
    fn finish(&mut self, reason: FinishReason) -> (String, Next) {
        let out = self.text[self.sent..].to_string();
        self.sent = self.text.len();
        (out, Next::Finish(reason))
    }

    /// Where the earliest stop string begins in the text not yet sent (a match cannot begin in sent text: that
    /// text never ended with the start of a stop string, see `held_back`).
    fn stop_string_at(&self) -> Option<usize> {
        let unsent = &self.text[self.sent..];
        self.rules
            .strings
            .iter()
            .filter_map(|s| unsent.find(s.as_str()))
            .min()
            .map(|i| self.sent + i)
    }

    /// Bytes at the end of the unsent text that could begin a stop string, held until the next token decides.
    fn held_back(&self) -> usize {
        let unsent = &self.text[self.sent..];
        let mut hold = 0;
        for s in &self.rules.strings {
            for (k, _) in s.char_indices().skip(1) {
                if k > hold && unsent.ends_with(&s[..k]) {
                    hold = k;
                }
            }
        }
        hold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoding(strings: &[&str]) -> Decoding {
        let rules = StopRules {
            max_tokens: 100,
            strings: strings.iter().map(|s| s.to_string()).collect(),
            at_eos: true,
        };
        Decoding::new(SamplingParams::greedy(), rules)
    }

    #[test]
    fn text_that_may_begin_a_stop_string_is_held_until_it_cannot() {
        let mut d = decoding(&["END", "\n\n"]);
        d.text = "abc E".into();
        assert_eq!(d.held_back(), 1);
        d.text = "abc EN".into();
        assert_eq!(d.held_back(), 2);
        d.text = "abc ENx\n".into();
        assert_eq!(d.held_back(), 1);
        assert_eq!(d.stop_string_at(), None);
        d.text = "abc ENx\n\nEND".into();
        assert_eq!(d.stop_string_at(), Some(7));
    }

    #[test]
    fn held_text_respects_character_boundaries() {
        let mut d = decoding(&["é!"]);
        d.text = "café".into();
        // "é" is two bytes: the hold is the whole character, never half of it.
        assert_eq!(d.held_back(), "é".len());
        d.sent = 3;
        assert_eq!(d.stop_string_at(), None);
    }
}
