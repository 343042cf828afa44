//! Chat templates: the model's own Jinja template rendered with minijinja the way transformers renders it
//! (`trim_blocks`, `lstrip_blocks`, Python string methods, `raise_exception`), and the Hugging Face
//! `tokenizer_config.json` / `chat_template.jinja` readers, old and new layouts alike.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One chat message, as OpenAI-style JSON has it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Fuel of one render before the per-message allowance: about 2M instructions or 128 MB of created data; real chat
/// templates use a few thousand per message.
pub const TEMPLATE_FUEL: u64 = 2_000_000;

/// Render `template` over `messages`. `bos`/`eos` are the token texts templates may print.
pub fn render(
    template: &str,
    messages: &[Message],
    add_generation_prompt: bool,
    bos: &str,
    eos: &str,
) -> Result<String> {
    let mut env = minijinja::Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(|e| Error::Invalid(format!("chat template syntax: {e}")))?;
    env.set_syntax(syntax);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        },
    );
    env.add_function("strftime_now", |fmt: String| strftime_now(&fmt));
    // Bounded work and memory: fuel counts instructions and the data a render creates (minijinja: ~64 bytes a
    // unit), so a template that loops 10^10 times or doubles a string until memory runs out stops with an error.
    let content: usize = messages.iter().map(|m| m.content.len()).sum();
    env.set_fuel(Some(TEMPLATE_FUEL + content as u64 / 8));
    let err = |e: minijinja::Error| Error::Invalid(format!("chat template: {e:#}"));
    env.add_template("chat", template).map_err(err)?;
    let messages_value: Vec<minijinja::Value> = messages
        .iter()
        .map(|m| minijinja::context! { role => m.role.clone(), content => m.content.clone() })
        .collect();
    let ctx = minijinja::context! {
        messages => messages_value,
        add_generation_prompt => add_generation_prompt,
        bos_token => bos,
        eos_token => eos,
        tools => minijinja::Value::from(()),
    };
    env.get_template("chat").map_err(err)?.render(ctx).map_err(err)
}

impl super::Tokenizer {
    /// Token ids of the prompt for `messages` in the model's chat template; `add_generation_prompt` opens the
    /// assistant's turn. The prompt every front end (chat, generate, a server) sends.
    /// A template that renders no tokens is an error (there would be nothing to condition on).
    pub fn encode_chat(&self, messages: &[Message], add_generation_prompt: bool) -> Result<Vec<u32>> {
        let ids = self.encode_prompt(&self.render_chat(messages, add_generation_prompt)?)?;
        if ids.is_empty() {
            return Err(Error::Invalid(
                "chat template: it rendered an empty prompt for these messages".into(),
            ));
        }
        Ok(ids)
    }

    /// The text of that prompt: the model's template over `messages`, with its BOS and EOS texts.
    pub fn render_chat(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let template = self.chat_template.as_deref().ok_or_else(|| {
            Error::Invalid(
                "the model has no chat template (tokenizer.chat_template): give a plain prompt instead".into(),
            )
        })?;
        let text = |id: Option<u32>| id.and_then(|i| self.token_text(i)).unwrap_or_default();
        render(
            template,
            messages,
            add_generation_prompt,
            &text(self.bos),
            &text(self.eos),
        )
    }

    /// Token ids of a prompt text that may begin with the BOS text (as rendered templates do): BOS is added only
    /// when the vocabulary asks for it and the text does not already print it.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let bos_text = self.bos.and_then(|b| self.token_text(b)).unwrap_or_default();
        let add_bos = bos_text.is_empty() || !text.starts_with(&bos_text);
        self.encode(text, add_bos)
    }
}

/// `strftime_now` for templates that print today's date (Llama 3.x): a small subset of strftime.
fn strftime_now(fmt: &str) -> String {
    let days = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86400) as i64;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let month = MONTHS[(m - 1) as usize];
    fmt.replace("%d", &format!("{d:02}"))
        .replace("%m", &format!("{m:02}"))
        .replace("%Y", &y.to_string())
        .replace("%B", month)
        .replace("%b", &month[..3])
}

/// The parts of `tokenizer_config.json` (and `chat_template.jinja`) that generation needs.
#[derive(Debug, Default)]
pub struct HfTokenizerConfig {
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub add_bos_token: bool,
    pub chat_template: Option<String>,
}

fn token_text(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(str::to_string),
        _ => None,
    }
}

impl HfTokenizerConfig {
    pub fn read(dir: &Path) -> Result<HfTokenizerConfig> {
        let mut cfg = HfTokenizerConfig::default();
        let path = dir.join("tokenizer_config.json");
        if path.exists() {
            let v = crate::loader::read_json(&path)?;
            cfg.bos_token = token_text(v.get("bos_token"));
            cfg.eos_token = token_text(v.get("eos_token"));
            cfg.add_bos_token = v.get("add_bos_token").and_then(|b| b.as_bool()).unwrap_or(false);
            cfg.chat_template = match v.get("chat_template") {
                Some(serde_json::Value::String(s)) => Some(s.clone()),
                // Older layout: a list of named templates; take "default".
                Some(serde_json::Value::Array(list)) => list
                    .iter()
                    .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                    .or(list.first())
                    .and_then(|t| t.get("template"))
                    .and_then(|t| t.as_str())
                    .map(str::to_string),
                _ => None,
            };
        }
        let jinja = dir.join("chat_template.jinja");
        if jinja.exists() {
            cfg.chat_template = Some(crate::loader::read_text(&jinja)?);
        }
        Ok(cfg)
    }
}

/// `eos_token_id` of a Hugging Face directory's `config.json` and `generation_config.json` (each a number or a list
/// of numbers; a missing file or field adds nothing). transformers stops generation at any of them.
pub fn hf_eos_ids(dir: &Path) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    for name in ["config.json", "generation_config.json"] {
        let path = dir.join(name);
        if !path.is_file() {
            continue;
        }
        let v = crate::loader::read_json(&path)?;
        let bad = || Error::File {
            path: path.clone(),
            message: "eos_token_id must be a token id or a list of token ids".into(),
        };
        let as_id = |x: &serde_json::Value| x.as_u64().and_then(|i| u32::try_from(i).ok()).ok_or_else(bad);
        match v.get("eos_token_id") {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::Array(list)) => {
                for x in list {
                    ids.push(as_id(x)?);
                }
            }
            Some(x) => ids.push(as_id(x)?),
        }
    }
    Ok(ids)
}

/// Gemma 3's chat template as google/gemma-3 checkpoints publish it (text parts only): the fallback for Gemma 3
/// GGUF files that carry no `tokenizer.chat_template`. A system message is folded into the first user turn.
pub const GEMMA3_TEMPLATE: &str = "{{ bos_token }}\
{%- if messages[0]['role'] == 'system' -%}\
{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\
{%- set loop_messages = messages[1:] -%}\
{%- else -%}\
{%- set first_user_prefix = '' -%}\
{%- set loop_messages = messages -%}\
{%- endif -%}\
{%- for message in loop_messages -%}\
{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\
{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\
{%- endif -%}\
{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}{%- else -%}{%- set role = message['role'] -%}{%- endif -%}\
{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}\
{{- message['content'] | trim -}}\
{{ '<end_of_turn>\n' }}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}";
