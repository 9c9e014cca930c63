"""Turn per-turn records into the benchmark's numbers: tau, tokens/s, speedups, losslessness."""

from __future__ import annotations

from collections import Counter, defaultdict
from statistics import mean, median


def _tps(recs) -> float:
    time_s = sum(r.time_s for r in recs)
    return sum(r.new_tokens for r in recs) / time_s if time_s > 0 else 0.0


def _block(recs_by_q: dict, ar_by_q: dict) -> dict:
    """tau, tokens/s and speedup over a set of questions (Spec-Bench: ratio of mean per-question tokens/s)."""
    recs = [r for rs in recs_by_q.values() for r in rs]
    calls = sum(r.target_calls for r in recs)
    tps = mean(_tps(rs) for rs in recs_by_q.values())
    ar_tps = mean(_tps(ar_by_q[q]) for q in recs_by_q)
    return {
        "tau": sum(r.new_tokens for r in recs) / calls if calls else 0.0,
        "tokens_per_s": tps,
        "speedup": tps / ar_tps if ar_tps else 0.0,
        "questions": len(recs_by_q),
    }


def acceptance_by_depth(hist: dict[int, int]) -> list[float]:
    """P(draft d accepted | drafts 1..d-1 accepted), from the histogram of accepted drafts per call.

    Steps that proposed fewer than d drafts count as rejections at d (rare: only near the token limit).
    """
    rates = []
    for d in range(1, max(hist, default=0) + 1):
        reached = sum(v for k, v in hist.items() if k >= d - 1)
        rates.append(sum(v for k, v in hist.items() if k >= d) / reached if reached else 0.0)
    return rates


def summarize(records: list, config: dict, design_lossless: dict[str, bool]) -> dict:
    methods = config["methods"]
    by_method_q: dict[str, dict] = {m: defaultdict(list) for m in methods}
    for r in records:
        by_method_q[r.method][r.question_id].append(r)
    # Only questions that every method finished count (Ctrl-C can stop in the middle of one).
    n_turns = {q: len(rs) for q, rs in by_method_q["ar"].items()}
    complete = [q for q in n_turns if all(len(by_method_q[m].get(q, [])) == n_turns[q] for m in methods)]
    category = {r.question_id: (r.category, r.group) for r in records}
    ar = {q: by_method_q["ar"][q] for q in complete}
    hf = {q: by_method_q["hf"][q] for q in complete} if "hf" in methods else None

    out = {"config": {**config, "complete_questions": len(complete)}, "methods": {}}
    for m in methods:
        mine = {q: by_method_q[m][q] for q in complete}
        if not mine:
            continue
        overall = _block(mine, ar)
        recs = [r for rs in mine.values() for r in rs]
        ratios = [_tps(mine[q]) / _tps(ar[q]) for q in complete if _tps(ar[q]) > 0]
        hist = Counter()
        for r in recs:
            hist.update(r.accepted_hist)
        total_time = sum(r.time_s for r in recs)
        drafted = [r for r in recs if r.draft_s is not None]
        mismatch = None
        if config.get("temperature", 0) == 0:
            for q in complete:
                for r, ref in zip(mine[q], ar[q], strict=True):
                    if r.tokens != ref.tokens and mismatch is None:
                        mismatch = {"question_id": q, "turn": r.turn + 1}
        groups: dict[str, dict] = {}
        for key_index, key in ((0, "per_category"), (1, "per_group")):
            cats = sorted({category[q][key_index] for q in complete})
            groups[key] = {c: _block({q: mine[q] for q in complete if category[q][key_index] == c}, ar)
                           for c in cats}
        out["methods"][m] = {
            **overall,
            "speedup_vs_hf": (overall["tokens_per_s"] / mean(_tps(hf[q]) for q in complete)) if hf else None,
            "median_speedup": median(ratios) if ratios else None,
            "lossless": (mismatch is None) if config.get("temperature", 0) == 0 else None,
            "lossless_by_design": design_lossless.get(m, True),
            "first_mismatch": mismatch,
            "new_tokens": sum(r.new_tokens for r in recs),
            "target_calls": sum(r.target_calls for r in recs),
            "time_s": total_time,
            "draft_share": sum(r.draft_s for r in drafted) / total_time if drafted and total_time else None,
            "verify_share": sum(r.verify_s for r in drafted) / total_time if drafted and total_time else None,
            "accepted_hist": {int(k): v for k, v in sorted(hist.items())},
            "acceptance_by_depth": acceptance_by_depth(hist),
            **groups,
        }
    out["records"] = [{k: v for k, v in vars(r).items()} for r in records]
    return out
