"""A held-out question file in Spec-Bench's format with three of make_prompts.py's shapes (summarization, RAG,
QA), built only from ShareGPT's held-out split, which no drafter trained on: a checkpoint's gains in those
categories can then be judged on held-out data too. The held-out split holds no German sentence, and the
self-distillation used nearly every German sentence of the training split, so translation has no held-out source.
Usage: python make_heldout.py OUT.jsonl [PER_CATEGORY]
"""

import json
import random
import sys

from make_prompts import is_prose

from blockdraft.data.sharegpt import load_conversations, split_conversations


def main(out_path: str, per_category: int = 8) -> None:
    rng = random.Random(0)
    _, valid = split_conversations(load_conversations())
    kinds: dict[str, list[str]] = {"summarization": [], "rag": [], "qa": []}
    for r in valid:
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
    with open(out_path, "w") as f:
        for name, prompts in kinds.items():
            prompts = list(dict.fromkeys(prompts))
            print(f"{name}: {len(prompts)} held-out prompts, {min(per_category, len(prompts))} kept", file=sys.stderr)
            rng.shuffle(prompts)
            for n, prompt in enumerate(prompts[:per_category]):
                f.write(json.dumps({"question_id": f"{name}{n}", "category": name, "turns": [prompt]}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:]))
