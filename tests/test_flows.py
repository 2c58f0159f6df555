"""What the flows and the report stage do with a mistyped stage, a malformed sweep metric, and a run that
evaluated no DOTS system: a clear error before anything runs, or a report without that section's rows."""
import json
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


@pytest.mark.parametrize("sweep, error", [
    ({"grid": {"rlvr.algo": ["ar3po", "grpp"]}}, "grpp"),  # a later value of a key was never checked
    ({"grid": {"judge.faults": [{"http_500": 0.1}]}}, "grid"),  # dvc exp run -S cannot set it
    ({"metrics": ["evalute:accuracy"]}, "'evalute' is not a stage"),
    ({"targets": ["rlvr_ar3po"], "metrics": ["evaluate:accuracy"]}, "not among the targets"),
    ({"metrics": ["rlvr_ar3po:rlvr_test.acuracy"]}, "no key 'acuracy' at rlvr_test"),  # read None for every variant
    ({"targets": ["rlvr"]}, "target 'rlvr' is not a stage"),
    # each value is valid with the others' first, but 6 heads do not divide 200: it failed at the last variant
    ({"grid": {"model.hidden_size": [192, 200], "model.num_heads": [4, 6]}}, r"num_heads \(6\).*hidden_size \(200\)"),
])
def test_a_sweep_is_checked_whole_before_any_variant_runs(tmp_path, monkeypatch, sweep, error):
    root = Path(__file__).resolve().parents[1]
    for name in ("params.yaml", "dvc.yaml"):  # a fresh checkout: no .dvc/tmp (the probe used to be written there)
        (tmp_path / name).write_text((root / name).read_text())
    (tmp_path / "reports/metrics").mkdir(parents=True)
    (tmp_path / "reports/metrics/rlvr_ar3po.json").write_text('{"rlvr_test": {"accuracy": 0.6}}')
    spec = {"name": "s", "targets": ["rlvr_ar3po"], "grid": {"rlvr.algo": ["ar3po"]},
            "metrics": ["rlvr_ar3po:rlvr_test.accuracy"]}
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.chdir(tmp_path)
    from flows.sweep import load_sweep

    assert load_sweep("sweep.yaml").grid == {"rlvr.algo": ["ar3po"]}
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump({**spec, "targets": [], **sweep}))
    with pytest.raises(ParamsError, match=error):
        load_sweep("sweep.yaml")


def test_sweep_values_reach_params_yaml_through_dvc_set_param_unchanged(tmp_path):
    from dvc.utils.hydra import apply_overrides

    from flows.sweep import set_param_args
    from posttrain.params import read_yaml

    overrides = {"judge.criteria": "Which is right, and why? It's 'B' \\ a\\b end\\", "judge.model": "1.0",
                 "judge.hf_model": "null", "rlhf.budget": 0.2, "seed": 3, "evaluate.formats": ["cot", "pot"],
                 "evaluate.dots": False, "task.jsonl": None, "judge.api_key_env": "A\\\n", "tracking.experiment": "on",
                 "warmup.learning_rate": 1e-05}
    path = tmp_path / "params.yaml"
    path.write_text((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    apply_overrides(path, set_param_args(overrides)[1::2])  # what dvc exp run -S does with them
    raw = read_yaml(path.read_text())  # as load_params reads what DVC wrote
    for dotted, value in overrides.items():
        section, key = dotted.split(".") if "." in dotted else (None, dotted)
        got = raw[section][key] if section else raw[key]
        assert got == value and type(got) is type(value), dotted


def test_sweep_values_with_an_interpolation_or_an_infinity_reach_params_yaml_unchanged(tmp_path):
    """Hydra resolved '${x}' inside quotes (the variant failed: 'Interpolation key not found') and read json's
    Infinity as a string."""
    import math

    from dvc.utils.hydra import apply_overrides

    from flows.sweep import set_param_args
    from posttrain.params import read_yaml

    overrides = {"judge.criteria": "Cost in ${usd}, \\${x} and $ {y}'", "judge.model": "${",
                 "rlhf.budget": float("inf"), "rlhf.kl_beta": float("-inf"), "warmup.learning_rate": float("nan")}
    path = tmp_path / "params.yaml"
    path.write_text((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    apply_overrides(path, set_param_args(overrides)[1::2])
    raw = read_yaml(path.read_text())
    for dotted, value in overrides.items():
        section, key = dotted.split(".")
        got = raw[section][key]
        assert type(got) is type(value) and (got == value or math.isnan(value) and math.isnan(got)), dotted


def test_a_sweep_report_groups_list_values_and_says_how_many_variants_ran(tmp_path, monkeypatch):
    import flows.sweep as sweep

    spec = sweep.SweepSpec(name="fmt", grid={"evaluate.formats": [["cot"], ["pot"]], "seed": [0, 1]},
                           metrics=["evaluate:accuracy"])
    rows = [{"variant": f"fmt-{i}", "evaluate.formats": f'["{f}"]', "seed": s, "evaluate:accuracy": 0.5 + i / 10}
            for i, (f, s) in enumerate([("cot", 0), ("cot", 1), ("pot", 0)])]
    monkeypatch.setattr(sweep, "OUT", tmp_path)
    report = sweep.write_report(spec, rows, planned=4).read_text()
    # fmt-3 failed (or was stopped) and none after it ran: it was '(the rest failed)'
    assert "3 of 4 variants (the sweep stopped at fmt-3)" in report and '["pot"]' in report


def test_a_null_grid_value_keeps_its_row_in_the_summary():
    import flows.sweep as sweep

    spec = sweep.SweepSpec(name="engine", grid={"rlvr.vllm": [None, "colocate"], "seed": [0, 1]},
                           metrics=["rlvr_ar3po:rlvr_test.accuracy"])
    rows = [{"variant": f"v{i}", "rlvr.vllm": v, "seed": s, "rlvr_ar3po:rlvr_test.accuracy": 0.5 + i / 10}
            for i, (v, s) in enumerate([(None, 0), (None, 1), ("colocate", 0), ("colocate", 1)])]
    summary = sweep.summarise(spec, rows)
    assert len(summary) == 2 and summary["rlvr_ar3po:rlvr_test.accuracy count"].tolist() == [2, 2]


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


def test_a_pipeline_run_logs_the_evaluation_only_when_it_ran_evaluate(tmp_path, monkeypatch):
    import mlflow
    from mlflow.tracking import MlflowClient

    import flows.pipeline

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    experiment_id = mlflow.create_experiment("posttrain", artifact_location=str(tmp_path / "artifacts"))
    metrics = tmp_path / "evaluate.json"
    metrics.write_text(json.dumps({"sft": {"accuracy": 0.5}}))  # an earlier run's, on other data or models
    monkeypatch.setattr(flows.pipeline, "METRICS", metrics)
    monkeypatch.setattr(flows.pipeline, "configure", lambda params: experiment_id)
    monkeypatch.setattr(flows.pipeline, "run_stage", lambda name, parent: {"stage": name, "ran": True, "seconds": 0})
    assert flows.pipeline.pipeline.fn(["prepare"])["metrics"] == {}
    assert flows.pipeline.pipeline.fn(["evaluate"])["metrics"] == {"sft": {"accuracy": 0.5}}
    runs = sorted(MlflowClient().search_runs([experiment_id]), key=lambda r: r.info.start_time)
    assert ["sft.accuracy" in r.data.metrics for r in runs] == [False, True]


def test_the_warmup_row_is_its_own_choice_or_nothing():
    from stages.report import accuracy_by_stage

    static_only = {"warmup": {"accuracy": 0.55, "by_difficulty": {"1": 0.55},
                              "by_format": {"cot": {"accuracy": 0.3, "by_difficulty": {"1": 0.3}},
                                            "pot": {"accuracy": 0.8, "by_difficulty": {"1": 0.8}}}}}
    assert accuracy_by_stage(static_only, None, None).empty  # was 'warm-up (own choice) 0.55', the formats' mean
    static_only["warmup"]["by_format"]["own_choice"] = {"accuracy": 0.4, "by_difficulty": {"1": 0.4}}
    assert accuracy_by_stage(static_only, None, None)["accuracy"].tolist() == [0.4]


def test_the_accuracy_plot_labels_the_panel_with_the_trajectory_lines(tmp_path, monkeypatch):
    import stages.evaluate as evaluate

    figures = []
    monkeypatch.setattr(evaluate.plt, "close", figures.append)
    line = {"accuracy": 0.5, "by_difficulty": {"1": 0.5, "2": 0.4}}
    evaluate.plot_accuracy({"warmup": {"accuracy": 0.5, "by_format": {"cot": line, "pot": line, "own_choice": line}},
                            "rlvr": {"accuracy": 0.5, "by_format": {"own_choice": line}}}, tmp_path / "acc.png")
    warmup, rlvr = figures[0].axes
    assert warmup.get_legend() is not None and rlvr.get_legend() is None
    assert (tmp_path / "acc.png").stat().st_size > 1000


def test_an_empty_stage_list_is_an_error_not_a_green_run_of_nothing(monkeypatch):
    import flows.pipeline

    def no_stage_may_run(*args):
        raise AssertionError("ran something")
    monkeypatch.setattr(flows.pipeline, "run_stage", no_stage_may_run)
    monkeypatch.setattr(flows.pipeline, "configure", no_stage_may_run)
    with pytest.raises(ParamsError, match="no stages named"):
        flows.pipeline.pipeline.fn([])


def test_the_run_summary_gives_each_models_own_choice_accuracy():
    from flows.pipeline import accuracy_lines

    warmup = {"accuracy": 0.401, "by_format": {"cot": {"accuracy": 0.3}, "own_choice": {"accuracy": 0.429}}}
    assert accuracy_lines({"warmup": warmup, "rlvr": {"accuracy": 0.662, "by_format": {"own_choice": {
        "accuracy": 0.662}}}}) == ["warmup: test accuracy 0.429 (own choice; mean over its 2 formats 0.401)",
                                   "rlvr: test accuracy 0.662"]


def test_the_report_draws_the_training_curves_from_the_curve_files_without_mlflow(tmp_path, monkeypatch):
    """The report read its curves from the MLflow store, which DVC does not track: a repro beside another store
    drew fewer curves with no input changed. It reads reports/curves/*.csv now."""
    import stages.report as report

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("mlflow.tracking.MlflowClient", None)  # any use of the store fails
    curves = tmp_path / "reports/curves"
    curves.mkdir(parents=True)
    (curves / "warmup.csv").write_text("step,loss,learning_rate\n20,2.5,0.002\n40,1.25,0.001\n")
    (curves / "sft_internal.csv").write_text("step,loss\n10,0.9\n")
    (curves / "sft_vanilla.csv").write_text("step,loss\n")  # trained no step
    (curves / "rlhf_routed.csv").write_text("step,kl,dev_accuracy\n1,0.0,\n2,0.01,0.5\n3,0.02,\n4,0.02,0.55\n")
    (curves / "rlvr_ar3po.csv").write_text("step,loss,rollout_reward_mean\n1,0.0,0.25\n2,,0.5\n")
    figures = []
    monkeypatch.setattr(report.plt, "close", figures.append)
    drawn = report.training_curves(tmp_path / "curves.png")
    assert drawn == ["warm-up loss", "SFT loss", "routed RLHF dev accuracy", "RLVR reward (verifier mean)"]
    warmup, sft, rm, rlhf, rlvr = figures[0].axes
    assert warmup.lines[0].get_ydata().tolist() == [2.5, 1.25] and not rm.lines
    assert [line.get_label() for line in sft.lines] == ["internal", "vanilla"]
    assert rlhf.lines[0].get_ydata().tolist() == [0.5, 0.55] and rlvr.lines[0].get_ydata().tolist() == [0.25, 0.5]
    assert (tmp_path / "curves.png").stat().st_size > 1000


def test_a_report_that_fails_midway_leaves_the_last_one_whole_and_a_new_one_has_no_stale_file(tmp_path, monkeypatch):
    import shutil

    import stages.report as report

    root = Path(__file__).resolve().parents[1]
    for part in ("reports/metrics", "reports/curves"):  # the committed run's metrics and curves
        shutil.copytree(root / part, tmp_path / part)
    monkeypatch.chdir(tmp_path)
    report.write_report()
    first = {p.name: p.read_bytes() for p in (tmp_path / "reports/report").iterdir()}
    assert "accuracy_by_stage.png" in first and "training_curves.png" in first
    (tmp_path / "reports/report/stale.csv").write_text("a section an earlier run had")

    def fail(path):
        raise RuntimeError("killed while drawing the curves")

    monkeypatch.setattr(report, "training_curves", fail)
    with pytest.raises(RuntimeError):
        report.write_report()
    assert {p.name: p.read_bytes() for p in (tmp_path / "reports/report").iterdir()} == {
        **first, "stale.csv": b"a section an earlier run had"}
    assert not [p for p in (tmp_path / "reports").iterdir() if p.name.startswith(".")]  # no temporary left
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    report.write_report()
    assert sorted(p.name for p in (tmp_path / "reports/report").iterdir()) == sorted(first)


def test_judge_serve_with_the_hf_backend_needs_no_prepared_data(tmp_path, monkeypatch, capsys):
    import contextlib
    import time

    import posttrain.judge_server as judge_server
    from posttrain.cli import main

    root = Path(__file__).resolve().parents[1]
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["judge"]["backend"] = "hf"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)  # no data/prepared: was FileNotFoundError data/prepared/train.jsonl
    monkeypatch.setattr(judge_server, "hf_backend", lambda model_dir: "hf judge of " + model_dir)
    served = []

    @contextlib.contextmanager
    def service(app, port):
        served.append(port)
        yield type("Service", (), {"base_url": f"http://127.0.0.1:{port}/v1"})

    def ctrl_c(seconds):
        raise KeyboardInterrupt
    monkeypatch.setattr(judge_server, "JudgeService", service)
    monkeypatch.setattr(judge_server, "build_app", lambda judge, *args: judge)
    monkeypatch.setattr(time, "sleep", ctrl_c)
    assert main(["judge", "serve", "--port", "8123"]) == 0 and served == [8123]
    assert "judge (hf backend" in capsys.readouterr().out


@pytest.mark.parametrize("output, ran", [("Running stage 'prepare':\n> python3 -m stages.prepare", True),
                                         ("Stage 'prepare' didn't change, skipping", False),
                                         ("Stage 'prepare' is cached - skipping run, checking out outputs", False)])
def test_a_stage_restored_from_dvcs_run_cache_is_not_reported_as_run(monkeypatch, output, ran):
    import logging

    import flows.pipeline

    monkeypatch.setattr(flows.pipeline, "run_dvc", lambda args, env, echo, what: output)
    monkeypatch.setattr(flows.pipeline, "get_run_logger", lambda: logging.getLogger("test"))
    assert flows.pipeline.run_stage.fn("prepare", "parent")["ran"] is ran
