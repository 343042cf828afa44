#!/usr/bin/env python3
"""Golden fixtures for SmolLM2-135M-Instruct (GGUF, Q4_1) from an implementation independent of shaderlm.

What this script does, with nothing taken from the engine:

* reads the GGUF with the `gguf` package and dequantizes every tensor to float32 with `gguf.quants.dequantize`
  (the file holds Q4_1 matrices, a Q8_0 token embedding and F32 norm vectors);
* builds the tokenizer with the `tokenizers` package from the vocabulary and merges stored in the GGUF, using the
  pre-tokenizer of SmolLM2's own tokenizer.json (Digits(individual_digits) then ByteLevel with the GPT-2 regex),
  which is what llama.cpp's `tokenizer.ggml.pre = "smollm"` means;
* renders chat prompts with the GGUF's own `tokenizer.chat_template` through jinja2, set up as transformers'
  `apply_chat_template` does (sandboxed, trim_blocks, lstrip_blocks);
* runs a numpy forward of the Llama architecture (RMSNorm, rotary embeddings, grouped-query causal attention with
  a KV cache, SwiGLU MLP, tied output projection) in float64 by default, then greedy-decodes.

Rotary convention. llama.cpp's converter permutes the rows of attn_q / attn_k of a `llama` model, inside each head,
from the Hugging Face "rotate-half" layout (dimension i pairs with i + head_dim/2) into ggml's "normal" rope layout
(dimension 2i pairs with 2i+1), because llama.cpp runs LLAMA models with LLAMA_ROPE_TYPE_NORM. So the stored
tensors are in the INTERLEAVED (adjacent-pairs) layout. This script undoes that permutation the way transformers'
GGUF loader does (`reverse_permute`) and then applies rotate-half RoPE, as the original PyTorch model does. The
self-check (skipped with --no-checks) also runs interleaved RoPE on the stored rows and asserts both give the
same logits, and shows that rotate-half on the stored rows (the wrong pairing) does not.

Optional cross-check against llama.cpp when `llama_cpp` (llama-cpp-python) is importable: see `LlamaCpp`.

Output: one JSON per prompt under tests/fixtures/smollm2/ plus index.json. See models/reference/README.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import tempfile
import time
from importlib.metadata import version as pkg_version

import numpy as np

import gguf
import jinja2
import jinja2.sandbox
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_MODEL = os.path.join(REPO, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
DEFAULT_OUT = os.path.join(REPO, "tests", "fixtures", "smollm2")

N_STEPS = 32
TOP_K = 10
ROUND = 5


# --------------------------------------------------------------------------------------------------------------
# GGUF reading
# --------------------------------------------------------------------------------------------------------------


class Gguf:
    def __init__(self, path: str):
        self.path = path
        self.reader = gguf.GGUFReader(path)
        self.meta = {}
        for name, field in self.reader.fields.items():
            if name.startswith("GGUF."):
                continue
            self.meta[name] = field.contents()
        self.tensors = {t.name: t for t in self.reader.tensors}
        self._cache = {}

    def tensor(self, name: str) -> np.ndarray:
        """Dequantized float32 array, numpy shape = reversed GGUF shape, i.e. [rows(out), cols(in)]."""
        if name not in self._cache:
            t = self.tensors[name]
            arr = gguf.quants.dequantize(t.data, t.tensor_type)
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            self._cache[name] = np.ascontiguousarray(arr.reshape(shape), dtype=np.float32)
        return self._cache[name]

    def types(self) -> dict:
        out = {}
        for t in self.reader.tensors:
            out[t.tensor_type.name] = out.get(t.tensor_type.name, 0) + 1
        return out


# --------------------------------------------------------------------------------------------------------------
# Tokenizer and chat template
# --------------------------------------------------------------------------------------------------------------


def build_tokenizer(meta: dict) -> Tokenizer:
    assert meta["tokenizer.ggml.model"] == "gpt2", meta["tokenizer.ggml.model"]
    pre = meta["tokenizer.ggml.pre"]
    assert pre == "smollm", f"this script only knows the 'smollm' pre-tokenizer, file says {pre!r}"
    tokens = meta["tokenizer.ggml.tokens"]
    token_types = meta["tokenizer.ggml.token_type"]
    merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    assert len(vocab) == len(tokens), "duplicate tokens in vocabulary"
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    # As SmolLM2's tokenizer.json: no normalizer; split off every digit, then GPT-2 byte-level regex split.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    # Control tokens (type 3) are matched whole in the text, like llama.cpp's special-token parsing.
    special = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, token_types) if ty == 3]
    tok.add_special_tokens(special)
    for t in special:
        assert tok.token_to_id(t.content) == vocab[t.content]
    assert tok.get_vocab_size() == len(tokens)
    return tok


def render_chat(template: str, messages: list, add_generation_prompt: bool, meta: dict) -> str:
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    tokens = meta["tokenizer.ggml.tokens"]
    return env.from_string(template).render(
        messages=messages,
        add_generation_prompt=add_generation_prompt,
        bos_token=tokens[meta["tokenizer.ggml.bos_token_id"]],
        eos_token=tokens[meta["tokenizer.ggml.eos_token_id"]],
    )


# --------------------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------------------


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's convert permute (same as transformers' GGUF `reverse_permute`).

    w: [n_head * head_dim, in] in the stored (interleaved) row order -> rotate-half row order.
    """
    rows = w.shape[0]
    half = rows // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class Llama:
    def __init__(self, g: Gguf, dtype=np.float64, rope_mode: str = "rotate_half"):
        m = g.meta
        assert m["general.architecture"] == "llama"
        self.n_layer = int(m["llama.block_count"])
        self.d = int(m["llama.embedding_length"])
        self.n_head = int(m["llama.attention.head_count"])
        self.n_kv = int(m["llama.attention.head_count_kv"])
        self.ffn = int(m["llama.feed_forward_length"])
        self.head_dim = self.d // self.n_head
        self.rope_dim = int(m.get("llama.rope.dimension_count", self.head_dim))
        assert self.rope_dim == self.head_dim, "partial rotary not handled"
        self.theta = float(m["llama.rope.freq_base"])
        self.eps = float(m["llama.attention.layer_norm_rms_epsilon"])
        self.ctx = int(m["llama.context_length"])
        assert not any(k.startswith("llama.rope.scaling") for k in m), "rope scaling not handled"
        self.dtype = dtype
        self.rope_mode = rope_mode  # "rotate_half" (unpermuted rows), "interleaved" (stored rows), "wrong"
        cast = lambda a: np.ascontiguousarray(a, dtype=dtype)

        self.embd = cast(g.tensor("token_embd.weight"))  # [vocab, d]
        self.vocab = self.embd.shape[0]
        self.out = cast(g.tensor("output.weight")) if "output.weight" in g.tensors else self.embd
        self.tied = "output.weight" not in g.tensors
        self.out_norm = cast(g.tensor("output_norm.weight"))
        self.layers = []
        for i in range(self.n_layer):
            p = f"blk.{i}."
            wq = g.tensor(p + "attn_q.weight")
            wk = g.tensor(p + "attn_k.weight")
            assert wq.shape == (self.n_head * self.head_dim, self.d)
            assert wk.shape == (self.n_kv * self.head_dim, self.d)
            if rope_mode == "rotate_half":
                wq, wk = unpermute_rows(wq, self.n_head), unpermute_rows(wk, self.n_kv)
            L = {
                "attn_norm": cast(g.tensor(p + "attn_norm.weight")),
                "wq": cast(wq),
                "wk": cast(wk),
                "wv": cast(g.tensor(p + "attn_v.weight")),
                "wo": cast(g.tensor(p + "attn_output.weight")),
                "ffn_norm": cast(g.tensor(p + "ffn_norm.weight")),
                "wg": cast(g.tensor(p + "ffn_gate.weight")),
                "wu": cast(g.tensor(p + "ffn_up.weight")),
                "wd": cast(g.tensor(p + "ffn_down.weight")),
            }
            assert L["wg"].shape == (self.ffn, self.d) and L["wd"].shape == (self.d, self.ffn)
            self.layers.append(L)
        half = self.head_dim // 2
        self.inv_freq = self.theta ** (-np.arange(half, dtype=np.float64) * 2.0 / self.head_dim)

    def new_cache(self):
        return {"k": [None] * self.n_layer, "v": [None] * self.n_layer, "n": 0}

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):
        # x: [T, heads, head_dim]; pos: [T]
        ang = pos[:, None].astype(np.float64) * self.inv_freq[None, :]  # [T, half]
        cos = np.cos(ang).astype(self.dtype)[:, None, :]
        sin = np.sin(ang).astype(self.dtype)[:, None, :]
        half = self.head_dim // 2
        if self.rope_mode == "interleaved":
            a, b = x[..., 0::2], x[..., 1::2]
            out = np.empty_like(x)
            out[..., 0::2] = a * cos - b * sin
            out[..., 1::2] = a * sin + b * cos
            return out
        # rotate-half: dimension i pairs with i + half
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)

    def forward(self, ids, cache, all_logits=False):
        """Run the tokens `ids` at positions cache['n']..; returns logits of the last (or every) position."""
        ids = np.asarray(ids, dtype=np.int64)
        T = len(ids)
        p0 = cache["n"]
        assert p0 + T <= self.ctx
        pos = np.arange(p0, p0 + T)
        hd, nh, nkv = self.head_dim, self.n_head, self.n_kv
        group = nh // nkv
        scale = 1.0 / math.sqrt(hd)
        x = self.embd[ids]  # [T, d]
        # causal mask over the full key range [0, p0 + T)
        kpos = np.arange(p0 + T)
        mask = np.where(kpos[None, :] <= pos[:, None], 0.0, -np.inf).astype(self.dtype)  # [T, S]
        for li, L in enumerate(self.layers):
            h = self.rmsnorm(x, L["attn_norm"])
            q = (h @ L["wq"].T).reshape(T, nh, hd)
            k = (h @ L["wk"].T).reshape(T, nkv, hd)
            v = (h @ L["wv"].T).reshape(T, nkv, hd)
            q = self.rope(q, pos)
            k = self.rope(k, pos)
            K = k if cache["k"][li] is None else np.concatenate([cache["k"][li], k], axis=0)
            V = v if cache["v"][li] is None else np.concatenate([cache["v"][li], v], axis=0)
            cache["k"][li], cache["v"][li] = K, V
            # grouped-query attention: query head j reads kv head j // group
            qg = q.reshape(T, nkv, group, hd).transpose(1, 2, 0, 3)  # [nkv, group, T, hd]
            Kt = K.transpose(1, 2, 0)[:, None, :, :]  # [nkv, 1, hd, S]
            s = (qg @ Kt) * scale + mask  # [nkv, group, T, S]
            s = s - s.max(axis=-1, keepdims=True)
            pr = np.exp(s)
            pr /= pr.sum(axis=-1, keepdims=True)
            o = pr @ V.transpose(1, 0, 2)[:, None, :, :]  # [nkv, group, T, hd]
            o = o.transpose(2, 0, 1, 3).reshape(T, nh * hd)
            x = x + o @ L["wo"].T
            h = self.rmsnorm(x, L["ffn_norm"])
            gte = h @ L["wg"].T
            up = h @ L["wu"].T
            act = gte / (1.0 + np.exp(-gte)) * up
            x = x + act @ L["wd"].T
        cache["n"] = p0 + T
        x = self.rmsnorm(x if all_logits else x[-1:], self.out_norm)
        logits = x @ self.out.T
        return logits if all_logits else logits[0]


# --------------------------------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------------------------------


def long_text() -> str:
    """A deterministic English text of well over 1,000 tokens, built from fixed word lists (no randomness)."""
    towns = ["Ashford", "Brindle", "Carrow", "Dunmere", "Elsworth", "Fenwick", "Glenmoor"]
    trades = ["baker", "blacksmith", "weaver", "miller", "carpenter", "potter", "fisherman", "cobbler", "brewer"]
    names = ["Anna", "Thomas", "Margaret", "William", "Eleanor", "Henry", "Clara", "Samuel", "Lucy", "Edward", "Martha"]
    acts = [
        "rose before dawn to light the fire",
        "walked along the river to the market",
        "mended the old fence behind the church",
        "carried bread and cheese to the neighbours",
        "counted the coins saved over the winter",
        "taught the children to read by candlelight",
        "repaired the roof after the autumn storm",
        "planted apple trees along the northern road",
    ]
    weathers = ["a cold grey morning", "a bright spring afternoon", "a long summer evening", "a quiet winter night",
                "a windy day in early autumn"]
    endings = [
        "and everyone in the village agreed that it had been worth the effort.",
        "although few people noticed at the time, it changed the life of the town.",
        "and the story was told again and again for many years afterwards.",
        "which is why the old road is still called by that name today.",
        "and by the end of the season the whole valley had heard about it.",
    ]
    paras = []
    k = 0
    for p in range(5):
        town = towns[p % len(towns)]
        sents = [f"Chapter {p + 1}. In the town of {town}, life followed the rhythm of the seasons."]
        for s in range(8):
            name = names[k % len(names)]
            trade = trades[(3 * k + 1) % len(trades)]
            act = acts[(5 * k + 2) % len(acts)]
            weather = weathers[(7 * k + 3) % len(weathers)]
            end = endings[(2 * k + s) % len(endings)]
            sents.append(f"On {weather}, {name} the {trade} {act}, {end}")
            k += 1
        paras.append(" ".join(sents))
    paras.append("After all those years, when people asked what the town of Ashford was best known for, the answer was")
    return "\n\n".join(paras)


def prompts():
    return [
        {"name": "plain_english", "text": "The history of the printing press began in 1440, when Johannes Gutenberg"},
        {
            "name": "chat_capital",
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "add_generation_prompt": True,
        },
        {
            "name": "code_python",
            "text": 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n',
        },
        {"name": "cjk", "text": "人工智能是计算机科学的一个分支。東京は日本の首都です。서울은 한국의 수도입니다. 北京是"},
        {"name": "emoji", "text": "Today was amazing 🎉🎉! I had pizza 🍕, saw my dog 🐶 and the sun ☀️ was out. Tomorrow I will"},
        {
            "name": "chat_multiturn_system",
            "messages": [
                {"role": "system", "content": "You are a concise assistant. Answer in one short sentence."},
                {"role": "user", "content": "Hi! What is 2 + 2?"},
                {"role": "assistant", "content": "2 + 2 = 4."},
                {"role": "user", "content": "And which planet is the largest in the solar system?"},
            ],
            "add_generation_prompt": True,
        },
        {"name": "whitespace", "text": "Line one\n\n\n   indented line\twith a tab\r\nand   several    spaces:"},
        {"name": "long_1k", "text": long_text()},
    ]


# --------------------------------------------------------------------------------------------------------------
# Generation and fixtures
# --------------------------------------------------------------------------------------------------------------


def top_k(logits: np.ndarray, k: int):
    # sort by logit descending, ties to the lower id
    order = np.lexsort((np.arange(len(logits)), -logits))[:k]
    return order


def step_record(logits: np.ndarray):
    idx = top_k(logits, TOP_K)
    m = float(logits.max())
    lse = m + math.log(float(np.exp(logits - m).sum()))
    return {
        "top_ids": [int(i) for i in idx],
        "top_logits": [round(float(logits[i]), ROUND) for i in idx],
        "gap": round(float(logits[idx[0]] - logits[idx[1]]), ROUND),
        "logsumexp": round(lse, ROUND),
    }


def greedy(model: Llama, ids, n_steps: int):
    cache = model.new_cache()
    logits = model.forward(ids, cache)
    all_logits = []
    out, steps = [], []
    for s in range(n_steps):
        rec = step_record(logits)
        all_logits.append(logits)
        nxt = rec["top_ids"][0]  # argmax, ties to lower id
        steps.append(rec)
        out.append(nxt)
        if s + 1 < n_steps:
            logits = model.forward([nxt], cache)
    return out, steps, all_logits


def fixture_record(pr: dict, text: str, ids, gen, gen_text: str, eos_at, steps) -> dict:
    """One prompt's fixture, in the field order the files have."""
    return {
        "name": pr["name"],
        "kind": "chat" if "messages" in pr else "text",
        "messages": pr.get("messages"),
        "add_generation_prompt": pr.get("add_generation_prompt"),
        "prompt": text,
        "prompt_tokens": ids,
        "n_prompt_tokens": len(ids),
        "greedy_tokens": gen,
        "greedy_text": gen_text,
        "first_eos_step": eos_at,
        "steps": steps,
    }


def dump_fixture(rec: dict, path: str):
    """JSON with one line per top-level field and one line per step, so the files stay small and diffable."""
    compact = dict(ensure_ascii=False, separators=(", ", ": "))
    fields = []
    for key, val in rec.items():
        if key == "steps":
            body = ",\n".join("  " + json.dumps(s, **compact) for s in val)
            text = "[\n" + body + "\n ]"
        else:
            text = json.dumps(val, **compact)
        fields.append(f" {json.dumps(key)}: {text}")
    with open(path, "w", encoding="utf-8") as f:
        f.write("{\n" + ",\n".join(fields) + "\n}\n")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def versions():
    out = {"python": platform.python_version()}
    for p in ["numpy", "gguf", "tokenizers", "jinja2"]:
        out[p] = pkg_version(p)
    return out


def rope_self_check(g: Gguf, model: Llama, ids):
    """Same logits from (unpermuted rows + rotate-half) and (stored rows + interleaved); differ for the wrong pairing."""
    ref = model.forward(ids, model.new_cache(), all_logits=True)
    inter = Llama(g, model.dtype, "interleaved").forward(ids, model.new_cache(), all_logits=True)
    diff = float(np.abs(ref - inter).max())
    wrong = Llama(g, model.dtype, "wrong").forward(ids, model.new_cache(), all_logits=True)
    wdiff = float(np.abs(ref - wrong).max())
    print(f"rope check: |rotate_half(unpermuted) - interleaved(stored)| max = {diff:.3e}; "
          f"|rotate_half(stored rows)| (wrong pairing) max diff = {wdiff:.3f}")
    tol = 1e-8 if model.dtype == np.float64 else 1e-3
    assert diff < tol, "rope conventions disagree"
    assert wdiff > 1e-2, "wrong rope pairing should change logits"
    return diff


def cache_self_check(model: Llama, ids):
    """Prefill all at once vs token by token through the KV cache: last-position logits must agree."""
    a = model.forward(ids, model.new_cache())
    c = model.new_cache()
    for t in ids:
        b = model.forward([t], c)
    d = float(np.abs(a - b).max())
    print(f"kv-cache check: |prefill - incremental| max = {d:.3e}")
    assert d < (1e-8 if model.dtype == np.float64 else 1e-3)


def write_f32_gguf(g: Gguf, path: str):
    """The same model with every tensor dequantized to F32 (for the llama.cpp cross-check)."""
    w = gguf.GGUFWriter(path, g.meta["general.architecture"])
    for name, f in g.reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == "general.file_type":
            w.add_key_value(name, 0, gguf.GGUFValueType.UINT32)  # ALL_F32
            continue
        vt = f.types[0]
        w.add_key_value(name, f.contents(), vt, f.types[1] if vt == gguf.GGUFValueType.ARRAY else None)
    for t in g.reader.tensors:
        w.add_tensor(t.name, g.tensor(t.name))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


class LlamaCpp:
    """Optional cross-check against llama.cpp (llama-cpp-python), used only when it is installed.

    * `exact`: llama.cpp on an F32 copy of the GGUF (weights dequantized by gguf, as here) with an F32 KV cache and
      no flash attention; fed this script's prompt and greedy tokens, its logits at every step must agree with
      this forward to float32 rounding. This checks the architecture (rope layout, GQA, norms, tied output).
    * `quantized`: llama.cpp on the Q4_1 file as shipped: its tokenization must equal ours, and its own greedy
      continuation is compared (it quantizes activations to 8 bits, so it may part ways at small gaps).
    """

    def __init__(self, g: Gguf, tmpdir: str):
        import llama_cpp

        self.version = pkg_version("llama_cpp_python")
        f32_path = os.path.join(tmpdir, "model-f32.gguf")
        write_f32_gguf(g, f32_path)
        kw = dict(n_ctx=2048, n_batch=512, logits_all=True, verbose=False, n_threads=os.cpu_count() or 1)
        self.exact = llama_cpp.Llama(model_path=f32_path, type_k=0, type_v=0, flash_attn=False, **kw)
        self.quant = llama_cpp.Llama(model_path=g.path, **kw)

    def compare(self, text, ids, ref_gen, ref_logits):
        their_ids = self.quant.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        res = {"tokenization_agrees": list(their_ids) == list(ids)}
        # exact: teacher-forced with our tokens
        llm = self.exact
        llm.reset()
        llm.eval(list(ids) + list(ref_gen[:-1]))
        n = len(ids)
        diffs = [float(np.abs(np.asarray(llm.scores[n - 1 + i], dtype=np.float64) - ref_logits[i]).max())
                 for i in range(len(ref_gen))]
        res["f32_max_abs_logit_diff_all_steps"] = float(f"{max(diffs):.2e}")
        # quantized: free-running greedy
        llm = self.quant
        llm.reset()
        llm.eval(ids)
        gen = []
        for _ in range(len(ref_gen)):
            nxt = int(top_k(np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64), 1)[0])
            gen.append(nxt)
            llm.eval([nxt])
        agree = 0
        while agree < len(gen) and gen[agree] == ref_gen[agree]:
            agree += 1
        res["q4_1_greedy_leading_tokens_agree"] = agree
        assert res["tokenization_agrees"], f"llama.cpp tokenizes differently: {list(their_ids)}"
        assert max(diffs) < 5e-3, f"llama.cpp (F32 weights) disagrees with this forward: {max(diffs)}"
        return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    ap.add_argument("--steps", type=int, default=N_STEPS)
    ap.add_argument("--only", help="comma-separated prompt names")
    ap.add_argument("--no-checks", action="store_true", help="skip the rope / kv-cache / llama.cpp self-checks")
    args = ap.parse_args()

    t0 = time.time()
    if not os.path.exists(args.model):
        sys.exit(f"model not found: {args.model} (run models/fetch.sh)")
    dtype = np.float64 if args.dtype == "float64" else np.float32
    g = Gguf(args.model)
    meta = g.meta
    tok = build_tokenizer(meta)
    template = meta["tokenizer.chat_template"]
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    bos = int(meta["tokenizer.ggml.bos_token_id"])
    eos = int(meta["tokenizer.ggml.eos_token_id"])
    model = Llama(g, dtype)
    print(f"loaded {os.path.basename(args.model)}: {g.types()} tied={model.tied} eps={model.eps} "
          f"theta={model.theta} add_bos={add_bos} ({time.time() - t0:.1f}s)")

    os.makedirs(args.out, exist_ok=True)
    checks = {}
    lcpp = None
    if not args.no_checks:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            print("llama.cpp cross-check: llama_cpp not installed, skipped")
        else:
            tmp = tempfile.TemporaryDirectory()
            lcpp = LlamaCpp(g, tmp.name)
    index_entries = []
    min_gap = None
    wanted = set(args.only.split(",")) if args.only else None
    for pr in prompts():
        if wanted and pr["name"] not in wanted:
            continue
        t1 = time.time()
        if "messages" in pr:
            text = render_chat(template, pr["messages"], pr["add_generation_prompt"], meta)
        else:
            text = pr["text"]
        ids = tok.encode(text, add_special_tokens=False).ids
        if add_bos:
            ids = [bos] + ids
        assert tok.decode(ids, skip_special_tokens=False) == text, "tokenizer round trip failed"

        if not args.no_checks and pr["name"] == "plain_english":
            checks["rope_max_abs_diff"] = rope_self_check(g, model, ids)
            cache_self_check(model, ids)

        gen, steps, step_logits = greedy(model, ids, args.steps)
        if lcpp is not None:
            res = lcpp.compare(text, ids, gen, step_logits)
            checks.setdefault("llama_cpp", {"version": lcpp.version})[pr["name"]] = res
        gen_text = tok.decode(gen, skip_special_tokens=False)
        eos_at = next((i for i, t in enumerate(gen) if t == eos), None)
        rec = fixture_record(pr, text, ids, gen, gen_text, eos_at, steps)
        fname = f"{pr['name']}.json"
        dump_fixture(rec, os.path.join(args.out, fname))
        gaps = [s["gap"] for s in steps]
        near = [{"step": i, "gap": s["gap"]} for i, s in enumerate(steps) if s["gap"] < 0.05]
        pmin = min(gaps)
        min_gap = pmin if min_gap is None else min(min_gap, pmin)
        index_entries.append({"file": fname, "n_prompt_tokens": len(ids), "min_gap": pmin, "near_ties": near})
        print(f"\n== {pr['name']}: {len(ids)} prompt tokens, {time.time() - t1:.1f}s")
        if "messages" in pr:
            print(f"prompt: {text!r}")
        else:
            print(f"prompt: {text[:120]!r}{'...' if len(text) > 120 else ''}")
        print(f"greedy: {gen_text!r}")
        print(f"step 0 top-5: {[(tok.id_to_token(i), l) for i, l in zip(steps[0]['top_ids'][:5], steps[0]['top_logits'][:5])]}")
        print(f"min top-2 gap {pmin:.5f}; near ties (<0.05): {near if near else 'none'}; first EOS step: {eos_at}")
        if lcpp is not None:
            print(f"llama.cpp {lcpp.version}: {checks['llama_cpp'][pr['name']]}")

    index = {
        "model": {
            "file": os.path.basename(args.model),
            "size": os.path.getsize(args.model),
            "sha256": sha256(args.model),
            "architecture": "llama",
            "tensor_types": g.types(),
        },
        "generator": {
            "script": "models/reference/golden.py",
            "math": args.dtype,
            "weights": "dequantized to float32 by gguf.quants.dequantize, then cast to the math dtype",
            "rope": "q/k rows un-permuted from the stored interleaved (ggml NORM) layout to rotate-half (HF) layout",
            "versions": versions(),
        },
        "conventions": {
            "steps": args.steps,
            "top_k": TOP_K,
            "step_0": "logits at the last prompt position; step i>0 after feeding greedy_tokens[i-1]",
            "greedy": "argmax, ties to the lower id; decoding continues past EOS",
            "top_order": "logit descending, ties to the lower id",
            "rounding": f"logits, gap, logsumexp rounded to {ROUND} decimals; gap is computed before rounding",
            "add_bos": add_bos,
            "eos_token_id": eos,
        },
        "checks": checks,
        "fixtures": index_entries,
        "min_gap": min_gap,
    }
    if not wanted:
        with open(os.path.join(args.out, "index.json"), "w", encoding="utf-8") as f:
            json.dump(index, f, ensure_ascii=False, indent=1)
            f.write("\n")
    print(f"\nsmallest top-2 gap over all steps: {min_gap:.5f}; total {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
