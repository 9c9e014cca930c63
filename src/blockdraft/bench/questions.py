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


SPEC_BENCH = Path(__file__).parent / "spec_bench" / "question.jsonl"  # shipped with the package (see NOTICE.md)


def default_question_file() -> Path:
    """The Spec-Bench questions shipped inside the package: found from any working directory."""
    return SPEC_BENCH


def load_questions(path: str | Path | None, per_category: int | None = None,
                   categories: list[str] | None = None) -> list[Question]:
    """Read a question file ('spec-bench' or None: the shipped Spec-Bench file; 'sharegpt': held-out ShareGPT
    prompts; else a path); keep the first `per_category` questions of each category, in file order."""
    if per_category is not None and per_category <= 0:
        raise BlockdraftError(f"--per-category must be a positive integer, got {per_category}")
    if str(path) == "sharegpt":
        return _sharegpt_questions(per_category)
    if path is None or str(path) == "spec-bench":
        path = SPEC_BENCH
    path = Path(path)
    if not path.is_file():
        raise BlockdraftError(f"question file '{path}' does not exist")
    questions, seen, found = [], {}, set()
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj.get("turns"), list):
                raise TypeError("'turns' must be a list of strings")
            q = Question(obj["question_id"], str(obj["category"]), tuple(str(t) for t in obj["turns"]))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise BlockdraftError(
                f"{path}:{lineno}: not a Spec-Bench question (needs question_id, category, turns): {e}"
            ) from None
        if not q.turns:
            raise BlockdraftError(f"{path}:{lineno}: question {q.question_id} has no turns")
        found.add(q.category)
        if categories and q.category not in categories:
            continue
        if per_category is not None and seen.get(q.category, 0) >= per_category:
            continue
        seen[q.category] = seen.get(q.category, 0) + 1
        questions.append(q)
    unknown = sorted(set(categories or ()) - found)
    if unknown:
        raise BlockdraftError(f"--categories: no question in '{path}' has category {', '.join(unknown)}; "
                              f"its categories are {', '.join(sorted(found))}")
    if not questions:
        raise BlockdraftError(f"no questions in '{path}'")
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
