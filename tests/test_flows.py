"""What the flows and the report stage do with a mistyped stage, a malformed sweep metric, and a run that
evaluated no DOTS system: a clear error before anything runs, or a report without that section's rows."""
import os
from pathlib import Path

import pytest
import yaml

from posttrain.params import ParamsError


def test_an_unknown_stage_name_is_an_error_naming_it_and_the_stages(monkeypatch):
    import flows.pipeline

    def no_stage_may_run(name, parent):
        raise AssertionError(f"ran stage {name}")
    monkeypatch.setattr(flows.pipeline, "run_stage", no_stage_may_run)
    monkeypatch.setattr(flows.pipeline, "configure", no_stage_may_run)
    with pytest.raises(ParamsError, match=r"'evalute'.*evaluate"):
        flows.pipeline.pipeline.fn(["evaluate", "evalute"])  # before: ran evaluate alone and exited 0


def test_a_sweep_metric_without_its_stage_is_refused_when_the_file_is_read(tmp_path):
    from flows.sweep import load_sweep

    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "lr", "grid": {"rlvr.learning_rate": [1e-5]},
                                    "metrics": ["rlvr_ar3po.rlvr_test.accuracy"]}))
    with pytest.raises(ParamsError, match="metrics"):
        load_sweep(path)


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[1] / "configs/sweeps").glob("*.yaml")))
def test_the_shipped_sweep_files_load(path):
    from flows.sweep import load_sweep

    assert load_sweep(path).metrics


def test_the_dots_table_of_a_run_without_static_trajectories_or_planners_is_empty():
    from stages.report import dots_table

    table = dots_table({"warmup": {"accuracy": 0.4, "by_format": {"own_choice": {"accuracy": 0.4}}}})
    assert table.empty and list(table.columns) == ["policy", "accuracy"]


def test_a_killed_pipeline_runs_parent_run_is_closed_by_the_next_pipeline_run(tmp_path, monkeypatch,
                                                                               restore_tracking_uri):
    import subprocess
    import sys

    import mlflow
    from mlflow.tracking import MlflowClient

    import flows.pipeline
    from posttrain.tracking import process_tags

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    experiment_id = mlflow.create_experiment("posttrain", artifact_location=str(tmp_path / "artifacts"))
    client = MlflowClient()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    killed = client.create_run(experiment_id, tags={"posttrain.stage": "pipeline", **process_tags(),
                                                    "posttrain.pid": dead.stdout.strip()})
    monkeypatch.setattr(flows.pipeline, "configure", lambda params: experiment_id)
    monkeypatch.setattr(flows.pipeline, "run_stage", lambda name, parent: {"stage": name, "ran": False, "seconds": 0})
    flows.pipeline.pipeline.fn(["report"])
    assert client.get_run(killed.info.run_id).info.status == "FAILED"
    (new,) = [r for r in client.search_runs([experiment_id]) if r.info.run_id != killed.info.run_id]
    assert new.info.status == "FINISHED" and new.data.tags["posttrain.pid"] == str(os.getpid())
