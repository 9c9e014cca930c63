"""`blockdraft selfdistill`: the target's own replies to ShareGPT prompts, appended to a JSONL file.

A drafter is judged on the target's *own* output, but ShareGPT replies were written by another
model; Medusa and EAGLE both found that training on the target's regenerated replies raises
acceptance. Replies come from our own engine (`Target` + `BatchDecoder`, method `ar` or
`lookup` or any trained drafter), in the target's dtype, greedy or sampled: lossless, so they are
the target's replies, only faster. Each record keeps its ShareGPT id, so `split_conversations`
holds out the same validation conversations as for the original file (a share of held-out
prompts is answered too, for validation), and `blockdraft train --data OUT.jsonl` reads it.

With `batch` > 1 several conversations decode together through the batch engine (continuous batching:
a conversation's next turn, or the next conversation, joins as soon as a slot frees), several times the
tokens per second of one at a time on a CPU, where a forward over 8 rows costs about what one does.

On a GPU, `engine="generate"` answers instead through transformers' `generate`, `batch` (a few hundred)
left-padded prompts at a time, greedy and first turns only: there a forward over hundreds of rows costs about
what one row does, and our batch engine is built for CPUs. Batched kernels and padding can flip a numeric
near-tie, so in bf16 a reply may differ from the target's one-sequence greedy reply in rare tokens (training
data, not output we promise); in float32 they are the same (tested).

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

from ..cli_args import Parser, add_compile_arg, add_precision_args, load_target, parse_and_run, positive_int
from ..errors import BlockdraftError
from .chat import has_chat_template
from .sharegpt import data_path, load_conversations, split_conversations


def human_turns(records, turns: int):
    """(id, the first `turns` human turns) of each record that starts with a human turn."""
    for r in records:
        texts = [str(t.get("value", "")).strip() for t in r["conversations"] if t.get("from") == "human"]
        if r["conversations"] and r["conversations"][0].get("from") == "human" and texts[0]:
            yield str(r.get("id")), [t for t in texts[:turns] if t]


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


def record_seed(seed: int, rid: str, turn: int = 0) -> int:
    key = f"{seed}:{rid}" if turn == 0 else f"{seed}:{rid}:{turn}"
    return int(hashlib.sha1(key.encode()).hexdigest()[:8], 16)


def replies(target, drafter, params, prompts, max_new_tokens, max_prompt_tokens, seed, batch):
    """(id, turns, reply tokens, target calls) of each conversation that got a reply, `batch` of them decoding
    together (BatchDecoder; batch 1 is one after another), in the order they finish. Each turn has its own seed
    (from `seed`, the id and the turn) and follows the target's own earlier replies; a conversation ends at its
    last turn, at a prompt longer than `max_prompt_tokens`, or at an empty reply (nothing to learn from)."""
    from ..decoding.batch import BatchDecoder

    decoder = BatchDecoder(target, max_batch=batch)

    def next_turn(conv: dict) -> bool:
        """Queue the conversation's next turn; False when it has none (or its prompt is too long)."""
        k = len(conv["turns"]) // 2
        if k >= len(conv["texts"]):
            return False
        messages = conv["messages"] + [{"role": "user", "content": conv["texts"][k]}]
        ids = target.encode_chat(messages)
        if len(ids) > max_prompt_tokens:
            return False
        conv["messages"] = messages
        decoder.add(ids, drafter, params, max_new_tokens, seed=record_seed(seed, conv["rid"], k), tag=conv)
        return True

    prompts = iter(prompts)
    while True:
        while decoder.free:
            item = next(prompts, None)
            if item is None:
                break
            next_turn({"rid": item[0], "texts": item[1], "messages": [], "turns": [], "tokens": 0, "calls": 0})
        if not decoder.active:
            return
        for seq in decoder.step():
            if seq.error is not None:
                raise seq.error
            conv, result = seq.tag, seq.result
            more = bool(result.text.strip())
            if more:
                conv["messages"].append({"role": "assistant", "content": result.text})
                conv["turns"] += [{"from": "human", "value": conv["messages"][-2]["content"]},
                                  {"from": "gpt", "value": result.text}]
                conv["tokens"] += len(result.tokens)
                conv["calls"] += result.stats.target_calls
                more = next_turn(conv)
            if not more and conv["turns"]:
                yield conv["rid"], conv["turns"], conv["tokens"], conv["calls"]


def generated_replies(target, prompts, max_new_tokens, max_prompt_tokens, batch):
    """(id, turns, reply tokens, forwards) of each prompt's greedy first-turn reply, through transformers'
    `generate` over `batch` left-padded prompts at a time (empty replies are skipped)."""
    import torch

    from ..decoding.stopping import Stopper

    stop = target.eos_token_ids  # a property that builds its set: once, not per generated token
    eos = sorted(stop)
    # a base model's frame ends a reply at a stop string ("\nQuestion:"): generate() needs the tokenizer to see it,
    # and the reply is cut where the decoder would cut it (the text before the string)
    stopper = Stopper(stop, target.stop_strings, target.decode)
    strings = {"stop_strings": list(target.stop_strings), "tokenizer": target.tokenizer} if target.stop_strings else {}
    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else eos[0]
    prompts = iter(prompts)
    while True:
        chunk = []
        for rid, texts in prompts:
            ids = target.encode_chat([{"role": "user", "content": texts[0]}])
            if len(ids) <= max_prompt_tokens:
                chunk.append((rid, texts[0], ids))
            if len(chunk) == batch:
                break
        if not chunk:
            return
        width = max(len(ids) for _, _, ids in chunk)
        x = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros_like(x)
        for i, (_, _, ids) in enumerate(chunk):  # left padding: every prompt ends where generation starts
            x[i, width - len(ids):], mask[i, width - len(ids):] = torch.tensor(ids), 1
        with torch.inference_mode():
            out = target.model.generate(input_ids=x.to(target.device), attention_mask=mask.to(target.device),
                                        max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad,
                                        eos_token_id=eos, **strings)
        for (rid, question, _), row in zip(chunk, out[:, width:].tolist(), strict=True):
            reply = list(itertools.takewhile(lambda t: t not in stop, row))
            text = target.decode(reply)
            cut = stopper.find_stop_string(reply, 0)
            if cut is not None:
                reply, text = reply[: cut[0]], text[: cut[1]]
            if text.strip():
                turns = [{"from": "human", "value": question}, {"from": "gpt", "value": text}]
                yield rid, turns, len(reply), len(reply)


ENGINES = ("blockdraft", "generate")


def selfdistill(target, out: str | Path, method: str = "lookup", max_tokens: int = 200_000,
                max_new_tokens: int = 256, max_prompt_tokens: int = 256, data: str = "sharegpt",
                temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0,
                max_minutes: float = 0.0, turns: int = 1, valid_share: float = 0.05, batch: int = 1,
                engine: str = "blockdraft") -> dict:
    """Append the target's replies to the training split's prompts (the first `turns` human turns of each
    conversation) to `out` (JSONL) until ~max_tokens reply tokens are in the file, `batch` conversations at a
    time. Returns a summary (records and tokens written now and in total, tau, why it stopped)."""
    from ..methods import make_drafter
    from ..verify import SamplingParams

    if not has_chat_template(target.tokenizer):
        raise BlockdraftError("self-distillation needs a target with a tokenizer and a chat template")
    if min(max_tokens, max_new_tokens, max_prompt_tokens, turns, batch) < 1:
        raise BlockdraftError("--max-tokens, --max-new-tokens, --max-prompt-tokens, --turns and --batch must be "
                              "positive")
    if engine not in ENGINES:
        raise BlockdraftError(f"unknown engine '{engine}': choose one of {', '.join(ENGINES)}")
    if engine == "generate" and (temperature > 0 or turns != 1):
        raise BlockdraftError("--engine generate writes greedy first-turn replies: use --temperature 0 --turns 1, "
                              "or the blockdraft engine")
    params = SamplingParams(temperature, top_k, top_p)
    drafter = make_drafter(method, target) if engine == "blockdraft" else None
    path = data_path(data)
    train, valid = split_conversations(load_conversations(path))
    # a share of held-out prompts first, so that training can validate on the target's own replies
    n_valid = max(1, int(max_tokens * valid_share / max_new_tokens * 2))
    out = Path(out)
    done, total = done_so_far(out)
    prompts = itertools.chain(itertools.islice(human_turns(valid, turns), n_valid), human_turns(train, turns))
    prompts = ((rid, texts) for rid, texts in prompts if rid not in done)
    if engine == "generate":
        method = "ar (transformers generate, left-padded batches)"
        answered = generated_replies(target, prompts, max_new_tokens, max_prompt_tokens, batch)
    else:
        answered = replies(target, drafter, params, prompts, max_new_tokens, max_prompt_tokens, seed, batch)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0, written, new_tokens, calls, stop = time.time(), 0, 0, 0, "prompts exhausted"
    settings = {"target": target.name, "method": method, "temperature": temperature, "top_p": top_p, "top_k": top_k,
                "dtype": str(target.dtype).removeprefix("torch."), "turns": turns, "batch": batch}
    bar = tqdm(total=max_tokens, initial=min(total, max_tokens), unit="tok", desc="self-distilled replies",
               smoothing=0.05, dynamic_ncols=True)
    try:
        with out.open("a", encoding="utf-8") as f:
            if out.stat().st_size and not out.read_bytes().endswith(b"\n"):
                f.write("\n")  # after a torn last line (a killed run), start a fresh one
            while True:
                if total >= max_tokens:
                    stop = "max tokens"
                    break
                if max_minutes and time.time() - t0 >= max_minutes * 60:
                    stop = "time limit"
                    break
                item = next(answered, None)  # in a batch, conversations still decoding at a stop are dropped
                if item is None:
                    break
                rid, conversation, n, c = item
                record = {"id": rid, "conversations": conversation, "reply_tokens": n, "selfdistill": settings}
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                f.flush()  # one complete line per conversation: a killed run loses at most the one in progress
                written, total, new_tokens, calls = written + 1, total + n, new_tokens + n, calls + c
                bar.update(min(n, max(0, max_tokens - bar.n)))
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


def add_arguments(d) -> None:
    """The `blockdraft selfdistill` command's arguments (cli.py's parser and main() below both use them)."""
    d.add_argument("out", help="output .jsonl file; appended to, and the prompts it already answers are skipped")
    d.add_argument("--target", default=None, help="model name (default smollm2-135m), model folder, or .gguf file")
    add_precision_args(d)
    d.add_argument("--data", default="sharegpt", help="'sharegpt' (default) or a ShareGPT-format .json/.jsonl file")
    d.add_argument("--method", default="lookup",
                   help="the lossless method that generates: lookup (default), ar, or any trained drafter")
    d.add_argument("--max-tokens", type=positive_int, default=200_000,
                   help="reply tokens in the file at the end, earlier runs included (default 200k)")
    d.add_argument("--max-new-tokens", type=positive_int, default=256, help="longest reply (default 256)")
    d.add_argument("--max-prompt-tokens", type=positive_int, default=256,
                   help="skip prompts longer than this, earlier turns included (default 256)")
    d.add_argument("--turns", type=positive_int, default=1,
                   help="answer the first N human turns of each conversation, each given the target's own earlier "
                        "replies (default 1)")
    d.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples losslessly")
    d.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold in (0, 1] (default 1)")
    d.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0 = off)")
    d.add_argument("--seed", type=int, default=0, help="sampling seed (each reply's own is derived from it and its id)")
    d.add_argument("--max-minutes", type=float, default=None, help="stop after this long; run again to continue")
    d.add_argument("--batch", type=positive_int, default=1,
                   help="conversations decoded together (continuous batching; default 1): 8 gives several times "
                        "the tokens per second on a CPU")
    d.add_argument("--engine", default="blockdraft", choices=["blockdraft", "generate"],
                   help="blockdraft (default): our engine, any method, sampled or greedy; generate: transformers' "
                        "generate over --batch left-padded prompts, greedy first turns only (on a GPU, with "
                        "--batch 256, far more tokens a second)")
    d.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's choice)")
    add_compile_arg(d, default=True)


def command(args) -> int:
    """`blockdraft selfdistill`: check the method and sampling values, load the target, append the replies."""
    from ..methods import check_method
    from ..verify import SamplingParams, make_acceptor

    make_acceptor(None, SamplingParams(args.temperature, args.top_k, args.top_p))  # bad sampling values, first
    check_method(args.method)
    target = load_target(args)
    s = selfdistill(target, args.out, args.method, args.max_tokens, args.max_new_tokens, args.max_prompt_tokens,
                    args.data, args.temperature, args.top_p, args.top_k, args.seed, args.max_minutes or 0.0,
                    args.turns, batch=args.batch, engine=args.engine)
    print(f"wrote {s['written']} replies ({s['new_tokens']:,} tokens, tau {s['tau']:.2f}, {s['minutes']:.1f} min) to "
          f"{s['file']}: {s['records']} records, {s['total_tokens']:,} reply tokens in all; stopped: {s['stop']}")
    return 0


def main(argv=None) -> int:
    """`python -m blockdraft.data.selfdistill ...` is `blockdraft selfdistill ...`."""
    parser = Parser(prog="blockdraft selfdistill",
                    description="write the target's own replies to ShareGPT prompts (JSONL, resumable)")
    add_arguments(parser)
    return parse_and_run(parser, argv, command)


if __name__ == "__main__":
    raise SystemExit(main())
