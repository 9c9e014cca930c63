"""Translation prompts from ShareGPT's other languages, for a round of self-distillation once the German is spent.

Spec-Bench's translation category asks "Translate German to English: <sentence>", and the two earlier rounds used
nearly every German sentence of ShareGPT's training split (make_prompts.py). The split also holds French, Spanish,
Portuguese and Italian sentences: prompts of the same shape in those languages teach the drafters the target's
replies to a translation request, which the German prompts share. The held-out split holds no German but some
Spanish and Portuguese, so the same shape built from it gives translation its first held-out check.
Languages are told apart by their commonest words, as make_prompts.py finds German (Spanish and Portuguese share
many, so some sentences get the other's name: the prompt's shape is what matters here, not the label).
Usage: python make_translation_prompts.py TRAIN_OUT.jsonl HELDOUT_OUT.jsonl [HELDOUT_COUNT]
"""

import itertools
import json
import random
import re
import sys

from blockdraft.data.sharegpt import load_conversations, split_conversations

COMMON_WORDS = {
    "French": "le la les et est pas je il elle avec pour sur un une des du de que qui dans ce nous vous sont au aux",
    "Spanish": "el la los las y es no yo con para por un una del de que en se su lo como pero más está son",
    "Portuguese": "o a os as e é não eu com para por um uma do da de que em se seu mas como são está",
    "Italian": "il la le gli e è non io con per un una del della di che in si come ma sono",
}
COMMON = {language: set(words.split()) for language, words in COMMON_WORDS.items()}
ENGLISH = set("the and is of to in that it for with was on are this be by an at have you he she they not a as no has "
              "when its how his her their which from or can will use".split())


def sentences_by_language(records) -> dict[str, list[str]]:
    """Sentences of 8-45 words where one language's common words make up at least a quarter and English ones
    under a tenth, deduplicated. Words common in English too ("a", "as", "no") count as English only."""
    out: dict[str, list[str]] = {language: [] for language in COMMON}
    for r in records:
        for turn in r["conversations"]:
            for s in re.split(r"(?<=[.!?])\s+", str(turn.get("value", ""))):
                words = re.findall(r"\w+", s.lower())
                if not 8 <= len(words) <= 45 or "`" in s or "{" in s or \
                        sum(w in ENGLISH for w in words) >= 0.1 * len(words):
                    continue
                own = [w for w in words if w not in ENGLISH]
                best = max(COMMON, key=lambda language: sum(w in COMMON[language] for w in own))
                if sum(w in COMMON[best] for w in own) >= 0.25 * len(words):
                    out[best].append(" ".join(s.split()))
    return {language: list(dict.fromkeys(found)) for language, found in out.items()}


def prompts(records, pairs: bool) -> list[tuple[str, str]]:
    """(language, prompt) for each sentence, and, with `pairs`, for each two neighbouring sentences as well."""
    out = []
    for language, found in sentences_by_language(records).items():
        out += [(language, f"Translate {language} to English: {s}") for s in found]
        if pairs:
            out += [(language, f"Translate {language} to English: {a} {b}") for a, b in itertools.pairwise(found)]
    return out


def main(train_out: str, heldout_out: str, heldout_count: int = 30) -> None:
    rng = random.Random(0)
    train, valid = split_conversations(load_conversations())
    train_prompts = prompts(train, pairs=True)
    rng.shuffle(train_prompts)
    with open(train_out, "w") as f:
        for n, (_, prompt) in enumerate(train_prompts):
            f.write(json.dumps({"id": f"translation{n}", "conversations": [{"from": "human", "value": prompt}]}) + "\n")
    heldout = prompts(valid, pairs=False)
    rng.shuffle(heldout)
    with open(heldout_out, "w") as f:
        for n, (_, prompt) in enumerate(heldout[:heldout_count]):
            f.write(json.dumps({"question_id": f"translation{n}", "category": "translation", "turns": [prompt]}) + "\n")
    counts = {language: sum(1 for lang, _ in train_prompts if lang == language) for language in COMMON}
    print(f"training prompts: {len(train_prompts)} {counts}; held-out: {min(heldout_count, len(heldout))} of "
          f"{len(heldout)}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:]))
