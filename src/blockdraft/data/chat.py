"""Chat formatting for training: a conversation's tokens under the target's own chat template, replies marked.

No template format is assumed (ChatML, Llama-3 headers, Mistral's [INST], Gemma's turns all work).
Where the template marks replies with `{% generation %}`, transformers returns the reply mask
itself; otherwise we render the conversation up to each reply twice, without it (plus the
generation prompt, exactly what the target sees when it starts that reply) and with it: the
characters in between are the reply. Every prefix rendering must be a prefix of the full one; a
template that renders history differently (e.g. one that drops earlier reasoning) is cut at the
first turn where it does. Character spans become token spans through the fast tokenizer's offsets.
"""

from __future__ import annotations

import re

from ..errors import BlockdraftError

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant"}
GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


def sharegpt_messages(record: dict) -> list[dict] | None:
    """The clean user/assistant alternation at the start of a ShareGPT record (None if it has no reply)."""
    messages = []
    for turn in record.get("conversations") or []:
        role = ROLES.get(turn.get("from"))
        text = str(turn.get("value", "")).strip()
        if role is None or not text:
            continue
        if messages and messages[-1]["role"] == role:
            break  # malformed alternation: keep the clean prefix
        messages.append({"role": role, "content": text})
    if len(messages) < 2 or messages[0]["role"] != "user":
        return None
    return messages


def has_chat_template(tokenizer) -> bool:
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def _render(tokenizer, messages, generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def reply_char_spans(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """(rendered text, [(start, end)] character span of every reply in it), by prefix rendering."""
    full = _render(tokenizer, messages)
    spans, text = [], full
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or i == 0:  # a reply needs something to reply to
            continue
        before = _render(tokenizer, messages[:i], generation_prompt=True)
        upto = _render(tokenizer, messages[: i + 1])
        if not upto.startswith(before) or len(upto) == len(before):
            text = full[: spans[-1][1]] if spans else ""  # keep the turns rendered consistently
            break
        if not full.startswith(upto):  # this reply is rendered differently once it is history
            if not spans:  # keep the conversation up to it, rendered as when it was the last message
                text, spans = upto, [(len(before), len(upto))]
            else:
                text = full[: spans[-1][1]]
            break
        spans.append((len(before), len(upto)))
    return text, spans


def _cut_after_eos(ids: list[int], reply: list[int], eos_ids) -> list[int]:
    """Within each run of reply tokens, stop after the first end token: what follows it (the newline after
    ChatML's <|im_end|>, say) is template decoration the target never generates."""
    out, inside_done = list(reply), False
    for i, r in enumerate(reply):
        if not r:
            inside_done = False
        elif inside_done:
            out[i] = 0
        elif ids[i] in eos_ids:
            inside_done = True
    return out


def chat_token_ids(tokenizer, messages: list[dict], eos_ids=()) -> tuple[list[int], list[int]]:
    """(token ids, reply [N]: 1 where the token belongs to a reply) of a conversation under the tokenizer's
    chat template. Raises jinja2's TemplateError where the template refuses the conversation."""
    eos_ids = set(eos_ids) | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())
    if GENERATION_TAG.search(tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""):
        out = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True)
        ids, reply = list(out["input_ids"]), list(out["assistant_masks"])
        return ids, _cut_after_eos(ids, reply, eos_ids)
    text, spans = reply_char_spans(tokenizer, messages)
    if not spans:
        return [], []
    if not getattr(tokenizer, "is_fast", False):
        raise BlockdraftError("finding the replies in a chat template's output needs a fast tokenizer "
                              "(tokenizer.json); this target's tokenizer is a slow one")
    # what apply_chat_template(tokenize=True) does: the rendered text, no extra special tokens
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, reply, k = list(enc["input_ids"]), [], 0
    for a, b in enc["offset_mapping"]:
        while k < len(spans) and a >= spans[k][1]:
            k += 1
        reply.append(int(k < len(spans) and b > spans[k][0] and b > a))
    return ids, _cut_after_eos(ids, reply, eos_ids)


PROBE = [{"role": "user", "content": "Hi there."}, {"role": "assistant", "content": "Hello! How can I help?"},
         {"role": "user", "content": "Say yes."}, {"role": "assistant", "content": "Yes."}]


def check_chat_template(tokenizer, name: str = "the target") -> None:
    """Refuse, in one line, a chat template in which no reply can be located (checked once per run)."""
    if tokenizer is not None and not has_chat_template(tokenizer):
        print(f"note: {name} has no chat template: conversations are used as plain text, one message a line")
        return
    try:
        ids, reply = chat_token_ids(tokenizer, PROBE)
    except Exception as e:  # jinja2 errors, templates that need tools or dates: say which template failed
        raise BlockdraftError(f"the chat template of {name} cannot render a user/assistant conversation "
                              f"({type(e).__name__}: {e})") from None
    if sum(reply) < 2:
        raise BlockdraftError(f"cannot locate the assistant replies in the chat template of {name}: rendering a "
                              "conversation with and without a reply must differ by the reply (or mark replies "
                              "with {% generation %})")
