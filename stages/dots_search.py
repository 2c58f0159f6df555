"""Stage `dots_search`: DOTS optimal-trajectory search over the training questions with the warm-up solver.

For each searched question (the first ``dots_search.n_questions``), the search of posttrain.dots runs
every candidate trajectory ``n_eval`` times per iteration at temperature > 0, with generation batched
across questions and candidates. Writes data/dots/search.jsonl (per question: every candidate's success
counts, the optimal trajectory, whether it was dropped) and the distribution of optimal trajectories by
difficulty and question kind (reports/metrics/dots_search.json, reports/dots/optimal_trajectories.png).

Resumable: questions are searched in fixed chunks, each appended to checkpoints/dots_search/<key>/done.jsonl
as it completes; a re-run skips the chunks already there and searches a partly written one again. Each
chunk's sampling seeds depend on its number alone, so a resumed search writes what an uninterrupted one would.
What the search spent (generations, tokens, seconds) is saved beside it (cost.json) after each chunk, so a
resumed run's cost covers every process.
"""
from __future__ import annotations

import json
import os
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import TextIO

import matplotlib.pyplot as plt
from tqdm.auto import tqdm

import mlflow
from posttrain.atomic import atomic_dir, atomic_write_json
from posttrain.dots import SearchConfig, search_trajectories
from posttrain.checkpoints import claim_checkpoint_dir, result_params
from posttrain.errors import stage_main
from posttrain.executor import TrajectoryExecutor
from posttrain.generation import open_generator
from posttrain.jsonl import read_jsonl
from posttrain.params import load_params
from posttrain.params_schema import Params
from posttrain.sandbox import sandbox_limits
from posttrain.tracking import stage_run
from posttrain.trajectories import BY_NAME, TRAJECTORIES

SOLVER, TRAIN, OUT = "models/warmup", "data/prepared/train.jsonl", Path("data/dots")
METRICS, PLOT = Path("reports/metrics/dots_search.json"), Path("reports/dots/optimal_trajectories.png")
CHECKPOINTS = Path("checkpoints/dots_search")
RESUME_SECTIONS = ("dots_search", "sandbox", "generation")  # the params a resumed run must share


def checkpoint_file(params: Params) -> Path:
    """done.jsonl under a key of the search params and the stage's inputs: only a matching run resumes."""
    return claim_checkpoint_dir(CHECKPOINTS, result_params(params, RESUME_SECTIONS), params.seed,
                                [Path(TRAIN), Path(SOLVER)]) / "done.jsonl"


def read_done(path: Path) -> dict[str, dict]:
    """Results already searched; a line cut short by a kill is ignored (its question is searched again)."""
    done = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            done[rec["id"]] = rec
    return done


def read_cost(path: Path) -> dict:
    """What earlier processes of this search spent (``cost.json`` beside the progress file): generations, tokens
    and seconds, and how many questions they cover. Zero for a new search."""
    cost = {"questions": 0, "generations": 0, "generated_tokens": 0, "seconds": 0.0}
    if path.exists():
        cost.update(json.loads(path.read_text(encoding="utf-8")))
    return cost


def open_progress(path: Path) -> TextIO:
    """The progress file, opened for appending. A last line a kill cut short is ended first, so the next record
    does not join it (``read_done`` skips the cut line, and its question is searched again)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    log = path.open("a", encoding="utf-8")
    if log.tell() and not path.read_bytes().endswith(b"\n"):
        log.write("\n")
    return log


def summarize(results: list[dict], records: dict[str, dict]) -> dict:
    """Optimal-trajectory counts by difficulty and kind, drop counts, mean actions per difficulty."""
    by_diff: dict[str, Counter] = defaultdict(Counter)
    by_kind: dict[str, Counter] = defaultdict(Counter)
    actions: dict[str, list[int]] = defaultdict(list)
    for r in results:
        rec = records[r["id"]]
        key = r["optimal"] or f"dropped: {r['dropped']}"
        by_diff[str(rec["difficulty"])][key] += 1
        by_kind[rec.get("kind", "chain")][key] += 1
        if r["optimal"]:
            actions[str(rec["difficulty"])].append(BY_NAME[r["optimal"]].n_actions)
    kept = [r for r in results if r["optimal"]]
    return {
        "n_searched": len(results), "n_kept": len(kept),
        "n_all_solved": sum(r["dropped"] == "all solved" for r in results),
        "n_all_failed": sum(r["dropped"] == "all failed" for r in results),
        "n_distinct_optimal": len({r["optimal"] for r in kept}),
        "optimal_by_difficulty": {d: dict(c) for d, c in sorted(by_diff.items(), key=lambda x: int(x[0]))},
        "optimal_by_kind": {k: dict(c) for k, c in sorted(by_kind.items())},
        "mean_actions_by_difficulty": {d: round(sum(a) / len(a), 3) for d, a in sorted(actions.items())},
    }


def plot_distribution(summary: dict, path: Path) -> None:
    """Stacked bars: share of each optimal trajectory per difficulty and per question kind."""
    names = [t.name for t in TRAJECTORIES] + ["dropped: all solved", "dropped: all failed"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for ax, key, label in ((axes[0], "optimal_by_difficulty", "difficulty"), (axes[1], "optimal_by_kind", "kind")):
        groups = list(summary[key])
        # bars at positions, labelled: string labels such as difficulty "3" make matplotlib log a categorical warning
        positions = range(len(groups))
        bottom = [0.0] * len(groups)
        for i, name in enumerate(names):
            shares = [summary[key][g].get(name, 0) / max(1, sum(summary[key][g].values())) for g in groups]
            if any(shares):
                ax.bar(positions, shares, bottom=bottom, label=name, color=plt.cm.tab20(i % 20))
                bottom = [b + s for b, s in zip(bottom, shares)]
        ax.set_xticks(positions, [str(g) for g in groups])
        ax.set(xlabel=label, ylabel="share of searched questions", title=f"optimal trajectory by {label}")
    axes[1].legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


@stage_main
def main() -> None:
    params = load_params()
    cfg = params.dots_search
    with stage_run("dots_search", params, sections=["seed", "sandbox", "dots_search", "generation"]):
        records = read_jsonl(TRAIN)[: cfg.n_questions]
        by_id = {r["id"]: r for r in records}
        generator = open_generator(str(SOLVER), params.generation, cfg.batch_size, cfg.max_new_tokens, params.seed)
        executor = TrajectoryExecutor(generator,
                                      sandbox_limits(params.sandbox), params.sandbox.workers, cfg.verify_retries)
        search = SearchConfig(cfg.iterations, cfg.n_eval, tuple(cfg.keep))
        progress_file = checkpoint_file(params)
        done = read_done(progress_file)
        if done:
            print(f"dots_search: resuming, {len(done)} of {len(records)} questions already searched")
            mlflow.set_tag("resumed_questions", len(done))
        cost_file = progress_file.with_name("cost.json")
        cost = read_cost(cost_file)  # a chunk killed between its results and its cost.json is not counted

        def chunk_sampler(chunk_no: int):
            """run_samples for one chunk. Its k-th call is seeded by the chunk's number and k alone, so a resumed
            search samples exactly what an uninterrupted one would have (a count of this process's calls would
            restart at the first chunk's seeds)."""
            calls = 0

            def run_samples(jobs, n):
                nonlocal calls
                calls += 1
                call_no = chunk_no * cfg.iterations + calls
                recs = [by_id[q] for q, _ in jobs for _ in range(n)]
                rows = executor.run(recs, [t for _, t in jobs for _ in range(n)], cfg.temperature,
                                    seed=params.seed + 1000 * call_no, desc=f"search call {call_no}")
                cost["generations"] += sum(r["attempts"] for r in rows)
                cost["generated_tokens"] += sum(r["n_tokens"] for r in rows)
                return [sum(rows[j * n + s]["correct"] for s in range(n)) for j in range(len(jobs))]
            return run_samples

        # fixed chunks over all the questions; one a kill left partly written is searched again whole, since the
        # batch a question is sampled in decides its samples
        chunks = [[r["id"] for r in records[i:i + cfg.chunk_size]] for i in range(0, len(records), cfg.chunk_size)]
        with open_progress(progress_file) as log, tqdm(total=len(records), desc="dots_search", unit="question") as bar:
            for chunk_no, chunk in enumerate(chunks):
                if all(q in done for q in chunk):
                    bar.update(len(chunk))
                    continue
                t0 = time.perf_counter()
                lines = []
                for result in search_trajectories(chunk, chunk_sampler(chunk_no), search):
                    rec = {**result.to_record(), "difficulty": by_id[result.id]["difficulty"],
                           "kind": by_id[result.id].get("kind", "chain")}
                    done[result.id] = rec
                    lines.append(json.dumps(rec) + "\n")
                log.write("".join(lines))
                log.flush()
                os.fsync(log.fileno())
                cost["seconds"] += time.perf_counter() - t0
                cost["questions"] += len(chunk)
                atomic_write_json(cost_file, cost)
                bar.update(len(chunk))
                mlflow.log_metrics({"searched": len(done), **cost}, step=len(done))
        results = [done[r["id"]] for r in records]
        summary = summarize(results, by_id)
        if cost["questions"]:
            summary["cost"] = {**cost, "generations_per_question": round(cost["generations"] / cost["questions"], 2),
                               "seconds_per_question": round(cost["seconds"] / cost["questions"], 3)}
        with atomic_dir(OUT) as tmp:
            (tmp / "search.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results), encoding="utf-8")
        atomic_write_json(METRICS, summary)
        plot_distribution(summary, PLOT)
        mlflow.log_metrics({k: v for k, v in summary.items() if isinstance(v, (int, float))})
        mlflow.log_dict(summary, "dots_search.json")
        mlflow.log_artifact(str(PLOT))
        print(f"dots_search: {summary['n_kept']} of {summary['n_searched']} questions kept, "
              f"{summary['n_distinct_optimal']} distinct optimal trajectories -> {OUT}/search.jsonl")


if __name__ == "__main__":
    main()
