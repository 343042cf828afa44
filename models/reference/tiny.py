#!/usr/bin/env python3
"""Tiny random checkpoints of every architecture shaderlm runs, with logits from an independent numpy forward.

For each architecture this script

* draws small random weights (numpy's PCG64 with a fixed seed per checkpoint, every value rounded to the nearest
  float16 so that an f16 and an f32 copy of one checkpoint hold exactly the same numbers);
* writes the checkpoint as the model's own code saves it: `config.json` (transformers 4's layout for Llama,
  Qwen2 and the MiniCPM remote code; transformers 5's layout, produced by transformers' own config classes, for
  Qwen3 and Gemma 3) and `model.safetensors` written with the `safetensors` package's numpy API; for Llama also a
  GGUF written with the `gguf` package's writer as llama.cpp's converter lays it out (q/k rows permuted for
  ggml's interleaved rope, `rope_freqs.weight` for llama3 rope scaling, vectors F32, matrices F16); for Phi-3 the
  config.json layout Phi-3-mini-128k / Phi-4-mini ship (checked against transformers' `Phi3Config`) and a GGUF as
  llama.cpp's `Phi3MiniModel` writes it;
* runs a float64 numpy forward written from the published modeling code (transformers' modeling_llama, _qwen2,
  _qwen3, _gemma3, _phi3, modeling_rope_utils and masking_utils; openbmb's modeling_minicpm.py; thunlp/BlockFFN's
  `BlockMLP`) over a fixed token sequence, and stores the logits of every position in
  `tests/fixtures/tiny/<name>/expected.json` (Phi-3 also `expected_short.json`, see `build_phi3`).

Nothing here comes from shaderlm. The forward reads the checkpoint back from the files it wrote (safetensors via
`safetensors.numpy`, the GGUF via `gguf.GGUFReader`), so the files, not the arrays in memory, are what is
checked; the GGUF forward undoes the converter's permutation and must equal the HF one.

Run from the repository root: `python models/reference/tiny.py [--only NAME,...] [--out DIR]`. Deterministic.
See models/reference/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
from importlib.metadata import version as pkg_version

import numpy as np

import gguf
from safetensors.numpy import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_OUT = os.path.join(REPO, "tests", "fixtures", "tiny")

N_TOKENS = 16
SIG = 6  # significant digits of stored logits


def tokens_for(vocab: int, n: int = N_TOKENS):
    return [(i * 37 + 11) % vocab for i in range(n)]


# --------------------------------------------------------------------------------------------------------------
# random weights
# --------------------------------------------------------------------------------------------------------------


class Draw:
    """Uniform values in [offset - scale, offset + scale), rounded to float16, in a fixed order from one seed."""

    def __init__(self, seed: int):
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def __call__(self, shape, scale, offset=0.0):
        v = self.rng.uniform(-scale, scale, size=shape) + offset
        return v.astype(np.float16).astype(np.float32)


def attn_weights(d: Draw, p: str, hidden, heads, kv_heads, head_dim, bias=False, qk_norm=False, gemma=False):
    w = 1.0 / math.sqrt(hidden)
    t = {
        f"{p}.self_attn.q_proj.weight": d((heads * head_dim, hidden), 2 * w),
        f"{p}.self_attn.k_proj.weight": d((kv_heads * head_dim, hidden), 2 * w),
        f"{p}.self_attn.v_proj.weight": d((kv_heads * head_dim, hidden), w),
        f"{p}.self_attn.o_proj.weight": d((hidden, heads * head_dim), 1.0 / math.sqrt(heads * head_dim)),
    }
    if bias:
        t[f"{p}.self_attn.q_proj.bias"] = d((heads * head_dim,), 0.5)
        t[f"{p}.self_attn.k_proj.bias"] = d((kv_heads * head_dim,), 0.5)
        t[f"{p}.self_attn.v_proj.bias"] = d((kv_heads * head_dim,), 0.5)
    if qk_norm:
        # Gemma stores w for x * (1 + w); Qwen3 stores the multiplier itself.
        off = 0.0 if gemma else 1.0
        t[f"{p}.self_attn.q_norm.weight"] = d((head_dim,), 0.3, off)
        t[f"{p}.self_attn.k_norm.weight"] = d((head_dim,), 0.3, off)
    return t


def mlp_weights(d: Draw, p: str, hidden, ffn):
    w = 1.0 / math.sqrt(hidden)
    return {
        f"{p}.mlp.gate_proj.weight": d((ffn, hidden), 2 * w),
        f"{p}.mlp.up_proj.weight": d((ffn, hidden), w),
        f"{p}.mlp.down_proj.weight": d((hidden, ffn), 1.0 / math.sqrt(ffn)),
    }


# --------------------------------------------------------------------------------------------------------------
# numpy building blocks (float64)
# --------------------------------------------------------------------------------------------------------------


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def rope_tables(inv_freq, n, attention_factor=1.0):
    """cos, sin [n, head_dim] as transformers builds them: emb = cat(freqs, freqs), times the attention factor."""
    t = np.arange(n, dtype=np.float64)
    freqs = np.outer(t, inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb) * attention_factor, np.sin(emb) * attention_factor


def default_inv_freq(theta, dim):
    return 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)


def llama3_inv_freq(theta, dim, rs):
    """transformers' `_compute_llama3_parameters`."""
    inv = default_inv_freq(theta, dim)
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    lo_wl, hi_wl = old / lo, old / hi
    wl = 2 * math.pi / inv
    out = np.where(wl > lo_wl, inv / factor, inv)
    smooth = (old / wl - lo) / (hi - lo)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wl < hi_wl) & ~(wl > lo_wl)
    return np.where(medium, smoothed, out)


def attention(q, k, v, cos, sin, scale, window=None):
    """q [T, H, D], k/v [T, KV, D]; rotate-half rope on q and k; causal (and sliding-window) softmax attention."""
    q = q * cos[:, None, :] + rotate_half(q) * sin[:, None, :]
    k = k * cos[:, None, :] + rotate_half(k) * sin[:, None, :]
    return attend(q, k, v, scale, window)


def attend(q, k, v, scale, window=None):
    """Causal (and sliding-window) softmax attention of q [T, H, D] over k/v [T, KV, D], rope already applied."""
    T, H, D = q.shape
    KV = k.shape[1]
    group = H // KV
    out = np.zeros((T, H, v.shape[2]))
    qi = np.arange(T)[:, None]
    ki = np.arange(T)[None, :]
    allowed = ki <= qi
    if window is not None:
        allowed &= ki > qi - window  # masking_utils.sliding_window_overlay
    for h in range(H):
        kh = h // group  # repeat_kv: query head h reads kv head h // n_rep
        s = (q[:, h, :] @ k[:, kh, :].T) * scale
        s = np.where(allowed, s, -np.inf)
        s = s - s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=-1, keepdims=True)
        out[:, h, :] = p @ v[:, kh, :]
    return out.reshape(T, H * v.shape[2])


def lin(x, w, b=None):
    y = x @ w.T
    return y if b is None else y + b


# --------------------------------------------------------------------------------------------------------------
# forwards
# --------------------------------------------------------------------------------------------------------------


def forward_llama(W, c, ids, arch, windows=None):
    """transformers' LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM; `windows[i]`, only for the self-check,
    a sliding window on layer i."""
    hidden, L = c["hidden_size"], c["num_hidden_layers"]
    H, KV = c["num_attention_heads"], c["num_key_value_heads"]
    D = c.get("head_dim") or hidden // H
    eps = c["rms_norm_eps"]
    rp = c.get("rope_parameters") or {"rope_type": "default", "rope_theta": c["rope_theta"], **(c.get("rope_scaling") or {})}
    theta = rp.get("rope_theta", c.get("rope_theta"))
    rtype = rp.get("rope_type", "default")
    if rtype == "llama3":
        inv = llama3_inv_freq(theta, D, rp)
    else:
        assert rtype == "default", rtype
        inv = default_inv_freq(theta, D)
    cos, sin = rope_tables(inv, len(ids))
    x = W["model.embed_tokens.weight"][ids]
    T = len(ids)
    for i in range(L):
        p = f"model.layers.{i}"
        h = rmsnorm(x, W[f"{p}.input_layernorm.weight"], eps)
        g = lambda n: W.get(f"{p}.self_attn.{n}")
        q = lin(h, g("q_proj.weight"), g("q_proj.bias")).reshape(T, H, D)
        k = lin(h, g("k_proj.weight"), g("k_proj.bias")).reshape(T, KV, D)
        v = lin(h, g("v_proj.weight"), g("v_proj.bias")).reshape(T, KV, D)
        if arch == "qwen3":  # Qwen3Attention: q_norm / k_norm over head_dim before rope
            q = rmsnorm(q, g("q_norm.weight"), eps)
            k = rmsnorm(k, g("k_norm.weight"), eps)
        a = attention(q, k, v, cos, sin, D**-0.5, (windows or {}).get(i))
        x = x + lin(a, g("o_proj.weight"))
        h = rmsnorm(x, W[f"{p}.post_attention_layernorm.weight"], eps)
        m = lambda n: W[f"{p}.mlp.{n}.weight"]
        x = x + lin(silu(lin(h, m("gate_proj"))) * lin(h, m("up_proj")), m("down_proj"))
    x = rmsnorm(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if c["tie_word_embeddings"] else W["lm_head.weight"]
    return lin(x, head)


def forward_gemma3(W, c, ids):
    """transformers 5's Gemma3ForCausalLM (modeling_gemma3.py, masking_utils.py)."""
    hidden, L = c["hidden_size"], c["num_hidden_layers"]
    H, KV, D = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    eps = c["rms_norm_eps"]
    assert c["hidden_activation"] == "gelu_pytorch_tanh"
    assert c.get("attn_logit_softcapping") is None and c.get("final_logit_softcapping") is None
    norm = lambda x, w: rmsnorm(x, 1.0 + w, eps)  # Gemma3RMSNorm: x * (1 + w)
    tables = {}
    for lt, rp in c["rope_parameters"].items():
        assert rp["rope_type"] == "default", rp
        tables[lt] = rope_tables(default_inv_freq(rp["rope_theta"], D), len(ids))
    T = len(ids)
    x = W["model.embed_tokens.weight"][ids] * math.sqrt(hidden)  # Gemma3TextScaledWordEmbedding
    for i in range(L):
        p = f"model.layers.{i}"
        lt = c["layer_types"][i]
        window = c["sliding_window"] if lt == "sliding_attention" else None
        g = lambda n: W[f"{p}.{n}.weight"]
        h = norm(x, g("input_layernorm"))
        q = lin(h, g("self_attn.q_proj")).reshape(T, H, D)
        k = lin(h, g("self_attn.k_proj")).reshape(T, KV, D)
        v = lin(h, g("self_attn.v_proj")).reshape(T, KV, D)
        q = norm(q, g("self_attn.q_norm"))
        k = norm(k, g("self_attn.k_norm"))
        cos, sin = tables[lt]
        a = attention(q, k, v, cos, sin, c["query_pre_attn_scalar"] ** -0.5, window)
        x = x + norm(lin(a, g("self_attn.o_proj")), g("post_attention_layernorm"))
        h = norm(x, g("pre_feedforward_layernorm"))
        h = lin(gelu_tanh(lin(h, g("mlp.gate_proj"))) * lin(h, g("mlp.up_proj")), g("mlp.down_proj"))
        x = x + norm(h, g("post_feedforward_layernorm"))
    x = norm(x, W["model.norm.weight"])
    return lin(x, W["model.embed_tokens.weight"])  # tied


def phi3_rope(c, seq_len):
    """transformers' Phi3RotaryEmbedding with rope type longrope (modeling_rope_utils: _compute_longrope_parameters
    and dynamic_rope_update's longrope_frequency_update): rotated dims int(head_dim * partial_rotary_factor);
    inv_freq = 1 / (ext * theta^(2j / dim)) with ext = long_factor when the current sequence length (max position
    + 1) exceeds original_max_position_embeddings, else short_factor; cos and sin times
    sqrt(1 + ln(s) / ln(original)), s = max_position_embeddings / original (1 when s <= 1). Returns (inv_freq,
    attention factor, "long" or "short")."""
    rs = c["rope_scaling"]
    assert rs["type"] == "longrope" and "factor" not in rs and "attention_factor" not in rs
    D = c["hidden_size"] // c["num_attention_heads"]  # Phi3Config has no head_dim
    dim = int(D * c.get("partial_rotary_factor", 1.0))
    orig, mpe = c["original_max_position_embeddings"], c["max_position_embeddings"]
    which = "long" if seq_len > orig else "short"
    ext = np.array(rs[f"{which}_factor"], dtype=np.float64)
    assert len(ext) == dim // 2
    s = mpe / orig
    attn = 1.0 if s <= 1.0 else math.sqrt(1 + math.log(s) / math.log(orig))
    inv = 1.0 / (ext * c["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    return inv, attn, which


def rope_partial(x, cos, sin):
    """apply_rotary_pos_emb of modeling_phi3: rotate-half on the first cos.shape[-1] dims, the rest passed through."""
    r = cos.shape[-1]
    xr, xp = x[..., :r], x[..., r:]
    return np.concatenate([xr * cos[:, None, :] + rotate_half(xr) * sin[:, None, :], xp], axis=-1)


def forward_phi3(W, c, ids, window="config"):
    """transformers' Phi3ForCausalLM over ids as one forward (no cache): fused qkv_proj split q | k | v, fused
    gate_up_proj chunked gate | up, SwiGLU, partial rotary longrope, the sliding window on every layer
    (create_sliding_window_causal_mask when sliding_window is set). `window` overrides the config, only for the
    notes' slips. Returns the logits and which longrope factors the sequence length selected."""
    hidden, L = c["hidden_size"], c["num_hidden_layers"]
    H, KV = c["num_attention_heads"], c["num_key_value_heads"]
    D = hidden // H
    eps = c["rms_norm_eps"]
    assert c["hidden_act"] == "silu" and not c.get("attention_bias")
    T = len(ids)
    inv, attn_factor, which = phi3_rope(c, T)
    cos, sin = rope_tables(inv, T, attn_factor)
    win = c.get("sliding_window") if window == "config" else window
    x = W["model.embed_tokens.weight"][ids]
    for i in range(L):
        p = f"model.layers.{i}"
        g = lambda n: W[f"{p}.{n}.weight"]
        h = rmsnorm(x, g("input_layernorm"), eps)
        qkv = lin(h, g("self_attn.qkv_proj"))
        q = qkv[:, : H * D].reshape(T, H, D)
        k = qkv[:, H * D : (H + KV) * D].reshape(T, KV, D)
        v = qkv[:, (H + KV) * D :].reshape(T, KV, D)
        a = attend(rope_partial(q, cos, sin), rope_partial(k, cos, sin), v, D**-0.5, win)
        x = x + lin(a, g("self_attn.o_proj"))
        h = rmsnorm(x, g("post_attention_layernorm"), eps)
        gu = lin(h, g("mlp.gate_up_proj"))
        gate, up = gu[:, : gu.shape[1] // 2], gu[:, gu.shape[1] // 2 :]
        x = x + lin(up * silu(gate), g("mlp.down_proj"))
    x = rmsnorm(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if c["tie_word_embeddings"] else W["lm_head.weight"]
    return lin(x, head), which


def forward_minicpm(W, c, ids, attend_fn=None):
    """openbmb's modeling_minicpm.py (MiniCPM4) and thunlp/BlockFFN's pretrain/bmt_to_hf/modeling_minicpm.py.
    `attend_fn(q, k, v, scale)` (rope applied) replaces dense causal attention (InfLLM-v2, `infllm_v2_attend`)."""
    hidden, L = c["hidden_size"], c["num_hidden_layers"]
    H, KV = c["num_attention_heads"], c["num_key_value_heads"]
    D = hidden // H  # MiniCPMAttention: head_dim = hidden_size // num_heads
    eps = c["rms_norm_eps"]
    T = len(ids)
    inv = default_inv_freq(c["rope_theta"], D)
    rs = c.get("rope_scaling")
    if rs is None:
        cos, sin = rope_tables(inv, T)
    else:
        # MiniCPMLongRoPE: the cos/sin cache is built once in __init__ for seq_len = max_position_embeddings (and
        # only ever grown), so the factors are the long ones whenever max_position_embeddings exceeds the original
        # context, whatever the length actually run; cos and sin are both multiplied by the scaling factor.
        assert rs["rope_type"] == "longrope"
        orig, mpe = rs["original_max_position_embeddings"], c["max_position_embeddings"]
        ext = np.array(rs["long_factor"] if mpe > orig else rs["short_factor"], dtype=np.float64)
        factor = math.sqrt(1 + math.log(mpe / orig) / math.log(orig))
        t = np.arange(T, dtype=np.float64)
        freqs = np.outer(t, 1.0 / ext) * inv
        emb = np.concatenate([freqs, freqs], axis=-1)
        cos, sin = np.cos(emb) * factor, np.sin(emb) * factor
    depth = c["scale_depth"] / math.sqrt(L)
    x = W["model.embed_tokens.weight"][ids] * c["scale_emb"]
    ffn_type = c.get("ffn_type", "vanilla")
    for i in range(L):
        p = f"model.layers.{i}"
        g = lambda n: W[f"{p}.{n}"]
        h = rmsnorm(x, g("input_layernorm.weight"), eps)
        q = lin(h, g("self_attn.q_proj.weight")).reshape(T, H, D)
        k = lin(h, g("self_attn.k_proj.weight")).reshape(T, KV, D)
        v = lin(h, g("self_attn.v_proj.weight")).reshape(T, KV, D)
        if attend_fn is None:
            a = attention(q, k, v, cos, sin, 1.0 / math.sqrt(D))
        else:
            q = q * cos[:, None, :] + rotate_half(q) * sin[:, None, :]
            k = k * cos[:, None, :] + rotate_half(k) * sin[:, None, :]
            a = attend_fn(q, k, v, 1.0 / math.sqrt(D))
        x = x + lin(a, g("self_attn.o_proj.weight")) * depth
        h = rmsnorm(x, g("post_attention_layernorm.weight"), eps)
        if ffn_type == "vanilla":
            m = silu(lin(h, g("mlp.gate_proj.weight"))) * lin(h, g("mlp.up_proj.weight"))
            y = lin(m, g("mlp.down_proj.weight"))
        else:
            y = block_mlp(W, p, c, h)
        x = x + y * depth
    x = rmsnorm(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if c["tie_word_embeddings"] else W["lm_head.weight"]
    return lin(x / (hidden / c["dim_model_base"]), head)


ROUTER_ACTIVE = []  # fraction of (token, expert) pairs with a nonzero router weight, per BlockMLP call


# --------------------------------------------------------------------------------------------------------------
# InfLLM-v2 sparse attention (MiniCPM4's sparse_config)
# --------------------------------------------------------------------------------------------------------------


def n_windows(n_keys, size, stride):
    """CompressK / calc_chunks_with_stride: only complete windows [i*stride, i*stride + size) of n_keys keys."""
    return 0 if n_keys < size else (n_keys - size) // stride + 1


def compress(k, size, stride):
    """CompressK.forward: the mean of each complete window's keys, k [T, KV, D] -> [n, KV, D]."""
    n = n_windows(k.shape[0], size, stride)
    return np.stack([k[i * stride:i * stride + size].mean(axis=0) for i in range(n)]) if n else np.zeros((0,) + k.shape[1:])


def logsumexp(x):
    m = x.max()
    return m + math.log(np.exp(x - m).sum())


class InfLLMv2:
    """MiniCPMInfLLMv2Attention (openbmb modeling_minicpm.py) with the infllm_v2 kernels written out in numpy.

    `sparse_at[p]` says whether the step holding position p attends sparsely: the model code switches per forward
    call, dense while kv_seq_len (position_ids.max() + 1, the step's KV length) < dense_len. Per sparse query at
    position p, per KV head: compressed keys C1 (kernel_size / kernel_stride) and C2 (4x both) over the complete
    windows within keys 0..=p; stage-1 scores S[i] = sum over the group's query heads of
    exp(scale q.C1[i] - logsumexp_j(scale q.C2[j])); block b's score the max of S over C1 windows
    b*B/stride - 1 .. b*B/stride + B/stride (max_pooling_1d, clipped to the existing windows); forced: blocks
    < init_blocks and qb - local_blocks ..= qb (+inf in max_pooling_1d); then the best candidates until
    topk + window_size / block_size blocks in all (block_score.topk), ids past qb dropped; then causal attention over
    the keys of the selected blocks (infllmv2_attn_varlen_func with topk_idx)."""

    def __init__(self, sc, sparse_at):
        self.size, self.stride = sc["kernel_size"], sc["kernel_stride"]
        self.B, self.I = sc["block_size"], sc["init_blocks"]
        self.L = sc["window_size"] // sc["block_size"]
        self.budget = sc["topk"] + self.L
        self.sparse_at = sparse_at
        self.margins = []  # relative score gap at the selection cut-off, per (layer, sparse query, KV head) that chose
        self.chosen = []  # (p, kv head, selected blocks) where scores decided
        self.ties = 0  # cut-offs between two blocks whose best score is one shared window

    def __call__(self, q, k, v, scale):
        T, H, D = q.shape
        KV = k.shape[1]
        G = H // KV
        B, s = self.B, self.stride
        C1 = compress(k, self.size, s)
        C2 = compress(k, 4 * self.size, 4 * s)
        out = np.zeros((T, H, D))
        for p in range(T):
            qb = p // B
            for kh in range(KV):
                heads = range(kh * G, (kh + 1) * G)
                if not self.sparse_at[p]:
                    blocks = set(range(qb + 1))
                else:
                    blocks = self.select(q[p, heads], C1[:n_windows(p + 1, self.size, s), kh],
                                         C2[:n_windows(p + 1, 4 * self.size, 4 * s), kh], qb, scale, p, kh)
                keys = [j for j in range(p + 1) if j // B in blocks]
                for h in heads:
                    sc = (k[keys, kh] @ q[p, h]) * scale
                    w = np.exp(sc - sc.max())
                    out[p, h] = (w / w.sum()) @ v[keys, kh]
        return out.reshape(T, H * D)

    def select(self, qg, c1, c2, qb, scale, p, kh):
        forced = set(range(min(self.I, qb + 1))) | set(range(max(0, qb - self.L), qb + 1))
        cands = [b for b in range(self.I, qb - self.L)]
        more = self.budget - len(forced)
        if len(cands) <= more:
            return forced | set(cands)  # every block 0..=qb: scores cannot matter
        assert len(c2) > 0, "C2 empty while scores decide"  # the sources' normalizer would be log(0)
        S = np.zeros(len(c1))
        for qh in qg:
            S += np.exp((c1 @ qh) * scale - logsumexp((c2 @ qh) * scale))
        per = self.B // self.stride

        def best(b):  # (score, the C1 window it comes from)
            lo, hi = max(b * per - 1, 0), min(b * per - 1 + per + 1, len(S))
            assert hi > lo
            i = lo + int(np.argmax(S[lo:hi]))
            return S[i], i

        # Neighbouring blocks share a C1 window (the pooling kernel is B/stride + 1 wide), so exact ties occur; they
        # go to the lower block id (torch.topk leaves ties unspecified).
        ranked = sorted(cands, key=lambda b: (-best(b)[0], b))
        sel_b, rest = ranked[:more], ranked[more:]
        if best(sel_b[-1])[0] == best(rest[0])[0]:
            self.ties += 1
        # Margin: the smallest relative gap across the cut-off between scores from different windows (scores from
        # one window are equal in any implementation).
        self.margins.append(min((best(a)[0] - best(z)[0]) / best(a)[0] for a in sel_b for z in rest
                                if best(a)[1] != best(z)[1]))
        sel = forced | set(sel_b)
        self.chosen.append((p, kh, sorted(sel)))
        return sel


def step_sparse_flags(steps, dense_len):
    """Per position: does its step (pos .. pos + n) attend sparsely, i.e. pos + n >= dense_len."""
    flags, pos = [], 0
    for n in steps:
        flags += [pos + n >= dense_len] * n
        pos += n
    return flags


MINICPM4_SPARSE = {"kernel_size": 8, "kernel_stride": 4, "block_size": 16, "init_blocks": 1, "window_size": 16,
                   "topk": 4, "use_nope": False, "dense_len": 48}
SPARSE_TOKENS = 110
SPARSE_FIRST = 40  # expected.json holds positions SPARSE_FIRST..SPARSE_TOKENS-1


def sparse_schedules():
    """Step schedules (token counts per forward call) the fixture holds; see build_minicpm4_sparse."""
    n = SPARSE_TOKENS
    return {
        "dense_prefill_then_decode": [20, 20] + [1] * (n - 40),
        "sparse_prefill_then_decode": [90] + [1] * (n - 90),
        "chunked_prefill": [20, 20, 20, 20, 20, 10],
    }


def make_minicpm4_sparse(out):
    """MiniCPM4 with sparse_config (tiny InfLLM-v2 sizes), GQA 4/2, longrope as minicpm4; f32."""
    hidden, L, H, KV, ffn, vocab = 128, 2, 4, 2, 128, 101
    D = hidden // H
    d = Draw(809)
    W = {"model.embed_tokens.weight": d((vocab, hidden), 0.2)}
    for i in range(L):
        p = f"model.layers.{i}"
        W[f"{p}.input_layernorm.weight"] = d((hidden,), 0.2, 1.0)
        W.update(attn_weights(d, p, hidden, H, KV, D))
        W[f"{p}.post_attention_layernorm.weight"] = d((hidden,), 0.2, 1.0)
        W.update(mlp_weights(d, p, hidden, ffn))
    W["model.norm.weight"] = d((hidden,), 0.2, 1.0)
    W["lm_head.weight"] = d((vocab, hidden), 1.0)
    half = D // 2
    cfg = {
        "architectures": ["MiniCPMForCausalLM"],
        "auto_map": MINICPM_AUTO_MAP,
        "bos_token_id": 1,
        "eos_token_id": [2, 3],
        "pad_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.1,
        "intermediate_size": ffn,
        "max_position_embeddings": 256,
        "model_type": "minicpm",
        "num_attention_heads": H,
        "num_hidden_layers": L,
        "num_key_value_heads": KV,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {
            "rope_type": "longrope",
            "long_factor": [round(1.0 + 0.9 * j, 4) for j in range(half)],
            "short_factor": [round(1.0 + 0.05 * j, 4) for j in range(half)],
            "original_max_position_embeddings": 32,
        },
        "rope_theta": 10000.0,
        "scale_depth": 1.4,
        "scale_emb": 12,
        "dim_model_base": 16,
        "sparse_config": MINICPM4_SPARSE,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "transformers_version": "4.46.3",
        "use_cache": True,
        "vocab_size": vocab,
    }
    d = os.path.join(out, "minicpm4_sparse")
    write_json(os.path.join(d, "config.json"), cfg)
    write_safetensors(os.path.join(d, "model.safetensors"), W, np.float32)
    return cfg, np.float32


def build_minicpm4_sparse(name, d):
    cfg, dt = make_minicpm4_sparse(os.path.dirname(d))
    sc = cfg["sparse_config"]
    ids = tokens_for(cfg["vocab_size"], SPARSE_TOKENS)
    W = load_hf(d)
    dense = forward_minicpm(W, cfg, ids)
    runs = {}
    for label, steps in sparse_schedules().items():
        att = InfLLMv2(sc, step_sparse_flags(steps, sc["dense_len"]))
        runs[label] = (forward_minicpm(W, cfg, ids, att), att)
    logits, att = runs["dense_prefill_then_decode"]
    # Below (topk + window / block) blocks every block 0..=qb is selected, so a sparse step equals a dense one
    # there and the logits do not depend on the schedule (to rounding).
    spread = max(float(np.abs(r[0] - logits).max()) for r in runs.values())
    assert spread < 1e-9, spread
    first_diff = int(np.argmax(np.abs(logits - dense).max(axis=-1) > 1e-9))
    margins = [m for _, a in runs.values() for m in a.margins]
    ties = sum(a.ties for _, a in runs.values())
    lo = slice(SPARSE_FIRST, SPARSE_TOKENS)
    rec = record(name, cfg, dt, logits[lo], ids, SOURCES["minicpm4_sparse"],
                 ["model.safetensors (f32) + config.json (MiniCPM remote code, sparse_config)"], [])
    rec["positions"] = (f"logits[i] is the distribution after tokens[0..=p] with p = first_position + i "
                        f"(positions {SPARSE_FIRST}..{SPARSE_TOKENS - 1})")
    rec["first_position"] = SPARSE_FIRST
    rec["schedules"] = sparse_schedules()
    rec["dense_max_abs_diff"] = [round_sig(float(x)) for x in np.abs(dense - logits).max(axis=-1)[lo]]
    rec["min_selection_margin"] = round_sig(min(margins))
    rec["tied_cutoffs"] = ties
    rec["notes"] = [
        f"sparse_config {json.dumps(sc)}: budget topk + window/block = {att.budget} blocks of {att.B} "
        f"(init {att.I}, local {att.L} and the query's own forced, the rest by score); a step attends sparsely "
        f"when its KV length reaches dense_len. Scores decide from position {att.budget * att.B} "
        f"(first logit differing from dense attention: position {first_diff}).",
        f"the three schedules give the same logits (max spread {spread:.2g}); dense attention differs by up to "
        f"{float(np.abs(dense - logits)[lo].max()):.3g} (dense_max_abs_diff per position)",
        f"min_selection_margin: the smallest relative gap between the last selected and the first unselected "
        f"candidate block score, between scores from different C1 windows, over every scored (layer, query, KV head) in "
        f"all schedules ({len(margins)}): {min(margins):.3g}; {ties} cut-offs fall between two blocks whose best "
        f"score is the window they share, an exact tie in any implementation, taken by the lower block id",
        "chunked_prefill: the published model code does not define sparse chunks after the first (compressed_attention "
        "numbers prefill queries from position 0 and get_compress_k then appends only the last key); the reference "
        "applies the decode rule per position (windows complete within keys 0..=p), which its decode and one-shot "
        "prefill paths both give.",
    ]
    write_json(os.path.join(d, "expected.json"), rec)
    return rec


def block_mlp(W, p, c, x):
    """BlockFFN's BlockMLP.forward with block_implementation = torch."""
    E, de = c["num_experts"], c["expert_size"]
    assert c["router_act"] == "relu" and c["hidden_act"] == "silu"
    r = np.maximum(lin(x, W[f"{p}.mlp.router_proj.weight"]), 0.0)
    ROUTER_ACTIVE.append(float((r > 0).mean()))
    norm = c["norm_after_router"]
    if norm == "sum":
        r = r / (r.sum(axis=-1, keepdims=True) * c["norm_scale"] + 1e-5)
    elif norm == "rms":
        r = rmsnorm(r, W[f"{p}.mlp.router_norm.weight"], c["rms_norm_eps"])
    else:
        assert norm == "none", norm
    up, down = W[f"{p}.mlp.up_proj"], W[f"{p}.mlp.down_proj"]
    if c["ffn_type"] == "block_linear":
        u = silu(x @ up.T).reshape(-1, E, de) * r[:, :, None]  # up [E*de, hidden]
        return u.reshape(-1, E * de) @ down.T  # down [hidden, E*de]
    u = silu(np.einsum("sm,edm->esd", x, up)) * r.T[:, :, None]  # up [E, de, hidden]
    return np.einsum("esd,emd->sm", u, down)  # down [E, hidden, de]


# --------------------------------------------------------------------------------------------------------------
# checkpoints
# --------------------------------------------------------------------------------------------------------------


def write_safetensors(path, tensors, dtype):
    save_file({k: np.ascontiguousarray(v.astype(dtype)) for k, v in sorted(tensors.items())}, path, metadata={"format": "pt"})


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=False)
        f.write("\n")


def llama_like(name, arch, seed, *, hidden, layers, heads, kv_heads, head_dim, ffn, vocab, tied):
    d = Draw(seed)
    W = {"model.embed_tokens.weight": d((vocab, hidden), 1.0)}
    for i in range(layers):
        p = f"model.layers.{i}"
        W[f"{p}.input_layernorm.weight"] = d((hidden,), 0.2, 1.0)
        W.update(attn_weights(d, p, hidden, heads, kv_heads, head_dim, bias=arch == "qwen2", qk_norm=arch == "qwen3"))
        W[f"{p}.post_attention_layernorm.weight"] = d((hidden,), 0.2, 1.0)
        W.update(mlp_weights(d, p, hidden, ffn))
    W["model.norm.weight"] = d((hidden,), 0.2, 1.0)
    if not tied:
        W["lm_head.weight"] = d((vocab, hidden), 1.0)
    return W


LLAMA3_ROPE = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
    "rope_type": "llama3",
}


def make_llama(out):
    """Llama 3.2-style config (transformers 4 layout) with llama3 rope scaling; HF f32 and a llama.cpp GGUF."""
    s = dict(hidden=32, layers=2, heads=4, kv_heads=2, head_dim=32, ffn=64, vocab=97, tied=False)
    W = llama_like("llama", "llama", 101, **s)
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": s["head_dim"],
        "hidden_act": "silu",
        "hidden_size": s["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": s["ffn"],
        "max_position_embeddings": 128,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": s["heads"],
        "num_hidden_layers": s["layers"],
        "num_key_value_heads": s["kv_heads"],
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": dict(LLAMA3_ROPE),
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "transformers_version": "4.45.0",
        "use_cache": True,
        "vocab_size": s["vocab"],
    }
    d = os.path.join(out, "llama")
    write_json(os.path.join(d, "config.json"), cfg)
    write_safetensors(os.path.join(d, "model.safetensors"), W, np.float32)
    write_llama_gguf(os.path.join(d, "model.gguf"), W, cfg)
    return cfg, np.float32


def permute(w, n_head):
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute: rotate-half rows to ggml's interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w, n_head):
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(c):
    """llama.cpp LlamaModel.generate_extra_tensors: rope_freqs.weight, the divisor of each frequency."""
    rs = c["rope_scaling"]
    D = c["head_dim"]
    freqs = default_inv_freq(c["rope_theta"], D)
    factor, lo, hi, old = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]
    lo_wl, hi_wl = old / lo, old / hi
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < hi_wl:
            out.append(1.0)
        elif wl > lo_wl:
            out.append(factor)
        else:
            smooth = (old / wl - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def write_llama_gguf(path, W, c):
    H, KV = c["num_attention_heads"], c["num_key_value_heads"]
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny random llama")
    w.add_vocab_size(c["vocab_size"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_block_count(c["num_hidden_layers"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_rope_dimension_count(c["head_dim"])
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_bos_token_id(c["bos_token_id"])
    w.add_eos_token_id(c["eos_token_id"])

    def put(name, arr):
        arr = arr.astype(np.float16) if arr.ndim == 2 else arr.astype(np.float32)
        w.add_tensor(name, np.ascontiguousarray(arr))

    put("rope_freqs.weight", llama3_rope_factors(c))
    put("token_embd.weight", W["model.embed_tokens.weight"])
    for i in range(c["num_hidden_layers"]):
        for hf, gg in GGUF_NAMES.items():
            t = W[f"model.layers.{i}.{hf}"]
            if gg == "attn_q.weight":
                t = permute(t, H)
            elif gg == "attn_k.weight":
                t = permute(t, KV)
            put(f"blk.{i}.{gg}", t)
    put("output_norm.weight", W["model.norm.weight"])
    put("output.weight", W["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def read_llama_gguf(path, c):
    """The GGUF back to HF names, permutation undone (as transformers' GGUF loader does)."""
    r = gguf.GGUFReader(path)
    H, KV = c["num_attention_heads"], c["num_key_value_heads"]
    back = {v: k for k, v in GGUF_NAMES.items()}
    W = {}
    factors = None
    for t in r.tensors:
        a = np.array(t.data, dtype=np.float32).reshape([int(x) for x in reversed(t.shape.tolist())])
        n = t.name
        if n == "rope_freqs.weight":
            factors = a
        elif n == "token_embd.weight":
            W["model.embed_tokens.weight"] = a
        elif n == "output_norm.weight":
            W["model.norm.weight"] = a
        elif n == "output.weight":
            W["lm_head.weight"] = a
        else:
            _, i, rest = n.split(".", 2)
            if rest == "attn_q.weight":
                a = unpermute(a, H)
            elif rest == "attn_k.weight":
                a = unpermute(a, KV)
            W[f"model.layers.{i}.{back[rest]}"] = a
    return W, factors


def make_qwen2(out):
    """Qwen2.5-style config (transformers 4 layout): q/k/v biases, tied embeddings, use_sliding_window false with
    a window smaller than the prompt (transformers ignores it then); f16 safetensors."""
    s = dict(hidden=64, layers=2, heads=2, kv_heads=1, head_dim=32, ffn=64, vocab=89, tied=True)
    W = llama_like("qwen2", "qwen2", 202, **s)
    cfg = {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "hidden_act": "silu",
        "hidden_size": s["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": s["ffn"],
        "max_position_embeddings": 128,
        "max_window_layers": 1,
        "model_type": "qwen2",
        "num_attention_heads": s["heads"],
        "num_hidden_layers": s["layers"],
        "num_key_value_heads": s["kv_heads"],
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": 6,
        "tie_word_embeddings": True,
        "torch_dtype": "float16",
        "transformers_version": "4.43.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": s["vocab"],
    }
    d = os.path.join(out, "qwen2")
    write_json(os.path.join(d, "config.json"), cfg)
    write_safetensors(os.path.join(d, "model.safetensors"), W, np.float16)
    return cfg, np.float16


def hf5_config(cls_name, **kw):
    import transformers

    # What save_pretrained writes: the values that differ from the class defaults, plus model_type and version.
    return getattr(transformers, cls_name)(**kw).to_diff_dict()


def make_qwen3(out):
    """Qwen3 config as transformers 5 saves it (Qwen3Config.to_dict: rope_parameters, layer_types, dtype);
    head_dim larger than hidden / heads; q/k norms; untied; f32."""
    s = dict(hidden=32, layers=3, heads=2, kv_heads=1, head_dim=32, ffn=64, vocab=83, tied=False)
    W = llama_like("qwen3", "qwen3", 303, **s)
    cfg = hf5_config(
        "Qwen3Config",
        vocab_size=s["vocab"],
        hidden_size=s["hidden"],
        intermediate_size=s["ffn"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"],
        head_dim=s["head_dim"],
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        architectures=["Qwen3ForCausalLM"],
        dtype="float32",
    )
    d = os.path.join(out, "qwen3")
    write_json(os.path.join(d, "config.json"), cfg)
    write_safetensors(os.path.join(d, "model.safetensors"), W, np.float32)
    return cfg, np.float32


GEMMA_WINDOW = 4


def make_gemma3(out):
    """Gemma 3 text config as transformers 5 saves it (Gemma3TextConfig.to_dict: rope_parameters per layer type,
    layer_types): 6 layers (5 sliding windows of 4 keys, then one global), query_pre_attn_scalar != head_dim;
    f16 safetensors, norms stored as w for x * (1 + w)."""
    hidden, L, H, KV, D, ffn, vocab = 32, 6, 2, 1, 32, 64, 79
    d = Draw(404)
    W = {"model.embed_tokens.weight": d((vocab, hidden), 1.0)}
    for i in range(L):
        p = f"model.layers.{i}"
        W[f"{p}.input_layernorm.weight"] = d((hidden,), 0.3)
        W.update(attn_weights(d, p, hidden, H, KV, D, qk_norm=True, gemma=True))
        W[f"{p}.post_attention_layernorm.weight"] = d((hidden,), 0.3)
        W[f"{p}.pre_feedforward_layernorm.weight"] = d((hidden,), 0.3)
        W[f"{p}.post_feedforward_layernorm.weight"] = d((hidden,), 0.3)
        W.update(mlp_weights(d, p, hidden, ffn))
    W["model.norm.weight"] = d((hidden,), 0.3)
    cfg = hf5_config(
        "Gemma3TextConfig",
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=L,
        num_attention_heads=H,
        num_key_value_heads=KV,
        head_dim=D,
        hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        query_pre_attn_scalar=64,
        sliding_window=GEMMA_WINDOW,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        tie_word_embeddings=True,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
        architectures=["Gemma3ForCausalLM"],
        dtype="float16",
    )
    assert cfg["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"], cfg["layer_types"]
    d = os.path.join(out, "gemma3")
    write_json(os.path.join(d, "config.json"), cfg)
    write_safetensors(os.path.join(d, "model.safetensors"), W, np.float16)
    return cfg, np.float16


MINICPM_AUTO_MAP = {
    "AutoConfig": "configuration_minicpm.MiniCPMConfig",
    "AutoModel": "modeling_minicpm.MiniCPMModel",
    "AutoModelForCausalLM": "modeling_minicpm.MiniCPMForCausalLM",
}


def make_minicpm4(out):
    """MiniCPM4-style config (remote code, transformers 4 layout): muP fields, longrope whose original context
    (32) is below max_position_embeddings (256), untied; f32."""
    hidden, L, H, KV, ffn, vocab = 64, 2, 2, 1, 64, 101
    D = hidden // H
    d = Draw(505)
    W = {"model.embed_tokens.weight": d((vocab, hidden), 0.2)}
    for i in range(L):
        p = f"model.layers.{i}"
        W[f"{p}.input_layernorm.weight"] = d((hidden,), 0.2, 1.0)
        W.update(attn_weights(d, p, hidden, H, KV, D))
        W[f"{p}.post_attention_layernorm.weight"] = d((hidden,), 0.2, 1.0)
        W.update(mlp_weights(d, p, hidden, ffn))
    W["model.norm.weight"] = d((hidden,), 0.2, 1.0)
    W["lm_head.weight"] = d((vocab, hidden), 1.0)
    half = D // 2
    cfg = {
        "architectures": ["MiniCPMForCausalLM"],
        "auto_map": MINICPM_AUTO_MAP,
        "bos_token_id": 1,
        "eos_token_id": [2, 3],
        "pad_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.1,
        "intermediate_size": ffn,
        "max_position_embeddings": 256,
        "model_type": "minicpm",
        "num_attention_heads": H,
        "num_hidden_layers": L,
        "num_key_value_heads": KV,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {
            "rope_type": "longrope",
            "long_factor": [round(1.0 + 0.9 * j, 4) for j in range(half)],
            "short_factor": [round(1.0 + 0.05 * j, 4) for j in range(half)],
            "original_max_position_embeddings": 32,
        },
        "rope_theta": 10000.0,
        "scale_depth": 1.4,
        "scale_emb": 12,
        "dim_model_base": 16,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "transformers_version": "4.46.3",
        "use_cache": True,
        "vocab_size": vocab,
    }
    d = os.path.join(out, "minicpm4")
    write_json(os.path.join(d, "config.json"), cfg)
    write_safetensors(os.path.join(d, "model.safetensors"), W, np.float32)
    return cfg, np.float32


def make_blockffn(out, name, seed, ffn_type, norm):
    """thunlp/BlockFFN checkpoint (MiniCPMForCausalLM with ffn_type block / block_linear): ReLU router, router
    norm, SiLU experts with no gate; router_norm.weight exists only for norm_after_router = rms; tied; f16."""
    hidden, L, H, KV, vocab, E, de = 64, 2, 2, 2, 71, 6, 32
    D = hidden // H
    d = Draw(seed)
    W = {"model.embed_tokens.weight": d((vocab, hidden), 0.5)}
    for i in range(L):
        p = f"model.layers.{i}"
        W[f"{p}.input_layernorm.weight"] = d((hidden,), 0.2, 1.0)
        W.update(attn_weights(d, p, hidden, H, KV, D))
        W[f"{p}.post_attention_layernorm.weight"] = d((hidden,), 0.2, 1.0)
        W[f"{p}.mlp.router_proj.weight"] = d((E, hidden), 0.3)
        if norm == "rms":
            W[f"{p}.mlp.router_norm.weight"] = d((E,), 0.5, 1.0)
        if ffn_type == "block":
            W[f"{p}.mlp.up_proj"] = d((E, de, hidden), 0.3)
            W[f"{p}.mlp.down_proj"] = d((E, hidden, de), 0.3)
        else:
            W[f"{p}.mlp.up_proj"] = d((E * de, hidden), 0.3)
            W[f"{p}.mlp.down_proj"] = d((hidden, E * de), 0.3)
    W["model.norm.weight"] = d((hidden,), 0.2, 1.0)
    cfg = {
        "architectures": ["MiniCPMForCausalLM"],
        "auto_map": MINICPM_AUTO_MAP,
        "attention_type": "vanilla",
        "block_implementation": "torch",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "dim_model_base": 32,
        "expert_size": de,
        "ffn_gated": True,
        "ffn_type": ffn_type,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": E * de,
        "max_position_embeddings": 256,
        "model_type": "minicpm",
        "norm_after_router": norm,
        "norm_scale": 1.5,
        "num_attention_heads": H,
        "num_experts": E,
        "num_hidden_layers": L,
        "num_key_value_heads": KV,
        "num_shared_experts": 0,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "router_act": "relu",
        "scale_depth": 1.4,
        "scale_emb": 12,
        "tie_word_embeddings": True,
        "torch_dtype": "float16",
        "transformers_version": "4.46.3",
        "use_cache": True,
        "vocab_size": vocab,
    }
    d = os.path.join(out, name)
    write_json(os.path.join(d, "config.json"), cfg)
    write_safetensors(os.path.join(d, "model.safetensors"), W, np.float16)
    return cfg, np.float16


PHI3_WINDOW = 6
PHI3_ORIGINAL = 16  # original_max_position_embeddings
PHI3_LONG_TOKENS = 24  # past the original context: long factors under every rule
PHI3_SHORT_TOKENS = 16  # within it: short factors under every rule


def make_phi3_weights():
    """Phi-3 / Phi-4-mini-style weights: q|k|v fused in qkv_proj, gate|up in gate_up_proj (Phi3Attention,
    Phi3MLP), untied lm_head."""
    hidden, L, H, KV, ffn, vocab = 64, 2, 2, 1, 64, 103
    D = hidden // H
    w = 1.0 / math.sqrt(hidden)
    d = Draw(808)
    W = {"model.embed_tokens.weight": d((vocab, hidden), 1.0)}
    for i in range(L):
        p = f"model.layers.{i}"
        W[f"{p}.input_layernorm.weight"] = d((hidden,), 0.2, 1.0)
        q, k, v = d((H * D, hidden), 2 * w), d((KV * D, hidden), 2 * w), d((KV * D, hidden), w)
        W[f"{p}.self_attn.qkv_proj.weight"] = np.concatenate([q, k, v])
        W[f"{p}.self_attn.o_proj.weight"] = d((hidden, H * D), 1.0 / math.sqrt(H * D))
        W[f"{p}.post_attention_layernorm.weight"] = d((hidden,), 0.2, 1.0)
        gate, up = d((ffn, hidden), 2 * w), d((ffn, hidden), w)
        W[f"{p}.mlp.gate_up_proj.weight"] = np.concatenate([gate, up])
        W[f"{p}.mlp.down_proj.weight"] = d((hidden, ffn), 1.0 / math.sqrt(ffn))
    W["model.norm.weight"] = d((hidden,), 0.2, 1.0)
    W["lm_head.weight"] = d((vocab, hidden), 1.0)
    return W


def phi3_config():
    """config.json in the layout microsoft/Phi-3-mini-128k-instruct and Phi-4-mini-instruct ship (transformers 4):
    rope_scaling {type longrope, long_factor, short_factor} with original_max_position_embeddings beside it at the
    top level, max_position_embeddings 32x larger (as 128k / 4k), partial_rotary_factor 0.75 (Phi-4-mini: 24 of 32
    dims rotated, 12 factors), a sliding_window on every layer that the sequence crosses."""
    hidden, heads = 64, 2
    half = int(hidden // heads * 0.75) // 2
    return {
        "architectures": ["Phi3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "embd_pdrop": 0.0,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": 64,
        "max_position_embeddings": 32 * PHI3_ORIGINAL,
        "model_type": "phi3",
        "num_attention_heads": heads,
        "num_hidden_layers": 2,
        "num_key_value_heads": 1,
        "original_max_position_embeddings": PHI3_ORIGINAL,
        "pad_token_id": 0,
        "partial_rotary_factor": 0.75,
        "resid_pdrop": 0.0,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "long_factor": [round(1.3 + 1.1 * j, 4) for j in range(half)],
            "short_factor": [round(1.0 + 0.03 * j, 4) for j in range(half)],
            "type": "longrope",
        },
        "rope_theta": 10000.0,
        "sliding_window": PHI3_WINDOW,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "transformers_version": "4.45.0",
        "use_cache": True,
        "vocab_size": 103,
    }


def check_phi3_config_with_transformers(cfg):
    """transformers 5's Phi3Config must read the hub layout as the forward does: original context moved into
    rope_parameters from the top level, partial_rotary_factor there too, type longrope, no factor or
    attention_factor (which would replace the attention factor)."""
    import transformers

    rp = transformers.Phi3Config(**{k: v for k, v in cfg.items() if k != "transformers_version"}).rope_parameters
    assert rp["rope_type"] == "longrope", rp
    assert rp["original_max_position_embeddings"] == cfg["original_max_position_embeddings"], rp
    assert rp["partial_rotary_factor"] == cfg["partial_rotary_factor"], rp
    assert rp["rope_theta"] == cfg["rope_theta"], rp
    assert rp["long_factor"] == cfg["rope_scaling"]["long_factor"] and rp["short_factor"] == cfg["rope_scaling"]["short_factor"]
    assert rp.get("factor") is None and rp.get("attention_factor") is None, rp


PHI3_GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def write_phi3_gguf(path, W, c):
    """As llama.cpp's convert_hf_to_gguf.py Phi3MiniModel writes it: its own set_gguf_parameters (context_length =
    max_position_embeddings, rope.scaling.original_context_length, rope.dimension_count = int(partial_rotary_factor
    * hidden) // heads, attention.sliding_window), generate_extra_tensors (rope.scaling.attn_factor =
    sqrt(1 + ln(s) / ln(original)), rope_factors_long / rope_factors_short F32), q|k|v and gate|up kept fused in
    HF's row order (attn_qkv, ffn_up; no permutation: phi3 ropes in NEOX mode), matrices F16, vectors F32."""
    H = c["num_attention_heads"]
    orig, mpe = c["original_max_position_embeddings"], c["max_position_embeddings"]
    scale = mpe / orig
    w = gguf.GGUFWriter(path, "phi3")
    w.add_name("tiny random phi3")
    w.add_context_length(mpe)
    w.add_rope_scaling_orig_ctx_len(orig)
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_block_count(c["num_hidden_layers"])
    w.add_head_count(H)
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_dimension_count(int(c["partial_rotary_factor"] * c["hidden_size"]) // H)
    w.add_rope_freq_base(c["rope_theta"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_sliding_window(c["sliding_window"] or 0)
    w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0)
    w.add_bos_token_id(c["bos_token_id"])
    w.add_eos_token_id(c["eos_token_id"])

    def put(name, arr):
        arr = arr.astype(np.float16) if arr.ndim == 2 else arr.astype(np.float32)
        w.add_tensor(name, np.ascontiguousarray(arr))

    rs = c["rope_scaling"]
    put("rope_factors_long.weight", np.array(rs["long_factor"], dtype=np.float32))
    put("rope_factors_short.weight", np.array(rs["short_factor"], dtype=np.float32))
    put("token_embd.weight", W["model.embed_tokens.weight"])
    for i in range(c["num_hidden_layers"]):
        for hf, gg in PHI3_GGUF_NAMES.items():
            put(f"blk.{i}.{gg}", W[f"model.layers.{i}.{hf}"])
    put("output_norm.weight", W["model.norm.weight"])
    put("output.weight", W["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def read_phi3_gguf(path):
    """The GGUF back to HF names and a Phi-3 config built from its metadata alone (as llama.cpp reads it: head_dim
    = hidden / heads, rotated dims from rope.dimension_count, the factor tensors, the attention factor key)."""
    r = gguf.GGUFReader(path)
    kv = {f.name: f.contents() for f in r.fields.values()}
    a = lambda k: kv[f"phi3.{k}"]
    assert kv["general.architecture"] == "phi3"
    back = {v: k for k, v in PHI3_GGUF_NAMES.items()}
    W, rf = {}, {}
    for t in r.tensors:
        arr = np.array(t.data, dtype=np.float32).reshape([int(x) for x in reversed(t.shape.tolist())])
        n = t.name
        if n.startswith("rope_factors_"):
            rf[n.split("_")[2].split(".")[0]] = [float(x) for x in arr]
        elif n == "token_embd.weight":
            W["model.embed_tokens.weight"] = arr
        elif n == "output_norm.weight":
            W["model.norm.weight"] = arr
        elif n == "output.weight":
            W["lm_head.weight"] = arr
        else:
            _, i, rest = n.split(".", 2)
            W[f"model.layers.{i}.{back[rest]}"] = arr
    hidden, H = a("embedding_length"), a("attention.head_count")
    rot = a("rope.dimension_count")
    c = {
        "hidden_size": hidden,
        "intermediate_size": a("feed_forward_length"),
        "num_hidden_layers": a("block_count"),
        "num_attention_heads": H,
        "num_key_value_heads": a("attention.head_count_kv"),
        "rms_norm_eps": a("attention.layer_norm_rms_epsilon"),
        "rope_theta": a("rope.freq_base"),
        "partial_rotary_factor": rot / (hidden // H),
        "max_position_embeddings": a("context_length"),
        "original_max_position_embeddings": a("rope.scaling.original_context_length"),
        "rope_scaling": {"type": "longrope", "long_factor": rf["long"], "short_factor": rf["short"]},
        "sliding_window": a("attention.sliding_window") or None,
        "hidden_act": "silu",
        "tie_word_embeddings": "lm_head.weight" not in W,
    }
    return W, c, a("rope.scaling.attn_factor")


# --------------------------------------------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------------------------------------------


def round_sig(x: float) -> float:
    return float(f"{x:.{SIG}g}")


def load_hf(dirpath):
    W = load_file(os.path.join(dirpath, "model.safetensors"))
    return {k: v.astype(np.float64) for k, v in W.items()}


def record(name, cfg, store_dtype, logits, ids, source, layouts, notes):
    top2 = np.sort(logits, axis=-1)[:, -2:]
    return {
        "name": name,
        "source": source,
        "layouts": layouts,
        "weights_dtype": np.dtype(store_dtype).name,
        "forward_dtype": "float64",
        "tokens": ids,
        "config": cfg,
        "positions": "logits[p] is the distribution after tokens[0..=p], every p",
        "notes": notes,
        "argmax": [int(np.argmax(l)) for l in logits],
        "gap": [round_sig(float(t[1] - t[0])) for t in top2],
        "max_abs_logit": round_sig(float(np.abs(logits).max())),
        "logits": [[round_sig(float(v)) for v in row] for row in logits],
    }


def build(name, out):
    d = os.path.join(out, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    notes = []
    if name == "llama":
        cfg, dt = make_llama(out)
        ids = tokens_for(cfg["vocab_size"])
        logits = forward_llama(load_hf(d), cfg, ids, "llama")
        Wg, factors = read_llama_gguf(os.path.join(d, "model.gguf"), cfg)
        # The GGUF's rope_freqs must be llama3's divisors, and its weights (permutation undone) the HF ones.
        inv = default_inv_freq(cfg["rope_theta"], cfg["head_dim"])
        assert np.allclose(inv / factors, llama3_inv_freq(cfg["rope_theta"], cfg["head_dim"], cfg["rope_scaling"]), rtol=1e-6)
        lg = forward_llama({k: v.astype(np.float64) for k, v in Wg.items()}, cfg, ids, "llama")
        assert np.array_equal(lg, logits), "GGUF and HF copies differ"
        # Without undoing the permutation the logits change: the GGUF layout is really exercised.
        Wp = {k: v.astype(np.float64) for k, v in Wg.items()}
        for i in range(cfg["num_hidden_layers"]):
            for n, h in (("q", cfg["num_attention_heads"]), ("k", cfg["num_key_value_heads"])):
                key = f"model.layers.{i}.self_attn.{n}_proj.weight"
                Wp[key] = permute(Wp[key], h)
        moved = float(np.abs(forward_llama(Wp, cfg, ids, "llama") - logits).max())
        no_scaling = dict(cfg, rope_scaling=None)
        moved_rope = float(np.abs(forward_llama(load_hf(d), no_scaling, ids, "llama") - logits).max())
        notes.append(f"model.gguf holds the same weights (matrices F16, exact: every value is an f16) with q/k rows "
                     f"permuted as llama.cpp's converter does; the forward on it, permutation undone, equals the HF one "
                     f"bit for bit. Reading the permuted rows with rotate-half moves the logits by up to {moved:.3g}; "
                     f"dropping the llama3 rope scaling moves them by up to {moved_rope:.3g}.")
        layouts = ["model.safetensors (f32) + config.json", "model.gguf (F16 matrices, F32 vectors)"]
    elif name in ("qwen2", "qwen3"):
        cfg, dt = (make_qwen2 if name == "qwen2" else make_qwen3)(out)
        ids = tokens_for(cfg["vocab_size"])
        logits = forward_llama(load_hf(d), cfg, ids, name)
        layouts = [f"model.safetensors ({np.dtype(dt).name}) + config.json"]
        if name == "qwen2":
            # Qwen2Config: layer i slides only when use_sliding_window and i >= max_window_layers.
            windowed = forward_llama(load_hf(d), cfg, ids, name, {1: cfg["sliding_window"]})
            notes.append("use_sliding_window is false, so sliding_window (6, shorter than the prompt) is ignored, "
                         "as transformers' Qwen2 does (layer_types all full_attention); applying it on layer 1 (as "
                         f"use_sliding_window true would) moves the logits by up to {np.abs(windowed - logits).max():.3g}")
    elif name == "gemma3":
        cfg, dt = make_gemma3(out)
        ids = tokens_for(cfg["vocab_size"])
        W = load_hf(d)
        logits = forward_gemma3(W, cfg, ids)
        wide = forward_gemma3(W, dict(cfg, sliding_window=1000), ids)
        off = forward_gemma3(W, dict(cfg, sliding_window=GEMMA_WINDOW + 1), ids)
        scal = forward_gemma3(W, dict(cfg, query_pre_attn_scalar=cfg["head_dim"]), ids)
        notes.append(f"without the window the logits move by up to {np.abs(wide - logits).max():.3g}; with a window of "
                     f"{GEMMA_WINDOW + 1} by up to {np.abs(off - logits).max():.3g}; with query_pre_attn_scalar = head_dim "
                     f"by up to {np.abs(scal - logits).max():.3g}")
        layouts = ["model.safetensors (f16) + config.json (transformers 5: rope_parameters per layer type, layer_types)"]
    elif name == "minicpm4":
        cfg, dt = make_minicpm4(out)
        ids = tokens_for(cfg["vocab_size"])
        W = load_hf(d)
        logits = forward_minicpm(W, cfg, ids)
        rs = cfg["rope_scaling"]
        short = dict(cfg, rope_scaling=dict(rs, long_factor=rs["short_factor"]))
        notes.append("longrope: the published MiniCPMLongRoPE builds its cos/sin cache for max_position_embeddings "
                     "(256) > original_max_position_embeddings (32), so it uses long_factor at every length; "
                     f"short_factor would move these logits by up to {np.abs(forward_minicpm(W, short, ids) - logits).max():.3g}")
        layouts = ["model.safetensors (f32) + config.json (MiniCPM remote code)"]
    elif name.startswith("blockffn"):
        spec = {"blockffn_block_rms": (606, "block", "rms"), "blockffn_linear_sum": (707, "block_linear", "sum")}[name]
        cfg, dt = make_blockffn(out, name, *spec)
        ids = tokens_for(cfg["vocab_size"])
        W = load_hf(d)
        ROUTER_ACTIVE.clear()
        logits = forward_minicpm(W, cfg, ids)
        active = ", ".join(f"{a:.2f}" for a in ROUTER_ACTIVE)
        notes.append(f"{ffn_type_desc(cfg)}; fraction of active (token, expert) pairs per layer: {active}")
        layouts = ["model.safetensors (f16) + config.json (BlockFFN's MiniCPM remote code)"]
    elif name in ("phi3_safetensors", "phi3_gguf"):
        return build_phi3(name, d)
    elif name == "minicpm4_sparse":
        return build_minicpm4_sparse(name, d)
    else:
        raise SystemExit(f"unknown checkpoint {name}")
    source = SOURCES[name.split("_")[0]]
    rec = record(name, cfg, dt, logits, ids, source, layouts, notes)
    write_json(os.path.join(d, "expected.json"), rec)
    return rec


def build_phi3(name, d):
    """Both Phi-3 checkpoints: expected.json for 24 tokens (past the original context of 16: long factors) and
    expected_short.json for the first 16 (within it: short factors)."""
    W = make_phi3_weights()
    cfg = phi3_config()
    check_phi3_config_with_transformers(cfg)
    ids = tokens_for(cfg["vocab_size"], PHI3_LONG_TOKENS)
    short_ids = ids[:PHI3_SHORT_TOKENS]
    if name == "phi3_safetensors":
        write_json(os.path.join(d, "config.json"), cfg)
        write_safetensors(os.path.join(d, "model.safetensors"), W, np.float16)
        Wf, c = load_hf(d), cfg
        layouts = ["model.safetensors (f16) + config.json (the layout Phi-3-mini-128k / Phi-4-mini ship: "
                   "rope_scaling type longrope, original_max_position_embeddings at the top level, "
                   "partial_rotary_factor, sliding_window)"]
        store, extra = cfg, []
    else:
        path = os.path.join(d, "model.gguf")
        write_phi3_gguf(path, W, cfg)
        Wg, c, attn_key = read_phi3_gguf(path)
        Wf = {k: v.astype(np.float64) for k, v in Wg.items()}
        for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "partial_rotary_factor", "max_position_embeddings",
                  "original_max_position_embeddings", "sliding_window", "rope_theta", "tie_word_embeddings"):
            assert c[k] == cfg[k], (k, c[k], cfg[k])
        assert np.allclose(c["rope_scaling"]["long_factor"], cfg["rope_scaling"]["long_factor"], rtol=1e-7)
        assert np.allclose(c["rope_scaling"]["short_factor"], cfg["rope_scaling"]["short_factor"], rtol=1e-7)
        _, attn, _ = phi3_rope(cfg, 1)
        assert abs(attn_key - attn) < 1e-6, (attn_key, attn)
        c["rope_scaling"]["attention_factor_key"] = attn_key
        hf_long, _ = forward_phi3(load_weights64(W), cfg, ids)
        hf_short, _ = forward_phi3(load_weights64(W), cfg, short_ids)
        layouts = ["model.gguf (F16 matrices, F32 vectors) as llama.cpp's Phi3MiniModel writes it: attn_qkv and "
                   "ffn_up fused in HF's row order, rope_factors_long/short.weight, phi3.rope.scaling.attn_factor, "
                   "phi3.rope.scaling.original_context_length, phi3.attention.sliding_window"]
        store, extra = {"gguf_metadata_as_config": c, "hf_config": cfg}, [hf_long, hf_short]
    logits, which = forward_phi3(Wf, c, ids)
    short_logits, which_short = forward_phi3(Wf, c, short_ids)
    assert (which, which_short) == ("long", "short")
    rs = c["rope_scaling"]
    swap = lambda key, other: dict(c, rope_scaling=dict(rs, **{key: rs[other]}))
    slips = [
        ("short_factor at 24 tokens", forward_phi3(Wf, swap("long_factor", "short_factor"), ids)[0] - logits),
        ("no sliding window (llama.cpp's phi3 disables SWA on load)", forward_phi3(Wf, c, ids, window=None)[0] - logits),
        (f"a window of {PHI3_WINDOW + 1}", forward_phi3(Wf, c, ids, window=PHI3_WINDOW + 1)[0] - logits),
        ("attention factor 1", forward_phi3(Wf, dict(c, max_position_embeddings=PHI3_ORIGINAL), ids)[0] - logits),
    ]
    slips_short = [
        ("long_factor at 16 tokens", forward_phi3(Wf, swap("short_factor", "long_factor"), short_ids)[0] - short_logits),
    ]
    moved = lambda xs: "; ".join(f"{n}: {np.abs(x).max():.3g}" for n, x in xs)
    # What a runtime that switches factors by position would give for the first 16 positions of the long run.
    prefix = float(np.abs(logits[:PHI3_SHORT_TOKENS] - short_logits).max())
    rule = {
        "original_max_position_embeddings": PHI3_ORIGINAL,
        "transformers": "modeling_rope_utils.py dynamic_rope_update / longrope_frequency_update: per forward call, "
        "long_factor if max(position_ids) + 1 > original_max_position_embeddings, else short_factor (the inverse "
        "frequencies of _compute_longrope_parameters; its attention factor comes from max_position_embeddings / "
        "original and does not switch); a cache is not re-rotated, so Phi3ForCausalLM.prepare_inputs_for_generation "
        "drops it when the input first passes the original length",
        "llama_cpp": "src/llama-model.cpp get_rope_factors(cparams, il) up to recent versions: long factors when the "
        "context's per-sequence size (n_ctx_seq, earlier n_ctx / n_seq_max) > n_ctx_orig_yarn "
        "(phi3.rope.scaling.original_context_length), fixed for the context; the newest source seen "
        "(get_rope_factors(cparams, pos_max, il), called from src/models/phi3.cpp) switches per batch when its "
        "largest position >= n_ctx_orig_yarn",
        "engine": "once per session from the KV-cache size: long when max_ctx > original (llama.cpp's session rule)",
        "this_fixture": "logits of one forward over all tokens: expected.json has 24 tokens (> 16: long_factor under "
        "transformers' rule, and under llama.cpp's / the engine's with the test's cache of 64); expected_short.json "
        "has the first 16 (<= 16: short_factor under transformers' rule, and under llama.cpp's / the engine's with a "
        "cache of 16); every rule agrees on both",
        "position_rule_difference": f"a runtime switching by position (newest llama.cpp, transformers with a cache "
        f"kept across the switch) would give positions 0..15 of the 24-token run with short factors: the logits there "
        f"differ from expected.json by up to {prefix:.3g}",
    }
    out = {}
    for fname, toks, lg, which_, sl, ex in (
        ("expected.json", ids, logits, which, slips, extra[:1]),
        ("expected_short.json", short_ids, short_logits, which_short, slips_short, extra[1:]),
    ):
        notes = [f"longrope: {which_}_factor (sequence of {len(toks)} against an original context of {PHI3_ORIGINAL}); "
                 f"attention factor {phi3_rope(c, 1)[1]:.6g}; rotated dims {len(rs['long_factor']) * 2} of "
                 f"{c['hidden_size'] // c['num_attention_heads']}; sliding window {PHI3_WINDOW} on both layers",
                 f"convention slips move the logits by up to: {moved(sl)}"]
        if ex:
            notes.append("the forward on the GGUF (its metadata and f32 factor tensors as config) against the one on "
                         f"the HF files: max |diff| {np.abs(ex[0] - lg).max():.3g}")
        rec = record(name, store, np.float16, lg, toks, SOURCES["phi3"], layouts, notes)
        rec["longrope"] = dict(rule, factors_used=f"{which_}_factor")
        write_json(os.path.join(d, fname), rec)
        out[fname] = rec
    return out["expected.json"]


def load_weights64(W):
    return {k: v.astype(np.float64) for k, v in W.items()}


def ffn_type_desc(cfg):
    return (f"ffn_type {cfg['ffn_type']}, norm_after_router {cfg['norm_after_router']}, {cfg['num_experts']} experts "
            f"of {cfg['expert_size']}")


SOURCES = {
    "llama": "transformers models/llama/modeling_llama.py, modeling_rope_utils.py (_compute_llama3_parameters); "
    "llama.cpp convert_hf_to_gguf.py (LlamaModel: permute, rope_freqs)",
    "qwen2": "transformers models/qwen2/modeling_qwen2.py, configuration_qwen2.py",
    "qwen3": "transformers models/qwen3/modeling_qwen3.py, configuration_qwen3.py",
    "gemma3": "transformers models/gemma3/modeling_gemma3.py, configuration_gemma3.py, masking_utils.py",
    "minicpm4": "openbmb MiniCPM4 modeling_minicpm.py (MiniCPMLongRoPE, MiniCPMDecoderLayer, MiniCPMForCausalLM)",
    "minicpm4_sparse": "openbmb MiniCPM4 modeling_minicpm.py (MiniCPMInfLLMv2Attention: sparse_config, CompressK, "
    "compressed_attention, sparse_forward); OpenBMB/infllmv2_cuda_impl (infllmv2_attn_stage1, max_pooling_1d, "
    "infllmv2_attn_varlen_func with topk_idx); InfLLM-V2, arXiv 2509.24663",
    "blockffn": "thunlp/BlockFFN pretrain/bmt_to_hf/modeling_minicpm.py (BlockMLP, MiniCPMDecoderLayer)",
    "phi3": "transformers models/phi3/modeling_phi3.py, configuration_phi3.py, modeling_rope_utils.py "
    "(_compute_longrope_parameters, dynamic_rope_update), masking_utils.py; llama.cpp convert_hf_to_gguf.py "
    "(Phi3MiniModel), src/models/phi3.cpp, src/llama-model.cpp (get_rope_factors)",
}

NAMES = ["llama", "qwen2", "qwen3", "gemma3", "minicpm4", "blockffn_block_rms", "blockffn_linear_sum", "phi3_safetensors",
         "phi3_gguf", "minicpm4_sparse"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="comma-separated names (default: all)")
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()
    names = args.only.split(",") if args.only else NAMES
    for n in names:
        rec = build(n, args.out)
        print(f"{n}: {len(rec['tokens'])} positions, max |logit| {rec['max_abs_logit']}, min gap {min(rec['gap']):.3g}")
    if not args.only:
        index = {
            "checkpoints": NAMES,
            "versions": {p: pkg_version(p) for p in ("numpy", "gguf", "safetensors", "transformers")},
        }
        write_json(os.path.join(args.out, "index.json"), index)


if __name__ == "__main__":
    main()
