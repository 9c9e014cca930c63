"""`blockdraft analyze`: Kim et al.'s analyses of a lattice drafter (entropy, repetition, oracle headroom).

For every question the target's greedy reply is generated once (with the drafter itself, which
also gives its real tau). Then the drafter is run teacher-forced at *every* position of that
reply, so each position t has the lattice the drafter would propose with root t. Greedy
decoding is deterministic, so from these lattices we can replay any drafting rule exactly:
a step at root t accepts the longest draft prefix that equals the reply's next tokens, and the
next step starts after it. That replays plain BPD (top-1 chain), rescored drafts, and the
oracle that may pick any of the top-k tokens per depth (the lattice's upper bound).
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..decoding import SpeculativeDecoder
from ..drafters import DraftContext, DraftLattice
from ..errors import BlockdraftError
from ..methods import make_drafter
from ..refine.drafter import RescoredDrafter
from ..refine.search import local_rescore, pbest_paths
from ..drafters.treeflash import TreeFlashDrafter
from ..trees.drafter import TreeDrafter
from .questions import Question
from .report import _finish

ORACLE_K = (1, 2, 4, 8, 16)


@dataclass
class QuestionAnalysis:
    category: str
    tau: float  # real decoding run of the base drafter
    entropy: list[float]  # mean entropy per depth
    oracle: dict[int, float]  # k -> replayed block efficiency with the oracle top-k path
    replayed: dict[str, float]  # method -> replayed tau
    repetition: dict[str, tuple[float, float]] = field(default_factory=dict)  # draft -> (identical share, run)


def teacher_forced_lattices(target, drafter, prompt: list[int], reply: list[int]):
    """The drafter's lattice at every root position of prompt + reply (index i: root = reply position i-1),
    and the drafter's per-depth states and logits there (None if it keeps none), which TreeFlash and Hydra read."""
    seq = prompt + reply
    target.feature_layers = drafter.feature_layers
    feats = target.prefill(seq[:-1])
    drafter.reset(prompt)
    lattices, hidden, prev = [], [], 0
    for t in range(len(prompt) - 1, len(seq) - 1):
        f = feats[prev:t] if feats is not None else None
        prev = t
        lattices.append(drafter.lattice(DraftContext(seq[: t + 1], f, max_depth=1 << 20)))
        hidden.append((getattr(drafter, "last_hidden", None), getattr(drafter, "last_logits", None)))
    return lattices, hidden


def accepted_length(paths: list[list[int]], truth: list[int]) -> int:
    """Longest prefix of any path that matches the true continuation."""
    best = 0
    for path in paths:
        n = 0
        while n < min(len(path), len(truth)) and path[n] == truth[n]:
            n += 1
        best = max(best, n)
    return best


def replay(drafts, truth_at, n_positions: int) -> float:
    """Block efficiency of a drafting rule: drafts(i) -> candidate paths at root index i."""
    i, steps, tokens = 0, 0, 0
    while i < n_positions:
        # at most the drafts the decoder has room for: its last step drafts up to the end and emits the bonus there
        n = min(accepted_length(drafts(i), truth_at(i)), n_positions - i - 1)
        steps += 1
        tokens += n + 1
        i += n + 1
    return tokens / max(steps, 1)


def oracle_paths(lattice: DraftLattice, truth: list[int], k: int) -> list[list[int]]:
    """The oracle's draft: follow the truth while it is among the top-k, then stop."""
    path = []
    for d, tok in enumerate(truth[: lattice.depth]):
        if tok not in lattice.tokens[d, :k].tolist():
            break
        path.append(tok)
    return [path]


def refined_paths(drafter, lattice: DraftLattice, history: list[int], hidden=(None, None)) -> list[list[int]]:
    """The drafts a rescored or tree drafter would propose from this lattice (a tree: its root-to-leaf paths)."""
    base = drafter.base
    k = getattr(base, "top_k", lattice.tokens.shape[1])
    lat = DraftLattice(lattice.tokens[:, :k], lattice.logp[:, :k], lattice.entropy)
    if isinstance(drafter, (TreeDrafter, TreeFlashDrafter)):
        # replay: hand the recorded lattice (and per-depth states) to the drafter's tree builder
        base.lattice = lambda ctx: lat
        base.last_hidden, base.last_logits = hidden
        tree = drafter.propose(DraftContext(list(history), None, max_depth=lat.depth))
        leaves = [i for i, ch in enumerate(tree.children) if not ch]
        return [tree.tokens[tree.path_to(i)[1:]].tolist() for i in leaves]
    if drafter.mode == "local":
        return [local_rescore(lat, history, drafter.rescorer, drafter.alpha)]
    return pbest_paths(lat, history, drafter.rescorer, drafter.alpha, drafter.p, beam=drafter.beam)[0].tolist()


def repetition(drafts: list[list[int]]) -> tuple[float, float]:
    """(share of neighbouring draft tokens that are identical, mean longest run of one repeated token)."""
    same = pairs = 0
    runs = []
    for d in drafts:
        eq = [a == b for a, b in itertools.pairwise(d)]
        same, pairs = same + sum(eq), pairs + len(eq)
        longest = run = 1
        for e in eq:
            run = run + 1 if e else 1
            longest = max(longest, run)
        runs.append(longest if d else 0)
    return same / max(pairs, 1), float(np.mean(runs)) if runs else 0.0


def h_max(entropy: list[float]) -> int:
    """Largest head index (1-based) up to which the mean entropy rises monotonically."""
    h = 1
    while h < len(entropy) and entropy[h] > entropy[h - 1]:
        h += 1
    return h


def analyze_prompt(target, base, refiners: dict[str, RescoredDrafter], prompt: list[int], category: str,
                   max_new_tokens: int) -> QuestionAnalysis | None:
    """All measures for one prompt (None when the reply is too short to say anything)."""
    run = SpeculativeDecoder(target, base).generate(prompt, max_new_tokens=max_new_tokens)
    reply = run.tokens
    if len(reply) < 2:
        return None
    lattices, hidden = teacher_forced_lattices(target, base, prompt, reply)
    seq = prompt + reply
    P = len(prompt) - 1  # root index of lattice 0 in seq

    def truth_at(i):
        return seq[P + i + 1 : P + i + 1 + lattices[i].depth]

    n = len(lattices)
    oracle = {k: replay(lambda i, k=k: oracle_paths(lattices[i], truth_at(i), k), truth_at, n) for k in ORACLE_K}
    replayed, rep = {}, {"top-1": repetition([lat.best().tolist() for lat in lattices])}
    for name, drafter in refiners.items():
        drafts = [refined_paths(drafter, lattices[i], seq[: P + i + 1], hidden[i]) for i in range(n)]
        replayed[name] = replay(drafts.__getitem__, truth_at, n)
        if isinstance(drafter, RescoredDrafter):  # a tree has no single draft to inspect
            rep[name] = repetition([d[0] for d in drafts])
    entropy = torch.stack([lat.entropy for lat in lattices]).mean(0).tolist()
    return QuestionAnalysis(category, run.stats.tau, entropy, oracle, replayed, rep)


def summarize(rows: list[QuestionAnalysis]) -> dict:
    """Means per category and overall."""
    groups = defaultdict(list)
    for r in rows:
        groups[r.category].append(r)
        groups["overall"].append(r)
    out = {}
    for cat, rs in groups.items():
        entropy = np.mean([r.entropy for r in rs], axis=0).tolist()
        out[cat] = {
            "questions": len(rs),
            "tau": float(np.mean([r.tau for r in rs])),
            "entropy": entropy,
            "h_max": h_max(entropy),
            "oracle": {k: float(np.mean([r.oracle[k] for r in rs])) for k in ORACLE_K},
            "replayed": {m: float(np.mean([r.replayed[m] for r in rs])) for m in rs[0].replayed},
            "repetition": {d: [float(np.mean([r.repetition[d][j] for r in rs])) for j in (0, 1)]
                           for d in rs[0].repetition},
        }
    return out


def markdown(summary: dict, base: str, command: str) -> str:
    cats = [c for c in summary if c != "overall"] + ["overall"]
    refiners = list(summary["overall"]["replayed"])
    lines = [f"# Draft analysis: `{base}`", "", f"Command: `{command}`", "",
             "tau = real decoding run of the base drafter; oracle k = block efficiency if the drafter could pick, "
             "at every depth, whichever of its top-k tokens the target wants (upper bound of the lattice); "
             "refined methods are replayed exactly on the target's greedy reply.", "",
             "## Block efficiency", "",
             "| category | n | tau | " + " | ".join(f"oracle k={k}" for k in ORACLE_K) + " | "
             + " | ".join(refiners) + " |",
             "|---" * (3 + len(ORACLE_K) + len(refiners)) + "|"]
    for c in cats:
        s = summary[c]
        lines.append(f"| {c} | {s['questions']} | {s['tau']:.3f} | "
                     + " | ".join(f"{s['oracle'][k]:.3f}" for k in ORACLE_K) + " | "
                     + " | ".join(f"{s['replayed'][m]:.3f}" for m in refiners) + " |")
    lines += ["", "## Head entropy (nats, mean per depth) and h_max", "",
              "| category | h_max | entropy per depth |", "|---|---|---|"]
    for c in cats:
        s = summary[c]
        lines.append(f"| {c} | {s['h_max']} | " + " ".join(f"{e:.2f}" for e in s["entropy"]) + " |")
    drafts = list(summary["overall"]["repetition"])
    lines += ["", "## Consecutive repetition in drafts (identical neighbours / mean longest run)", "",
              "| category | " + " | ".join(drafts) + " |", "|---" * (1 + len(drafts)) + "|"]
    for c in cats:
        r = summary[c]["repetition"]
        lines.append(f"| {c} | " + " | ".join(f"{r[d][0]:.1%} / {r[d][1]:.2f}" for d in drafts) + " |")
    return "\n".join(lines) + "\n"


def plots(summary: dict, folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for c, s in summary.items():
        ax.plot(range(1, len(s["entropy"]) + 1), s["entropy"], marker="o", lw=2.5 if c == "overall" else 1, label=c)
    ax.set_xlabel("head / depth")
    ax.set_ylabel("mean entropy (nats)")
    paths = [_finish(fig, ax, "Draft entropy per depth", folder / "entropy.png")]

    s = summary["overall"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ORACLE_K, [s["oracle"][k] for k in ORACLE_K], marker="o", label="oracle top-k")
    ax.axhline(s["tau"], color="k", ls="--", label="tau (real run)")
    for m, v in s["replayed"].items():
        ax.axhline(v, ls=":", color=ax._get_lines.get_next_color(), label=m)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("block efficiency")
    paths.append(_finish(fig, ax, "Oracle top-k headroom", folder / "oracle.png"))
    return paths


def analyze(target, questions: list[Question], drafter: str = "bpd", refiners: tuple[str, ...] = (),
            max_new_tokens: int = 128, out: str | Path = "runs/analyze", command: str = "") -> dict:
    base = make_drafter(drafter, target, top_k=max(ORACLE_K))
    if not hasattr(base, "lattice"):
        raise BlockdraftError(f"method '{drafter}' has no top-k lattice to analyse: use bpd or dflash")
    refined = {}
    for spec in refiners:
        r = make_drafter(spec, target)
        if not isinstance(r, (RescoredDrafter, TreeDrafter, TreeFlashDrafter)):
            raise BlockdraftError(f"'{spec}' is neither a rescored nor a tree method (bpd-ngram, ddtree, ...)")
        if type(r.base) is not type(base):
            raise BlockdraftError(f"'{spec}' refines another drafter than '{drafter}'")
        refined[spec] = r
    rows = [analyze_prompt(target, base, refined, target.encode(q.turns[0]), q.category, max_new_tokens)
            for q in tqdm(questions, desc="analyze", unit="question")]
    rows = [r for r in rows if r is not None]
    if not rows:
        raise BlockdraftError("every reply was too short to analyse: raise --max-new-tokens")
    summary = summarize(rows)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "analysis.json").write_text(json.dumps(summary, indent=1))
    (folder / "report.md").write_text(markdown(summary, drafter, command))
    plots(summary, folder)
    return summary
