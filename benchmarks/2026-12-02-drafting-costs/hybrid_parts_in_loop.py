"""Where a drafter's time goes inside the real decoding loop (eager target, bf16, 2 threads).

Wraps the parts of hydra / hybrid drafting with timers and decodes 8 Spec-Bench first turns (every 40th
question), 128 tokens each, after one warm-up generation:
    python benchmarks/2026-12-02-drafting-costs/hybrid_parts_in_loop.py [METHOD] [compile]
Prints tokens/s, drafting and verification per step, tau, and each part's ms per step and per call.
"""
import time, torch, sys, json, collections, functools
from pathlib import Path
import blockdraft
torch.set_num_threads(2)
from blockdraft.api import load_target
from blockdraft.methods import make_drafter
from blockdraft.decoding import SpeculativeDecoder
import blockdraft.drafters.treeflash as tfm, blockdraft.drafters.heads as hm, blockdraft.drafters.suffix as sm, blockdraft.drafters.hybrid as hy
acc = collections.defaultdict(float); cnt = collections.Counter()
def wrap(obj, name, label):
    f = getattr(obj, name)
    @functools.wraps(f)
    def g(*a, **k):
        t0 = time.perf_counter(); r = f(*a, **k); acc[label] += time.perf_counter() - t0; cnt[label] += 1; return r
    setattr(obj, name, g)
wrap(hm.HeadsDrafter, "draft_lattice", "heads_lattice")
wrap(tfm.TreeFlashDrafter, "transitions", "transitions")
wrap(tfm, "best_first_transition_tree", "tree_builder")
wrap(tfm.TreeFlashDrafter, "scored_tree", "learned_total")
wrap(sm.SuffixDrafter, "sources", "suffix_sources")
wrap(hy.HybridDrafter, "propose", "hybrid_propose")
method = sys.argv[1] if len(sys.argv) > 1 else "hybrid"
compile_ = len(sys.argv) > 2
t = load_target(compile=compile_)
d = make_drafter(method, t)
dec = SpeculativeDecoder(t, d)
qs = [json.loads(l) for l in open(Path(blockdraft.__file__).parent / 'bench' / 'spec_bench' / 'question.jsonl')]
prompts = [q["turns"][0] for q in qs[::40]][:8]
def ids_of(p):
    ids = t.tokenizer.apply_chat_template([{"role":"user","content":p}], add_generation_prompt=True)
    return ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "input_ids") else ids
dec.generate(ids_of(prompts[0]), max_new_tokens=32)
acc.clear(); cnt.clear()
tot = dict(draft=0, verify=0, calls=0, toks=0, total=0)
for p in prompts:
    r = dec.generate(ids_of(p), max_new_tokens=128)
    s = r.stats; tot["draft"] += s.draft_s; tot["verify"] += s.verify_s; tot["calls"] += s.target_calls; tot["toks"] += s.new_tokens; tot["total"] += s.total_s
n = tot["calls"]
print(method, "tok/s %.1f" % (tot["toks"]/tot["total"]), "draft ms/step %.2f verify ms/step %.2f tau %.2f" % (tot["draft"]/n*1e3, tot["verify"]/n*1e3, tot["toks"]/n))
for k in acc: print(f"  {k:16s} {acc[k]/n*1e3:6.2f} ms/step  ({cnt[k]} calls, {acc[k]/cnt[k]*1e3:.2f} ms/call)")
