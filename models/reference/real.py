#!/usr/bin/env python3
"""Golden fixtures for published GGUF models (Qwen2.5-Coder 0.5B / 1.5B, Gemma 3 270M), independent of shaderlm.

    python models/reference/real.py qwen2.5-coder-0.5b | qwen2.5-coder-1.5b | gemma3-270m [--only NAME,...]

It shares the GGUF reading, greedy loop, fixture format and prompts with golden.py (imported from it)
and adds numpy forwards of two more architectures, written from Hugging Face's modeling code:

* qwen2 (modeling_qwen2.py): Llama with biases on q/k/v, untied output.weight. llama.cpp's converter
  (convert_hf_to_gguf.py, Qwen2Model) writes attn_q/attn_k unchanged -- only LlamaModel permutes them -- and
  llama.cpp runs qwen2 with LLAMA_ROPE_TYPE_NEOX, so the stored rows are in HF order and rope is rotate-half
  (dimension i pairs with i + head_dim/2) on the rows as stored.
* gemma3 (modeling_gemma3.py, configuration_gemma3.py): embeddings times sqrt(hidden); per layer
  x += post_attention_norm(attn(attn_norm(x))); x += post_ffw_norm(mlp(ffn_norm(x))); GeGLU with the tanh gelu;
  RMSNorm of q and k over head_dim before rope; scores scaled by query_pre_attn_scalar**-0.5 (256 = head_dim,
  as llama.cpp's 1/sqrt(n_embd_head_k)); 5 sliding-window layers then 1 global one (layer i is global when
  (i + 1) % 6 == 0), rope base 10000 on sliding layers and the GGUF's freq_base (1e6) on global ones; a query at
  position p sees keys p - window + 1 .. p on sliding layers (HF masking_utils: kv_idx > q_idx - window; llama.cpp
  LLAMA_SWA_TYPE_STANDARD masks p1 - p0 >= n_swa); no logit soft-capping (Gemma3TextConfig defaults None); output
  tied to token_embd. HF's RMSNorm multiplies by (1 + w); llama.cpp's converter (Gemma3Model.modify_tensors)
  already added 1 to every *norm.weight, so this script multiplies by the stored weight.

The self-checks (skipped with --no-checks) test what the comments above assert: prefill equals token-by-token
decoding through the KV cache (and, for Gemma, chunked prefill across the sliding window equals one-shot
prefill); the chosen rope pairing, and for Gemma the chosen norm formula, give the natural-text prompt a far
lower negative log-likelihood than the alternatives; Gemma's sliding window changes the long prompt's logits.

Tokenizers: qwen2 is built here with `tokenizers` from the GGUF's vocabulary and merges (Qwen2's pre-tokenizer
regex, byte-level, NFC as in its tokenizer.json, control and user-defined tokens matched whole); Gemma 3 uses
transformers' GGUF tokenizer conversion (`convert_gguf_tokenizer`, fed the metadata read by `gguf`, as
transformers' own GGUF reader imports torch). When transformers is importable the qwen2 tokenizer is also
checked against transformers' conversion on every prompt.

Output: tests/fixtures/<model>/<prompt>.json + index.json, in golden.py's format. See models/reference/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import unicodedata

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden  # noqa: E402  (prompt texts, GGUF reader, greedy loop, fixture writer)
from golden import Gguf, dump_fixture, fixture_record, greedy, render_chat, sha256  # noqa: E402

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers  # noqa: E402

REPO = golden.REPO

MODELS = {
    "qwen2.5-coder-0.5b": {"file": "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf", "arch": "qwen2", "dtype": "float64"},
    # 1.5B: float32 (6 GB of weights instead of 12, and several times faster on two cores).
    "qwen2.5-coder-1.5b": {"file": "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf", "arch": "qwen2", "dtype": "float32"},
    "gemma3-270m": {"file": "gemma-3-270m-Q4_K_M.gguf", "arch": "gemma3", "dtype": "float64"},
}

# Gemma 3's chat template as published with the instruction-tuned Gemma 3 checkpoints (tokenizer_config.json
# "chat_template" of google/gemma-3-270m-it and the other gemma-3-*-it repositories; also in transformers'
# Gemma 3 conversion script). The GGUF used here carries no template, so the script supplies it.
GEMMA3_CHAT_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

# Qwen2's pre-tokenizer split (its tokenizer.json; llama.cpp's `qwen2` pre-tokenizer is the same pattern).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def prompts():
    """golden.py's eight prompts plus a coding chat (the Qwen models are coder models)."""
    out = golden.prompts()
    out.insert(2, {
        "name": "chat_code",
        "messages": [{"role": "user", "content": "Write a Python function that checks whether a string is a "
                                                 "palindrome, ignoring case and spaces."}],
        "add_generation_prompt": True,
    })
    return out


# --------------------------------------------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------------------------------------------


def qwen2_tokenizer(meta: dict) -> Tokenizer:
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "qwen2"
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"]
    vocab = {t: i for i, t in enumerate(tokens)}
    assert len(vocab) == len(tokens)
    merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    # Control tokens (type 3) are special; user-defined ones (type 4, e.g. <tool_call>) are plain added tokens.
    # Both are matched whole, as in Qwen's tokenizer.json and llama.cpp.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == 4])
    for t, ty in zip(tokens, types):
        if ty in (3, 4):
            assert tok.token_to_id(t) == vocab[t]
    assert tok.get_vocab_size() == len(tokens)
    return tok


def transformers_tokenizer(g: Gguf) -> Tokenizer:
    """transformers' GGUF tokenizer conversion, fed the metadata as transformers' GGUF reader would name it."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer)

    td = {name: g.meta[f"tokenizer.{key}"] for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
          if f"tokenizer.{key}" in g.meta}
    tok, _ = convert_gguf_tokenizer(g.meta["general.architecture"], td)
    return tok


def gemma3_tokenizer(g: Gguf) -> Tokenizer:
    m = g.meta
    assert m["tokenizer.ggml.model"] == "llama" and m.get("tokenizer.ggml.add_space_prefix") is False
    # transformers derives BPE merges from the token order in the file; llama.cpp's sentencepiece tokenizer merges
    # by score. The two agree because the scores of the normal tokens fall strictly with the token id:
    types = np.asarray(m["tokenizer.ggml.token_type"])
    scores = np.asarray(m["tokenizer.ggml.scores"])[types == 1]
    assert np.all(np.diff(scores) < 0), "score order differs from file order"
    tok = transformers_tokenizer(g)
    assert tok.get_vocab_size() == len(m["tokenizer.ggml.tokens"])
    return tok


# --------------------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------------------


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


class Base:
    """Shared pieces: weight loading, rope, grouped-query attention over a KV cache."""

    def __init__(self, g: Gguf, dtype, wdtype):
        self.g = g
        self.dtype = dtype
        self.wdtype = wdtype
        self.rope_mode = "rotate_half"  # or "interleaved" (the wrong pairing, for the self-check)

    def w(self, name):
        return np.ascontiguousarray(self.g.tensor(name), dtype=self.wdtype)

    def new_cache(self):
        return {"k": [None] * self.n_layer, "v": [None] * self.n_layer, "n": 0}

    def inv_freq(self, theta):
        half = self.head_dim // 2
        return theta ** (-np.arange(half, dtype=np.float64) * 2.0 / self.head_dim)

    def rope(self, x, pos, inv_freq):
        ang = pos[:, None].astype(np.float64) * inv_freq[None, :]
        cos = np.cos(ang).astype(self.dtype)[:, None, :]
        sin = np.sin(ang).astype(self.dtype)[:, None, :]
        if self.rope_mode == "interleaved":
            a, b = x[..., 0::2], x[..., 1::2]
            out = np.empty_like(x)
            out[..., 0::2] = a * cos - b * sin
            out[..., 1::2] = a * sin + b * cos
            return out
        half = self.head_dim // 2
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)

    def attend(self, q, k, v, li, cache, pos, scale, window=None):
        """q [T, nh, hd], k/v [T, nkv, hd] (roped); appends k/v to the cache; returns [T, nh * hd]."""
        T = q.shape[0]
        nh, nkv, hd = self.n_head, self.n_kv, self.head_dim
        group = nh // nkv
        K = k if cache["k"][li] is None else np.concatenate([cache["k"][li], k], axis=0)
        V = v if cache["v"][li] is None else np.concatenate([cache["v"][li], v], axis=0)
        cache["k"][li], cache["v"][li] = K, V
        kpos = np.arange(K.shape[0])
        ok = kpos[None, :] <= pos[:, None]
        if window is not None:
            ok &= pos[:, None] - kpos[None, :] < window  # keys p - window + 1 .. p
        mask = np.where(ok, 0.0, -np.inf).astype(self.dtype)
        qg = q.reshape(T, nkv, group, hd).transpose(1, 2, 0, 3)  # query head j reads kv head j // group
        s = (qg @ K.transpose(1, 2, 0)[:, None, :, :]) * scale + mask
        s = s - s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=-1, keepdims=True)
        o = p @ V.transpose(1, 0, 2)[:, None, :, :]
        return o.transpose(2, 0, 1, 3).reshape(T, nh * hd)

    def logits(self, x, all_logits):
        x = rmsnorm(x if all_logits else x[-1:], self.out_norm, self.eps)
        out = x @ self.out.T
        return out if all_logits else out[0]


class Qwen2(Base):
    arch = "qwen2"

    def __init__(self, g: Gguf, dtype=np.float64, wdtype=np.float64):
        super().__init__(g, dtype, wdtype)
        m = g.meta
        assert m["general.architecture"] == "qwen2"
        self.n_layer = int(m["qwen2.block_count"])
        self.d = int(m["qwen2.embedding_length"])
        self.n_head = int(m["qwen2.attention.head_count"])
        self.n_kv = int(m["qwen2.attention.head_count_kv"])
        self.head_dim = self.d // self.n_head
        assert int(m.get("qwen2.rope.dimension_count", self.head_dim)) == self.head_dim
        assert not any(k.startswith("qwen2.rope.scaling") for k in m), "rope scaling not handled"
        self.theta = float(m["qwen2.rope.freq_base"])
        self.eps = float(m["qwen2.attention.layer_norm_rms_epsilon"])
        self.embd = self.w("token_embd.weight")
        self.tied = "output.weight" not in g.tensors
        self.out = self.embd if self.tied else self.w("output.weight")
        self.out_norm = self.w("output_norm.weight")
        self.layers = []
        for i in range(self.n_layer):
            p = f"blk.{i}."
            L = {k: self.w(p + n) for k, n in [
                ("attn_norm", "attn_norm.weight"), ("wq", "attn_q.weight"), ("bq", "attn_q.bias"),
                ("wk", "attn_k.weight"), ("bk", "attn_k.bias"), ("wv", "attn_v.weight"), ("bv", "attn_v.bias"),
                ("wo", "attn_output.weight"), ("ffn_norm", "ffn_norm.weight"), ("wg", "ffn_gate.weight"),
                ("wu", "ffn_up.weight"), ("wd", "ffn_down.weight")]}
            assert L["wq"].shape == (self.d, self.d) and L["wk"].shape == (self.n_kv * self.head_dim, self.d)
            self.layers.append(L)
        self.freq = self.inv_freq(self.theta)
        g._cache.clear()

    def forward(self, ids, cache, all_logits=False):
        ids = np.asarray(ids, dtype=np.int64)
        T, p0 = len(ids), cache["n"]
        pos = np.arange(p0, p0 + T)
        hd = self.head_dim
        x = self.embd[ids].astype(self.dtype)
        for li, L in enumerate(self.layers):
            h = rmsnorm(x, L["attn_norm"], self.eps)
            q = (h @ L["wq"].T + L["bq"]).reshape(T, self.n_head, hd)
            k = (h @ L["wk"].T + L["bk"]).reshape(T, self.n_kv, hd)
            v = (h @ L["wv"].T + L["bv"]).reshape(T, self.n_kv, hd)
            q, k = self.rope(q, pos, self.freq), self.rope(k, pos, self.freq)
            x = x + self.attend(q, k, v, li, cache, pos, 1.0 / math.sqrt(hd)) @ L["wo"].T
            h = rmsnorm(x, L["ffn_norm"], self.eps)
            gte = h @ L["wg"].T
            x = x + (gte / (1.0 + np.exp(-gte)) * (h @ L["wu"].T)) @ L["wd"].T
        cache["n"] = p0 + T
        return self.logits(x, all_logits)

    def conventions(self):
        return {
            "rope": "rotate-half (NEOX: dimension i with i + head_dim/2) on attn_q/attn_k rows as stored "
                    "(llama.cpp's converter does not permute qwen2)",
            "rope_theta": self.theta,
            "rms_norm_eps": self.eps,
            "attention": f"{self.n_head} query heads, {self.n_kv} kv heads, head_dim {self.head_dim}, "
                         "scale 1/sqrt(head_dim), q/k/v biases",
            "output": "tied to token_embd" if self.tied else "output.weight (untied)",
        }


class Gemma3(Base):
    arch = "gemma3"
    LOCAL_ROPE_THETA = 10000.0  # HF rope_local_base_freq default; llama.cpp hard-codes it (not in the GGUF)
    SWA_PATTERN = 6  # HF sliding_window_pattern default; llama.cpp set_swa_pattern(6)

    def __init__(self, g: Gguf, dtype=np.float64, wdtype=np.float64):
        super().__init__(g, dtype, wdtype)
        m = g.meta
        assert m["general.architecture"] == "gemma3"
        self.n_layer = int(m["gemma3.block_count"])
        self.d = int(m["gemma3.embedding_length"])
        self.n_head = int(m["gemma3.attention.head_count"])
        self.n_kv = int(m["gemma3.attention.head_count_kv"])
        self.head_dim = int(m["gemma3.attention.key_length"])
        assert int(m["gemma3.attention.value_length"]) == self.head_dim
        assert not any(k.startswith("gemma3.rope.scaling") for k in m), "rope scaling not handled"
        assert not any("softcapping" in k for k in m), "logit soft-capping not expected for Gemma 3"
        self.theta_global = float(m["gemma3.rope.freq_base"])
        self.window = int(m["gemma3.attention.sliding_window"])
        self.eps = float(m["gemma3.attention.layer_norm_rms_epsilon"])
        # query_pre_attn_scalar is not stored; it is 256 (= head_dim) for Gemma 3 270M, and llama.cpp uses
        # 1/sqrt(head_dim) for every Gemma 3 size but 27B.
        self.scale = self.head_dim ** -0.5
        self.embd = self.w("token_embd.weight")
        self.embed_scale = np.asarray(math.sqrt(self.d), dtype=self.dtype)
        self.tied = "output.weight" not in g.tensors
        assert self.tied
        self.out = self.embd
        self.norm_offset = 0.0  # stored norm weights already include HF's "+ 1"; 1.0 only for the self-check
        self._out_norm = self.w("output_norm.weight")
        self.layers = []
        for i in range(self.n_layer):
            p = f"blk.{i}."
            L = {k: self.w(p + n) for k, n in [
                ("attn_norm", "attn_norm.weight"), ("wq", "attn_q.weight"), ("wk", "attn_k.weight"),
                ("wv", "attn_v.weight"), ("q_norm", "attn_q_norm.weight"), ("k_norm", "attn_k_norm.weight"),
                ("wo", "attn_output.weight"), ("post_attn_norm", "post_attention_norm.weight"),
                ("ffn_norm", "ffn_norm.weight"), ("wg", "ffn_gate.weight"), ("wu", "ffn_up.weight"),
                ("wd", "ffn_down.weight"), ("post_ffn_norm", "post_ffw_norm.weight")]}
            assert L["wq"].shape == (self.n_head * self.head_dim, self.d)
            assert L["wk"].shape == (self.n_kv * self.head_dim, self.d)
            L["global"] = (i + 1) % self.SWA_PATTERN == 0
            self.layers.append(L)
        self.freq_local = self.inv_freq(self.LOCAL_ROPE_THETA)
        self.freq_global = self.inv_freq(self.theta_global)
        self.use_window = True
        g._cache.clear()

    @property
    def out_norm(self):
        return self._out_norm + self.norm_offset

    def norm(self, x, w):
        return rmsnorm(x, w + self.norm_offset if self.norm_offset else w, self.eps)

    def forward(self, ids, cache, all_logits=False):
        ids = np.asarray(ids, dtype=np.int64)
        T, p0 = len(ids), cache["n"]
        pos = np.arange(p0, p0 + T)
        hd = self.head_dim
        x = self.embd[ids].astype(self.dtype) * self.embed_scale
        for li, L in enumerate(self.layers):
            h = self.norm(x, L["attn_norm"])
            q = self.norm((h @ L["wq"].T).reshape(T, self.n_head, hd), L["q_norm"])
            k = self.norm((h @ L["wk"].T).reshape(T, self.n_kv, hd), L["k_norm"])
            v = (h @ L["wv"].T).reshape(T, self.n_kv, hd)
            freq = self.freq_global if L["global"] else self.freq_local
            q, k = self.rope(q, pos, freq), self.rope(k, pos, freq)
            window = None if L["global"] or not self.use_window else self.window
            a = self.attend(q, k, v, li, cache, pos, self.scale, window) @ L["wo"].T
            x = x + self.norm(a, L["post_attn_norm"])
            h = self.norm(x, L["ffn_norm"])
            f = (gelu_tanh(h @ L["wg"].T) * (h @ L["wu"].T)) @ L["wd"].T
            x = x + self.norm(f, L["post_ffn_norm"])
        cache["n"] = p0 + T
        return self.logits(x, all_logits)

    def conventions(self):
        return {
            "embedding": f"token_embd row times sqrt({self.d}) (computed in the math dtype)",
            "norms": "RMSNorm times the stored weight: the GGUF already holds HF's (1 + w)",
            "rope": "rotate-half (NEOX) on attn_q/attn_k rows as stored (not permuted for gemma3)",
            "rope_theta_global": self.theta_global,
            "rope_theta_local": self.LOCAL_ROPE_THETA,
            "layers": f"layer i is global when (i + 1) % {self.SWA_PATTERN} == 0, else sliding-window",
            "global_layers": [i for i, L in enumerate(self.layers) if L["global"]],
            "sliding_window": self.window,
            "window_rule": "a query at position p sees keys at positions p - window + 1 .. p",
            "attention": f"{self.n_head} query heads, {self.n_kv} kv head, head_dim {self.head_dim}, "
                         "q_norm/k_norm (RMSNorm over head_dim) before rope, scale 256**-0.5",
            "mlp": "down(gelu_tanh(gate(x)) * up(x))",
            "softcapping": None,
            "output": "tied to token_embd (unscaled)",
            "rms_norm_eps": self.eps,
        }


# --------------------------------------------------------------------------------------------------------------
# Self-checks
# --------------------------------------------------------------------------------------------------------------


def nll(model, ids):
    """Mean negative log-likelihood of ids[1:] given the prefix."""
    lg = model.forward(ids, model.new_cache(), all_logits=True)[:-1]
    m = lg.max(axis=-1, keepdims=True)
    lse = (m[:, 0] + np.log(np.exp(lg - m).sum(axis=-1)))
    return float(np.mean(lse - lg[np.arange(len(ids) - 1), ids[1:]]))


def tol(model):
    return 1e-8 if model.dtype == np.float64 else 2e-3


def cache_check(model, ids):
    a = model.forward(ids, model.new_cache())
    c = model.new_cache()
    for t in ids:
        b = model.forward([t], c)
    d = float(np.abs(a - b).max())
    print(f"kv-cache check: |prefill - token by token| max = {d:.3e}")
    assert d < tol(model)
    return d


def chunked_check(model, ids, chunk=191):
    a = model.forward(ids, model.new_cache())
    c = model.new_cache()
    for s in range(0, len(ids), chunk):
        b = model.forward(ids[s:s + chunk], c)
    d = float(np.abs(a - b).max())
    print(f"chunked-prefill check ({len(ids)} tokens in chunks of {chunk}): max diff = {d:.3e}")
    assert d < tol(model)
    return d


def rope_check(model, ids):
    """Rotate-half on the stored rows vs interleaved pairs: they differ, and rotate-half fits the text far better."""
    right = nll(model, ids)
    model.rope_mode = "interleaved"
    try:
        wrong = nll(model, ids)
    finally:
        model.rope_mode = "rotate_half"
    print(f"rope check: prompt NLL/token rotate-half (used) {right:.3f}, interleaved {wrong:.3f}")
    assert right + 0.2 < wrong, "rotate-half on the stored rows should fit the prompt clearly better"
    return {"nll_rotate_half": round(right, 4), "nll_interleaved": round(wrong, 4)}


def norm_check(model, ids):
    """Gemma: stored norm weight as is vs HF's (1 + w) on top of it."""
    right = nll(model, ids)
    model.norm_offset = 1.0
    try:
        wrong = nll(model, ids)
    finally:
        model.norm_offset = 0.0
    print(f"norm check: prompt NLL/token with w as stored (used) {right:.3f}, with 1 + w {wrong:.3f}")
    assert right + 0.5 < wrong, "the stored Gemma norm weights should already include the +1"
    return {"nll_stored_w": round(right, 4), "nll_one_plus_stored_w": round(wrong, 4)}


def window_check(model, ids):
    a = model.forward(ids, model.new_cache())
    model.use_window = False
    try:
        b = model.forward(ids, model.new_cache())
    finally:
        model.use_window = True
    d = float(np.abs(a - b).max())
    print(f"window check ({len(ids)} tokens): |sliding - no window| max logit diff = {d:.3f}")
    assert d > 1e-3, "a prompt longer than the window should depend on it"
    return round(d, 4)


# --------------------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", choices=sorted(MODELS))
    ap.add_argument("--gguf", help="path of the GGUF (default models/<file>)")
    ap.add_argument("--out", help="output directory (default tests/fixtures/<model>)")
    ap.add_argument("--dtype", choices=["float64", "float32"], help="math dtype (default per model)")
    ap.add_argument("--steps", type=int, default=golden.N_STEPS)
    ap.add_argument("--only", help="comma-separated prompt names (writes no index.json)")
    ap.add_argument("--no-checks", action="store_true")
    args = ap.parse_args()
    spec = MODELS[args.model]
    path = args.gguf or os.path.join(REPO, "models", spec["file"])
    out_dir = args.out or os.path.join(REPO, "tests", "fixtures", args.model)
    if not os.path.exists(path):
        sys.exit(f"model not found: {path} (run bash models/fetch.sh {args.model})")
    dname = args.dtype or spec["dtype"]
    dtype = np.float64 if dname == "float64" else np.float32
    wdtype = dtype  # weights are stored in the math dtype (mixed dtypes would make numpy skip BLAS)

    t0 = time.time()
    g = Gguf(path)
    meta = g.meta
    types = g.types()
    if spec["arch"] == "qwen2":
        tok = qwen2_tokenizer(meta)
        template = meta["tokenizer.chat_template"]
        template_source = "tokenizer.chat_template in the GGUF"
    else:
        tok = gemma3_tokenizer(g)
        template = GEMMA3_CHAT_TEMPLATE
        template_source = "Gemma 3's published chat template (google/gemma-3-*-it tokenizer_config.json)"
    t_tok = time.time() - t0
    cross = None
    if spec["arch"] == "qwen2" and not args.no_checks:
        try:
            cross = transformers_tokenizer(g)
        except ImportError:
            print("transformers not installed: tokenizer cross-check skipped")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    bos = int(meta["tokenizer.ggml.bos_token_id"])
    eos = int(meta["tokenizer.ggml.eos_token_id"])
    bos_text = meta["tokenizer.ggml.tokens"][bos]
    eos_ids = {eos}
    if spec["arch"] == "gemma3":
        eos_ids.add(tok.token_to_id("<end_of_turn>"))  # the turn end a chat reply stops at
    model = (Qwen2 if spec["arch"] == "qwen2" else Gemma3)(g, dtype, wdtype)
    t_load = time.time() - t0
    print(f"loaded {os.path.basename(path)}: {types} ({t_load:.1f}s, tokenizer {t_tok:.1f}s); "
          f"math {dname}, weights {np.dtype(wdtype).name}")

    os.makedirs(out_dir, exist_ok=True)
    all_prompts = prompts()
    wanted = set(args.only.split(",")) if args.only else (set(spec["prompts"]) if "prompts" in spec else None)
    checks, entries, timings = {}, [], {"load_s": round(t_load, 1)}
    min_gap = None
    texts = {}
    for pr in all_prompts:
        if wanted and pr["name"] not in wanted:
            continue
        if "messages" in pr:
            texts[pr["name"]] = (render_chat(template, pr["messages"], pr["add_generation_prompt"],
                                             {**meta, "tokenizer.ggml.bos_token_id": bos}), False)
        else:
            texts[pr["name"]] = (pr["text"], add_bos)

    def encode(text, with_bos):
        ids = tok.encode(text, add_special_tokens=False).ids
        return [bos] + ids if with_bos else ids

    if not args.no_checks:
        tc = time.time()
        plain = encode(golden.prompts()[0]["text"], add_bos)
        checks["kv_cache_max_abs_diff"] = cache_check(model, plain)
        checks["rope"] = rope_check(model, plain)
        if spec["arch"] == "gemma3":
            checks["norm"] = norm_check(model, plain)
            long_ids = encode(golden.long_text(), add_bos)
            checks["chunked_prefill_max_abs_diff"] = chunked_check(model, long_ids)
            checks["sliding_window_effect_max_logit_diff"] = window_check(model, long_ids)
        if cross is not None:
            agree = {}
            for name, (text, _) in texts.items():
                agree[name] = cross.encode(text, add_special_tokens=False).ids == encode(text, False)
            print(f"tokenizer vs transformers' GGUF conversion: {agree}")
            assert all(agree.values()), "tokenizer disagrees with transformers' GGUF conversion"
            checks["tokenizer_agrees_with_transformers_gguf_conversion"] = agree
        timings["checks_s"] = round(time.time() - tc, 1)

    for pr in all_prompts:
        if pr["name"] not in texts:
            continue
        t1 = time.time()
        text, with_bos = texts[pr["name"]]
        ids = encode(text, with_bos)
        dec = tok.decode(ids[1:] if with_bos else ids, skip_special_tokens=False)
        assert dec == text, f"tokenizer round trip failed: {dec!r}"
        if spec["arch"] == "qwen2":
            assert unicodedata.normalize("NFC", text) == text  # so the NFC normalizer changes nothing here
        gen, steps, _ = greedy(model, ids, args.steps)
        gen_text = tok.decode(gen, skip_special_tokens=False)
        eos_at = next((i for i, t in enumerate(gen) if t in eos_ids), None)
        rec = fixture_record(pr, text, ids, gen, gen_text, eos_at, steps)
        if spec["arch"] == "gemma3":
            # Gemma: BOS is added by the tokenizer to a raw prompt; a chat prompt carries "<bos>" as text.
            rec["bos_added"] = with_bos
        fname = f"{pr['name']}.json"
        dump_fixture(rec, os.path.join(out_dir, fname))
        gaps = [s["gap"] for s in steps]
        near = [{"step": i, "gap": s["gap"]} for i, s in enumerate(steps) if s["gap"] < 0.05]
        pmin = min(gaps)
        min_gap = pmin if min_gap is None else min(min_gap, pmin)
        dt = time.time() - t1
        timings[pr["name"] + "_s"] = round(dt, 1)
        entries.append({"file": fname, "n_prompt_tokens": len(ids), "min_gap": pmin, "near_ties": near})
        print(f"\n== {pr['name']}: {len(ids)} prompt tokens, {dt:.1f}s")
        print(f"prompt: {text[:160]!r}{'...' if len(text) > 160 else ''}")
        print(f"greedy: {gen_text!r}")
        print(f"min top-2 gap {pmin:.5f}; near ties (<0.05): {near if near else 'none'}; first EOS step: {eos_at}")

    vers = golden.versions()
    try:
        from importlib.metadata import version as pkg_version
        vers["transformers"] = pkg_version("transformers")
    except Exception:
        pass
    index = {
        "model": {
            "name": args.model,
            "file": os.path.basename(path),
            "size": os.path.getsize(path),
            "sha256": sha256(path),
            "architecture": spec["arch"],
            "general.name": meta.get("general.name"),
            "tensor_types": types,
        },
        "generator": {
            "script": "models/reference/real.py",
            "math": dname,
            "weights": f"dequantized to float32 by gguf.quants.dequantize, stored as {np.dtype(wdtype).name}",
            "versions": vers,
            "timings": timings,
        },
        "architecture": model.conventions(),
        "tokenizer": (
            "tokenizers BPE from the GGUF vocab + merges; NFC; Qwen2 split regex then byte-level; control (type 3) "
            "and user-defined (type 4) tokens matched whole"
            if spec["arch"] == "qwen2" else
            "transformers' GGUF conversion (gemma3): BPE with byte fallback, merges from the vocabulary in file order "
            "(= score order), ' ' -> U+2581 without a prefix space, control and user-defined tokens matched whole"
        ),
        "chat_template": template_source,
        "conventions": {
            "steps": args.steps,
            "top_k": golden.TOP_K,
            "step_0": "logits at the last prompt position; step i>0 after feeding greedy_tokens[i-1]",
            "greedy": "argmax, ties to the lower id; decoding continues past EOS",
            "top_order": "logit descending, ties to the lower id",
            "rounding": f"logits, gap, logsumexp rounded to {golden.ROUND} decimals; gap is computed before rounding",
            "add_bos": add_bos,
            "bos": ("text prompts: BOS id prepended by the tokenizer; chat prompts: the template writes "
                    f"{bos_text!r} as text and no second BOS is added (fixture field bos_added)"
                    if add_bos else "no BOS"),
            "eos_token_ids": sorted(eos_ids),
        },
        "checks": checks,
        "fixtures": entries,
        "min_gap": min_gap,
    }
    if not args.only:
        with open(os.path.join(out_dir, "index.json"), "w", encoding="utf-8") as f:
            json.dump(index, f, ensure_ascii=False, indent=1)
            f.write("\n")
    print(f"\nsmallest top-2 gap over all steps: {min_gap}; total {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
