"""Spec-Bench question files: one JSON object per line with question_id, category and turns."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import BlockdraftError

# Spec-Bench's leaderboard groups the eight MT-bench categories into one column.
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


@dataclass(frozen=True)
class Question:
    question_id: int | str
    category: str
    turns: tuple[str, ...]

    @property
    def group(self) -> str:
        return "mt_bench" if self.category in MT_BENCH else self.category


def default_question_file() -> Path | None:
    """../shared/data/spec_bench/question.jsonl, looked up from the working directory and the repo."""
    rel = Path("shared/data/spec_bench/question.jsonl")
    here = Path(__file__).resolve()
    for base in [Path.cwd(), *Path.cwd().parents, *here.parents]:
        if (base / rel).is_file():
            return base / rel
    return None


def load_questions(path: str | Path | None, per_category: int | None = None,
                   categories: list[str] | None = None) -> list[Question]:
    """Read a question file; keep the first `per_category` questions of each category, in file order."""
    if str(path) == "sharegpt":
        return _sharegpt_questions(per_category)
    if path is None:
        path = default_question_file()
        if path is None:
            raise BlockdraftError("no question file given and ../shared/data/spec_bench/question.jsonl not found")
    path = Path(path)
    if not path.is_file():
        raise BlockdraftError(f"question file '{path}' does not exist")
    questions, seen = [], {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            q = Question(obj["question_id"], str(obj["category"]), tuple(str(t) for t in obj["turns"]))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise BlockdraftError(
                f"{path}:{lineno}: not a Spec-Bench question (needs question_id, category, turns): {e}"
            ) from None
        if not q.turns:
            raise BlockdraftError(f"{path}:{lineno}: question {q.question_id} has no turns")
        if categories and q.category not in categories:
            continue
        if per_category is not None and seen.get(q.category, 0) >= per_category:
            continue
        seen[q.category] = seen.get(q.category, 0) + 1
        questions.append(q)
    if not questions:
        raise BlockdraftError(f"no questions selected from '{path}'")
    return questions


def _sharegpt_questions(n: int | None) -> list[Question]:
    """First user turns of the held-out ShareGPT split, as single-turn questions (category 'sharegpt')."""
    from ..data import load_conversations, split_conversations

    _, valid = split_conversations(load_conversations())
    questions = []
    for r in valid:
        turn = r["conversations"][0]
        text = str(turn.get("value", "")).strip()
        if turn.get("from") == "human" and 20 <= len(text) <= 4000:
            questions.append(Question(r["id"], "sharegpt", (text,)))
    return questions[: n or 20]
