"""One process or several for the same RL steps: an RL stage (`rlvr_ar3po` by default, or `rlhf_routed`) runs once
as one process and once under `torchrun --standalone --nproc_per_node N` with `prompts_per_step / N` prompts per
rank, so that every step covers the same prompts' worth of rollouts from the same SFT policy. On a CPU the question is
whether N single-threaded ranks, each generating for its share of a round's prompts, beat one process using every
core; on GPUs the same code spreads the rollouts over the cards.

    python3 bench/rl_processes.py [--stage rlvr_ar3po] [--procs 2] [--steps 20] [--prompts 8]
                                  [--out reports/bench/rl_processes.json]

Per run: seconds per step (the Trainer's train_runtime over the steps: rollouts, loss and update, and the dev
evaluation at the last step), the rollout's wall seconds and tokens per second (rank 0's, waits for the other ranks
included), responses and tokens, and test accuracy of the SFT and the trained policy (the stage's own evaluation,
on rank 0). Each run gets a fresh copy of the repository (`posttrain.workspace.clone_workspace`) with the pipeline's
inputs linked in, so run `dvc repro` first; nothing here is touched.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from mlflow.tracking import MlflowClient

from posttrain.atomic import atomic_write_json
from posttrain.workspace import clone_workspace

ROOT = Path(__file__).resolve().parents[1]
# what each stage reads from the pipeline (linked into the copy) and its params section
INPUTS = {"rlvr_ar3po": ["models/sft", "data/prepared"],
          "rlhf_routed": ["models/sft", "models/rm", "data/prepared", "data/preference_benchmark",
                          "reports/rm/benchmark_scores.jsonl"]}
SECTION = {"rlvr_ar3po": "rlvr", "rlhf_routed": "rlhf"}


def workspace(stage: str, scratch: Path, name: str, steps: int, prompts_per_rank: int) -> Path:
    """A copy of the repository with the stage's inputs linked in and its section set for this run."""
    repo = clone_workspace(ROOT, scratch / name)
    for rel in INPUTS[stage]:
        if not (ROOT / rel).exists():
            raise SystemExit(f"{ROOT / rel} is missing: run `dvc repro` first")
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).symlink_to(ROOT / rel)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params[SECTION[stage]].update(max_steps=steps, prompts_per_step=prompts_per_rank, dev_every=steps,
                                  save_steps=steps)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return repo


def run_stage(stage: str, repo: Path, procs: int) -> dict:
    """Run the stage (as one process, or under torchrun) and read back what its MLflow run recorded."""
    env = {**os.environ, "TMPDIR": str(repo)}  # the other ranks' throwaway MLflow stores go in the copy
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    launch = [sys.executable, "-m"] if procs == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(procs), "-m"]
    start = time.perf_counter()
    done = subprocess.run([*launch, f"stages.{stage}"], cwd=repo, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{stage} on {procs} process(es) failed:\n{done.stderr[-4000:]}")
    wall = time.perf_counter() - start
    client = MlflowClient(tracking_uri=f"sqlite:///{repo}/mlflow/mlflow.db")
    run = client.search_runs([client.get_experiment_by_name("posttrain").experiment_id],
                             filter_string=f"tags.`posttrain.stage` = '{stage}'")[0]
    return {"wall_s": wall, **run.data.metrics}


def summarize(stage: str, m: dict, steps: int) -> dict:
    """The figures this bench compares, from one run's MLflow metrics."""
    out = {"seconds_per_step": m["train_runtime"] / steps, "stage_wall_s": m["wall_s"]}
    if stage == "rlvr_ar3po":
        gen = m["total_generation_seconds"]
        out.update(generation_s=gen, training_s=m["total_training_seconds"], responses=m["total_responses"],
                   tokens=m["total_tokens"], generation_tokens_per_s=m["total_tokens"] / max(gen, 1e-9),
                   sft_test=m["sft_test_accuracy"], test=m["rlvr_test_accuracy"])
    else:
        out.update(judge_calls=m["judge_total.calls"], sft_test=m["sft_test_accuracy"], test=m["rlhf_test_accuracy"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stage", choices=sorted(INPUTS), default="rlvr_ar3po")
    ap.add_argument("--procs", type=int, default=2, help="ranks of the multi-process run")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step, over all ranks")
    ap.add_argument("--out", type=Path, default=ROOT / "reports/bench/rl_processes.json")
    args = ap.parse_args()
    if args.prompts % args.procs:
        raise SystemExit(f"--prompts {args.prompts} does not split over --procs {args.procs}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="rl-processes-") as scratch:
        for procs in (1, args.procs):
            repo = workspace(args.stage, Path(scratch), f"procs{procs}", args.steps, args.prompts // procs)
            print(f"{args.stage}: {args.steps} steps of {args.prompts} prompts on {procs} process(es) ...", flush=True)
            results[procs] = summarize(args.stage, run_stage(args.stage, repo, procs), args.steps)
            print(json.dumps(results[procs], indent=1), flush=True)
    one, many = results[1], results[args.procs]
    report = {"stage": args.stage, "steps": args.steps, "prompts_per_step": args.prompts, "procs": args.procs,
              "runs": {str(k): v for k, v in results.items()},
              "speedup_per_step": one["seconds_per_step"] / many["seconds_per_step"]}
    if "generation_tokens_per_s" in one:
        report["generation_speedup"] = many["generation_tokens_per_s"] / one["generation_tokens_per_s"]
    atomic_write_json(args.out, report)
    print(f"{args.stage}: {one['seconds_per_step']:.2f} s per step on 1 process, {many['seconds_per_step']:.2f} s on "
          f"{args.procs} ranks ({report['speedup_per_step']:.2f}x); test {one['test']:.3f} vs {many['test']:.3f} "
          f"(SFT {one['sft_test']:.3f}); written to {args.out}")


if __name__ == "__main__":
    main()
