"""Runs in blockdraft's environment: the same drafters, prompts and length in blockdraft, in check.py's JSON format.

    ours.py --questions question.jsonl --run blockdraft-bpd=bpd:checkpoint=DIR [--run NAME=METHOD ...]
            [--per-category 2] [--max-tokens 64] [--dtype float32] [--no-compile] --out-dir DIR

One process, one target (compiled, as `blockdraft bench` runs it), each METHOD in turn, written to
DIR/NAME.json. Its spec-decode counters come from our statistics: one draft per verification call,
accepted tokens per call (the bonus token not counted, as in vLLM), accepted counts per depth. Each
method first decodes an untimed warm-up, as check.py does for vLLM.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from check import first_turns  # noqa: E402  (stdlib-only, shared with the vLLM side)


def run_method(target, name: str, method: str, turns: list[dict], max_tokens: int, dtype: str) -> dict:
    from blockdraft.decoding import SpeculativeDecoder
    from blockdraft.methods import make_drafter

    drafter = make_drafter(method, target)
    warm = target.encode_chat([{"role": "user", "content": turns[0]["text"]}])
    SpeculativeDecoder(target, drafter).generate(warm, 16)
    records, hist = [], {}
    for q in turns:
        ids = target.encode_chat([{"role": "user", "content": q["text"]}])
        t = time.perf_counter()
        # vLLM stops at EOS too: the same stopping rule, the same length limit
        result = SpeculativeDecoder(target, drafter).generate(ids, max_tokens)
        dt = time.perf_counter() - t
        for n, count in result.stats.accepted_hist.items():
            hist[int(n)] = hist.get(int(n), 0) + count
        records.append({**q, "prompt_tokens": len(ids), "tokens": list(result.tokens), "time_s": dt})
        print(f"[{name}] q{q['question_id']} ({q['category']}): {len(result.tokens)} tokens, "
              f"tau {result.stats.tau:.2f}, {len(result.tokens) / dt:.1f} tok/s", flush=True)
    depth = max(hist, default=0)
    counters = {"num_drafts": sum(hist.values()), "num_draft_tokens": None,
                "num_accepted_tokens": sum(n * c for n, c in hist.items()),
                "num_accepted_tokens_per_pos": [sum(c for n, c in hist.items() if n > i) for i in range(depth)]}
    print(json.dumps({"mode": name, "spec_decode": counters}), flush=True)
    model = method.split("checkpoint=")[-1] if "checkpoint=" in method else None
    return {"mode": name, "speculative_config": {"method": method, "model": model, "num_speculative_tokens": "-"},
            "dtype": dtype, "records": records, "spec_decode": counters}


def main() -> None:
    p = argparse.ArgumentParser(prog="ours.py")
    p.add_argument("--questions", required=True)
    p.add_argument("--run", action="append", required=True, metavar="NAME=METHOD")
    p.add_argument("--per-category", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--out-dir", required=True)
    args = p.parse_args()
    runs = [r.split("=", 1) for r in args.run]
    if any(len(r) != 2 for r in runs):
        sys.exit("ours.py: --run takes NAME=METHOD, e.g. blockdraft-lookup=lookup")

    from blockdraft import load_target

    target = load_target("smollm2-135m", args.dtype, "cpu", compile=not args.no_compile)
    turns = first_turns(args.questions, args.per_category)
    for name, method in runs:
        out = run_method(target, name, method, turns, args.max_tokens, args.dtype)
        Path(args.out_dir, f"{name}.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
