"""What a kill costs: each long stage of the smoke pipeline is run whole, then run again and SIGKILLed at a random
point after its first progress file appeared (mid-training, mid-checkpoint or mid-output write, wherever the draw
lands), then `dvc repro` finishes it.

    python3 bench/kill_resume.py [--stages warmup dots_search ...] [--kills 2] [--seed 0] [--repo <smoke copy>]

Per kill: when it struck, whether the re-run resumed (said so on its output) or started over, the work redone
(time before the kill + resumed run - whole run), whether `dvc status` is clean and the outputs load, and whether
MLflow shows the killed run FAILED with the resumed run linked to it. Each run is forced (`dvc repro --force`), as a
run after a change of inputs would be; the re-run after the kill is forced too, so the stage's own resume logic,
not DVC's cache, decides what is redone. Runs in a fresh smoke copy of the repository (nothing here is touched, and
`--repo` reuses a copy that already ran the smoke pipeline); prints a table, writes reports/bench/kill_resume.json.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from posttrain.orchestration import prefect_settings
from posttrain.workspace import clone_workspace

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "reports/bench/kill_resume.json"
LONG_STAGES = ["warmup", "dots_search", "sft", "train_rm", "rlhf_routed", "rlvr_ar3po", "evaluate"]
RESUME_WORDS = ("resuming", "already scored", "already searched")


def dvc(args: list[str], repo: Path, env: dict) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"dvc {' '.join(args)} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return time.perf_counter() - start, proc.stdout + proc.stderr


def killed_run(stage: str, repo: Path, env: dict, extra: float) -> tuple[float, bool]:
    """Force ``stage``; once it has written its first progress file under checkpoints/<stage> (a Trainer
    checkpoint being saved, a searched chunk, a scored shard), wait ``extra`` more seconds and SIGKILL its process
    group. (seconds it ran, whether it was killed: a stage can finish first)."""
    progress = repo / "checkpoints" / stage
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "dvc", "repro", "--force", "--single-item", stage], cwd=repo,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = None
    while proc.poll() is None:
        if deadline is None and progress.exists() and any(p.is_file() for p in progress.rglob("*")):
            deadline = time.perf_counter() + extra
        if deadline is not None and time.perf_counter() >= deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return time.perf_counter() - start, True
        time.sleep(0.1)
    return time.perf_counter() - start, False


def mlflow_link(repo: Path, stage: str) -> dict:
    client = MlflowClient(tracking_uri=f"sqlite:///{repo}/mlflow/mlflow.db")
    exp = client.get_experiment_by_name("posttrain")
    runs = client.search_runs([exp.experiment_id], f"tags.`posttrain.stage` = '{stage}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    linked = runs[0].data.tags.get("posttrain.resumed_from_run")
    return {"linked": bool(linked), "killed_run_failed": bool(linked) and client.get_run(linked).info.status == "FAILED"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", nargs="+", default=LONG_STAGES, choices=LONG_STAGES)
    ap.add_argument("--kills", type=int, default=2, help="kills per stage, each at a fresh random point")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repo", type=Path, help="a smoke copy that already ran `dvc repro` (default: make one)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    rows = []
    with tempfile.TemporaryDirectory(prefix="kill_resume_") as tmp:
        repo = args.repo.resolve() if args.repo else clone_workspace(ROOT, Path(tmp) / "repo",
                                                                     profile="configs/params.smoke.yaml")
        env = {**os.environ, **prefect_settings(repo.parent)}
        env.pop("POSTTRAIN_PARENT_RUN_ID", None)
        print("smoke pipeline ...", flush=True)
        dvc(["repro"], repo, env)
        for stage in args.stages:
            whole, _ = dvc(["repro", "--force", "--single-item", stage], repo, env)
            for k in range(args.kills):
                ran, killed = killed_run(stage, repo, env, rng.uniform(0, 0.5) * whole)
                resumed_s, out = dvc(["repro", "--force", "--single-item", stage], repo, env)
                _, status = dvc(["status", stage], repo, env)
                row = {"stage": stage, "killed": killed, "whole_s": round(whole, 1), "killed_at_s": round(ran, 1),
                       "killed_at_share": round(ran / whole, 2), "resume_s": round(resumed_s, 1),
                       "redone_s": round(ran + resumed_s - whole, 1),
                       "resumed": any(w in out for w in RESUME_WORDS), "status_clean": "changed" not in status,
                       **mlflow_link(repo, stage)}
                rows.append(row)
                print(json.dumps(row), flush=True)
                OUT.parent.mkdir(parents=True, exist_ok=True)
                OUT.write_text(json.dumps(rows, indent=1))
    print(f"\n{'stage':13}{'whole s':>8}{'killed at':>10}{'resume s':>9}{'redone s':>9}  resumed  clean  mlflow")
    for r in rows:
        print(f"{r['stage']:13}{r['whole_s']:>8}{r['killed_at_share']:>9.0%} {r['resume_s']:>9}{r['redone_s']:>9}  "
              f"{str(r['resumed']):7}  {str(r['status_clean']):5}  "
              f"{'FAILED+linked' if r['killed_run_failed'] else 'linked' if r['linked'] else 'no link'}")
    print(f"-> {OUT}")


if __name__ == "__main__":
    main()
