"""`ar` on the static engine against transformers' forward and transformers' generate(), same model, one process.

    python benchmarks/engines.py --target gemma3-270m [--dtype auto] [--weights full] [--compile] [--questions 12]
                                 [--tokens 128]

The three run the same first turns of the Spec-Bench quick subset, interleaved question by question; prints
each one's median tokens/s, the ratios, and whether the outputs are identical (greedy).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from blockdraft import Target
from blockdraft.bench.questions import load_questions
from blockdraft.decoding import SpeculativeDecoder
from blockdraft.methods import make_drafter


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--weights", default="auto", help="the static engine's weights; transformers' forward and "
                   "generate() run the model with the values they dequantize to (the same model)")
    p.add_argument("--compile", action="store_true", help="compile the static engine (transformers' stays eager)")
    p.add_argument("--questions", type=int, default=12, help="first turns of the quick subset (2 per category)")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    static = Target.load(args.target, dtype=args.dtype, engine="static", compile=args.compile,
                         weights=args.weights)
    hf = Target(static.model, static.tokenizer, name=static.name, engine="hf")
    prompts = [static.encode(q.turns[0]) for q in load_questions(None, per_category=2)][: args.questions]

    def ours(target):
        decoder = SpeculativeDecoder(target, make_drafter("ar", target))
        return lambda ids: decoder.generate(ids, args.tokens).tokens

    def generate(ids):
        x = torch.tensor([ids])
        eos = sorted(static.eos_token_ids)
        out = static.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=args.tokens,
                                    do_sample=False, eos_token_id=eos, pad_token_id=eos[0],
                                    **({"stop_strings": list(static.stop_strings), "tokenizer": static.tokenizer}
                                       if static.stop_strings else {}))
        return out[0, len(ids):].tolist()

    runners = {"static": ours(static), "transformers forward": ours(hf), "hf generate": generate}
    for run in runners.values():  # warm-up
        run(prompts[0][:16])
    rates = {name: [] for name in runners}
    outputs = {name: [] for name in runners}
    with torch.inference_mode():
        for ids in prompts:
            for name, run in runners.items():
                t0 = time.perf_counter()
                tokens = run(ids)
                rates[name].append(len(tokens) / (time.perf_counter() - t0))
                outputs[name].append(tokens)
    base = statistics.median(rates["transformers forward"])
    print(f"{static.name}, {str(static.dtype).removeprefix('torch.')}, {static.weights} weights, {args.threads} "
          f"threads, static engine "
          f"{'compiled' if static.compiled else 'eager'}, {len(prompts)} first turns, {args.tokens} tokens")
    for name in runners:
        median = statistics.median(rates[name])
        same = sum(a == b for a, b in zip(outputs[name], outputs["static"], strict=True))
        print(f"  {name:22s} {median:6.1f} tok/s  {median / base:4.2f}x transformers' forward  "
              f"identical to static: {same}/{len(prompts)}")


if __name__ == "__main__":
    main()
