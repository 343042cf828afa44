//! Pre-tokenizer split rules per `tokenizer.ggml.pre`, as llama.cpp's `llama-vocab.cpp` defines them. Each regex
//! splits the pieces left by the previous one, keeping matches and gaps as separate pieces.

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The regexes for a pre-tokenizer name; unknown names get llama.cpp's default set.
pub fn regexes(pre: &str) -> Vec<&'static str> {
    match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "dbrx" | "smaug-bpe" | "falcon3" | "pixtral" | "chatglm-bpe" => {
            vec![LLAMA3]
        }
        "qwen2" | "stablelm2" | "hunyuan" | "deepseek-r1-qwen" | "megrez" => vec![QWEN2],
        "gpt-2" | "gpt2" | "mpt" | "olmo" | "jais" | "trillion" => vec![GPT2],
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" => {
            vec![r"\p{N}", GPT2]
        }
        "falcon" => vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"],
        "poro-chat" | "bloom" | "gpt3-finnish" => vec![r" ?[^(\s|.,!?…。，、।۔،)]+"],
        "viking" => vec![r" ?[^(\s|.,!?…。，、।۔،)]+", r"\p{N}"],
        _ => vec![r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
    }
}

/// llama.cpp looks whole words up in the vocabulary before merging for these.
pub fn ignore_merges(pre: &str) -> bool {
    matches!(pre, "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral")
}
