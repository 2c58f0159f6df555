"""Stages under a multi-process launch (torchrun, as `accelerate launch` and `deepspeed` start them): two ranks train
one model with DDP on the CPU (gloo), and only rank 0 writes the model, the curve and the MLflow run. The RL stages
roll out once per step over both ranks' prompts (one replay buffer, one routing budget, one judge ledger)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from smoke_workspace import mlflow_runs, run, smoke_env, smoke_repo

pytestmark = pytest.mark.e2e


def torchrun(stage: str, repo: Path, tmp: Path) -> subprocess.CompletedProcess:
    env = {**smoke_env(repo.parent), "TMPDIR": str(tmp)}  # where the other ranks' throwaway stores go
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", f"stages.{stage}"], cwd=repo, env=env, capture_output=True, text=True, timeout=900)


def test_warmup_on_two_ranks_writes_once_and_trains_on_both(tmp_path):
    repo = smoke_repo(tmp_path)
    for stage in ("prepare", "base_model"):
        run([sys.executable, "-m", f"stages.{stage}"], repo)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    done = torchrun("warmup", repo, scratch)
    assert done.returncode == 0, done.stderr[-4000:]

    # one MLflow run for the stage, rank 0's, with the Trainer's curve in it
    runs = [r for r in mlflow_runs(repo) if r.data.tags["posttrain.stage"] == "warmup"]
    assert len(runs) == 1 and runs[0].info.status == "FINISHED" and "loss" in runs[0].data.metrics
    # the model swapped in once and whole, no temporary beside it, the rank's throwaway store removed at its exit
    assert sorted(p.name for p in (repo / "models").iterdir()) == ["base", "warmup"]
    assert (repo / "models/warmup/model.safetensors").is_file()
    assert list(scratch.glob("posttrain-mlflow-rank*")) == []
    # both ranks trained: each step took a batch per rank, so the run covered twice the data one process would
    metrics, params = runs[0].data.metrics, runs[0].data.params
    examples_per_step = int(params["warmup.max_steps"]) * int(params["warmup.batch_size"]) * int(
        params["warmup.grad_accum"])
    assert metrics["epoch"] * metrics["n_examples"] / examples_per_step == pytest.approx(2)


@pytest.fixture(scope="module")
def rl_inputs(tmp_path_factory) -> Path:
    """A smoke workspace holding what the RL stages read (the SFT policy, the PM), built in one process; AR3PO's
    buffer is seeded with the reference solutions, so the smoke policy's failures get a negative advantage (a step
    with a gradient) although it solves nothing itself."""
    repo = smoke_repo(tmp_path_factory.mktemp("rl"))
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["rlvr"]["buffer_seed"] = "reference"
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(["dvc", "repro", "sft", "train_rm"], repo)
    return repo


def stage_metrics(repo: Path, stage: str) -> tuple[dict, dict]:
    runs = [r for r in mlflow_runs(repo) if r.data.tags["posttrain.stage"] == stage]
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    return runs[0].data.metrics, runs[0].data.params


def metric_history(repo: Path, stage: str, key: str) -> list[float]:
    from mlflow.tracking import MlflowClient

    run_id = next(r.info.run_id for r in mlflow_runs(repo) if r.data.tags["posttrain.stage"] == stage)
    client = MlflowClient(tracking_uri=f"sqlite:///{repo}/mlflow/mlflow.db")
    return [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


def test_rlvr_ar3po_on_two_ranks_rolls_out_once_over_both_ranks_prompts(rl_inputs, tmp_path):
    done = torchrun("rlvr_ar3po", rl_inputs, tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    metrics, params = stage_metrics(rl_inputs, "rlvr_ar3po")
    # each step's rollout covered both ranks' prompts, and rank 0's totals count them all (one rank's would be half)
    steps, per_rank = int(params["rlvr.max_steps"]), int(params["rlvr.prompts_per_step"])
    assert metrics["total_prompts"] == 2 * per_rank * steps
    # the buffered references gave the failures a negative advantage: the ranks' shares carried a gradient
    assert metrics["total_buffer_hits"] > 0 and max(metric_history(rl_inputs, "rlvr_ar3po", "grad_norm")) > 0
    assert (rl_inputs / "models/rlvr/model.safetensors").is_file()
    assert len([line for line in done.stdout.splitlines() if line.startswith("rlvr_ar3po (ar3po): test")]) == 1


def test_rlhf_routed_on_two_ranks_routes_the_whole_step_on_one_budget(rl_inputs, tmp_path):
    done = torchrun("rlhf_routed", rl_inputs, tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    metrics, params = stage_metrics(rl_inputs, "rlhf_routed")
    n = int(params["rlhf.n_responses"])
    pairs = metric_history(rl_inputs, "rlhf_routed", "routing/pairs")
    # rank 0 scored and routed both ranks' groups together: every step's pairs are both ranks' pairs
    assert pairs == [2 * int(params["rlhf.prompts_per_step"]) * n * (n - 1) / 2] * int(params["rlhf.max_steps"])
    # and paid the judge for all of them: one ledger, no call from the other rank
    routed = metric_history(rl_inputs, "rlhf_routed", "routing/routed_fraction")
    assert sum(routed) > 0 and metrics["judge_total.calls"] > 0
    assert done.stdout.count("rlhf_routed: test accuracy") == 1
    # the last checkpoint holds rank 0's counts (what a resumed run starts from), not another rank's empty ones
    from posttrain.rlhf import ROUTING_STATE

    last = max(rl_inputs.glob("checkpoints/rlhf_routed/*/checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    saved = json.loads((last / ROUTING_STATE).read_text())
    assert saved["totals"]["pairs"] == sum(pairs) and saved["ledger"]["calls"] == metrics["judge_total.calls"]
