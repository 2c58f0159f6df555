"""What the sandbox's kernel layers cost: programs/s with every layer this kernel offers against the audit hook and
resource limits alone, the two interleaved in rounds so that load on the machine falls on both alike.

    python3 bench/sandbox.py [--programs 60] [--rounds 3] [--workers 2] [--parent-gib 0]

``--parent-gib`` makes the calling process hold that much resident memory first, as a stage holding a policy does:
what starting a program costs may grow with the caller's size.

Prints a table; nothing here is asserted.
"""
from __future__ import annotations

import argparse
import time
from unittest import mock

from posttrain import sandbox
from posttrain.confinement import available_layers

# a pot-style program: arithmetic in a function, printed
PROGRAM = "def solve():\n    x = {i} * 7 + 3\n    return (x - 4) // 2\nprint(solve())\n"


def rate(n: int, workers: int, layers: frozenset[str]) -> float:
    codes = [PROGRAM.format(i=i) for i in range(n)]
    with mock.patch.object(sandbox, "available_layers", lambda: layers):
        start = time.perf_counter()
        results = sandbox.run_programs(codes, sandbox.SandboxLimits(), workers=workers)
        seconds = time.perf_counter() - start
    assert all(r.ok for r in results), [r.reason for r in results if not r.ok][:3]
    return n / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--parent-gib", type=float, default=0.0, help="resident memory the caller holds meanwhile")
    args = ap.parse_args()
    ballast = bytearray(int(args.parent_gib * 2**30))  # zero-filled by the allocator: every page touched below
    ballast[::4096] = b"\x01" * len(range(0, len(ballast), 4096))
    layers = available_layers()
    rows = {"audit hook + limits": frozenset(), f"+ kernel ({', '.join(sorted(layers)) or 'none offered'})": layers}
    rate(4, args.workers, layers)  # warm the page cache
    rates = {name: [] for name in rows}
    for _ in range(args.rounds):
        for name, chosen in rows.items():
            rates[name].append(rate(args.programs, args.workers, chosen))
    base = sum(rates["audit hook + limits"]) / args.rounds
    print(f"caller holds {len(ballast) / 2**30:.1f} GiB")
    print(f"| sandbox | programs/s ({args.rounds} rounds of {args.programs}, {args.workers} workers) | vs hook alone |")
    print("|---|---|---|")
    for name, rs in rates.items():
        mean = sum(rs) / len(rs)
        print(f"| {name} | {mean:.1f} ({min(rs):.1f}-{max(rs):.1f}) | {mean / base:.2f}x |")


if __name__ == "__main__":
    main()
