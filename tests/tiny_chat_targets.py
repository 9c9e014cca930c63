"""Tiny random targets of other architectures (Qwen2, Mistral) with non-ChatML chat templates, built locally."""

from __future__ import annotations

import torch
from transformers import MistralConfig, MistralForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from blockdraft import Target

CHARS = list("abcdefghijklmnopqrstuvwxyz .,!?\n")

# Llama-3's header format (the real template also writes a system date; the structure is the same)
LLAMA3 = ("{{- bos_token }}{%- for m in messages %}{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' "
          "+ m['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
          "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}")
# the same, with the reply marked for transformers' return_assistant_tokens_mask
LLAMA3_GENERATION = ("{{- bos_token }}{%- for m in messages %}{{- '<|start_header_id|>' + m['role'] + "
                     "'<|end_header_id|>\\n\\n' }}{%- if m['role'] == 'assistant' %}{% generation %}"
                     "{{- m['content'] | trim + '<|eot_id|>' }}{% endgeneration %}{%- else %}"
                     "{{- m['content'] | trim + '<|eot_id|>' }}{%- endif %}{%- endfor %}"
                     "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
                     "{%- endif %}")
# Mistral's [INST] format, role check included
MISTRAL = ("{{- bos_token }}{%- for m in messages %}{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
           "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}"
           "{%- if m['role'] == 'user' %}{{- '[INST] ' + m['content'] + ' [/INST]' }}"
           "{%- else %}{{- ' ' + m['content'] + eos_token }}{%- endif %}{%- endfor %}")
CHATML = ("{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")

STYLES = {  # template, (bos, eos), the other special tokens
    "llama3": (LLAMA3, ("<|begin_of_text|>", "<|eot_id|>"), ["<|start_header_id|>", "<|end_header_id|>"]),
    "llama3-generation": (LLAMA3_GENERATION, ("<|begin_of_text|>", "<|eot_id|>"),
                          ["<|start_header_id|>", "<|end_header_id|>"]),
    "mistral": (MISTRAL, ("<s>", "</s>"), ["[INST]", "[/INST]"]),
    "chatml": (CHATML, ("<|endoftext|>", "<|im_end|>"), ["<|im_start|>"]),
}


def chat_tokenizer(style: str, first_char_id: int = 0) -> PreTrainedTokenizerFast:
    """A character-level tokenizer with the special tokens and chat template of `style`. With `first_char_id`
    above 65,536 every real token sits above 16 bits (the vocabulary is padded with unused tokens)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    template, (bos, eos), others = STYLES[style]
    specials = ["<unk>", bos, eos, *others]
    vocab = {t: i for i, t in enumerate(specials)}
    for i in range(len(vocab), first_char_id):
        vocab[f"<unused{i}>"] = i
    for c in CHARS:
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token=bos, eos_token=eos,
                                   pad_token="<unk>")
    fast.chat_template = template
    return fast


def tiny_model(arch: str, tokenizer, seed: int = 0, logit_scale: float = 4.0, hidden: int = 32):
    """A random 2-layer Qwen2 or Mistral whose special token ids are the tokenizer's."""
    torch.manual_seed(seed)
    common = dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=False))
    elif arch == "mistral":
        model = MistralForCausalLM(MistralConfig(**common, sliding_window=None))
    else:
        raise ValueError(arch)
    model.eval()
    unused = [i for t, i in tokenizer.get_vocab().items() if t.startswith("<unused")]
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)  # peaked distributions: clear top-1 choices to learn
        model.lm_head.weight[unused] = 0.0  # logit 0: the padding tokens lose to the best real token
    return model


def tiny_chat_target(arch: str, style: str, first_char_id: int = 0, name: str | None = None) -> Target:
    tok = chat_tokenizer(style, first_char_id)
    return Target(tiny_model(arch, tok), tok, name=name or f"tiny-{arch}-{style}")
