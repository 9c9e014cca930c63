"""Concurrency 8 with a prompt chunk riding the step's eager pass (as the batch engine does) against two passes (the
step on the compiled graphs, the chunk in an eager pass of its own), alternating, two runs each; issue 16's
in-process load (200 Spec-Bench first turns, 64 tokens, `lookup`, compiled, default dtype, 2 threads).

    python benchmarks/2026-12-04-c8-profile/two_pass.py      # from the repository root
"""

import sys
import types

import torch

from blockdraft.api import load_target
from blockdraft.bench import load_questions
from blockdraft.methods import make_drafter
from blockdraft.target.batch_engine import BatchEngine
from blockdraft.target.engine import in_order

sys.path.insert(0, "benchmarks")
import serve_load  # noqa: E402  (benchmarks/serve_load.py: its in-process load, unchanged)

riding = BatchEngine.forward_with_prompt


@torch.inference_mode()
def two_pass(self, first, tokens, depths, allowed, hidden_layers, slot, chunk):
    self._reserve(max(self._end(first, tokens), self._end(slot, [chunk])) + 1)
    prompt = self._rows(slot, [chunk], [torch.arange(len(chunk))], [None], "none")
    ((_, chunk_ascending),) = self.w.decoder.run([prompt], self.keys, self.values, tuple(hidden_layers))
    self._advance(slot, [chunk])
    logits, hidden = self.forward(first, tokens, depths, allowed, hidden_layers)
    return logits, hidden, in_order(chunk_ascending, hidden_layers)


def main() -> None:
    torch.set_num_threads(2)
    target = load_target(None, compile=True)
    drafter = make_drafter("lookup", target)
    conversations = [q.turns[:1] for q in load_questions(None)]
    args = types.SimpleNamespace(max_batch=8, max_tokens=64, system=[])
    texts = {}
    for name in ("riding", "two-pass", "riding", "two-pass"):
        BatchEngine.forward_with_prompt = riding if name == "riding" else two_pass
        level = serve_load.run_level_in_process(target, drafter, conversations, 200, 8, 256.0, args)
        same = sum(texts.get(i) == t for i, t in level["texts"].items()) if texts else None
        texts = texts or level["texts"]
        print(f"{name}: {level['tokens_per_s']:.1f} tok/s, wall {level['wall_s']:.1f} s, p50 {level['p50']:.2f} s, "
              f"p95 {level['p95']:.2f} s" + (f", {same}/200 texts as the first run" if same is not None else ""),
              flush=True)


if __name__ == "__main__":
    main()
