"""Runs in the vLLM venv: greedy generation with an exported drafter (or none), with vLLM's spec-decode counters.

    check.py run --target HF_FOLDER --questions question.jsonl --mode plain|ngram|medusa|dflash [--draft DIR]
                 [--k N] [--per-category 2] [--max-tokens 64] [--dtype float32] --out RESULT.json
    check.py report plain.json medusa.json dflash.json   # a markdown table; outputs compared with plain

Imports only vLLM and the standard library (blockdraft is not installed in the vLLM venv).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def first_turns(questions: str, per_category: int) -> list[dict]:
    """The first turns of the first `per_category` questions of each Spec-Bench category, in file order:
    the questions `blockdraft bench --per-category N` runs (2 = the quick subset)."""
    seen, out = {}, []
    for line in Path(questions).read_text().splitlines():
        q = json.loads(line)
        if seen.get(q["category"], 0) < per_category:
            seen[q["category"]] = seen.get(q["category"], 0) + 1
            out.append({"question_id": q["question_id"], "category": q["category"], "text": q["turns"][0]})
    return out


# vLLM's ngram proposer with its documentation's example values, as in benchmarks/peers/measure.py
NGRAM = {"method": "ngram", "prompt_lookup_max": 4}


def eos_ids(folder: str) -> list[int]:
    """The end-of-turn ids a model folder declares (generation_config.json, config.json)."""
    out = []
    for name in ("generation_config.json", "config.json"):
        path = Path(folder) / name
        value = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
        out += value if isinstance(value, list) else [value] if value is not None else []
    return out


def until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    return next((tokens[:i] for i, t in enumerate(tokens) if t in eos), tokens)


def spec_counters(llm) -> dict:
    """vLLM's spec-decode metrics (vllm/v1/spec_decode/metrics.py) from the offline engine's Prometheus snapshot."""
    out = {}
    for m in llm.get_metrics():
        name = m.name.removeprefix("vllm:spec_decode_")
        if m.name.startswith("vllm:spec_decode_"):
            out[name] = list(m.values) if hasattr(m, "values") else m.value
    return out


def chat_ids(tok, text: str) -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def counter_delta(after: dict, before: dict) -> dict:
    """The counters of the timed prompts only (the warm-up's subtracted)."""
    out = {}
    for name, value in after.items():
        prev = before.get(name)
        if isinstance(value, list):
            prev = prev or [0] * len(value)
            out[name] = [a - b for a, b in zip(value, prev, strict=False)]
        else:
            out[name] = value - (prev or 0)
    return out


def run(args) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    if args.mode == "plain":
        spec = None
    elif args.mode == "ngram":
        spec = {**NGRAM, "num_speculative_tokens": args.k}
    else:
        spec = {"method": args.mode, "model": args.draft, "num_speculative_tokens": args.k}
    extra = {}
    if args.mode == "medusa":
        draft = json.loads((Path(args.draft) / "config.json").read_text())
        if draft.get("truncated_vocab_size", draft["vocab_size"]) < draft["vocab_size"]:
            # vLLM 0.32 bug: MedusaModel.load_weights turns token_map into a parameter but leaves it out of the
            # names it returns as loaded (medusa.py:171-173, 202), so the strict check of
            # default_loader.py:track_weights_loading fails on every checkpoint with a reduced vocabulary
            # ("Following weights were not initialized from checkpoint: {'token_map'}"). Skipping that check
            # is vLLM's own switch; every tensor is still loaded.
            extra["model_loader_extra_config"] = {"enable_weights_track": False}
    t0 = time.perf_counter()
    # No prefix caching: every prompt is prefilled in full, as in blockdraft's own runs.
    llm = LLM(model=args.target, tokenizer=args.target, dtype=args.dtype, max_model_len=2048,
              speculative_config=spec, enable_prefix_caching=False, seed=0, disable_log_stats=False, **extra)
    load_s = time.perf_counter() - t0
    tok = llm.get_tokenizer()
    eos = {tok.eos_token_id} | set(eos_ids(args.target))
    records = []
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    turns = first_turns(args.questions, args.per_category)
    llm.generate([TokensPrompt(prompt_token_ids=chat_ids(tok, turns[0]["text"]))],  # warm-up, untimed, uncounted
                 SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)
    before = spec_counters(llm)
    for q in turns:
        ids = chat_ids(tok, q["text"])
        t = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=ids)], greedy, use_tqdm=False)
        dt = time.perf_counter() - t
        tokens = until_eos(list(out[0].outputs[0].token_ids), eos)  # vLLM keeps the EOS token, blockdraft not
        records.append({**q, "prompt_tokens": len(ids), "tokens": tokens, "time_s": dt,
                        "text_out": out[0].outputs[0].text})
        print(f"[{args.mode}] q{q['question_id']} ({q['category']}): {len(tokens)} tokens, {len(tokens) / dt:.1f} tok/s",
              flush=True)
    result = {"mode": args.mode, "speculative_config": spec, "llm_extra": extra, "dtype": args.dtype, "load_s": load_s,
              "records": records, "spec_decode": counter_delta(spec_counters(llm), before)}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({"mode": args.mode, "spec_decode": result["spec_decode"]}), flush=True)


def _plain_of(mode: str) -> str:
    """The run each run is compared with: its own engine's plain greedy decoding."""
    return "blockdraft-ar" if mode.startswith("blockdraft-") else "plain"


def _tokens_per_s(run: dict) -> float:
    return sum(len(x["tokens"]) for x in run["records"]) / sum(x["time_s"] for x in run["records"])


def report(paths: list[str]) -> None:
    runs = {r["mode"]: r for r in (json.loads(Path(p).read_text()) for p in paths)}
    print("| run | drafter | k | drafts | draft tokens | accepted | acceptance rate | mean acceptance length "
          "| accepted per position | tokens/s | vs own plain | vs vLLM plain | output == own plain greedy |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    vllm_plain = _tokens_per_s(runs["plain"]) if "plain" in runs else None
    for r in runs.values():
        s, recs = r["spec_decode"], r["records"]
        plain = runs.get(_plain_of(r["mode"]))
        ref = {x["question_id"]: x["tokens"] for x in plain["records"]} if plain else {}
        tps = _tokens_per_s(r)
        same = sum(ref.get(x["question_id"]) == x["tokens"] for x in recs)
        spec = r["speculative_config"] or {}
        drafts, drafted, accepted = s.get("num_drafts", 0), s.get("num_draft_tokens", 0), s.get("num_accepted_tokens", 0)
        rate = f"{accepted / drafted:.3f}" if drafted else "-"
        # vLLM's own summary (SpecDecodingLogging): mean acceptance length = 1 + accepted / drafts
        length = f"{1 + accepted / drafts:.3f}" if drafts else "-"
        per_pos = s.get("num_accepted_tokens_per_pos", [])
        own = f"{tps / _tokens_per_s(plain):.2f}x" if plain else "-"
        vs_vllm = f"{tps / vllm_plain:.2f}x" if vllm_plain else "-"
        print(f"| {r['mode']} | {Path(spec['model']).name if spec.get('model') else '-'} "
              f"| {spec.get('num_speculative_tokens', '-')} | {drafts or '-'} | {drafted or '-'} "
              f"| {accepted if drafts else '-'} | {rate} | {length} | {per_pos if per_pos else '-'} | {tps:.1f} "
              f"| {own} | {vs_vllm} | {same}/{len(recs) if plain else '-'} |")
    for r in runs.values():
        plain = runs.get(_plain_of(r["mode"]))
        if plain is None or plain is r:
            continue
        ref = {x["question_id"]: x["tokens"] for x in plain["records"]}
        for x in r["records"]:
            if ref.get(x["question_id"]) != x["tokens"]:
                a, b = ref[x["question_id"]], x["tokens"]
                i = next((j for j, (u, v) in enumerate(zip(a, b)) if u != v), min(len(a), len(b)))
                print(f"\n{r['mode']} q{x['question_id']}: first difference from {plain['mode']} at output token {i}")


def main() -> None:
    p = argparse.ArgumentParser(prog="check.py")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--target", required=True)
    r.add_argument("--questions", required=True)
    r.add_argument("--mode", required=True, choices=["plain", "ngram", "medusa", "dflash"])
    r.add_argument("--draft", default=None)
    r.add_argument("--k", type=int, default=4)
    r.add_argument("--per-category", type=int, default=2)
    r.add_argument("--max-tokens", type=int, default=64)
    r.add_argument("--dtype", default="float32")
    r.add_argument("--out", required=True)
    c = sub.add_parser("report")
    c.add_argument("paths", nargs="+")
    args = p.parse_args()
    if args.cmd == "run":
        if args.mode in ("medusa", "dflash") and not args.draft:
            sys.exit("check.py run: --draft is required with a speculative mode")
        run(args)
    else:
        report(args.paths)


if __name__ == "__main__":
    main()
