"""Server counters and gauges, rendered in the Prometheus text exposition format (no client library needed)."""

from __future__ import annotations

import threading
from collections import Counter


class Metrics:
    """Updated by the request handlers (requests) and by the worker thread (tokens, steps), read by /metrics."""

    def __init__(self):
        self._lock = threading.Lock()  # the worker thread and the event loop both write
        self.requests = Counter()  # (endpoint, outcome) -> count; outcome: ok | error | cancelled
        self.prompt_tokens = Counter()  # method -> tokens
        self.generated_tokens = Counter()  # method -> tokens
        self.target_calls = Counter()  # method -> verification passes
        self.accepted = Counter()  # method -> {drafts accepted in one step -> steps}, as (method, k)
        self.batch_sizes = Counter()  # sequences verified together in one target forward -> forwards
        self.queue_length = 0  # requests waiting for a slot
        self.active = 0  # sequences being decoded
        self.prefix_cache = (0, 0, 0, 0)  # lookups, hits, prompt tokens reused, bytes held (BatchDecoder's cache)

    def count_request(self, endpoint: str, outcome: str) -> None:
        with self._lock:
            self.requests[(endpoint, outcome)] += 1

    def count_generation(self, method: str, prompt_tokens: int, new_tokens: int, target_calls: int,
                         accepted_hist: dict[int, int]) -> None:
        with self._lock:
            self.prompt_tokens[method] += prompt_tokens
            self.generated_tokens[method] += new_tokens
            self.target_calls[method] += target_calls
            for k, steps in accepted_hist.items():
                self.accepted[(method, int(k))] += steps

    def count_batch(self, size: int, forwards: int = 1) -> None:
        with self._lock:
            self.batch_sizes[size] += forwards

    def set_load(self, queue_length: int, active: int) -> None:
        with self._lock:
            self.queue_length, self.active = queue_length, active

    def set_prefix_cache(self, cache) -> None:
        with self._lock:
            self.prefix_cache = (cache.lookups, cache.hits, cache.reused_tokens, cache.nbytes)

    def render(self) -> str:
        with self._lock:
            out: list[str] = []

            def family(name: str, kind: str, help_text: str, samples: list[tuple[dict, float]]) -> None:
                out.append(f"# HELP {name} {help_text}")
                out.append(f"# TYPE {name} {kind}")
                for labels, value in samples:
                    text = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
                    out.append(f"{name}{{{text}}} {value:g}" if text else f"{name} {value:g}")

            family("blockdraft_requests_total", "counter", "HTTP generation requests by endpoint and outcome",
                   [({"endpoint": e, "outcome": o}, n) for (e, o), n in sorted(self.requests.items())])
            family("blockdraft_prompt_tokens_total", "counter", "prompt tokens of finished generations",
                   [({"method": m}, n) for m, n in sorted(self.prompt_tokens.items())])
            family("blockdraft_generated_tokens_total", "counter", "tokens generated",
                   [({"method": m}, n) for m, n in sorted(self.generated_tokens.items())])
            family("blockdraft_target_calls_total", "counter", "target verification passes",
                   [({"method": m}, n) for m, n in sorted(self.target_calls.items())])
            family("blockdraft_tau", "gauge", "tokens per target call, bonus included, since the start",
                   [({"method": m}, self.generated_tokens[m] / c) for m, c in sorted(self.target_calls.items()) if c])
            family("blockdraft_accepted_drafts_total", "counter",
                   "decoding steps by the number of drafted tokens the target accepted",
                   [({"method": m, "accepted": k}, n) for (m, k), n in sorted(self.accepted.items())])
            family("blockdraft_acceptance_rate", "gauge",
                   "share of steps whose draft was accepted at least to this depth",
                   self._acceptance_by_depth())
            family("blockdraft_queue_length", "gauge", "requests waiting for a decoding slot",
                   [({}, self.queue_length)])
            family("blockdraft_active_sequences", "gauge", "sequences being decoded now", [({}, self.active)])
            family("blockdraft_batch_size_total", "counter",
                   "target forwards by the number of sequences verified together",
                   [({"size": s}, n) for s, n in sorted(self.batch_sizes.items())])
            lookups, hits, reused, held = self.prefix_cache
            family("blockdraft_prefix_cache_lookups_total", "counter", "prompts looked up in the prefix cache",
                   [({}, lookups)])
            family("blockdraft_prefix_cache_hits_total", "counter", "prompts that started like a cached sequence",
                   [({}, hits)])
            family("blockdraft_prefix_cache_reused_tokens_total", "counter",
                   "prompt tokens taken from the prefix cache instead of prefilled", [({}, reused)])
            family("blockdraft_prefix_cache_bytes", "gauge", "memory the prefix cache holds", [({}, held)])
            return "\n".join(out) + "\n"

    def _acceptance_by_depth(self) -> list[tuple[dict, float]]:
        samples = []
        for method in sorted({m for m, _ in self.accepted}):
            hist = {k: n for (m, k), n in self.accepted.items() if m == method}
            steps = sum(hist.values())
            for depth in range(1, max(hist) + 1):
                reached = sum(n for k, n in hist.items() if k >= depth)
                samples.append(({"method": method, "depth": depth}, reached / steps))
        return samples


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
