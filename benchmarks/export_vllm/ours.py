"""Runs in blockdraft's environment: the same drafter, prompts and length in blockdraft, in check.py's JSON format.

    ours.py --questions question.jsonl --method bpd:checkpoint=DIR --mode NAME [--prompts 3] [--max-tokens 64]
            [--dtype float32] --out RESULT.json

Its spec-decode counters come from our statistics: one draft per verification call, accepted tokens
per call (the bonus token not counted, as in vLLM), accepted counts per depth.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from check import first_turns  # noqa: E402  (stdlib-only, shared with the vLLM side)


def main() -> None:
    p = argparse.ArgumentParser(prog="ours.py")
    p.add_argument("--questions", required=True)
    p.add_argument("--method", required=True)
    p.add_argument("--mode", required=True)
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    from blockdraft import load_target
    from blockdraft.decoding import SpeculativeDecoder
    from blockdraft.methods import make_drafter

    target = load_target("smollm2-135m", args.dtype, "cpu")
    drafter = make_drafter(args.method, target)
    records, hist = [], {}
    for q in first_turns(args.questions, args.prompts):
        ids = target.encode_chat([{"role": "user", "content": q["text"]}])
        t = time.perf_counter()
        # vLLM stops at EOS too: the same stopping rule, the same length limit
        result = SpeculativeDecoder(target, drafter).generate(ids, args.max_tokens)
        dt = time.perf_counter() - t
        for n, count in result.stats.accepted_hist.items():
            hist[int(n)] = hist.get(int(n), 0) + count
        records.append({**q, "prompt_tokens": len(ids), "tokens": list(result.tokens), "time_s": dt})
        print(f"[{args.mode}] q{q['question_id']} ({q['category']}): {len(result.tokens)} tokens, "
              f"tau {result.stats.tau:.2f}", flush=True)
    depth = max(hist, default=0)
    counters = {"num_drafts": sum(hist.values()), "num_draft_tokens": None,
                "num_accepted_tokens": sum(n * c for n, c in hist.items()),
                "num_accepted_tokens_per_pos": [sum(c for n, c in hist.items() if n > i) for i in range(depth)]}
    out = {"mode": args.mode, "speculative_config": {"method": args.method, "model": args.method.split("=")[-1],
                                                     "num_speculative_tokens": "-"},
           "dtype": args.dtype, "records": records, "spec_decode": counters}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps({"mode": args.mode, "spec_decode": counters}), flush=True)


if __name__ == "__main__":
    main()
