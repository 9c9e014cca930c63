"""A held-out question file in Spec-Bench's format with three of make_prompts.py's shapes (summarization, RAG,
QA), built only from ShareGPT's held-out split, which no drafter trained on: a checkpoint's gains in those
categories can then be judged on held-out data too. The held-out split holds no German sentence, and the
self-distillation used nearly every German sentence of the training split, so translation has no held-out source.
Usage: python make_heldout.py OUT.jsonl [PER_CATEGORY]
"""

import json
import random
import sys

from make_prompts import add_shaped_prompts

from blockdraft.data.sharegpt import load_conversations, split_conversations


def main(out_path: str, per_category: int = 8) -> None:
    rng = random.Random(0)
    _, valid = split_conversations(load_conversations())
    kinds: dict[str, list[str]] = {"summarization": [], "rag": [], "qa": []}
    add_shaped_prompts(valid, kinds)
    with open(out_path, "w") as f:
        for name, prompts in kinds.items():
            prompts = list(dict.fromkeys(prompts))
            print(f"{name}: {len(prompts)} held-out prompts, {min(per_category, len(prompts))} kept", file=sys.stderr)
            rng.shuffle(prompts)
            for n, prompt in enumerate(prompts[:per_category]):
                f.write(json.dumps({"question_id": f"{name}{n}", "category": name, "turns": [prompt]}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:]))
