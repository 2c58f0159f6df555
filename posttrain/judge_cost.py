"""What the judge cost: calls (cache hits are free), tokens in and out, money at the params' prices, and
failures by kind. Thread-safe: the judge client's worker threads add to one ledger.

Example:
    >>> ledger = CostLedger(price_in_per_1k=0.5, price_out_per_1k=2.0)
    >>> ledger.add(tokens_in=1000, tokens_out=500)
    >>> ledger.cost
    1.5
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class CostLedger:
    """What the judge cost: calls made (cache hits are free), tokens, money, failures by kind."""

    price_in_per_1k: float
    price_out_per_1k: float
    calls: int = 0
    cache_hits: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, tokens_in: int, tokens_out: int) -> None:
        with self.lock:
            self.calls += 1
            self.tokens_in += tokens_in
            self.tokens_out += tokens_out

    def fail(self, kind: str) -> None:
        with self.lock:
            self.failures[kind] = self.failures.get(kind, 0) + 1

    @property
    def cost(self) -> float:
        return self.tokens_in / 1000 * self.price_in_per_1k + self.tokens_out / 1000 * self.price_out_per_1k

    def state_dict(self) -> dict:
        """The counts, for a checkpoint (a resumed run's ledger then covers the whole run)."""
        with self.lock:
            return {"calls": self.calls, "cache_hits": self.cache_hits, "tokens_in": self.tokens_in,
                    "tokens_out": self.tokens_out, "failures": dict(self.failures)}

    def load_state_dict(self, state: dict) -> None:
        with self.lock:
            self.calls, self.cache_hits = state["calls"], state["cache_hits"]
            self.tokens_in, self.tokens_out, self.failures = state["tokens_in"], state["tokens_out"], state["failures"]

    def as_metrics(self, prefix: str = "judge.") -> dict[str, float]:
        out = {"calls": self.calls, "cache_hits": self.cache_hits, "tokens_in": self.tokens_in,
               "tokens_out": self.tokens_out, "cost": self.cost,
               "failures": sum(self.failures.values())}
        out.update({f"failures.{k}": v for k, v in self.failures.items()})
        return {f"{prefix}{k}": float(v) for k, v in out.items()}
