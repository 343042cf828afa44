//! The output side of a generation, shared by plain and speculative decoding: each chosen token is recorded,
//! checked against the stop rules (end of turn, stop strings, the token budget, an interrupt) and streamed as text.

use super::{GenOptions, GenOutput};
use crate::error::Result;
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// Records the tokens a generation chooses and decides when it stops.
pub(super) struct Emitter<'t, F: FnMut(&str) -> bool> {
    tok: &'t Tokenizer,
    opts: &'t GenOptions,
    stream: StreamDecoder,
    on_text: F,
    pub out: GenOutput,
    /// The stop reason, once the generation must end.
    stopped: Option<String>,
}

impl<'t, F: FnMut(&str) -> bool> Emitter<'t, F> {
    pub fn new(tok: &'t Tokenizer, opts: &'t GenOptions, prompt: &[u32], on_text: F) -> Self {
        Emitter {
            tok,
            opts,
            stream: StreamDecoder::new(),
            on_text,
            out: GenOutput {
                prompt_ids: prompt.to_vec(),
                ..Default::default()
            },
            stopped: (opts.max_tokens == 0).then(|| "max tokens".to_string()),
        }
    }

    /// Whether the generation has ended.
    pub fn done(&self) -> bool {
        self.stopped.is_some()
    }

    /// Tokens still allowed.
    pub fn budget(&self) -> usize {
        self.opts.max_tokens.saturating_sub(self.out.generated.len())
    }

    /// Record `next`; false once the generation must stop (this token was the last one).
    pub fn push(&mut self, next: u32) -> Result<bool> {
        if self.done() {
            return Ok(false);
        }
        self.out.generated.push(next);
        if self.opts.stop_at_eos && self.tok.is_stop(next) {
            self.stopped = Some("end of turn".into());
            return Ok(false);
        }
        if let Some(piece) = self.stream.step(self.tok, next)? {
            self.out.text.push_str(&piece);
            if let Some(s) = self
                .opts
                .stop_strings
                .iter()
                .find(|s| self.out.text.contains(s.as_str()))
            {
                let cut = self.out.text.find(s.as_str()).unwrap_or(self.out.text.len());
                self.out.text.truncate(cut);
                self.stopped = Some(format!("stop string {s:?}"));
                return Ok(false);
            }
            if !(self.on_text)(&piece) {
                self.stopped = Some("interrupted".into());
                return Ok(false);
            }
        }
        if self.out.generated.len() >= self.opts.max_tokens {
            self.stopped = Some("max tokens".into());
            return Ok(false);
        }
        Ok(true)
    }

    /// End the generation because the context is full.
    pub fn context_full(&mut self) {
        self.stopped.get_or_insert_with(|| "context full".into());
    }

    /// The output, with the rest of the text flushed when the generation ran out of tokens or context.
    pub fn finish(mut self) -> Result<GenOutput> {
        let stopped = self.stopped.take().unwrap_or_else(|| "max tokens".into());
        if stopped == "max tokens" || stopped == "context full" {
            let rest = self.stream.flush(self.tok)?;
            (self.on_text)(&rest);
            self.out.text.push_str(&rest);
        }
        self.out.stopped_by = stopped;
        Ok(self.out)
    }
}
