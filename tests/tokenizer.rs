//! Tokenizers built from GGUF-style vocabularies (byte-level BPE and SentencePiece), special tokens, BOS, the
//! streaming detokenizer, and chat templates.

use shaderlm::tokenizer::chat::{render, Message};
use shaderlm::tokenizer::{StreamDecoder, Tokenizer, VocabSpec, TOKEN_CONTROL, TOKEN_NORMAL};

/// GPT-2's byte-to-character table: printable bytes map to themselves, the rest to U+0100 upwards.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    if printable(b) {
        return b as char;
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap()
}

fn enc(s: &str) -> String {
    s.bytes().map(byte_char).collect()
}

/// 256 byte tokens, a few merged words, and ChatML specials.
fn gpt2_spec(pre: &str) -> VocabSpec {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let mut types = vec![TOKEN_NORMAL; 256];
    let mut merges = Vec::new();
    for (a, b) in [
        ("h", "e"),
        ("l", "l"),
        ("he", "ll"),
        ("hell", "o"),
        (" ", "w"),
        (" w", "o"),
    ] {
        merges.push(format!("{} {}", enc(a), enc(b)));
        tokens.push(enc(&format!("{a}{b}")));
        types.push(TOKEN_NORMAL);
    }
    for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] {
        tokens.push(s.to_string());
        types.push(TOKEN_CONTROL);
    }
    VocabSpec {
        model: "gpt2".into(),
        pre: pre.into(),
        token_types: types,
        merges,
        bos: Some(tokens.len() as u32 - 2),
        eos: Some(tokens.len() as u32 - 3),
        add_bos: false,
        tokens,
        ..Default::default()
    }
}

#[test]
fn byte_level_bpe_merges_and_round_trips_any_text() {
    let tok = Tokenizer::from_vocab(&gpt2_spec("smollm")).unwrap();
    let ids = tok.encode("hello wo", false).unwrap();
    let texts: Vec<String> = ids.iter().map(|&i| tok.token_text(i).unwrap()).collect();
    assert_eq!(texts, vec![enc("hello"), enc(" wo")]);
    for text in ["héllo 世界 🦀\n\tx", "", "12345 +-*/", "<|im_start|>user\nhi<|im_end|>"] {
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text);
    }
}

#[test]
fn special_tokens_are_atomic_and_stop_generation() {
    let tok = Tokenizer::from_vocab(&gpt2_spec("smollm")).unwrap();
    let start = tok.token_id("<|im_start|>").unwrap();
    let end = tok.token_id("<|im_end|>").unwrap();
    let ids = tok.encode("<|im_start|>he<|im_end|>", false).unwrap();
    assert_eq!(ids.first(), Some(&start));
    assert_eq!(ids.last(), Some(&end));
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert!(tok.is_stop(end) && tok.is_stop(tok.eos.unwrap()) && !tok.is_stop(start));
}

#[test]
fn only_special_tokens_end_a_turn() {
    // Qwen's vocabulary has an ordinary text token "</s>" (HTML, XML): it must not stop generation, while a
    // CONTROL token with the same text does.
    let mut spec = gpt2_spec("smollm");
    spec.tokens.push("</s>".into());
    spec.token_types.push(TOKEN_NORMAL);
    let text_id = spec.tokens.len() as u32 - 1;
    let tok = Tokenizer::from_vocab(&spec).unwrap();
    assert!(!tok.is_stop(text_id), "a NORMAL </s> token ends the turn");
    assert!(tok.is_stop(tok.token_id("<|im_end|>").unwrap()));
    spec.token_types[text_id as usize] = TOKEN_CONTROL;
    let tok = Tokenizer::from_vocab(&spec).unwrap();
    assert!(tok.is_stop(text_id), "a CONTROL </s> token does not end the turn");
}

#[test]
fn hugging_face_eos_lists_and_special_flags_decide_the_stop_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = gpt2_spec("smollm");
    spec.tokens.push("</s>".into());
    spec.token_types.push(TOKEN_NORMAL);
    let text_id = spec.tokens.len() as u32 - 1;
    let tok = Tokenizer::from_vocab(&spec).unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), tok.to_json().unwrap()).unwrap();
    let config = serde_json::json!({"eos_token": "<|endoftext|>", "add_bos_token": false});
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    let hf = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert!(!hf.is_stop(text_id), "an ordinary </s> token ends the turn");
    assert!(hf.is_stop(tok.token_id("<|im_end|>").unwrap()));
    // generation_config.json's eos_token_id list (Llama 3 style) adds stop ids; config.json's single number too.
    std::fs::write(
        dir.path().join("generation_config.json"),
        format!("{{\"eos_token_id\": [{text_id}, 3]}}"),
    )
    .unwrap();
    std::fs::write(dir.path().join("config.json"), r#"{"eos_token_id": 5}"#).unwrap();
    let hf = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert!(hf.is_stop(text_id) && hf.is_stop(3) && hf.is_stop(5) && !hf.is_stop(4));
    std::fs::write(dir.path().join("config.json"), r#"{"eos_token_id": "x"}"#).unwrap();
    let err = Tokenizer::from_hf_dir(dir.path()).err().unwrap().to_string();
    assert!(err.contains("config.json") && err.contains("eos_token_id"), "{err}");
}

#[test]
fn sentencepiece_without_space_prefix_keeps_the_text_as_is() {
    let mut spec = spm_spec();
    spec.add_space_prefix = Some(false);
    let tok = Tokenizer::from_vocab(&spec).unwrap();
    let ids = tok.encode("hi the", false).unwrap();
    let texts: Vec<String> = ids.iter().map(|&i| tok.token_text(i).unwrap()).collect();
    assert_eq!(texts[0], "h", "{texts:?}");
    assert_eq!(tok.decode(&ids, false).unwrap(), "hi the");
    let ids = tok.encode(" hi", false).unwrap();
    assert_eq!(tok.token_text(ids[0]).unwrap(), "▁hi");
    assert_eq!(tok.decode(&ids, false).unwrap(), " hi");
}

#[test]
fn smollm_rules_split_digits_one_by_one() {
    // "smollm" splits every digit apart before the GPT-2 rules; "gpt2" keeps " 12" together.
    let mut spec = gpt2_spec("smollm");
    spec.merges.push(format!("{} {}", enc("1"), enc("2")));
    spec.tokens.push(enc("12"));
    spec.token_types.push(TOKEN_NORMAL);
    let smollm = Tokenizer::from_vocab(&spec).unwrap();
    assert_eq!(smollm.encode("12", false).unwrap().len(), 2);
    spec.pre = "gpt2".into();
    let gpt2 = Tokenizer::from_vocab(&spec).unwrap();
    assert_eq!(gpt2.encode("12", false).unwrap().len(), 1);
}

#[test]
fn bos_is_added_only_when_the_model_asks() {
    let mut spec = gpt2_spec("gpt2");
    let tok = Tokenizer::from_vocab(&spec).unwrap();
    assert_eq!(tok.encode("he", true).unwrap().len(), 1);
    spec.add_bos = true;
    let tok = Tokenizer::from_vocab(&spec).unwrap();
    let ids = tok.encode("he", true).unwrap();
    assert_eq!(ids[0], tok.bos.unwrap());
    assert_eq!(tok.encode("he", false).unwrap().len(), 1);
}

#[test]
fn stream_decoder_never_emits_half_a_character() {
    let tok = Tokenizer::from_vocab(&gpt2_spec("gpt2")).unwrap();
    let text = "a🦀é世";
    let ids = tok.encode(text, false).unwrap();
    assert!(
        ids.len() >= 8,
        "multi-byte characters should be byte tokens here: {ids:?}"
    );
    let mut stream = StreamDecoder::new();
    let mut out = String::new();
    for &id in &ids {
        if let Some(piece) = stream.step(&tok, id).unwrap() {
            assert!(!piece.contains('\u{FFFD}'), "emitted a partial character: {piece:?}");
            out.push_str(&piece);
        }
    }
    out.push_str(&stream.flush(&tok).unwrap());
    assert_eq!(out, text);
}

/// A small SentencePiece vocabulary: specials, 256 byte pieces, and a few words (earlier ones more likely).
fn spm_spec() -> VocabSpec {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, TOKEN_CONTROL, TOKEN_CONTROL];
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    types.extend([6; 256]);
    let words = ["▁", "h", "i", "▁h", "▁hi", "t", "▁t", "he", "▁the"];
    for w in words {
        tokens.push(w.into());
        types.push(TOKEN_NORMAL);
    }
    let mut scores = vec![0.0f32; tokens.len()];
    for (i, s) in scores.iter_mut().enumerate().skip(259) {
        *s = -(i as f32); // earlier pieces are more likely
    }
    VocabSpec {
        model: "llama".into(),
        tokens,
        token_types: types,
        scores,
        bos: Some(1),
        eos: Some(2),
        add_bos: true,
        ..Default::default()
    }
}

#[test]
fn sentencepiece_vocab_uses_scores_and_byte_fallback() {
    let spec = spm_spec();
    let tok = Tokenizer::from_vocab(&spec).unwrap();
    let ids = tok.encode("hi the", true).unwrap();
    let texts: Vec<String> = ids.iter().map(|&i| tok.token_text(i).unwrap()).collect();
    assert_eq!(texts[0], "<s>");
    assert_eq!(texts[1], "▁hi");
    // "ü" is not in the vocabulary: byte fallback gives its two UTF-8 bytes, and decoding restores it.
    let ids = tok.encode("hi ü", false).unwrap();
    assert!(ids.iter().any(|&i| tok.token_text(i).unwrap() == "<0xC3>"), "{ids:?}");
    assert_eq!(tok.decode(&ids, false).unwrap(), "hi ü");
}

#[test]
fn bad_vocabularies_are_errors() {
    let mut spec = gpt2_spec("gpt2");
    spec.merges.push("nospace".into());
    assert!(Tokenizer::from_vocab(&spec).is_err());
    let mut spec = gpt2_spec("gpt2");
    spec.model = "wordpiece-2000".into();
    assert!(Tokenizer::from_vocab(&spec).is_err());
    let mut spec = gpt2_spec("gpt2");
    spec.eos = Some(1_000_000);
    assert!(Tokenizer::from_vocab(&spec).is_err());
    assert!(Tokenizer::from_vocab(&VocabSpec::default()).is_err());
}

const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

#[test]
fn chatml_template_renders_like_transformers() {
    let msgs = [Message::new("user", "Hi")];
    let out = render(CHATML, &msgs, true, "<|im_start|>", "<|im_end|>").unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let msgs = [Message::new("system", "Be brief."), Message::new("user", "Hi")];
    let out = render(CHATML, &msgs, false, "", "").unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    );
}

#[test]
fn templates_get_python_methods_and_raise_exception() {
    let t = "{{ messages[0].content.strip().upper() }}{% if messages|length > 1 %}{{ raise_exception('one only') }}{% endif %}";
    assert_eq!(
        render(t, &[Message::new("user", "  hi ")], false, "", "").unwrap(),
        "HI"
    );
    let err = render(
        t,
        &[Message::new("user", "a"), Message::new("user", "b")],
        false,
        "",
        "",
    )
    .unwrap_err();
    assert!(err.to_string().contains("one only"), "{err}");
    assert!(render("{% if %}", &[], false, "", "").is_err());
}

#[test]
fn gemma3_builtin_template_renders_turns() {
    let msgs = [
        Message::new("system", "Be brief."),
        Message::new("user", " Hi "),
        Message::new("assistant", "Hello."),
        Message::new("user", "Bye"),
    ];
    let out = render(
        shaderlm::tokenizer::chat::GEMMA3_TEMPLATE,
        &msgs,
        true,
        "<bos>",
        "<eos>",
    )
    .unwrap();
    assert_eq!(
        out,
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n\
         <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    );
    let bad = [Message::new("assistant", "x")];
    assert!(render(shaderlm::tokenizer::chat::GEMMA3_TEMPLATE, &bad, true, "<bos>", "<eos>").is_err());
}

/// Templates run on bounded fuel: a loop of 10^10 iterations and a string doubled until memory runs out both end
/// in an error within moments, while a real template over a long conversation still renders.
#[test]
fn runaway_templates_run_out_of_fuel() {
    let msgs = [Message::new("user", "hi")];
    let start = std::time::Instant::now();
    let loops = "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}";
    let doubling =
        "{% set s = namespace(v='ab') %}{% for i in range(64) %}{% set s.v = s.v ~ s.v %}{% endfor %}{{ s.v }}";
    for t in [loops, doubling] {
        let e = render(t, &msgs, true, "", "").expect_err(t).to_string();
        assert!(e.contains("fuel"), "{t}: {e}");
    }
    assert!(start.elapsed().as_secs() < 30, "took {:?}", start.elapsed());
    let chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
    let long: Vec<Message> = (0..2000)
        .map(|i| Message::new(if i % 2 == 0 { "user" } else { "assistant" }, &"word ".repeat(200)))
        .collect();
    let text = render(chatml, &long, false, "", "").unwrap();
    assert_eq!(text.matches("<|im_start|>").count(), 2000);
}
