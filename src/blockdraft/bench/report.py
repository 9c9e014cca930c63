"""Write a benchmark's results.json, a Spec-Bench-style report.md and PNG plots."""

from __future__ import annotations

import json
from pathlib import Path

GROUP_ORDER = ["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"]
GROUP_TITLE = {"mt_bench": "MT-bench", "translation": "Transl.", "summarization": "Summ.", "qa": "QA",
               "math_reasoning": "Math", "rag": "RAG"}


def _fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def markdown_table(results: dict) -> str:
    methods = results["methods"]
    groups = [g for g in GROUP_ORDER if any(g in m["per_group"] for m in methods.values())]
    groups += sorted({g for m in methods.values() for g in m["per_group"]} - set(groups))
    head = ["method"] + [GROUP_TITLE.get(g, g) for g in groups] + ["overall", "tau", "tok/s", "vs hf",
                                                                    "median", "lossless"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, m in methods.items():
        cells = [name] + [_fmt(m["per_group"].get(g, {}).get("speedup")) + "x" for g in groups]
        cells += [f"**{m['speedup']:.2f}x**", _fmt(m["tau"]), _fmt(m["tokens_per_s"], ".1f"),
                  _fmt(m["speedup_vs_hf"]), _fmt(m["median_speedup"]),
                  {True: "yes", False: "NO", None: "n/a"}[m["lossless"]]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_report(results: dict) -> str:
    cfg = results["config"]
    mach = cfg["machine"]
    out = [
        "# blockdraft bench",
        "",
        f"{mach['date']} · {mach['platform']} · {mach['cpu_count']} CPUs · torch {mach['torch']} · "
        f"transformers {mach['transformers']} · {cfg['threads']} threads · "
        f"{cfg.get('dtype', '?')} on {cfg.get('device', '?')}"
        + (f" · {cfg['weights']} weights" if cfg.get("weights", "full") != "full" else "")
        + (f" · engine compiled ({cfg.get('compile_s', 0):.0f} s at load, not timed)" if cfg.get("compiled") else
           " · engine eager"),
        f"target `{cfg['target']}` · {cfg['complete_questions']} questions from `{cfg['question_file']}` "
        f"(per category: {cfg['per_category'] or 'all'}) · max {cfg['max_new_tokens']} new tokens · "
        f"temperature {cfg['temperature']}" + (" · **interrupted**" if cfg.get("interrupted") else ""),
        "",
        "Speedup = mean per-question tokens/s of the method / the same for `ar`, measured in this run.",
        "tau = tokens per target call, bonus token included. `median` = median of per-question speedups.",
        "",
        markdown_table(results),
        "",
        "## Per category (tau / speedup)",
        "",
    ]
    methods = results["methods"]
    cats = sorted({c for m in methods.values() for c in m["per_category"]})
    out.append("| method | " + " | ".join(cats) + " |")
    out.append("|" + "---|" * (len(cats) + 1))
    for name, m in methods.items():
        cells = [f"{m['per_category'][c]['tau']:.2f} / {m['per_category'][c]['speedup']:.2f}x"
                 if c in m["per_category"] else "-" for c in cats]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out += ["", "## Where the time goes", "",
            "| method | drafting | drafting per step | verifying | plain steps (paced) | accepted drafts per call "
            "| acceptance rate at depth 1, 2, ... |",
            "|---|---|---|---|---|---|---|"]
    for name, m in methods.items():
        hist = ", ".join(f"{k}: {v}" for k, v in m["accepted_hist"].items()) or "-"
        rates = " ".join(f"{r:.2f}" for r in m.get("acceptance_by_depth", [])) or "-"
        per_step = f"{m['draft_ms_per_step']:.2f} ms" if m.get("draft_ms_per_step") is not None else "-"
        out.append(f"| {name} | {_fmt(m['draft_share'], '.1%')} | {per_step} | {_fmt(m['verify_share'], '.1%')} "
                   f"| {_fmt(m.get('plain_step_share'), '.0%')} | {hist} | {rates} |")
    if cfg.get("ties") is not None:
        out += ["", "## Output against `ar`", "", tolerance_line(cfg), "", against_ar_table(results)]
    return "\n".join(out) + "\n"


def tolerance_line(cfg: dict) -> str:
    """How greedy outputs were compared: bitwise in float32, else with the measured tie tolerance."""
    t = cfg["ties"]
    if cfg.get("dtype") == "float32" or not t.get("samples"):
        return "float32: outputs must be token-identical to `ar`; every divergence is a real mismatch."
    return (f"{t['dtype']} on {t['device']}: a divergence is a *numeric tie* when the float32 logit gap between `ar`'s "
            f"token and the method's is below **{t['tolerance']:.4f}**, the {t['quantile']:.1%} quantile of "
            f"|gap(one-token steps) - gap(batched passes)| over {t['positions']} positions of {t['source']} "
            f"(max {t['max_noise']:.4f}); otherwise a *real mismatch*.")


def against_ar_table(results: dict) -> str:
    lines = ["| method | identical turns | numeric ties | real mismatches | later turns (not compared) | "
             "largest tie gap | first real mismatch |", "|---|---|---|---|---|---|---|"]
    for name, m in results["methods"].items():
        if m.get("identical_turns") is None:
            continue
        turns = m["identical_turns"] + m["ties"] + m["real_mismatches"] + m["later_turns"]
        gaps = [abs(d["gap"]) for d in m["divergences"] if d["tie"]]
        first = m["first_mismatch"]
        lines.append(f"| {name} | {m['identical_turns']}/{turns} ({m['identical_share']:.0%}) | {m['ties']} | "
                     f"{m['real_mismatches']} | {m['later_turns']} | {_fmt(max(gaps) if gaps else None, '.4f')} | "
                     + (f"question {first['question_id']}, turn {first['turn']}" if first else "-") + " |")
    return "\n".join(lines)


def _finish(fig, ax, title: str, path: Path) -> Path:
    import matplotlib.pyplot as plt

    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot(results: dict, folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = results["methods"]
    cats = sorted({c for m in methods.values() for c in m["per_category"]})
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(cats) + 2), 4))
    width = 0.8 / max(1, len(methods))
    for i, (name, m) in enumerate(methods.items()):
        xs = [j + i * width for j in range(len(cats))]
        ax.bar(xs, [m["per_category"].get(c, {}).get("speedup", 0) for c in cats], width, label=name)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cats))], cats, rotation=30, ha="right")
    ax.set_ylabel("speedup vs ar")
    speed = _finish(fig, ax, "Speedup per category", folder / "speedup_per_category.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, m in methods.items():
        hist = m["accepted_hist"]
        if hist:
            total = sum(hist.values())
            ks = sorted(hist)
            ax.plot(ks, [hist[k] / total for k in ks], marker="o", label=name)
    ax.set_xlabel("draft tokens accepted per target call")
    ax.set_ylabel("share of calls")
    hist = _finish(fig, ax, "Accepted length histogram", folder / "accepted_length_hist.png")
    return [speed, hist]


def write_report(results: dict, folder: str | Path) -> list[Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(results, indent=1))
    (folder / "report.md").write_text(markdown_report(results))
    return [folder / "results.json", folder / "report.md", *plot(results, folder)]
