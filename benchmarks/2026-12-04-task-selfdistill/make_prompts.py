"""Spec-Bench-shaped prompts built from ShareGPT's training split (never from Spec-Bench's questions).

Spec-Bench's weakest categories for the trained drafters are translation (German -> English), summarization
("Summarize: " + a ~3,000-character news article), RAG (~3,000 characters of passages, then a question) and QA
(a short question). ShareGPT's replies are mostly chat answers, so the drafters rarely saw the target copy from a
long context or translate. This writes ShareGPT-format records whose first human turn has those shapes, built
only from ShareGPT's training split, for `blockdraft selfdistill --data`:
- translation: "Translate German to English: " + a German sentence found in ShareGPT (one or two sentences);
- summarization: "Summarize: " + an English prose passage (a human turn or a reply, 700-4,000 characters);
- rag: a prose reply (or several of one conversation, 1,500-3,500 characters), a newline, then the human turn it
  answered, when that is a short question;
- qa: a short human question (20-100 characters, ending in '?').
Kinds are interleaved so that a run cut short by --max-minutes still has all of them.
Usage: python make_prompts.py OUT.jsonl
"""

import itertools
import json
import random
import re
import sys

from blockdraft.data.sharegpt import load_conversations, split_conversations

GERMAN = set("der die das und ist nicht ich sie mit für auf ein eine zu den von sich des dem auch werden wird wir "
             "es im einer eines über oder aber wie bei nach aus sind".split())


def is_prose(text: str) -> bool:
    letters = sum(c.isalpha() or c.isspace() for c in text)
    ascii_share = sum(c.isascii() for c in text) / max(len(text), 1)
    return ("```" not in text and "{" not in text and letters >= 0.9 * len(text) and ascii_share >= 0.98
            and len(re.findall(r"[.!?](\s|$)", text)) >= 5)


def german_sentences(records) -> list[str]:
    out = []
    for r in records:
        for turn in r["conversations"]:
            for s in re.split(r"(?<=[.!?])\s+", str(turn.get("value", ""))):
                words = re.findall(r"[A-Za-zÄÖÜäöüß]+", s)
                if 8 <= len(words) <= 45 and sum(w.lower() in GERMAN for w in words) >= 0.25 * len(words) \
                        and "`" not in s and "{" not in s:
                    out.append(" ".join(s.split()))
    return list(dict.fromkeys(out))


def add_shaped_prompts(records, kinds: dict[str, list[str]]) -> None:
    """Append the summarization, QA and RAG prompts that `records` yield to those lists of `kinds`."""
    for r in records:
        turns = [(t.get("from"), str(t.get("value", "")).strip()) for t in r["conversations"]]
        for i, (who, text) in enumerate(turns):
            if 700 <= len(text) <= 4000 and is_prose(text):
                kinds["summarization"].append(f"Summarize: {text}")
            if who == "human" and 20 <= len(text) <= 100 and text.endswith("?"):
                kinds["qa"].append(text)
                replies = [t for w, t in turns[i + 1:i + 4] if w == "gpt" and is_prose(t)]
                passage = "\n".join(replies)
                while len(passage) > 3500 and len(replies) > 1:
                    replies.pop()
                    passage = "\n".join(replies)
                if 1500 <= len(passage) <= 3500:
                    kinds["rag"].append(f"{passage}\n{text}")


def main(out_path: str) -> None:
    rng = random.Random(0)
    train, _ = split_conversations(load_conversations())
    kinds: dict[str, list[str]] = {"translation": [], "summarization": [], "rag": [], "qa": []}
    de = german_sentences(train)
    kinds["translation"] = [f"Translate German to English: {s}" for s in de]
    kinds["translation"] += [f"Translate German to English: {a} {b}" for a, b in itertools.pairwise(de)]
    add_shaped_prompts(train, kinds)
    for name, prompts in kinds.items():
        prompts[:] = list(dict.fromkeys(prompts))
        rng.shuffle(prompts)
        print(f"{name}: {len(prompts)} prompts", file=sys.stderr)
    with open(out_path, "w") as f:
        for n, prompt in enumerate(p for group in itertools.zip_longest(*kinds.values()) for p in group if p):
            f.write(json.dumps({"id": f"task{n}", "conversations": [{"from": "human", "value": prompt}]}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
