"""A training stage under a multi-process launch (torchrun, as `accelerate launch` and `deepspeed` start it): two
ranks train one model with DDP on the CPU (gloo), and only rank 0 writes the model, the curve and the MLflow run.
The RL stages refuse such a launch with one line (see posttrain.process_group)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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


def test_an_rl_stage_refuses_a_multi_process_launch(tmp_path):
    repo = smoke_repo(tmp_path)
    done = torchrun("rlvr_ar3po", repo, tmp_path)
    assert done.returncode != 0
    assert "error: rlvr_ar3po runs in one process, but this launch started 2" in done.stderr
    assert not (repo / "mlflow/mlflow.db").exists()  # refused before it opened a run
