"""The benchmark loop: warm up, then every method on every question, interleaved, in one process."""

from __future__ import annotations

import datetime
import os
import platform
from collections import Counter
from dataclasses import asdict, dataclass, field

import torch
from tqdm import tqdm

from ..errors import BlockdraftError
from ..model import Target
from ..model.precision import dtype_name
from ..verify import SamplingParams
from .metrics import summarize
from .questions import Question
from .runners import DecoderRunner, check_methods, make_runner
from .ties import classify_question, float32_reference, tie_tolerance


@dataclass
class BenchConfig:
    methods: list[str]
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    acceptor: str | None = None
    pace: bool = False  # our decoders take plain steps while drafting is measured not to pay (decoding/pacer.py)
    question_file: str = ""
    per_category: int | None = None
    target: str = ""
    threads: int = field(default_factory=torch.get_num_threads)


@dataclass
class TurnRecord:
    question_id: int | str
    category: str
    group: str
    turn: int
    method: str
    new_tokens: int
    target_calls: int
    time_s: float
    draft_s: float | None
    verify_s: float | None
    accepted_hist: dict
    tokens: list[int]
    plain_steps: int = 0  # of target_calls, one-token steps the pacer chose


def machine_info() -> dict:
    import transformers

    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def _messages(question: Question, answers: list[str], turn: int) -> list[dict]:
    """Spec-Bench multi-turn: earlier turns carry the method's *own* earlier answers."""
    msgs = []
    for i in range(turn):
        msgs += [{"role": "user", "content": question.turns[i]}, {"role": "assistant", "content": answers[i]}]
    return msgs + [{"role": "user", "content": question.turns[turn]}]


def _prompt_ids(target: Target, question: Question, answers: list[str], turn: int) -> list[int]:
    if target.tokenizer is not None and getattr(target.tokenizer, "chat_template", None):
        return target.encode_chat(_messages(question, answers, turn))
    text = "\n\n".join(t for pair in zip(question.turns[:turn], answers, strict=True) for t in pair)
    return target.encode((text + "\n\n" if text else "") + question.turns[turn], chat_template=False)


def run_bench(target: Target, questions: list[Question], config: BenchConfig, progress: bool = True) -> dict:
    """Run every method on every question; returns the results dict (see metrics.summarize).

    Ctrl-C stops early and keeps what was measured (marked `interrupted` in the config).
    """
    check_methods(config.methods, target.weights)
    params = SamplingParams(config.temperature, config.top_k, config.top_p)
    runners = {m: make_runner(m, target, params, config.acceptor, config.pace) for m in config.methods}
    torch.set_num_threads(config.threads)

    # Warm-up: the first calls pay for lazy initialisation and allocator growth; measure none of it.
    # Two prompt lengths, so that torch.compile (hf-compiled) has also made its shapes dynamic.
    warm = _prompt_ids(target, questions[0], [], 0)[:64]
    for runner in runners.values():
        for length in (len(warm), max(2, len(warm) - 8)):
            runner.run(warm[:length], 8, config.seed)
        if isinstance(runner, DecoderRunner):
            runner.forget()  # what a drafter carries across generations must come from measured turns only

    records: list[TurnRecord] = []
    total_turns = sum(len(q.turns) for q in questions) * len(runners)
    interrupted = False
    bar = tqdm(total=total_turns, desc="bench", unit="turn", disable=not progress)
    try:
        names = list(runners)
        for qi, q in enumerate(questions):
            # Interleaved: every method on this question, then the next question. The order rotates
            # (A B C, B C A, ...) so no method always runs first, right after another's long prompt.
            shift = qi % len(names)
            for name in names[shift:] + names[:shift]:
                runner = runners[name]
                answers: list[str] = []
                for turn in range(len(q.turns)):
                    ids = _prompt_ids(target, q, answers, turn)
                    if len(ids) + config.max_new_tokens > target.max_length:
                        raise BlockdraftError(f"question {q.question_id} turn {turn + 1} does not fit the context")
                    rec = runner.run(ids, config.max_new_tokens, config.seed)
                    answers.append(target.decode(rec.tokens) if target.tokenizer is not None else "")
                    records.append(TurnRecord(
                        q.question_id, q.category, q.group, turn, name, len(rec.tokens), rec.target_calls,
                        rec.time_s, rec.draft_s, rec.verify_s,
                        {int(k): v for k, v in sorted(Counter(rec.accepted_hist).items())}, rec.tokens,
                        rec.plain_steps,
                    ))
                    bar.update(1)
                    bar.set_postfix_str(f"q{q.question_id} {name} {len(rec.tokens) / rec.time_s:.1f} tok/s")
    except KeyboardInterrupt:
        interrupted = True
    finally:
        bar.close()

    cfg = {**asdict(config), "interrupted": interrupted, "machine": machine_info(),
           "questions": len(questions), "dtype": dtype_name(target.dtype), "weights": target.weights,
           "device": str(target.device),
           "compiled": target.compiled, "compile_s": round(target.compile_seconds, 1)}
    lossless = {m: r.lossless for m, r in runners.items()}
    against_ar = None
    if params.greedy:
        cfg["ties"] = tie_tolerance(target, fallback=[r.tokens for r in records if r.method == "ar"])
        against_ar = compare_with_ar(target, questions, records, cfg["ties"]["tolerance"])
    return summarize(records, cfg, lossless, against_ar)


def compare_with_ar(target: Target, questions: list[Question], records: list[TurnRecord], tolerance: float) -> dict:
    """Per method and question: (identical turns, classified divergences, later differing turns), see
    bench/ties.py. The float32 reference model is made only if some output differs."""
    by = {}
    for r in records:
        by.setdefault((r.method, r.question_id), []).append(r.tokens)
    reference = None
    out: dict[str, dict] = {}
    for q in questions:
        ar_turns = by.get(("ar", q.question_id))
        if ar_turns is None:
            continue
        answers = [target.decode(t) if target.tokenizer is not None else "" for t in ar_turns]
        for (method, qid), turns in by.items():
            if qid != q.question_id or len(turns) != len(ar_turns):
                continue
            if turns != ar_turns and reference is None:
                reference = float32_reference(target)
            prompt_of = lambda t, q=q, answers=answers: _prompt_ids(target, q, answers[:t], t)  # noqa: E731
            out.setdefault(method, {})[qid] = classify_question(qid, ar_turns, turns, prompt_of, reference, tolerance)
    return out
