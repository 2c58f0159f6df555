"""The smoke workspace the end-to-end tests run in: a copy of the repository on the smoke profile, with the
judge's API key set to a secret that must leave no trace, and Prefect's state kept inside the copy."""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

from posttrain.orchestration import prefect_settings
from posttrain.workspace import clone_workspace

ROOT = Path(__file__).resolve().parents[1]
STAGES = ["prepare", "base_model", "warmup", "dots_search", "sft", "seppo_sample", "preference_benchmark", "train_rm",
          "rlhf_routed", "rlvr_ar3po", "evaluate", "report"]
SECRET = f"sk-posttrain-{secrets.token_hex(12)}"  # the judge API key of the smoke runs: it must leave no trace


def smoke_env(tmp: Path) -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env.update(prefect_settings(tmp))
    env.pop("POSTTRAIN_PARENT_RUN_ID", None)
    env["POSTTRAIN_JUDGE_API_KEY"] = SECRET
    return env


def smoke_repo(tmp: Path) -> Path:
    """A git repository holding the project's files with the smoke profile as params.yaml."""
    return clone_workspace(ROOT, tmp / "repo", profile="configs/params.smoke.yaml")


# A guard against a hang, not a speed target: the whole smoke pipeline takes a few minutes alone, but beside another
# training job on a 2-core machine without AVX-512 it took 10 and once passed 15.
HANG_GUARD_S = 1800


def run(cmd: list[str], repo: Path, timeout: int = HANG_GUARD_S) -> str:
    proc = subprocess.run(cmd, cwd=repo, env=smoke_env(repo.parent), capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


def mlflow_runs(repo: Path, parts: bool = False) -> list:
    """The workspace's stage and pipeline runs; with ``parts``, the runs nested in a stage's run for one of the
    models it trains (``posttrain.tracking.part_run``) instead."""
    from mlflow.tracking import MlflowClient

    from posttrain.tracking import PART_TAG

    client = MlflowClient(tracking_uri=f"sqlite:///{repo}/mlflow/mlflow.db")
    exp = client.get_experiment_by_name("posttrain")
    return [r for r in client.search_runs([exp.experiment_id], max_results=1000)
            if (PART_TAG in r.data.tags) == parts]
