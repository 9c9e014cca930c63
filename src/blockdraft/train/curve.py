"""The learning curve of a training run: validation tau against training data seen, as markdown and PNG.

python -m blockdraft.train.curve RUN_DIR [RUN_DIR ...] --out DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def read_curve(run: Path) -> list[dict]:
    """The validation records of OUT/train_log.jsonl, in order."""
    lines = (Path(run) / "train_log.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "valid_tau_tf" in r]


def markdown(run: Path, points: list[dict]) -> str:
    seen_key = next((k for k in ("anchors_seen", "positions_seen") if points and k in points[0]), None)
    rows = [f"### {Path(run).name}", "", f"| minutes | step | {seen_key or 'seen'} | tau (teacher-forced) | "
            "top-1 agreement per depth |", "|---|---|---|---|---|"]
    for p in points:
        acc = " ".join(f"{a:.3f}" for a in p["valid_accuracy"])
        rows.append(f"| {p['minutes']:.1f} | {p['step']} | {p.get(seen_key, '-')} | {p['valid_tau_tf']:.3f} | {acc} |")
    return "\n".join(rows) + "\n"


def plot(runs: list[Path], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for run in runs:
        points = read_curve(run)
        ax.plot([p["minutes"] for p in points], [p["valid_tau_tf"] for p in points], marker="o", label=run.name)
    ax.set_xlabel("training minutes (2-core CPU)")
    ax.set_ylabel("validation tau (teacher-forced chain)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out / "training_curve.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    text = "\n".join(markdown(r, read_curve(r)) for r in args.runs)
    (args.out / "training_curve.md").write_text(text)
    print(text)
    print(f"wrote {plot(args.runs, args.out)}")


if __name__ == "__main__":
    main()
