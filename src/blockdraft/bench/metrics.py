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


def against_ar(per_question: dict | None, complete: list, turns: int) -> dict:
    """Counts over the complete questions of one method: identical turns, numeric ties, real mismatches
    (from run.compare_with_ar); `lossless` = no real mismatch. None entries: no comparison (sampling)."""
    if per_question is None:
        return {"identical_turns": None, "identical_share": None, "ties": None, "real_mismatches": None,
                "later_turns": None, "divergences": [], "lossless": None, "first_mismatch": None}
    rows = [per_question[q] for q in complete if q in per_question]
    identical = sum(r[0] for r in rows)
    found = [d for r in rows for d in r[1]]
    real = [d for d in found if not d.tie]
    return {
        "identical_turns": identical,
        "identical_share": identical / turns if turns else None,
        "ties": len(found) - len(real),
        "real_mismatches": len(real),
        "later_turns": sum(r[2] for r in rows),  # differing turns after an earlier divergence: not compared
        "divergences": [d.to_dict() for d in found],
        "lossless": not real,
        "first_mismatch": {"question_id": real[0].question_id, "turn": real[0].turn + 1} if real else None,
    }


def summarize(records: list, config: dict, design_lossless: dict[str, bool], compared: dict | None = None) -> dict:
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
        versus = against_ar(None if compared is None else compared.get(m, {}), complete, len(recs))
        groups: dict[str, dict] = {}
        for key_index, key in ((0, "per_category"), (1, "per_group")):
            cats = sorted({category[q][key_index] for q in complete})
            groups[key] = {c: _block({q: mine[q] for q in complete if category[q][key_index] == c}, ar)
                           for c in cats}
        out["methods"][m] = {
            **overall,
            "speedup_vs_hf": (overall["tokens_per_s"] / mean(_tps(hf[q]) for q in complete)) if hf else None,
            "median_speedup": median(ratios) if ratios else None,
            **versus,
            "lossless_by_design": design_lossless.get(m, True),
            "new_tokens": sum(r.new_tokens for r in recs),
            "target_calls": sum(r.target_calls for r in recs),
            # target calls the pacer made one-token steps (drafting measured not to pay, decoding/pacer.py)
            "plain_step_share": (sum(r.plain_steps for r in recs)
                                 / max(1, sum(r.target_calls for r in recs))) if drafted else None,
            "time_s": total_time,
            "draft_share": sum(r.draft_s for r in drafted) / total_time if drafted and total_time else None,
            "verify_share": sum(r.verify_s for r in drafted) / total_time if drafted and total_time else None,
            # drafting time per target call (the proposer's own cost per step, e.g. a retrieval query)
            "draft_ms_per_step": (1000 * sum(r.draft_s for r in drafted) / max(1, sum(r.target_calls for r in drafted))
                                  if drafted else None),
            "accepted_hist": {int(k): v for k, v in sorted(hist.items())},
            "acceptance_by_depth": acceptance_by_depth(hist),
            **groups,
        }
    out["records"] = [{k: v for k, v in vars(r).items()} for r in records]
    return out
