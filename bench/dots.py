"""Benchmark of DOTS: accuracy of every static trajectory vs the internalized and external DOTS planners vs
vanilla SFT, per difficulty; mean actions per difficulty; search cost; sandbox throughput.

    python3 bench/dots.py            # in a workspace where `dvc repro` has run (reads its reports)

Prints a report; nothing here is asserted.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from posttrain.evaluation import program_of
from posttrain.sandbox import run_programs
from posttrain.task.arithmetic import generate_problems
from posttrain.task.solutions import render_response
from posttrain.trajectories import BY_NAME


def accuracy_table(metrics: dict) -> list[tuple[str, dict]]:
    """(label, {"accuracy", "by_difficulty"}) rows: static trajectories, then DOTS and vanilla SFT."""
    rows = [(f"static {fmt}", fs) for fmt, fs in metrics["warmup"]["by_format"].items() if fmt != "own_choice"]
    rows.append(("warm-up, own choice", metrics["warmup"]["by_format"]["own_choice"]))
    for name, label in (("dots_internal", "DOTS internalized"), ("dots_external", "DOTS external planner"),
                        ("sft_vanilla", "vanilla SFT")):
        if name in metrics:
            rows.append((label, metrics[name]))
    return rows


def question_group(rec: dict) -> str:
    """The kind of a test question; ``repeat`` split by whether a loop over its count can finish."""
    if rec.get("kind") != "repeat":
        return rec.get("kind", "chain")
    return "repeat, huge n" if max(s[2] for s in rec["steps"] if len(s) > 2) >= 10**8 else "repeat, small n"


def kind_table(responses: list[dict], records: dict[str, dict]) -> dict[str, dict[str, float]]:
    """{system: {group: accuracy}}: static trajectories of the warm-up model, DOTS and vanilla, per question kind."""
    cells: dict[str, dict[str, list[bool]]] = {}
    for r in responses:
        system = f"static {r['format']}" if r["model"] == "warmup" else r["model"]
        cells.setdefault(system, {}).setdefault(question_group(records[r["id"]]), []).append(r["correct"])
    return {system: {g: sum(v) / len(v) for g, v in sorted(groups.items())} for system, groups in cells.items()}


def print_kind_table(table: dict[str, dict[str, float]]) -> None:
    groups = sorted({g for row in table.values() for g in row})
    print("\ntest accuracy by question kind (best static per kind marked *)")
    print(f"{'':28}" + "".join(f"{g:>17}" for g in groups))
    static = {s: row for s, row in table.items() if s.startswith("static") and s != "static own_choice"}
    best = {g: max(static, key=lambda s: static[s].get(g, 0)) for g in groups}
    for system, row in table.items():
        print(f"{system:28}" + "".join(f"{row.get(g, 0):16.2f}{'*' if best[g] == system else ' '}" for g in groups))
    print("best static per kind: " + ", ".join(f"{g}: {best[g][7:]}" for g in groups))


def sandbox_throughput(n: int = 200, workers: int = 2) -> float:
    """Reference pot programs run per second through the sandbox."""
    problems = generate_problems(n, seed=0, difficulties=range(1, 7), max_operand=12, max_value=60)
    codes = [program_of(render_response(p, BY_NAME["pot+verify"])) for p in problems]
    start = time.perf_counter()
    results = run_programs(codes, workers=workers)
    seconds = time.perf_counter() - start
    failed = sum(not r.ok for r in results)
    if failed:
        print(f"warning: {failed} reference programs failed in the sandbox")
    return n / seconds


def main() -> None:
    metrics = json.loads(Path("reports/metrics/evaluate.json").read_text())
    search = json.loads(Path("reports/metrics/dots_search.json").read_text())
    rows = accuracy_table(metrics)
    diffs = sorted(rows[0][1]["by_difficulty"], key=int)
    print("test accuracy by difficulty")
    print(f"{'':28}" + "".join(f"{'d' + d:>7}" for d in diffs) + f"{'all':>7}")
    best_static = max((r for r in rows if r[0].startswith("static")), key=lambda r: r[1]["accuracy"])
    for label, s in sorted(rows, key=lambda r: -r[1]["accuracy"]):
        mark = "  <- best static" if label == best_static[0] else ""
        print(f"{label:28}" + "".join(f"{s['by_difficulty'].get(d, 0):7.2f}" for d in diffs) + f"{s['accuracy']:7.2f}{mark}")
    responses = Path("reports/evaluate/responses.jsonl")
    if responses.exists():
        records = {r["id"]: r for r in map(json.loads, Path("data/prepared/test.jsonl").read_text().splitlines())}
        print_kind_table(kind_table([json.loads(line) for line in responses.read_text().splitlines()], records))
    print("\nmean actions per question by difficulty")
    for name in ("dots_internal", "dots_external"):
        if name in metrics:
            print(f"  {name}: {metrics[name]['mean_actions_by_difficulty']}")
    print(f"  search optimum (training questions): {search['mean_actions_by_difficulty']}")
    print(f"\nsearch: {search['n_searched']} questions, {search['n_kept']} kept "
          f"({search['n_all_solved']} all solved, {search['n_all_failed']} all failed), "
          f"{search['n_distinct_optimal']} distinct optimal trajectories")
    print(f"optimal trajectory by kind: {json.dumps(search['optimal_by_kind'])}")
    if "cost" in search:
        c = search["cost"]
        print(f"search cost: {c['generations_per_question']} generations and {c['seconds_per_question']} s "
              f"per question ({c['generated_tokens']} tokens in all)")
    print(f"sandbox throughput: {sandbox_throughput():.1f} programs/s on 2 workers")


if __name__ == "__main__":
    main()
