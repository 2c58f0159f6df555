"""The sft stage on a tiny model: three planners, each trained in an MLflow run of its own under the stage's."""
import json
from pathlib import Path

import yaml
from mlflow.tracking import MlflowClient
from tiny_model import tiny_scratch_model

ROOT = Path(__file__).resolve().parents[1]


def test_each_planner_trains_in_a_run_of_its_own_under_the_stage_run(tmp_path, monkeypatch, restore_tracking_uri):
    """Three Trainers in one run clashed: MLflow refused their differing params ("Changing param values is not
    allowed") and their losses shared one key, so the stage's loss curve zigzagged between three models."""
    import stages.sft

    tiny = tiny_scratch_model(tmp_path / "models/warmup", n_problems=12, seed=5)
    (tmp_path / "data/prepared").mkdir(parents=True)
    (tmp_path / "data/dots").mkdir(parents=True)
    (tmp_path / "data/prepared/train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in tiny.records))
    (tmp_path / "data/dots/search.jsonl").write_text("".join(
        json.dumps({"id": r["id"], "optimal": "cot", "dropped": False}) + "\n" for r in tiny.records))
    params = yaml.safe_load((ROOT / "configs/params.smoke.yaml").read_text())
    params["sft"].update(max_steps=2, external_max_steps=3, save_steps=1, logging_steps=1, batch_size=4)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)

    stages.sft.main()

    client = MlflowClient(tracking_uri="sqlite:///mlflow/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name(params["tracking"]["experiment"]).experiment_id])
    (stage,) = [r for r in runs if r.data.tags.get("posttrain.stage") == "sft"]
    parts = {r.info.run_name: r for r in runs if r.data.tags.get("posttrain.part_of") == "sft"}
    assert sorted(parts) == ["sft external", "sft internal", "sft vanilla"] and len(runs) == 4
    for name, run in parts.items():
        assert run.data.tags["mlflow.parentRunId"] == stage.info.run_id and run.info.status == "FINISHED"
        steps = 3 if name == "sft external" else 2
        assert run.data.params["max_steps"] == str(steps)  # each Trainer's own arguments, logged whole
        assert len(client.get_metric_history(run.info.run_id, "loss")) == steps
    assert "loss" not in stage.data.metrics and "max_steps" not in stage.data.params
    assert {f"{p}.final_loss" for p in ("internal", "external", "vanilla")} <= set(stage.data.metrics)
    assert (tmp_path / "models/sft/config.json").is_file() and (tmp_path / "models/sft_checkpoints/step-00001").is_dir()
