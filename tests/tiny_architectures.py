"""Tiny random causal LMs of many transformers architectures (2 layers, width 64), for the any-architecture tests.

Each entry is a model type and the config fields it needs beyond the common ones: windowed architectures get a
sliding window of WINDOW tokens (well below the tests' prompt + reply length, so the window is exercised),
hybrid ones one sliding and one full layer. The seed and init scale are chosen per architecture so that greedy
output is neither a single repeated token nor free of repeats (drafts then get accepted and rejected).
"""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM

WINDOW = 8
HYBRID = ["sliding_attention", "full_attention"]

# DeepSeek-V2/V3's attention (keys and values from a rank-16 latent, a rotary part apart) and MoE, made tiny
MLA = {"num_key_value_heads": 4, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16,
       "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "first_k_dense_replace": 1}

# name -> (model_type, extra config fields, seed, init std)
ARCHITECTURES = {
    "llama": ("llama", {}, 0, 0.1),
    "qwen2-sliding": ("qwen2", {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1}, 1, 0.1),
    "qwen3": ("qwen3", {"head_dim": 16}, 0, 0.2),
    "qwen3-moe": ("qwen3_moe", {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                                "moe_intermediate_size": 32}, 0, 0.2),
    "mistral-sliding": ("mistral", {"sliding_window": WINDOW}, 0, 0.1),
    "mixtral-sliding": ("mixtral", {"sliding_window": WINDOW, "num_local_experts": 4}, 1, 0.1),
    "gemma": ("gemma", {"head_dim": 16}, 0, 0.5),
    "gemma2": ("gemma2", {"head_dim": 16, "sliding_window": WINDOW, "tie_word_embeddings": False}, 1, 0.2),
    "gemma3-text": ("gemma3_text", {"head_dim": 16, "sliding_window": WINDOW, "layer_types": HYBRID,
                                    "tie_word_embeddings": False}, 0, 0.2),
    "phi3": ("phi3", {}, 0, 0.2),
    "olmo2": ("olmo2", {}, 0, 0.2),
    "olmo3-sliding": ("olmo3", {"sliding_window": WINDOW, "layer_types": HYBRID}, 2, 0.2),
    "gpt2": ("gpt2", {"n_positions": 512}, 1, 0.5),
    "gpt-neox": ("gpt_neox", {}, 0, 0.2),
    "opt": ("opt", {"ffn_dim": 128, "word_embed_proj_dim": 64}, 0, 0.2),
    "falcon": ("falcon", {}, 2, 0.2),
    "stablelm": ("stablelm", {}, 1, 0.2),
    "granite": ("granite", {}, 2, 0.1),
    "phi": ("phi", {}, 1, 0.2),
    "starcoder2-sliding": ("starcoder2", {"sliding_window": WINDOW}, 0, 0.2),
    "cohere2": ("cohere2", {"sliding_window": WINDOW, "layer_types": HYBRID}, 0, 0.2),
    "smollm3": ("smollm3", {}, 0, 0.2),
    "gptj": ("gptj", {"rotary_dim": 8}, 1, 0.2),
    "exaone4-sliding": ("exaone4", {"sliding_window": WINDOW, "layer_types": HYBRID}, 2, 0.2),
    # multi-head latent attention, as DeepSeek's own configs have it: one key/value head per attention head
    "deepseek-v2": ("deepseek_v2", {**MLA, "q_lora_rank": None}, 0, 0.1),
    "deepseek-v3": ("deepseek_v3", {**MLA, "q_lora_rank": 32, "n_group": 1, "topk_group": 1}, 0, 0.1),
}


def tiny_model(name: str, vocab_size: int, seed: int | None = None, init: float | None = None):
    """A randomly initialised float32 model of architecture `name` (a key of ARCHITECTURES)."""
    model_type, extra, default_seed, default_init = ARCHITECTURES[name]
    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1,
                  eos_token_id=2, pad_token_id=0, initializer_range=default_init if init is None else init)
    config = AutoConfig.for_model(model_type, **{**common, **extra})
    torch.manual_seed(default_seed if seed is None else seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # peakier distributions: clear greedy choices, so the output repeats itself
        model.get_output_embeddings().weight.mul_(4.0)
    return model
