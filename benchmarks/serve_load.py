"""A bounded load test of a running `blockdraft serve`: N requests at each concurrency, nothing lost or duplicated.

    blockdraft serve --max-batch 8 &
    python benchmarks/serve_load.py [--url http://127.0.0.1:8000] [--requests 200] [--concurrency 1,4,8]
                                    [--max-tokens 64] [--method lookup] [--api-key KEY]
    python benchmarks/serve_load.py --in-process [--threads 2] [--prefix-cache-mb 256,0] ...   # no server
    python benchmarks/serve_load.py --turns 2 ...   # conversations: turn 2 resends turn 1 and its reply
    python benchmarks/serve_load.py --system-prompt benchmarks/prompts/system_prompt.txt ...   # one shared by all

`--in-process` decodes the same requests with `BatchDecoder` in this process, each concurrency level as
closed-loop clients (a finished request is replaced by the next before the next step): the ceiling the
server would reach if HTTP, the event loop and the client cost nothing.

Requests are chat completions of Spec-Bench first turns (cycled), greedy; with `--turns 2`, each client holds a
conversation of the 80 two-turn questions (cycled): turn 1, then turn 2 with turn 1 and its reply in the history,
which is what the server's prefix cache is for, as is `--system-prompt FILE` (a system message, ~480 tokens for
the shipped one, at the start of every request). Per concurrency: answers (one per turn) and
errors, p50/p95 latency, total generated tokens/s, and the ratio to concurrency 1. Every request must get
exactly one answer, each with its own id, and a prompt's greedy text must not change with the load (in
bf16 a batched pass may flip a numeric tie: such differences are counted, not hidden). Exit code 1 when a
request was lost, duplicated or failed.
"""

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from blockdraft.bench import load_questions


def run_level(url: str, conversations: list[list[str]], n: int, concurrency: int, args) -> dict:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    client = httpx.Client(base_url=url, headers=headers, timeout=600,
                          limits=httpx.Limits(max_connections=concurrency))

    def one(i: int):
        """Conversation i, turn after turn; (i, latencies, replies (None if a turn failed), status)."""
        messages, latencies, replies = [], [], []
        for turn in conversations[i % len(conversations)]:
            messages.append({"role": "user", "content": turn})
            body = {"model": args.model, "messages": args.system + messages, "max_tokens": args.max_tokens,
                    "temperature": 0}
            if args.method:
                body["method"] = args.method
            t0 = time.perf_counter()
            r = client.post("/v1/chat/completions", json=body)
            latencies.append(time.perf_counter() - t0)
            if r.status_code != 200:
                return i, latencies, None, r.status_code
            replies.append(r.json())
            messages.append({"role": "assistant", "content": replies[-1]["choices"][0]["message"]["content"]})
        return i, latencies, replies, 200

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, range(n)))
    wall = time.perf_counter() - t0
    client.close()
    answered = [i for i, _, replies, _ in results if replies is not None]
    ids = [reply["id"] for _, _, replies, _ in results if replies is not None for reply in replies]
    latencies = sorted(lat for _, lats, replies, _ in results if replies is not None for lat in lats)
    tokens = sum(reply["usage"]["completion_tokens"] for _, _, replies, _ in results if replies is not None
                 for reply in replies)
    texts = {i: tuple(reply["choices"][0]["message"]["content"] for reply in replies)
             for i, _, replies, _ in results if replies is not None}
    return {"concurrency": concurrency, "answered": len(answered), "errors": n - len(answered),
            "lost_or_duplicated": sorted(answered) != list(range(n)) or len(set(ids)) != len(ids),
            "p50": statistics.median(latencies) if latencies else float("nan"),
            "p95": latencies[max(0, int(0.95 * len(latencies)) - 1)] if latencies else float("nan"),
            "tokens_per_s": tokens / wall, "wall_s": wall, "texts": texts,
            "statuses": sorted({status for *_, status in results if status != 200})}


def run_level_in_process(target, drafter, conversations: list[list[str]], n: int, concurrency: int, cache_mb: float,
                         args) -> dict:
    from blockdraft.decoding import BatchDecoder

    # as the server's: its slots, `concurrency` of them used
    batch = BatchDecoder(target, max_batch=args.max_batch, prefix_cache_mb=cache_mb)
    pending = [(i, []) for i in range(n)]  # (conversation, messages so far)
    started, done, latencies, tokens, prefills = {}, {}, [], 0, {1: [], 2: []}
    t0 = time.perf_counter()
    while pending or batch.active:
        while pending and len(batch.active) < concurrency:
            i, messages = pending.pop(0)
            turns = conversations[i % len(conversations)]
            messages = messages + [{"role": "user", "content": turns[len(messages) // 2]}]
            started[i] = time.perf_counter()
            batch.add(target.encode_chat(args.system + messages), drafter, max_new_tokens=args.max_tokens, seed=0,
                      tag=(i, messages))
        for seq in batch.step():
            i, messages = seq.tag
            latencies.append(time.perf_counter() - started[i])
            tokens += len(seq.result.tokens)
            prefills[len(messages) // 2 + 1].append(seq.result.stats.prefill_s)  # added to the first step's wait
            done[i] = done.get(i, ()) + (seq.result.text,)
            if len(done[i]) < len(conversations[i % len(conversations)]):  # the client's next turn, at once
                pending.insert(0, (i, messages + [{"role": "assistant", "content": seq.result.text}]))
    wall = time.perf_counter() - t0
    latencies.sort()
    return {"concurrency": f"{concurrency} (prefix cache {cache_mb:g} MB)", "answered": len(done),
            "errors": n - len(done), "lost_or_duplicated": sorted(done) != list(range(n)),
            "p50": statistics.median(latencies), "p95": latencies[max(0, int(0.95 * len(latencies)) - 1)],
            "tokens_per_s": tokens / wall, "wall_s": wall, "texts": done, "statuses": [],
            "prefix_cache": batch.prefix_cache,
            "prefill_p50": {t: statistics.median(v) for t, v in prefills.items() if v}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--concurrency", default="1,4,8")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--method", default=None, help="per-request method (default: the server's)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--model", default=None, help="the model name sent (default: the server's first in /v1/models)")
    p.add_argument("--in-process", action="store_true", help="decode the same requests here with BatchDecoder "
                   "(no server): the server's ceiling")
    p.add_argument("--threads", type=int, default=2, help="torch threads with --in-process")
    p.add_argument("--max-batch", type=int, default=8, help="the batch's slots with --in-process (as serve's)")
    p.add_argument("--prefix-cache-mb", default="256", help="the batch's prefix cache with --in-process (as serve's; "
                   "0 = off); several, comma-separated, run every concurrency with each, side by side")
    p.add_argument("--turns", type=int, choices=[1, 2], default=1,
                   help="1: first turns (default); 2: two-turn conversations, turn 2 after turn 1's reply")
    p.add_argument("--system-prompt", default=None, metavar="FILE",
                   help="a text file sent as the system message of every request (default: none)")
    args = p.parse_args()
    args.system = []
    if args.system_prompt:
        with open(args.system_prompt, encoding="utf-8") as f:
            args.system = [{"role": "system", "content": f.read().strip()}]
    questions = load_questions(None)
    conversations = ([q.turns[:1] for q in questions] if args.turns == 1 else
                     [q.turns[:2] for q in questions if len(q.turns) >= 2])
    if args.in_process:
        import torch

        from blockdraft.api import load_target
        from blockdraft.methods import make_drafter

        torch.set_num_threads(args.threads)
        target = load_target(None, compile=True)
        drafter = make_drafter(args.method or "lookup", target)
        levels = [run_level_in_process(target, drafter, conversations, args.requests, int(c), float(mb), args)
                  for mb in args.prefix_cache_mb.split(",")
                  for c in args.concurrency.split(",")]
    else:
        if args.model is None:  # OpenAI's API (and vLLM) require it; blockdraft serve checks it
            headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
            args.model = httpx.get(args.url + "/v1/models", headers=headers, timeout=60).json()["data"][0]["id"]
        levels = [run_level(args.url, conversations, args.requests, int(c), args)
                  for c in args.concurrency.split(",")]
    base = levels[0]
    unit = "conversations" if args.turns > 1 else "requests"
    shared = f", system prompt {args.system_prompt}" if args.system_prompt else ""
    print(f"{args.requests} {unit}, {args.max_tokens} tokens per reply{shared}")
    print("| concurrency | answered | errors | p50 latency (s) | p95 latency (s) | tokens/s | vs first |")
    print("|---|---|---|---|---|---|---|")
    for lv in levels:
        print(f"| {lv['concurrency']} | {lv['answered']} | {lv['errors']} | {lv['p50']:.2f} | {lv['p95']:.2f} | "
              f"{lv['tokens_per_s']:.1f} | {lv['tokens_per_s'] / base['tokens_per_s']:.2f}x |")
    for lv in levels:
        cache = lv.get("prefix_cache")
        if cache is not None:
            print(f"concurrency {lv['concurrency']}: prefix cache {cache.hits} hits of {cache.lookups} prompts, "
                  f"{cache.reused_tokens} prompt tokens reused, {cache.nbytes / 2**20:.0f} MB held at the end")
        if "prefill_p50" in lv:  # from add() to the prompt in the cache: what a reply waits before its first step
            waits = ", ".join(f"turn {t} {s:.3f} s" for t, s in lv["prefill_p50"].items())
            print(f"concurrency {lv['concurrency']}: median wait for the prompt to be in the cache: {waits}")
        if lv["errors"]:
            print(f"concurrency {lv['concurrency']}: {lv['errors']} errors, HTTP status {lv['statuses']}")
    for lv in levels[1:]:
        changed = sum(lv["texts"].get(i) != t for i, t in base["texts"].items())
        print(f"concurrency {lv['concurrency']}: {changed} of {len(base['texts'])} replies differ from concurrency "
              f"{base['concurrency']}'s (greedy: 0 in float32; bf16 ties may flip)")
    bad = any(lv["lost_or_duplicated"] or lv["errors"] for lv in levels)
    print("every request answered exactly once" if not bad else "REQUESTS LOST, DUPLICATED OR FAILED")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
