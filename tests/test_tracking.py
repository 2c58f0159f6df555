"""MLflow runs of killed stages: closed as FAILED by the next run of the stage, which links to them."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
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
    # a run of the same stage whose process is alive (a concurrent run, so another process: pytest's parent) must be
    # left alone
    alive = client.create_run(client.get_run(killed_id).info.experiment_id,
                              tags={"posttrain.stage": "warmup", "posttrain.pid": str(os.getppid()),
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
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
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
    assert tags["numerics.MKL_ENABLE_INSTRUCTIONS"] == "AVX2" and tags["numerics.DNNL_MAX_CPU_ISA"] == "unset"


def smoke_params(tmp_path, **sections):
    base = load_params(SMOKE)
    update = {"tracking": base.tracking.model_copy(update={"uri": f"sqlite:///{tmp_path}/mlflow.db",
                                                           "artifact_root": str(tmp_path / "artifacts")})}
    update.update({name: getattr(base, name).model_copy(update=fields) for name, fields in sections.items()})
    return base.model_copy(update=update)


def test_a_deleted_experiment_stops_the_stage_with_one_line_naming_the_key(tmp_path, monkeypatch,
                                                                           restore_tracking_uri):
    """Deleting the experiment in the MLflow UI, then running the pipeline: every stage died of a traceback ending in
    "MlflowException: The experiment 1 must be in the 'active' state", naming neither the experiment nor the key."""
    from posttrain.errors import UserError

    monkeypatch.chdir(tmp_path)
    params = smoke_params(tmp_path)
    with stage_run("warmup", params, sections=["seed"]) as run:
        experiment_id = run.info.experiment_id
    MlflowClient(tracking_uri=params.tracking.uri).delete_experiment(experiment_id)
    with pytest.raises(UserError, match=rf"^tracking.experiment: MLflow experiment '{params.tracking.experiment}' "
                                        rf"\(id {experiment_id}\) is deleted"):
        with stage_run("warmup", params, sections=["seed"]):
            pass


def test_credentials_in_an_endpoint_url_never_reach_mlflow(tmp_path, monkeypatch, restore_tracking_uri):
    """judge.base_url may hold credentials (https://user:key@host/v1, or ?api_key=...: the judge client logs only the
    host for that reason), and rlhf_routed logged its judge section to MLflow verbatim."""
    monkeypatch.chdir(tmp_path)
    judge_url = "https://alice:sk-SECRET1@judge.example.com:8443/v1?key=SECRET2"
    vllm_url = "http://bob:SECRET3@10.0.0.5:8000"
    params = smoke_params(tmp_path, judge={"base_url": judge_url}, rlhf={"vllm_server_url": vllm_url})
    with stage_run("rlhf_routed", params, sections=["seed", "judge", "rlhf"]) as run:
        run_id = run.info.run_id
    logged = MlflowClient(tracking_uri=params.tracking.uri).get_run(run_id).data.params
    assert not [v for v in logged.values() if "SECRET" in v], logged
    assert logged["judge.base_url"] == "https://***@judge.example.com:8443/v1?***"  # where it points stays
    assert logged["rlhf.vllm_server_url"] == "http://***@10.0.0.5:8000"
    assert logged["judge.model"] == params.judge.model


def test_a_killed_run_whose_pid_this_process_now_has_is_closed(tmp_path, monkeypatch, restore_tracking_uri):
    """A container restarted after a kill starts the same processes in the same order, so the resumed stage often
    gets the killed one's PID: the killed run looked alive (its PID answers: ours) and stayed RUNNING for ever."""
    import socket

    monkeypatch.chdir(tmp_path)
    params = smoke_params(tmp_path)
    with stage_run("warmup", params, sections=["seed"]) as run:
        experiment_id = run.info.experiment_id
    client = MlflowClient(tracking_uri=params.tracking.uri)
    killed = client.create_run(experiment_id, tags={"posttrain.stage": "warmup", "posttrain.pid": str(os.getpid()),
                                                    "posttrain.host": socket.gethostname()})
    with stage_run("warmup", params, sections=["seed"]) as run:
        resumed_id = run.info.run_id
    assert client.get_run(killed.info.run_id).info.status == "FAILED"
    assert client.get_run(resumed_id).data.tags["posttrain.resumed_from_run"] == killed.info.run_id


def test_a_stage_stopped_with_ctrl_c_is_closed_as_killed_and_linked_to_the_next_run_once(tmp_path, monkeypatch,
                                                                                          restore_tracking_uri):
    """Ctrl-C ended the run FAILED with nothing saying it was stopped, and the resumed run, logging the same steps
    again, named no run before it (only a run left RUNNING by a killed process was linked)."""
    monkeypatch.chdir(tmp_path)
    params = smoke_params(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        with stage_run("warmup", params, sections=["seed"]) as run:
            stopped_id = run.info.run_id
            raise KeyboardInterrupt
    client = MlflowClient(tracking_uri=params.tracking.uri)
    stopped = client.get_run(stopped_id)
    assert stopped.info.status == "KILLED" and stopped.data.tags["posttrain.interrupted"] == "true"
    with stage_run("warmup", params, sections=["seed"]) as run:
        resumed_id = run.info.run_id
    assert client.get_run(resumed_id).data.tags["posttrain.resumed_from_run"] == stopped_id
    with stage_run("warmup", params, sections=["seed"]) as run:  # a later run resumes nothing
        assert "posttrain.resumed_from_run" not in client.get_run(run.info.run_id).data.tags


def test_ctrl_c_in_a_stage_is_one_line_and_exit_130(capsys):
    from posttrain.errors import stage_main

    @stage_main
    def main():
        raise KeyboardInterrupt

    main.__wrapped__.__module__ = "stages.warmup"
    with pytest.raises(SystemExit) as stop:
        main()
    assert stop.value.code == 130
    assert capsys.readouterr().err == "warmup: interrupted; `dvc repro` resumes it from its last checkpoint\n"
