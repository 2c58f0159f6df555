"""MLflow runs of killed stages: closed as FAILED by the next run of the stage, which links to them."""
import os
import signal
import subprocess
import sys
from pathlib import Path

from mlflow.tracking import MlflowClient

import mlflow

from posttrain.params import load_params
from posttrain.tracking import stage_run

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "params.smoke.yaml"
KILLED_STAGE = """
import os, signal, sys
from posttrain.params import load_params
from posttrain.tracking import part_run, stage_run
params = load_params(sys.argv[1]).model_copy(update={{"tracking": load_params(sys.argv[1]).tracking.model_copy(
    update={{"uri": sys.argv[2], "artifact_root": sys.argv[3]}})}})
with stage_run("warmup", params, sections=["seed"]) as run, part_run("model") as part:
    print(run.info.run_id, part.info.run_id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # as a machine dying mid-stage would
"""


def test_a_killed_stage_run_is_closed_as_failed_and_linked_to_the_next(tmp_path, monkeypatch, restore_tracking_uri):
    monkeypatch.chdir(tmp_path)
    uri, artifacts = f"sqlite:///{tmp_path}/mlflow.db", str(tmp_path / "artifacts")
    done = subprocess.run([sys.executable, "-c", KILLED_STAGE.format(), str(SMOKE), uri, artifacts],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    killed_id, killed_part_id = done.stdout.split()[:2]
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(killed_id).info.status == "RUNNING"  # nothing could end it
    part = client.get_run(killed_part_id)
    assert part.info.status == "RUNNING" and part.info.experiment_id == client.get_run(killed_id).info.experiment_id

    base = load_params(SMOKE)
    params = base.model_copy(update={"tracking": base.tracking.model_copy(update={"uri": uri, "artifact_root": artifacts})})
    # a run of the same stage whose process is alive (a concurrent run) must be left alone
    alive = client.create_run(client.get_run(killed_id).info.experiment_id,
                              tags={"posttrain.stage": "warmup", "posttrain.pid": str(os.getpid()),
                                    "posttrain.host": client.get_run(killed_id).data.tags["posttrain.host"]})
    with stage_run("warmup", params, sections=["seed"]) as run:
        resumed_id = run.info.run_id
    killed = client.get_run(killed_id)
    assert killed.info.status == "FAILED" and killed.data.tags["posttrain.interrupted"] == "true"
    assert client.get_run(resumed_id).data.tags["posttrain.resumed_from_run"] == killed_id  # the stage's, not its part's
    assert client.get_run(killed_part_id).info.status == "FAILED"
    assert client.get_run(resumed_id).info.status == "FINISHED"
    # tmp_path is no DVC repo: the run says its deps went unhashed, so checkpoint keys keep other keys' dirs
    assert client.get_run(resumed_id).data.tags["posttrain.dvc_hashes_missing"] == "true"
    assert client.get_run(alive.info.run_id).info.status == "RUNNING"


def test_a_rank_other_than_0_logs_to_a_throwaway_store_with_rank_0s_tags(tmp_path, monkeypatch,
                                                                          restore_tracking_uri):
    """Under torchrun / accelerate launch each rank runs the stage: one run in the real store, and the other ranks'
    tags (which key their checkpoint directories) the same as rank 0's."""
    import posttrain.tracking

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    base = load_params(SMOKE)
    params = base.model_copy(update={"tracking": base.tracking.model_copy(
        update={"uri": uri, "artifact_root": str(tmp_path / "artifacts")})})
    monkeypatch.setattr(posttrain.tracking, "process_tags", lambda: {"posttrain.pid": "1", "posttrain.host": "h"})
    tags = {}
    for rank in ["1", "0"]:
        monkeypatch.setenv("RANK", rank)
        with stage_run("warmup", params, sections=["seed"]) as run:
            tags[rank] = run.data.tags
            mlflow.log_metric("loss", 1.0)  # as the stages log, with no run handle
    runs = MlflowClient(tracking_uri=uri).search_runs(
        [MlflowClient(tracking_uri=uri).get_experiment_by_name(params.tracking.experiment).experiment_id])
    assert [r.info.run_id for r in runs] == [run.info.run_id]  # rank 0's alone
    ours = {rank: {k: v for k, v in t.items() if not k.startswith("mlflow.")} for rank, t in tags.items()}
    assert ours["1"] == ours["0"] and ours["0"]["posttrain.stage"] == "warmup"


def test_a_stage_run_records_what_decides_its_float_results(tmp_path, monkeypatch, restore_tracking_uri):
    """Weights repeat bit for bit on one machine, not across CPUs: the run says which CPU kernels and threads made it."""
    import torch

    monkeypatch.chdir(tmp_path)
    base = load_params(SMOKE)
    params = base.model_copy(update={"tracking": base.tracking.model_copy(
        update={"uri": f"sqlite:///{tmp_path}/mlflow.db", "artifact_root": str(tmp_path / "artifacts")})})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with stage_run("warmup", params, sections=["seed"]) as run:
            run_id = run.info.run_id
    finally:
        torch.set_num_threads(threads)
    tags = MlflowClient(tracking_uri=params.tracking.uri).get_run(run_id).data.tags
    assert tags["numerics.torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert tags["numerics.torch_threads"] == "1"
    assert tags["numerics.torch"] == torch.__version__
    assert tags["numerics.device"] == (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")
    assert tags["numerics.cpu"]  # the CPU's model name
