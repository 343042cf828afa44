#!/usr/bin/env python3
"""config.json and generation_config.json of SmolLM2-135M-Instruct as transformers 5 writes them.

SmolLM2's published hyper-parameters (HuggingFaceTB/SmolLM2-135M-Instruct) are passed to transformers'
`LlamaConfig` and `GenerationConfig` and saved with `save_pretrained`, so the files have transformers 5's layout:
`rope_parameters` (no top-level `rope_theta`), `dtype` (no `torch_dtype`). tests/smollm2_hf.rs builds a Hugging Face
directory from the GGUF's weights with these files and checks it against the same golden fixtures as the GGUF.
No torch is needed. Output: tests/fixtures/smollm2-hf/.
"""

import os
import sys

import transformers
from transformers import GenerationConfig, LlamaConfig

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "fixtures", "smollm2-hf")


def main():
    assert transformers.__version__.startswith("5."), f"want transformers 5.x, have {transformers.__version__}"
    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        hidden_act="silu",
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        dtype="bfloat16",
        architectures=["LlamaForCausalLM"],
    )
    gen = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=2)
    os.makedirs(OUT, exist_ok=True)
    cfg.save_pretrained(OUT)
    gen.save_pretrained(OUT)
    print(f"wrote {OUT} with transformers {transformers.__version__}", file=sys.stderr)


if __name__ == "__main__":
    main()
