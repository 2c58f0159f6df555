"""What a kill costs and what it leaves behind: each long stage of a smoke pipeline (longer stages, more checkpoints
than configs/params.smoke.yaml) is run whole, then run again and SIGKILLed three times, each followed by a
`dvc repro` that finishes it:

- ``random``: at a uniform point of the window in which the whole run had progress on disk (after its first
  checkpoint / searched chunk / scored shard appeared, before it ended);
- ``checkpoint_write``: the instant the c-th file appears under checkpoints/<stage> (c uniform over the files
  the whole run wrote there), i.e. while a checkpoint is being written;
- ``output_write``: the instant the c-th file of the stage's outputs appears or changes (c uniform over the
  outputs' files), i.e. while the stage, or DVC moving them into its cache, writes them.

    python3 bench/kill_resume.py [--stages warmup dots_search ...] [--kinds random ...] [--seed 0] [--repo <copy>]
                                 [--out reports/bench/kill_resume.json]

Per kill: when it struck, the work it threw away (seconds since the stage last saved complete progress, or since
it started if it had saved none), whether the re-run resumed (said so on its output) or started over, the time it
cost overall (time before the kill + resumed run - whole run: this adds the restart's fixed costs, imports and model
loading, and is as noisy as the machine's load), whether `dvc status` is clean, DVC's cache whole (every
object hashes to its name, every locked output present), every output file parses, and whether MLflow shows the
killed run FAILED with the resumed run linked to it. The whole run and each run to be killed start without the
stage's checkpoints (which outlive a successful run) and are forced (`dvc repro --force`), as after a change of
inputs; the re-run after a kill is forced too, so the stage's own resume logic, not DVC's cache, decides what is
redone. Runs in a fresh copy of the
repository (nothing here is touched; `--repo` reuses a copy that already ran); prints a table, writes
reports/bench/kill_resume.json.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from mlflow.tracking import MlflowClient

from posttrain.orchestration import prefect_settings
from posttrain.workspace import clone_workspace, damaged_cache_objects, invalid_outputs, run_and_kill

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "reports/bench/kill_resume.json"
LONG_STAGES = ["warmup", "dots_search", "sft", "train_rm", "rlhf_routed", "rlvr_ar3po", "evaluate"]
KINDS = ["random", "checkpoint_write", "output_write"]
RESUME_WORDS = ("resuming", "already scored", "already searched")
# what marks a unit of saved progress complete, per stage (see posttrain/checkpoints.py and the stages)
PROGRESS_MARKERS = {"dots_search": "done.jsonl", "evaluate": "*.json", "rlhf_routed": "routing_state.json",
                    "rlvr_ar3po": "rollout_state.json"}
# The smoke profile's stages are mostly start-up; these make the resumable part long enough to hit.
LONGER = {"warmup": {"max_steps": 60, "save_steps": 10}, "dots_search": {"n_questions": 24, "chunk_size": 4},
          "sft": {"max_steps": 30, "save_steps": 5}, "train_rm": {"max_steps": 12, "pointwise_max_steps": 12},
          "rlhf": {"max_steps": 8}, "rlvr": {"max_steps": 8}, "evaluate": {"shard_size": 3}}


def dvc(args: list[str], repo: Path, env: dict) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"dvc {' '.join(args)} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return time.perf_counter() - start, proc.stdout + proc.stderr


def stage_outputs(repo: Path, stage: str) -> list[Path]:
    spec = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"][stage]
    return [repo / (o if isinstance(o, str) else next(iter(o)))
            for kind in ("outs", "metrics", "plots") for o in spec.get(kind, [])]


def files_written_since(paths: list[Path], since: float) -> int:
    """Files under ``paths`` created or modified after ``since`` (a wall-clock time)."""
    n = 0
    for path in paths:
        for f in path.rglob("*") if path.is_dir() else [path]:
            try:
                n += f.is_file() and f.stat().st_mtime >= since
            except FileNotFoundError:  # removed between listing and stat
                pass
    return n


def watch_whole_run(stage: str, repo: Path, env: dict) -> dict:
    """Run the stage whole, watching when progress first appears on disk and how many files it writes."""
    cmd = [sys.executable, "-m", "dvc", "repro", "--force", "--single-item", stage]
    shutil.rmtree(repo / "checkpoints" / stage, ignore_errors=True)
    progress, outs = [repo / "checkpoints" / stage], stage_outputs(repo, stage)
    seen = {"first_progress_s": None, "progress_files": 0, "out_files": 0}
    t0 = time.time()

    def watch(elapsed: float) -> bool:
        n = files_written_since(progress, t0)
        if n and seen["first_progress_s"] is None:
            seen["first_progress_s"] = elapsed
        seen["progress_files"] = max(seen["progress_files"], n)
        seen["out_files"] = max(seen["out_files"], files_written_since(outs, t0))
        return False

    ran = run_and_kill(cmd, repo, env, watch)
    if ran.returncode:
        raise RuntimeError(f"{stage} failed (exit {ran.returncode}) on its whole run")
    return {**seen, "whole_s": ran.seconds}


def last_saved_progress(repo: Path, stage: str) -> float | None:
    """When the newest complete unit of progress (checkpoint, searched chunk, scored shard) was saved, or None."""
    marker = PROGRESS_MARKERS.get(stage, "trainer_state.json")
    times = []
    for f in (repo / "checkpoints" / stage).rglob(marker):
        try:
            json.loads(f.read_text()) if f.suffix == ".json" else None  # a marker cut by the kill does not count
            times.append(f.stat().st_mtime)
        except (ValueError, OSError):
            pass
    return max(times, default=None)


def killed_run(stage: str, kind: str, repo: Path, env: dict, whole: dict, rng: random.Random
               ) -> tuple[float, bool, float]:
    """Force ``stage`` and SIGKILL it at the moment ``kind`` draws (see the module doc). (seconds it ran, whether
    the kill landed, seconds of work since the last saved progress: what the kill threw away)."""
    cmd = [sys.executable, "-m", "dvc", "repro", "--force", "--single-item", stage]
    shutil.rmtree(repo / "checkpoints" / stage, ignore_errors=True)
    t0 = time.time()
    if kind == "random":
        first = whole["first_progress_s"] or 0.0
        at = first + rng.uniform(0.05, 0.95) * (whole["whole_s"] - first)
        ran = run_and_kill(cmd, repo, env, lambda elapsed: elapsed >= at)
    else:
        paths = [repo / "checkpoints" / stage] if kind == "checkpoint_write" else stage_outputs(repo, stage)
        target = rng.randint(1, max(1, whole["progress_files" if kind == "checkpoint_write" else "out_files"]))
        ran = run_and_kill(cmd, repo, env, lambda _: files_written_since(paths, t0) >= target)
    if ran.returncode:
        raise RuntimeError(f"{stage} failed (exit {ran.returncode}) before it could be killed")
    saved = last_saved_progress(repo, stage)
    lost = ran.seconds if saved is None or saved < t0 else t0 + ran.seconds - saved
    return ran.seconds, ran.killed, lost


def mlflow_link(repo: Path, stage: str) -> dict:
    client = MlflowClient(tracking_uri=f"sqlite:///{repo}/mlflow/mlflow.db")
    exp = client.get_experiment_by_name("posttrain")
    runs = client.search_runs([exp.experiment_id], f"tags.`posttrain.stage` = '{stage}'",
                              order_by=["attributes.start_time DESC"], max_results=2)
    linked = runs[0].data.tags.get("posttrain.resumed_from_run")
    # the run before the resumed one is the killed one's (a kill can land after it finished, in DVC's commit)
    return {"linked": bool(linked), "killed_run_failed": bool(linked) and client.get_run(linked).info.status == "FAILED",
            "killed_run_status": runs[1].info.status if len(runs) > 1 else None}


def make_longer(repo: Path) -> None:
    params = yaml.safe_load((repo / "params.yaml").read_text())
    for section, values in LONGER.items():
        params[section].update(values)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", nargs="+", default=LONG_STAGES, choices=LONG_STAGES)
    ap.add_argument("--kinds", nargs="+", default=KINDS, choices=KINDS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repo", type=Path, help="a copy made by an earlier run of this bench (default: make one)")
    ap.add_argument("--out", type=Path, default=OUT, help="where the rows go (JSON)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    rows = []
    with tempfile.TemporaryDirectory(prefix="kill_resume_") as tmp:
        if args.repo:
            repo = args.repo.resolve()
        else:
            repo = clone_workspace(ROOT, Path(tmp) / "repo", profile="configs/params.smoke.yaml")
            make_longer(repo)
        env = {**os.environ, **prefect_settings(repo.parent)}
        env.pop("POSTTRAIN_PARENT_RUN_ID", None)
        print(f"pipeline in {repo} ...", flush=True)
        dvc(["repro"], repo, env)
        for stage in args.stages:
            whole = watch_whole_run(stage, repo, env)
            print(f"{stage}: whole run {whole}", flush=True)
            for kind in args.kinds:
                ran, killed, lost = killed_run(stage, kind, repo, env, whole, rng)
                resumed_s, out = dvc(["repro", "--force", "--single-item", stage], repo, env)
                _, status = dvc(["status", stage], repo, env)
                cache = damaged_cache_objects(repo)
                outputs = invalid_outputs(stage_outputs(repo, stage))
                row = {"stage": stage, "kind": kind, "killed": killed, "whole_s": round(whole["whole_s"], 1),
                       "killed_at_s": round(ran, 1), "killed_at_share": round(ran / whole["whole_s"], 2),
                       "lost_s": round(lost, 1) if killed else 0.0, "resume_s": round(resumed_s, 1),
                       "redone_s": round(ran + resumed_s - whole["whole_s"], 1),
                       "resumed": any(w in out for w in RESUME_WORDS), "status_clean": "changed" not in status,
                       "cache_whole": not cache, "outputs_parse": not outputs, "problems": cache + outputs,
                       **mlflow_link(repo, stage)}
                rows.append(row)
                print(json.dumps(row), flush=True)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(rows, indent=1))
    print(f"\n{'stage':12} {'kill':17}{'whole s':>8}{'at':>6}{'lost s':>7}{'resume s':>9}{'redone s':>9}  resumed "
          "clean cache outputs mlflow")
    for r in rows:
        at = f"{r['killed_at_share']:.0%}" if r["killed"] else "done"
        print(f"{r['stage']:12} {r['kind']:17}{r['whole_s']:>8}{at:>6}{r['lost_s']:>7}{r['resume_s']:>9}"
              f"{r['redone_s']:>9}  "
              f"{str(r['resumed']):7} {str(r['status_clean']):5} {str(r['cache_whole']):5} "
              f"{str(r['outputs_parse']):7} "
              f"{'FAILED+linked' if r['killed_run_failed'] else 'linked' if r['linked'] else 'no link'}"
              f"{'' if r['linked'] else ' (killed run ' + str(r['killed_run_status']) + ')'}")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
