"""Write a Spec-Bench-format question file with prompts of ~100, ~1,000 and ~4,000 tokens (held-out ShareGPT).

    python benchmarks/context_prompts.py OUT.jsonl [--per-length 3]
    blockdraft bench --questions OUT.jsonl --methods ar,hf,lookup,treeflash

Each prompt is a held-out ShareGPT conversation (never Spec-Bench, never the training split), cut
to about the length of its category (`ctx100`, `ctx1000`, `ctx4000`) in the target's tokens and
followed by a request to continue it, so that one bench run shows how every method scales with
the context.
"""

import argparse
import json

from blockdraft import Target
from blockdraft.data import load_conversations, split_conversations

LENGTHS = (100, 1000, 4000)


def conversation_text(record: dict) -> str:
    names = {"human": "User", "gpt": "Assistant"}
    return "\n\n".join(f"{names.get(t.get('from'), 'User')}: {t.get('value', '')}" for t in record["conversations"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--per-length", type=int, default=3)
    args = ap.parse_args()
    tok = Target.load("smollm2-135m").tokenizer
    _, valid = split_conversations(load_conversations())
    rows, used = [], set()
    for length in LENGTHS:
        found = 0
        for r in valid:
            if r["id"] in used:
                continue
            ids = tok(conversation_text(r))["input_ids"]
            if len(ids) < length:
                continue
            text = tok.decode(ids[:length])
            prompt = f"{text}\n\n(End of the conversation so far.) Write the assistant's next reply."
            rows.append({"question_id": f"{r['id']}-{length}", "category": f"ctx{length}", "turns": [prompt]})
            used.add(r["id"])
            found += 1
            if found == args.per_length:
                break
    with open(args.out, "w") as f:
        f.write("\n".join(json.dumps(row) for row in rows) + "\n")
    print(f"wrote {len(rows)} prompts to {args.out}")


if __name__ == "__main__":
    main()
