"""The method registry: every decoding method (`ar`, `lookup`, ..., `treeflash`) declared once, as a Method.

`--method NAME[:key=value...]` builds a drafter through its Method's factory; the command line's help, bench's
method validation, the server, hybrid's sources, the run-wide `--budget`, `blockdraft train --drafter` and
`blockdraft export` all read the Method. Adding a drafter is its class plus one `register(Method(...))`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .drafters import BPDDrafter, DFlashDrafter, Drafter, NoDrafter, PromptLookupDrafter, SuffixDrafter
from .drafters.hybrid import BUDGET as HYBRID_BUDGET
from .drafters.quantized import QuantizedDrafter
from .drafters.recycle import RecycleDrafter
from .errors import BlockdraftError
from .model import Target
from .model.packing import prepack_linears

CHECKPOINTS = Path(__file__).parent / "checkpoints"  # shipped drafters: CHECKPOINTS/<target name>/<method>
HYBRID_ROLES = ("retrieval", "learned")


@dataclass(frozen=True)
class Method:
    """A decoding method: what `--method NAME` builds, and what the rest of blockdraft needs to know about it."""

    name: str
    summary: str  # one line: --help, the README's methods table
    factory: Callable[..., Drafter]  # factory(target, **options) -> Drafter
    options: str = ""  # its NAME:key=value options, in a few words (--help)
    tree: bool = False  # grows a tree of budget= nodes: the run-wide --budget applies, hybrid passes its own
    hybrid: str | None = None  # one of HYBRID_ROLES: a source that hybrid's sources= may name
    trainer: str | None = None  # `blockdraft train --drafter KIND` that makes its checkpoint (train/KIND.py)
    exporter: str | None = None  # vLLM's speculative method its checkpoint exports as (`blockdraft export`)
    int4_target: bool = True  # runs beside a target with int4 weights (`quantized` lowers the target's own copy)


METHODS: dict[str, Method] = {}  # name -> Method, in the order --help lists them


def register(method: Method) -> Method:
    """Make `method` usable by name everywhere (make_drafter, the CLI, bench, serve, hybrid)."""
    if method.name in METHODS:
        raise BlockdraftError(f"method '{method.name}' is already registered")
    if method.hybrid not in (None, *HYBRID_ROLES):
        raise BlockdraftError(f"method '{method.name}': hybrid must be one of {', '.join(HYBRID_ROLES)}")
    METHODS[method.name] = method
    return method


def unregister(name: str) -> Method:
    """Remove a registered method (tests; a plugin unloading)."""
    return METHODS.pop(name)


def check_method(spec: str, also: tuple[str, ...] = ()) -> str:
    """The method name of `spec`, refused in one line unless registered (or one of `also`)."""
    name = parse_method(spec)[0]
    if name not in METHODS and spec not in also:
        raise BlockdraftError(f"unknown method '{name}': choose one of {', '.join([*METHODS, *also])}")
    return name


def shipped_checkpoint(target: Target, method: str, train_as: str) -> Path:
    folder = CHECKPOINTS / target.name / method
    if not (folder / "config.json").is_file():
        raise BlockdraftError(
            f"no '{method}' drafter ships for target '{target.name}': train one with `blockdraft train --drafter "
            f"{train_as} --target {target.name} --out DIR`, then use --method {method}:checkpoint=DIR")
    return folder


def trained(cls, method: str) -> Callable[..., Drafter]:
    """Factory for a trained drafter: the shipped checkpoint for this target, or `checkpoint=DIR`."""
    def factory(target: Target, checkpoint: str | None = None, **options) -> Drafter:
        return cls.from_pretrained(checkpoint or shipped_checkpoint(target, method, method), target, **options)
    return factory


def shipped_rescorer(target: Target, kind: str, folder: str | None):
    """The n-gram or neural rescoring LM: `lm=DIR`, else the one shipped for this target."""
    from .refine.neural import NeuralRescorer
    from .refine.ngram import NGramLM

    train_as = {"ngram": "ngram --order 4", "neural": "neural"}[kind]
    folder = folder or shipped_checkpoint(target, kind, train_as)
    if kind == "neural":
        return NeuralRescorer.from_pretrained(folder, target)
    return NGramLM.load(folder, target=target)


def rescored(base: str, kind: str, mode: str, alpha: float) -> Callable[..., Drafter]:
    """Factory for a refined drafter: base drafter options (checkpoint=, top_k=, ...) plus
    lm=DIR (the rescoring LM), alpha= (its weight), mode=local|global and p= (paths, global mode)."""
    def factory(target: Target, lm: str | None = None, alpha: float = alpha, mode: str = mode, p: int = 16,
                beam: int = 256, **options) -> Drafter:
        from .refine.drafter import RescoredDrafter

        drafter = METHODS[base].factory(target, **options)
        return RescoredDrafter(drafter, shipped_rescorer(target, kind, lm), mode, alpha, p, beam)
    return factory


def rest_method(target: Target, datastore: str | None = None, **options) -> Drafter:
    """REST: `datastore=DIR` (from `blockdraft train --drafter datastore`), else one shipped for this target,
    else the cached one, built from ShareGPT's training split on first use; plus RestDrafter's options."""
    from .drafters.rest import Datastore, RestDrafter
    from .train.datastore import default_datastore

    shipped = CHECKPOINTS / target.name / "datastore"
    if datastore or (shipped / "config.json").is_file():
        store = Datastore.load(datastore or shipped, target)
    else:
        store = default_datastore(target)
    return RestDrafter(store, **options)


def default_hybrid_sources(target: Target) -> str:
    """suffix plus the first learned drafter that ships for this target (hydra, then treeflash), else recycle."""
    for learned in ("hydra", "treeflash"):
        if (CHECKPOINTS / target.name / learned / "config.json").is_file():
            return f"suffix+{learned}"
    return "suffix+recycle"


def hybrid_method(target: Target, sources: str | None = None, budget: int = HYBRID_BUDGET, skip: float = 4.0,
                  weights: str | None = None, cost: str = "auto", learned_budget: int = 16,
                  gate: bool = True, **learned_options) -> Drafter:
    """Factory for `hybrid`: sources= (separated by + or ,: the methods registered with hybrid="retrieval", and at
    most one with hybrid="learned"; default: default_hybrid_sources),
    weights= (one multiplier per source, same order), budget= (nodes at most), skip= (expected accepted
    tokens from retrieval above which the learned drafter is not run), gate=true|false (run the learned
    drafter only where its measured gain pays for its measured time), cost=auto|off (cost-aware size); any other
    option goes to the learned drafter (e.g. checkpoint=, module=, parents=)."""
    from .drafters.hybrid import HybridDrafter
    from .trees.budget import cost_curve

    sources = sources or default_hybrid_sources(target)
    # '+' separates sources inside bench's comma-separated --methods list; ',' works elsewhere
    names = [n.strip() for n in str(sources).replace("+", ",").split(",") if n.strip()]
    factors = ([float(w) for w in str(weights).replace("+", ",").split(",")] if weights is not None
               else [1.0] * len(names))
    if len(factors) != len(names):
        raise BlockdraftError(f"hybrid: {len(names)} sources but {len(factors)} weights")
    retrieval, learned = {}, None
    for name in names:
        source = METHODS.get(name)
        role = source.hybrid if source else None
        if role == "retrieval":
            retrieval[name] = source.factory(target)
        elif role == "learned" and learned is None:
            sized = {"budget": learned_budget} if source.tree else {}  # a chain (quantized): its length is its own
            learned = (name, source.factory(target, **sized, **learned_options))
        else:
            def having(r):
                return ", ".join(m.name for m in METHODS.values() if m.hybrid == r)
            raise BlockdraftError(f"hybrid: unknown or repeated source '{name}': use {having('retrieval')} and "
                                  f"one of {having('learned')}")
    if learned is None and learned_options:
        raise BlockdraftError(f"hybrid: option(s) {', '.join(learned_options)} need a learned source")
    if cost not in ("auto", "off"):
        raise BlockdraftError(f"hybrid: cost must be auto or off, got '{cost}'")
    curve = cost_curve(target) if cost == "auto" else None
    if not isinstance(gate, bool):
        raise BlockdraftError(f"hybrid: gate must be true or false, got '{gate}'")
    return HybridDrafter(retrieval, learned, budget, curve, skip, dict(zip(names, factors, strict=True)), gate)


def tree_method(base: str, builder: str, budget: int = 16) -> Callable[..., Drafter]:
    """Factory for a tree method: budget=B (draft nodes), prior=A (weight of the shipped n-gram LM
    in best-first scores, 0 = off), lm=DIR (another n-gram LM), plus the base drafter's options."""
    def factory(target: Target, budget: int | str = budget, prior: float = 0.0, lm: str | None = None,
                sample: bool = False, draft_temp: float = 1.0, **options) -> Drafter:
        from .trees.budget import cost_curve
        from .trees.drafter import TreeDrafter

        ngram = shipped_rescorer(target, "ngram", lm) if prior > 0 else None
        curve = cost_curve(target) if budget == "auto" else None
        return TreeDrafter(METHODS[base].factory(target, **options), builder, budget, ngram, prior, cost_curve=curve,
                           sample=sample, vocab_size=target.vocab_size, draft_temp=draft_temp)
    return factory


def ar_tree(base: str, method: str, train_as: str) -> Callable[..., Drafter]:
    """Factory for a parent-conditioned tree method: the base drafter (its options) + its AR-approximation
    module (`module=DIR`), best-first over transition tables; budget=, parents= (M), children= (K);
    sample=1: at T > 0 children are sampled from the module's distribution, with q (trees/sampled.py), drawn at
    draft_temp= times the decoder's temperature (default 1); columns=N: children only among each depth's N
    likeliest marginal tokens (default 128; 0: the whole draft vocabulary).
    The budget defaults to 'auto': sized per step by the cost curve at the current context length, which on
    held-out ShareGPT matched a fixed 16 nodes and at long contexts kept the trees ahead of `ar`."""
    def factory(target: Target, module: str | None = None, budget: int | str = "auto", parents: int = 8,
                children: int = 8, sample: bool = False, draft_temp: float = 1.0, columns: int | None = None,
                **options) -> Drafter:
        from .drafters.treeflash import TreeFlashDrafter
        from .trees.budget import cost_curve

        drafter = METHODS[base].factory(target, **options)
        folder = module or shipped_checkpoint(target, method, train_as)
        curve = cost_curve(target) if budget == "auto" else None
        return TreeFlashDrafter.from_pretrained(folder, target, drafter, budget=budget, parents=parents,
                                                children=children, cost_curve=curve, sample=sample,
                                                draft_temp=draft_temp,
                                                **({} if columns is None else {"columns": columns}))
    return factory


TREE_OPTIONS = "budget=N|auto prior= lm=DIR sample= draft_temp=, and the base drafter's"
AR_TREE_OPTIONS = "module=DIR budget=N|auto parents= children= sample= draft_temp= columns=, and the base drafter's"
RESCORED_OPTIONS = "lm=DIR alpha= mode=local|global p= beam=, and the base drafter's"

register(Method("ar", "plain autoregressive decoding through the same Target code (baseline)",
                lambda target, **kw: NoDrafter()))
register(Method("lookup", "prompt lookup decoding (training-free n-gram copy)",
                lambda target, **kw: PromptLookupDrafter(**kw),
                "max_ngram= min_ngram= num_tokens= max_branches= min_gain="))
register(Method("suffix", "SuffixDecoding: frequency-ranked suffix matches in the request and in earlier outputs "
                          "(training-free)", lambda target, **kw: SuffixDrafter(**kw),
                "budget= factor= min_prob= depth= max_match= global_tree= max_global=", hybrid="retrieval"))
register(Method("recycle", "token recycling: best-first trees over the target's own top-k from earlier passes "
                           "(training-free)", lambda target, **kw: RecycleDrafter(target.vocab_size, **kw),
                "k= budget= depth= min_prob=", hybrid="retrieval"))
register(Method("quantized", "self-speculation: a float16/int8 copy of the target drafts a chain on its cache "
                             "(training-free)", QuantizedDrafter, "depth= min_prob= weights=auto|float16|int8",
                hybrid="learned", int4_target=False))
register(Method("rest", "REST: longest-suffix retrieval from a ShareGPT datastore, merged into a trie", rest_method,
                "datastore=DIR budget= depth= max_match= occurrences= min_prob= min_match=", hybrid="retrieval",
                trainer="datastore"))
register(Method("hybrid", "one tree from several sources (suffix, rest, treeflash/hydra), ranked by "
                          "online-calibrated acceptance, sized by the cost curve", hybrid_method,
                "sources=A+B weights= budget= skip= gate= cost=auto|off learned_budget=, and the learned source's"))
register(Method("bpd", "blockwise parallel decoding heads on the target's state (chain)", trained(BPDDrafter, "bpd"),
                "checkpoint=DIR top_k= num_heads=", trainer="bpd", exporter="medusa"))
register(Method("dflash", "one-shot block drafter fed with target features (chain)", trained(DFlashDrafter, "dflash"),
                "checkpoint=DIR top_k= depth=", trainer="dflash", exporter="dflash"))
register(Method("medusa", "BPD heads, Medusa's static top-k tree (16 nodes)", tree_method("bpd", "static"),
                TREE_OPTIONS, tree=True))
register(Method("bpd-tree", "BPD heads, best-first tree over the heads' marginals (budget 16)",
                tree_method("bpd", "best"), TREE_OPTIONS, tree=True, hybrid="learned"))
register(Method("ddtree", "block drafter, best-first tree over its marginals (DDTree, budget 16)",
                tree_method("dflash", "best"), TREE_OPTIONS, tree=True, hybrid="learned"))
register(Method("treeflash", "block drafter + AR-approximation module, best-first tree over transition tables "
                             "(TreeFlash), budget auto", ar_tree("dflash", "treeflash", "treeflash --init DFLASH_DIR"),
                AR_TREE_OPTIONS, tree=True, hybrid="learned", trainer="treeflash"))
register(Method("hydra", "BPD heads + the same AR module (parent-conditioned, Hydra-like), best-first tree, "
                         "budget auto", ar_tree("bpd", "hydra", "treeflash --init BPD_DIR"),
                AR_TREE_OPTIONS, tree=True, hybrid="learned", trainer="treeflash"))
register(Method("bpd-ngram", "BPD heads, the p best lattice paths under a 4-gram LM, verified as one tree",
                rescored("bpd", "ngram", "global", 0.5), RESCORED_OPTIONS, trainer="ngram"))
register(Method("bpd-neural", "BPD heads, draft rescored left to right by a small LM",
                rescored("bpd", "neural", "local", 0.5), RESCORED_OPTIONS, trainer="neural"))
register(Method("dflash-ngram", "block drafter, the p best lattice paths under a 4-gram LM, verified as one tree",
                rescored("dflash", "ngram", "global", 0.5), RESCORED_OPTIONS, trainer="ngram"))
register(Method("dflash-neural", "block drafter, draft rescored left to right by a small LM",
                rescored("dflash", "neural", "local", 0.5), RESCORED_OPTIONS, trainer="neural"))


def with_budget(spec: str, budget: str | int | None) -> str:
    """Apply a run-wide `--budget` to a tree method spec (an explicit budget= in the spec wins)."""
    name, options = parse_method(spec)
    if budget is None or name not in METHODS or not METHODS[name].tree or "budget" in options:
        return spec
    return f"{spec}:budget={budget}"


def parse_method(spec: str) -> tuple[str, dict]:
    """'lookup:min_ngram=1:num_tokens=6' -> ('lookup', {'min_ngram': 1, 'num_tokens': 6}).

    Options let one benchmark run compare variants of a method side by side.
    """
    name, *pairs = spec.strip().split(":")
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BlockdraftError(f"bad method option '{pair}' in '{spec}': write NAME:key=value[:key=value]")
        for cast in (int, float):
            try:
                value = cast(value)
                break
            except ValueError:
                pass
        else:
            value = {"true": True, "false": False}.get(value.lower(), value)
        options[key] = value
    return name, options


def make_drafter(method: str, target: Target, **options) -> Drafter:
    """Build the drafter for a method name or spec ('lookup', 'lookup:max_branches=3')."""
    name, spec_options = parse_method(method)
    check_method(method)
    options = {**spec_options, **options}
    int8 = options.pop("int8", "auto")
    if int8 not in (True, False, "auto"):
        raise BlockdraftError(f"int8 must be true, false or auto, got '{int8}'")
    try:
        drafter = METHODS[name].factory(target, **options)
    except (TypeError, ValueError) as e:  # an unknown option, or a value of the wrong kind (weights=x)
        raise BlockdraftError(f"bad option for method '{name}': {e}") from None
    drafter.name = method
    prepack_linears(drafter, int8)  # decoding only: training builds its modules elsewhere
    return drafter
