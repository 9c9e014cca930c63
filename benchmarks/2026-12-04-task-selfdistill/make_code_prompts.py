"""Coding and science prompts from ShareGPT's training split, for the categories translation rounds give back.

Rounds 6 and 7 taught the drafters German and lost a little of Spec-Bench's coding and STEM questions each time
(treeflash@32 on the quick subset: coding 2.80 -> 2.56, STEM 2.46 -> 2.21). The self-distilled chat replay
(runs/sd5/sd.jsonl) holds only as many of those as ShareGPT's mix does. This writes ShareGPT-format records whose
first human turn asks for code or about science, from conversations the replay has not used (EXCLUDE), coding and
science interleaved so that a run cut short by --max-minutes has both. A keyword test picks them: a code fence or a
programming word for coding, a science word for STEM (a prompt with both counts as coding). English only (nearly all
ASCII) and 20-1,500 characters, so that prefill stays short next to a 256-token reply.
It also writes HELDOUT_COUNT held-out questions of the same kinds from ShareGPT's held-out split, skipping the first
60 prompts that `--questions sharegpt --per-category 60` already measures: up to half of them science, coding for the
rest (the held-out split is small and has few science questions).
Usage: python make_code_prompts.py TRAIN_OUT.jsonl HELDOUT_OUT.jsonl [HELDOUT_COUNT]
"""

import itertools
import json
import re
import sys

from blockdraft.bench.questions import load_questions
from blockdraft.data.selfdistill import human_turns
from blockdraft.data.sharegpt import load_conversations, split_conversations

EXCLUDE = "runs/sd5/sd.jsonl"
CODE = re.compile(r"```|\b(python|javascript|typescript|java|c\+\+|c#|golang|rust|sql|html|css|react|node\.?js|"
                  r"django|flask|api|function|class|method|algorithm|code|script|program|regex|bash|json|array|"
                  r"database|query|compile|debug)\b", re.I)
STEM = re.compile(r"\b(physics|chemistry|chemical|biology|quantum|molecules?|atoms?|equations?|theorem|calculus|"
                  r"derivative|integral|probability|statistics|energy|force|velocity|electrons?|dna|proteins?|"
                  r"cells?|photosynthesis|thermodynamics|entropy|gravity|circuit|voltage|reaction|enzymes?|climate|"
                  r"genetic|evolution|neurons?|matrix|vectors?|scientific|science)\b", re.I)


def kind(text: str) -> str | None:
    """'coding', 'stem' or None for a first human turn."""
    if not 20 <= len(text) <= 1500 or sum(c.isascii() for c in text) < 0.97 * len(text):
        return None
    if CODE.search(text):
        return "coding"
    return "stem" if STEM.search(text) else None


def first_turns(records, skip: set[str]) -> dict[str, list[tuple[str, str]]]:
    """(id, first human turn) of each kind, in split order."""
    kinds = {"coding": [], "stem": []}
    for id_, (text,) in human_turns(records, 1):
        if id_ not in skip and (k := kind(text)):
            kinds[k].append((id_, text))
    return kinds


def main(train_out: str, heldout_out: str, heldout_count: int = 30) -> None:
    train, valid = split_conversations(load_conversations())
    used = {r["id"] for r in load_conversations(EXCLUDE)}
    kinds = first_turns(train, used)
    interleaved = [p for pair in itertools.zip_longest(*kinds.values()) for p in pair if p]
    with open(train_out, "w") as f:
        for id_, text in interleaved:
            f.write(json.dumps({"id": id_, "conversations": [{"from": "human", "value": text}]}) + "\n")
    measured = {q.question_id for q in load_questions("sharegpt", 60)}
    held = first_turns(valid, measured)
    held["stem"] = held["stem"][: heldout_count // 2]
    held["coding"] = held["coding"][: heldout_count - len(held["stem"])]
    with open(heldout_out, "w") as f:
        for category, found in held.items():
            for id_, text in found:
                f.write(json.dumps({"question_id": id_, "category": category, "turns": [text]}) + "\n")
    print(f"{len(kinds['coding'])} coding and {len(kinds['stem'])} STEM training prompts "
          f"({len(used)} replayed conversations skipped); held out: {len(held['coding'])} coding, "
          f"{len(held['stem'])} STEM", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:]))
