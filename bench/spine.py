"""Benchmark of the spine: accuracy of the warm-up model vs the untrained one, pipeline wall times,
Prefect and MLflow overhead per stage, SFT tokens/s and parameter count.

    python3 bench/spine.py                 # everything, in temporary copies of the repository (~35 min)
    python3 bench/spine.py --reuse .       # reuse an already-run default pipeline in this workspace

Prints a report; nothing here is asserted (the machine is shared and noisy).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from posttrain.orchestration import prefect_settings
from posttrain.workspace import clone_workspace

ROOT = Path(__file__).resolve().parents[1]


def timed(cmd: list[str], cwd: Path, env: dict | None = None) -> float:
    # dvc.yaml runs `python3 -m stages.<name>`: the interpreter running this script must come first on PATH
    env = {**(env or os.environ), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return time.perf_counter() - start


def stage_durations(repo: Path) -> dict[str, dict]:
    """Latest MLflow run per stage: wall seconds and metrics."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{repo}/mlflow/mlflow.db")
    exp = client.get_experiment_by_name("posttrain")
    out: dict[str, dict] = {}
    for r in client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"], max_results=500):
        stage = r.data.tags.get("posttrain.stage")
        if stage and stage != "pipeline" and stage not in out and r.info.end_time:
            out[stage] = {"seconds": (r.info.end_time - r.info.start_time) / 1000, "metrics": r.data.metrics}
    return out


def tracking_overhead(repo: Path, stages: list[str], repeats: int = 3) -> dict[str, float]:
    """Seconds that importing MLflow and opening and closing one stage's run (with DVC lineage hashes) cost."""
    code = (  # the clock starts before mlflow is imported: its import time is overhead too
        "import sys, time; t = time.perf_counter()\n"
        "from posttrain.params import load_params; from posttrain.tracking import stage_run\n"
        "p = load_params()\n"
        "p = p.model_copy(update={'tracking': p.tracking.model_copy(update={'uri': sys.argv[2]})})\n"
        "with stage_run(sys.argv[1], p, sections=['seed']): pass\n"
        "print(time.perf_counter() - t)\n"
    )
    store = f"sqlite:///{tempfile.mkdtemp(prefix='posttrain-overhead-')}/mlflow.db"  # keep the user's store clean
    result = {}
    for stage in stages:
        times = []
        for _ in range(repeats):
            proc = subprocess.run([sys.executable, "-c", code, stage, store], cwd=repo, capture_output=True, text=True)
            times.append(float(proc.stdout.strip().splitlines()[-1]))
        result[stage] = statistics.median(times)
    return result


def prefect_overhead(repo: Path, stages: list[str]) -> tuple[float, float]:
    """(flow wall seconds, sum of the same no-op `dvc repro -s` calls run directly) on an up-to-date repo."""
    env = {**os.environ, **prefect_settings(repo)}
    timed([sys.executable, "-m", "flows.pipeline"], repo, env)  # first flow starts Prefect's database
    flow = timed([sys.executable, "-m", "flows.pipeline"], repo, env)
    direct = sum(timed([sys.executable, "-m", "dvc", "repro", "--single-item", s], repo) for s in stages)
    return flow, direct


def untrained_accuracy(repo: Path, n: int) -> dict:
    """The base (untrained) model evaluated like the warm-up model, on the first n test questions."""
    code = (
        "import json, sys; from posttrain.params import load_params\n"
        "from posttrain.accuracy_summary import summarize\n"
        "from posttrain.sharded_evaluation import answer_in_formats\n"
        "from stages.evaluate import resolve_formats\n"
        "p = load_params(); recs = [json.loads(l) for l in open('data/prepared/test.jsonl')][:int(sys.argv[1])]\n"
        "rows = answer_in_formats('models/base', recs, resolve_formats('all'), p)\n"
        "print(json.dumps(summarize(rows, [r['n_tokens'] for r in rows])))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(n)], cwd=repo, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(title: str, summaries: dict[str, dict]) -> None:
    print(f"\n{title}")
    diffs = sorted({d for s in summaries.values() for d in s["by_difficulty"]}, key=int)
    print(f"{'':24}" + "".join(f"{'d' + d:>7}" for d in diffs) + f"{'all':>7}")
    for name, s in summaries.items():
        print(f"{name:24}" + "".join(f"{s['by_difficulty'].get(d, 0):7.2f}" for d in diffs) + f"{s['accuracy']:7.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reuse", type=Path, help="a workspace where the default pipeline already ran")
    ap.add_argument("--untrained-n", type=int, default=60, help="test questions for the untrained model")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="posttrain-bench-"))
    stages = ["prepare", "base_model", "warmup", "dots_search", "sft", "evaluate"]

    if args.reuse:
        repo, full = args.reuse.resolve(), None
    else:
        repo = clone_workspace(ROOT, tmp / "default")
        full = timed([sys.executable, "-m", "dvc", "repro"], repo)
    noop = [timed([sys.executable, "-m", "dvc", "repro"], repo) for _ in range(3)]
    durations = stage_durations(repo)
    smoke_repo = clone_workspace(ROOT, tmp / "smoke", "configs/params.smoke.yaml")
    smoke = timed([sys.executable, "-m", "dvc", "repro"], smoke_repo)
    overhead = tracking_overhead(repo, stages)
    flow, direct = prefect_overhead(repo, stages)
    metrics = json.loads((repo / "reports/metrics/evaluate.json").read_text())
    untrained = untrained_accuracy(repo, args.untrained_n)

    print("== posttrain spine benchmark ==")
    warm = durations["warmup"]["metrics"]
    print(f"model parameters: {durations['base_model']['metrics']['n_parameters']:.0f}")
    print(f"SFT warm-up: {warm['train_tokens']:.0f} tokens at {warm['train_tokens_per_s']:.0f} tokens/s, "
          f"final train loss {warm['final_loss']:.3f}")
    print(f"default dvc repro: {'%.0f s' % full if full else 'reused workspace'}; stages: "
          + ", ".join(f"{s} {durations[s]['seconds']:.0f} s" for s in stages))
    print(f"no-op dvc repro: median {statistics.median(noop):.2f} s (runs: {', '.join(f'{t:.2f}' for t in noop)})")
    print(f"smoke profile dvc repro: {smoke:.0f} s")
    print("MLflow + lineage overhead per stage (s, share of the stage's time): " + ", ".join(
        f"{s} {overhead[s]:.2f} ({100 * overhead[s] / durations[s]['seconds']:.1f}%)" for s in stages))
    per_stage = (flow - direct) / len(stages)
    total = sum(durations[s]["seconds"] for s in stages)
    print(f"Prefect overhead: flow of {len(stages)} no-op tasks {flow:.1f} s vs the same dvc calls direct "
          f"{direct:.1f} s -> {per_stage:.2f} s per stage ({100 * (flow - direct) / total:.2f}% of the pipeline)")
    table(f"test accuracy by difficulty (untrained: first {args.untrained_n} questions, all 13 formats)",
          {"untrained (all formats)": untrained, **{f"{m} (all formats)": s for m, s in metrics.items()}})
    for model, s in metrics.items():
        table(f"{model}: test accuracy by trajectory format",
              {fmt: {"by_difficulty": fs["by_difficulty"], "accuracy": fs["accuracy"]}
               for fmt, fs in s["by_format"].items()})
    print(f"\nmean response tokens: untrained {untrained['mean_response_tokens']}, "
          + ", ".join(f"{m} {s['mean_response_tokens']}" for m, s in metrics.items()))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
