"""`blockdraft selfdistill`: the target's own replies to ShareGPT prompts, appended to a JSONL file.

A drafter is judged on the target's *own* output, but ShareGPT replies were written by another
model; Medusa and EAGLE both found that training on the target's regenerated replies raises
acceptance. Replies come from our own engine (`Target` + `SpeculativeDecoder`, method `ar` or
`lookup` or any trained drafter), in the target's dtype, greedy or sampled: lossless, so they are
the target's replies, only faster. Each record keeps its ShareGPT id, so `split_conversations`
holds out the same validation conversations as for the original file (a share of held-out
prompts is answered too, for validation), and `blockdraft train --data OUT.jsonl` reads it.

The output is appended one record a line and flushed: a run stopped by `--max-minutes`, Ctrl-C or
a kill continues where it stopped when started again (records already in the file are skipped,
and their reply tokens count towards `--max-tokens`). Sampled replies use a seed derived from
(seed, id), so a resumed file holds what an uninterrupted run would have written.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from pathlib import Path

from tqdm import tqdm

from ..errors import BlockdraftError
from .chat import has_chat_template
from .sharegpt import data_path, load_conversations, split_conversations


def first_prompts(records, target, max_prompt_tokens: int):
    """(id, prompt text, chat-template ids) of each record's first human turn that fits, lazily."""
    for r in records:
        turns = r["conversations"]
        if not turns or turns[0].get("from") != "human":
            continue
        text = str(turns[0].get("value", "")).strip()
        if not text:
            continue
        ids = target.encode(text)
        if len(ids) <= max_prompt_tokens:
            yield str(r.get("id")), text, ids


def done_so_far(path: Path) -> tuple[set[str], int]:
    """(ids already answered in `path`, their reply tokens); a torn last line (a killed run) is ignored."""
    ids, tokens = set(), 0
    if not path.is_file():
        return ids, tokens
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        ids.add(str(record.get("id")))
        tokens += int(record.get("reply_tokens", 0))
    return ids, tokens


def record_seed(seed: int, rid: str) -> int:
    return int(hashlib.sha1(f"{seed}:{rid}".encode()).hexdigest()[:8], 16)


def selfdistill(target, out: str | Path, method: str = "lookup", max_tokens: int = 200_000,
                max_new_tokens: int = 256, max_prompt_tokens: int = 256, data: str = "sharegpt",
                temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0,
                max_minutes: float = 0.0, valid_share: float = 0.05) -> dict:
    """Append the target's replies to the training split's prompts to `out` (JSONL) until ~max_tokens reply
    tokens are in the file. Returns a summary (records and tokens written now and in total, tau, why it stopped)."""
    from ..decoding import SpeculativeDecoder
    from ..methods import make_drafter
    from ..verify import SamplingParams

    if not has_chat_template(target.tokenizer):
        raise BlockdraftError("self-distillation needs a target with a tokenizer and a chat template")
    if min(max_tokens, max_new_tokens, max_prompt_tokens) < 1:
        raise BlockdraftError("--max-tokens, --max-new-tokens and --max-prompt-tokens must be positive")
    params = SamplingParams(temperature, top_k, top_p)
    decoder = SpeculativeDecoder(target, make_drafter(method, target), params)
    path = data_path(data)
    train, valid = split_conversations(load_conversations(path))
    # a share of held-out prompts first, so that training can validate on the target's own replies
    n_valid = max(1, int(max_tokens * valid_share / max_new_tokens * 2))
    out = Path(out)
    done, total = done_so_far(out)
    prompts = itertools.chain(itertools.islice(first_prompts(valid, target, max_prompt_tokens), n_valid),
                              first_prompts(train, target, max_prompt_tokens))
    out.parent.mkdir(parents=True, exist_ok=True)
    t0, written, new_tokens, calls, stop = time.time(), 0, 0, 0, "prompts exhausted"
    settings = {"target": target.name, "method": method, "temperature": temperature, "top_p": top_p, "top_k": top_k,
                "dtype": str(target.dtype).removeprefix("torch.")}
    bar = tqdm(total=max_tokens, initial=min(total, max_tokens), unit="tok", desc="self-distilled replies",
               smoothing=0.05, dynamic_ncols=True)
    try:
        with out.open("a", encoding="utf-8") as f:
            if out.stat().st_size and not out.read_bytes().endswith(b"\n"):
                f.write("\n")  # after a torn last line (a killed run), start a fresh one
            for rid, text, ids in prompts:
                if rid in done:
                    continue
                if total >= max_tokens:
                    stop = "max tokens"
                    break
                if max_minutes and time.time() - t0 >= max_minutes * 60:
                    stop = "time limit"
                    break
                result = decoder.generate(ids, max_new_tokens, seed=record_seed(seed, rid))
                if not result.text.strip():
                    continue  # an immediate end of turn: nothing to learn from
                record = {"id": rid, "conversations": [{"from": "human", "value": text},
                                                       {"from": "gpt", "value": result.text}],
                          "reply_tokens": len(result.tokens), "selfdistill": settings}
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                f.flush()  # one complete line per reply: a killed run loses at most the reply in progress
                written, total = written + 1, total + len(result.tokens)
                new_tokens, calls = new_tokens + len(result.tokens), calls + result.stats.target_calls
                bar.update(min(len(result.tokens), max(0, max_tokens - bar.n)))
                bar.set_postfix(tau=f"{new_tokens / max(calls, 1):.2f}",
                                tok_s=f"{new_tokens / max(time.time() - t0, 1e-9):.1f}")
    except KeyboardInterrupt:
        stop = "interrupted"
    bar.close()
    if total >= max_tokens:
        stop = "max tokens"
    return {"file": str(out), "written": written, "new_tokens": new_tokens, "total_tokens": total,
            "records": len(done) + written, "tau": new_tokens / max(calls, 1), "stop": stop,
            "minutes": (time.time() - t0) / 60}


def main(argv=None) -> int:
    """`python -m blockdraft.data.selfdistill ...` is `blockdraft selfdistill ...`."""
    import sys

    from ..cli import main as cli_main

    return cli_main(["selfdistill", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
