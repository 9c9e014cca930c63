"""How close two engines' greedy outputs are on the same prompts: identical first turns, and at each first divergence
the float32 logit gap of the GGUF file's exact model (blockdraft's target in float32: the file's dequantized values).

    python benchmarks/peers/agreement.py runs/peers-DATE [--a llamacpp/plain.json] [--b blockdraft/ar.json]

A small gap means the two engines disagree where the model itself hesitates (two tokens nearly tied); a large one,
that one engine computes a different model.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))  # one stopped (end of turn) where the other did not


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--a", default="llamacpp/plain.json")
    ap.add_argument("--b", default="blockdraft/ar.json")
    args = ap.parse_args()
    prompts = json.loads((args.folder / "prompts.json").read_text())
    a = {r["question_id"]: r["tokens"] for r in json.loads((args.folder / args.a).read_text())["records"]}
    b = {r["question_id"]: r["tokens"] for r in json.loads((args.folder / args.b).read_text())["records"]}

    from blockdraft import Target

    target = Target.load(prompts["config"]["gguf"], dtype="float32")  # the file's values, exactly
    same, gaps = 0, []
    for p in prompts["prompts"]:
        qa, qb = a.get(p["question_id"]), b.get(p["question_id"])
        if qa is None or qb is None:
            continue
        i = first_divergence(qa, qb)
        if i is None:
            same += 1
            continue
        if i >= min(len(qa), len(qb)):  # a stop against a token: no pair of tokens to compare
            gaps.append(float("nan"))
            continue
        with torch.inference_mode():
            logits = target.model(torch.tensor([p["prompt_ids"] + qa[:i]])).logits[0, -1].float()
        gaps.append(abs(float(logits[qa[i]] - logits[qb[i]])))
    n = same + len(gaps)
    gaps = [g for g in gaps if g == g]
    print(f"{args.a} vs {args.b}: {same}/{n} first turns identical; at the {len(gaps)} first divergences the float32 "
          f"logit gap |{args.a.split('/')[0]} token - {args.b.split('/')[0]} token| has median "
          f"{statistics.median(gaps) if gaps else 0:.3f}, max {max(gaps) if gaps else 0:.3f} "
          f"(gaps: {', '.join(f'{g:.3f}' for g in sorted(gaps))})")


if __name__ == "__main__":
    main()
