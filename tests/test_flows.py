"""What the flows and the report stage do with a mistyped stage, a malformed sweep metric, and a run that
evaluated no DOTS system: a clear error before anything runs, or a report without that section's rows."""
import contextlib
import json
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

from posttrain.accuracy_summary import own_choice, summarize
from posttrain.params import ParamsError
from posttrain.trajectories import TRAJECTORIES


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
    ({"grid": {"rlvr.algo": ["grpo", "dapo", "grpo"]}}, "variants 0 and 2 give the same params"),  # ran twice
    ({"grid": {"rlvr.learning_rate": [1, 1.0]}}, "variants 0 and 1 give the same params"),
    ({"name": "-s"}, "name: got '-s'"),  # `dvc exp run --name -s-0` read the name as an option
    ({"metrics": ["prepare:n_train"]}, "stage prepare writes no reports/metrics/prepare.json"),  # None every time
    ({"metrics": ["rlvr_ar3po:rlvr_test.accuracy"] * 2}, "'rlvr_ar3po:rlvr_test.accuracy' listed twice"),
    ({"grid": {"rlvr.algoo": ["grpo"]}}, r"sweep.yaml: variant rlvr.algoo=\"grpo\": .*'algoo'"),  # which file?
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
    import flows.sweep_report as report
    from flows.sweep import SweepSpec

    spec = SweepSpec(name="fmt", grid={"evaluate.formats": [["cot"], ["pot"]], "seed": [0, 1]},
                           metrics=["evaluate:accuracy"])
    rows = [{"variant": f"fmt-{i}", "evaluate.formats": f'["{f}"]', "seed": s, "evaluate:accuracy": 0.5 + i / 10}
            for i, (f, s) in enumerate([("cot", 0), ("cot", 1), ("pot", 0)])]
    monkeypatch.setattr(report, "OUT", tmp_path)
    opening = report.status(spec, 3, 4, "2026-01-01 00:00 UTC", error=RuntimeError("variant fmt-3 failed (exit 1)"))
    text = report.write_report(spec, rows, 4, opening).read_text()
    # fmt-3 failed (or was stopped) and none after it ran: it was '(the rest failed)'
    assert "3 of 4 variants ran" in text and "`fmt-3` failed" in text and '["pot"]' in text


def test_a_null_grid_value_keeps_its_row_in_the_summary():
    from flows.sweep import SweepSpec
    from flows.sweep_report import summarise

    spec = SweepSpec(name="engine", grid={"rlvr.vllm": [None, "colocate"], "seed": [0, 1]},
                           metrics=["rlvr_ar3po:rlvr_test.accuracy"])
    rows = [{"variant": f"v{i}", "rlvr.vllm": v, "seed": s, "rlvr_ar3po:rlvr_test.accuracy": 0.5 + i / 10}
            for i, (v, s) in enumerate([(None, 0), (None, 1), ("colocate", 0), ("colocate", 1)])]
    summary = summarise(spec, rows)
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
    line, own = ({"accuracy": a, "by_difficulty": {"1": a, "2": a}} for a in (0.5, 0.4))
    evaluate.plot_accuracy({"warmup": {"accuracy": 0.47, "by_format": {"cot": line, "pot": line, "own_choice": own}},
                            "rlvr": {"accuracy": 0.4, "by_format": {"own_choice": own}}}, tmp_path / "acc.png")
    warmup, rlvr = figures[0].axes
    assert warmup.get_legend() is not None and rlvr.get_legend() is None
    # the warm-up's own accuracy heads its panel: the mean over its formats (0.47) is not any system's
    assert warmup.get_title() == "warmup: own choice 0.40, mean over 3 formats 0.47"
    assert rlvr.get_title() == "rlvr: own choice 0.40"
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
    # in the pipeline's order, not evaluate.json's alphabetical one; a model outside it last
    assert [line.split(":")[0] for line in accuracy_lines({k: {"accuracy": 0.5} for k in (
        "dots_external", "rlvr", "warmup", "base", "rlhf")})] == ["warmup", "dots_external", "rlhf", "rlvr", "base"]
    # told its trajectory each time (evaluate.formats without own_choice): was "test accuracy 0.500", the mean
    static = {"accuracy": 0.5, "by_format": {"cot": {"accuracy": 0.75}, "pot": {"accuracy": 0.25}}}
    assert accuracy_lines({"warmup": static}) == ["warmup: no own-choice accuracy; mean over its 2 static formats 0.500"]


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
    # a model that trained no step has no line and no legend entry; a panel without data says so
    assert [line.get_label() for line in sft.lines] == ["internal"]
    assert [t.get_text() for t in rm.texts] == ["no data"] and not warmup.texts
    assert rlhf.lines[0].get_ydata().tolist() == [0.5, 0.55] and rlvr.lines[0].get_ydata().tolist() == [0.25, 0.5]
    # shares on their whole range (a 0.50 -> 0.55 move drawn over the full height looked large)
    assert rlhf.get_ylim() == rlvr.get_ylim() == (-0.02, 1.02) and warmup.get_ylim() != (-0.02, 1.02)
    assert (tmp_path / "curves.png").stat().st_size > 1000


def test_a_long_curve_is_drawn_with_a_centred_mean_over_its_points_and_the_points_themselves(tmp_path, monkeypatch):
    """The trailing mean lagged: at warm-up's step 100 it drew 2.66 where the loss was 1.07."""
    import stages.report as report

    monkeypatch.chdir(tmp_path)
    (tmp_path / "reports/curves").mkdir(parents=True)
    steps = range(1, 61)
    (tmp_path / "reports/curves/warmup.csv").write_text("step,loss\n" + "".join(f"{s},{100 - s}\n" for s in steps))
    figures = []
    monkeypatch.setattr(report.plt, "close", figures.append)
    report.training_curves(tmp_path / "curves.png")
    raw, smoothed = figures[0].axes[0].lines
    assert raw.get_ydata().tolist() == [100 - s for s in steps]
    # a centred window of 10 on a straight line sits half a step off it; a trailing one sat 4.5 steps behind
    assert max(abs(y - (100 - s)) for s, y in zip(steps[5:-5], smoothed.get_ydata()[5:-5])) <= 0.5 + 1e-9


def test_the_reward_model_table_gives_us_spearman_beside_the_routing_scores(tmp_path, monkeypatch):
    """The column "Spearman(u, correct)" showed the predictive score's -0.44; u's own (the variance's) was +0.11."""
    import shutil

    import stages.report as report

    root = Path(__file__).resolve().parents[1]
    for part in ("reports/metrics", "reports/curves"):
        shutil.copytree(root / part, tmp_path / part)
    monkeypatch.chdir(tmp_path)
    report.write_report()
    table = pd.read_csv(tmp_path / "reports/report/reward_model.csv")
    rm = json.loads((root / "reports/metrics/train_rm.json").read_text())
    pm = table[table["model"] == "pairwise PM"].iloc[0]
    assert pm["Spearman(u, correct)"] == pytest.approx(rm["spearman_variance_correct"])
    assert pm[f"Spearman({rm['uncertainty_score']} score, correct)"] == pytest.approx(rm["spearman_uncertainty_correct"])


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


SWEEP = {"name": "s", "targets": ["rlvr_ar3po"], "grid": {"rlvr.algo": ["ar3po", "grpo"]},
         "metrics": ["rlvr_ar3po:rlvr_test.accuracy", "rlvr_ar3po:zero_advantage_share"]}


@pytest.fixture
def sweep_workspace(tmp_path, monkeypatch):
    """A workspace for flows.sweep with DVC faked: every DVC command is recorded, ``exp list`` prints ``listed``,
    and ``exp run`` calls ``on_exp_run(variant number, its -S values)``, which does what the variant would."""
    import logging
    from types import SimpleNamespace

    import flows.sweep as sweep

    root = Path(__file__).resolve().parents[1]
    for name in ("params.yaml", "dvc.yaml"):
        (tmp_path / name).write_text((root / name).read_text())
    (tmp_path / "reports/metrics").mkdir(parents=True)
    (tmp_path / "reports/metrics/rlvr_ar3po.json").write_text(
        json.dumps({"rlvr_test": {"accuracy": 0.6}, "zero_advantage_share": 0.1}))
    monkeypatch.chdir(tmp_path)
    ws = SimpleNamespace(path=tmp_path, calls=[], listed="", on_exp_run=lambda n, sets: None)

    def run_dvc(args, env, log, what):
        ws.calls.append(list(args))
        if args[:2] == ["exp", "run"]:
            sets = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "-S")
            ws.on_exp_run(sum(c[:2] == ["exp", "run"] for c in ws.calls) - 1, sets)
        return ws.listed if args[:2] == ["exp", "list"] else ""

    monkeypatch.setattr(sweep, "run_dvc", run_dvc)
    monkeypatch.setattr(sweep, "get_run_logger", lambda: logging.getLogger("sweep"))
    monkeypatch.setattr(sweep, "run_variant", sweep.run_variant.fn)  # as a plain function: no Prefect API
    monkeypatch.setattr(sweep, "dvc_lock", contextlib.nullcontext)

    def run(spec=SWEEP):
        (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec))
        return sweep.sweep.fn("sweep.yaml")
    ws.run = run
    return ws


@pytest.mark.parametrize("stop, said", [
    (RuntimeError("variant s-0 failed (exit 1):\nERROR: out of memory"),
     "`s-0` failed:\n\n```\nvariant s-0 failed (exit 1):\nERROR: out of memory\n```"),
    (KeyboardInterrupt(), "`s-0` was interrupted (KeyboardInterrupt)")])
def test_a_sweep_stopped_at_its_first_variant_replaces_the_earlier_report_with_what_happened(sweep_workspace, stop,
                                                                                          said):
    """The report was written only once a variant had finished: the earlier sweep's stayed, looking current."""
    out = sweep_workspace.path / "reports/sweeps"
    out.mkdir(parents=True)
    for ext in ("md", "csv", "png"):
        (out / f"s.{ext}").write_text("the earlier sweep's")

    def stopped(n, sets):
        raise stop
    sweep_workspace.on_exp_run = stopped
    with pytest.raises(type(stop)):
        sweep_workspace.run()
    report = (out / "s.md").read_text()
    assert "**Stopped**: 0 of 2 variants ran" in report and said in report
    assert "the earlier sweep's" not in (out / "s.csv").read_text() and not (out / "s.png").exists()


def test_a_sweep_does_not_start_while_a_pipeline_run_holds_the_repository(sweep_workspace):
    """A sweep rewrites params.yaml for each variant and puts params.yaml and dvc.lock back at its end: beside a
    pipeline run it changed that run's params under its stages, and undid its outputs."""
    from posttrain.errors import UserError
    from posttrain.orchestration import pipeline_lock

    with pipeline_lock(), pytest.raises(UserError, match="another pipeline run"):
        sweep_workspace.run()
    assert not any(c[:2] == ["exp", "run"] for c in sweep_workspace.calls)
    sweep_workspace.run()  # and once that run is over, it runs
    assert sum(c[:2] == ["exp", "run"] for c in sweep_workspace.calls) == 2


def test_a_metric_key_the_last_run_wrote_as_null_does_not_stop_the_sweep(sweep_workspace):
    """Every metrics file writes an undefined figure as null: the sweep refused the file ('... is not a number')."""
    from flows.sweep import load_sweep

    (sweep_workspace.path / "reports/metrics/rlvr_ar3po.json").write_text(
        '{"rlvr_test": {"accuracy": null}, "zero_advantage_share": 0.25}')
    (sweep_workspace.path / "sweep.yaml").write_text(yaml.safe_dump(SWEEP))
    assert load_sweep("sweep.yaml").metrics == SWEEP["metrics"]


def test_a_metric_null_or_missing_in_a_variant_is_shown_as_missing_in_the_report(sweep_workspace):
    def metrics(n, sets):  # s-0 could not compute its accuracy, s-1's algorithm writes no zero-advantage share
        written = [{"rlvr_test": {"accuracy": None}, "zero_advantage_share": 0.25}, {"rlvr_test": {"accuracy": 0.7}}]
        (sweep_workspace.path / "reports/metrics/rlvr_ar3po.json").write_text(json.dumps(written[n]))
    sweep_workspace.on_exp_run = metrics
    rows = sweep_workspace.run()["rows"]
    assert [r["rlvr_ar3po:rlvr_test.accuracy"] for r in rows] == [None, 0.7]
    assert [r["rlvr_ar3po:zero_advantage_share"] for r in rows] == [0.25, None]
    report = (sweep_workspace.path / "reports/sweeps/s.md").read_text()
    summary, every = (markdown_rows(part) for part in report.split("## Mean")[1].split("## Every variant"))
    assert [row[2:4] for row in every] == [["n/a", "0.2500"], ["0.7000", "n/a"]] and "nan" not in report
    # no value to average, and no spread over one value
    assert [row[1:3] + row[4:6] for row in summary] == [["n/a", "n/a", "0.2500", "n/a"],
                                                         ["0.7000", "n/a", "n/a", "n/a"]]


def markdown_rows(text: str) -> list[list[str]]:
    """The body rows of the first markdown table in ``text``, cell by cell."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


@pytest.mark.parametrize("fails_at", [None, 1])
def test_the_workspace_is_put_back_as_it_was_before_the_sweep_finished_or_stopped(sweep_workspace, fails_at):
    """dvc exp run leaves the last variant in the workspace: its params.yaml then ran under the next `dvc repro` and
    under the next sweep's every variant (a budget swept in one sweep stayed in the next)."""
    from posttrain.orchestration import PIPELINE_LOCK

    ws = sweep_workspace
    (ws.path / "dvc.lock").write_text("schema: '2.0'\nstages: {}  # the user's\n")
    (ws.path / "reports/report").mkdir(parents=True)
    (ws.path / "reports/report/accuracy.csv").write_text("the user's run")

    def files():
        return {p.relative_to(ws.path).as_posix(): p.read_bytes() for p in ws.path.rglob("*")
                if p.is_file() and "sweeps" not in p.parts and p.name != "sweep.yaml"
                and p.name != PIPELINE_LOCK.name}  # the lock file, in DVC's scratch directory, stays
    before = files()

    def variant(n, sets):
        params = ws.path / "params.yaml"
        params.write_text(params.read_text().replace("algo:", f"algo: {sets['rlvr.algo']}  # was"))
        (ws.path / "dvc.lock").write_text(f"the lock of variant {n}")
        (ws.path / "reports/metrics/rlvr_ar3po.json").write_text('{"rlvr_test": {"accuracy": 0.7}}')
        (ws.path / "reports/report/accuracy.csv").unlink(missing_ok=True)
        (ws.path / "reports/report/another.csv").write_text(f"variant {n}")
        if n == fails_at:
            raise RuntimeError(f"variant s-{n} failed (exit 1)")
    ws.on_exp_run = variant
    with pytest.raises(RuntimeError) if fails_at else contextlib.nullcontext():
        ws.run()
    assert files() == before
    assert ws.calls[-1] == ["checkout", "--force", "rlvr_ar3po"]  # the target's cached outputs, as dvc.lock says
    assert "The workspace is as it was before the sweep" in (ws.path / "reports/sweeps/s.md").read_text()


def test_a_sweep_run_again_replaces_every_experiment_of_its_earlier_run(sweep_workspace):
    """Only the experiments this run re-ran were replaced: s-2 of an earlier, larger grid stayed beside them."""
    sweep_workspace.listed = "s-0\ns-1\ns-2\ns-x\nss-0\nother-1\n"
    sweep_workspace.run()
    runs = [c for c in sweep_workspace.calls if c[:2] in (["exp", "remove"], ["exp", "run"])]
    assert runs[0] == ["exp", "remove", "s-0", "s-1", "s-2"] and len(runs) == 3


def test_the_sweep_report_writes_grid_values_as_given_and_metrics_to_four_decimals(sweep_workspace):
    """Every number was written to 4 decimals: learning rates of 1e-05 and 3e-05 were both 0.0000."""
    sweep_workspace.run({**SWEEP, "grid": {"rlvr.learning_rate": [1e-5, 3e-5], "seed": [0, 1]}})
    report = (sweep_workspace.path / "reports/sweeps/s.md").read_text()
    summary, every = (markdown_rows(part) for part in report.split("## Mean")[1].split("## Every variant"))
    assert [row[:2] for row in summary] == [["1e-05", "0.6000"], ["3e-05", "0.6000"]]
    assert [row[1:4] for row in every] == [["1e-05", "0", "0.6000"], ["1e-05", "1", "0.6000"],
                                           ["3e-05", "0", "0.6000"], ["3e-05", "1", "0.6000"]]


def test_a_malformed_sweep_file_gets_one_line_per_problem_naming_its_key(tmp_path):
    """pydantic's report spread one bad grid value over five messages and links to its docs."""
    from flows.sweep import load_sweep

    path = tmp_path / "sweep.yaml"
    path.write_text("name: s\ngrid: {seed: 0, judge.faults: [{http_500: 0.1}]}\ntarget: [evaluate]\n")
    with pytest.raises(ParamsError) as err:
        load_sweep(path)
    assert str(err.value).splitlines() == [
        f"{path}: grid: seed: got 0: Input should be a valid list",
        f"{path}: grid: judge.faults: item 1: got {{'http_500': 0.1}}, expected a number, string, true/false or null, "
        "or a list of them (what `dvc exp run -S` sets)",
        f"{path}: metrics: missing",
        f"{path}: target: unknown key (the keys are name, targets, grid, metrics)"]


@pytest.mark.parametrize("cron, problem", [("0 3 * *", "not a cron expression"), ("61 3 * * *", "not a cron"),
                                           ("0 3 * * * *", "6 fields")])  # the sixth: seconds, 60 runs a night
def test_serve_refuses_a_bad_cron_before_registering_anything(monkeypatch, capsys, cron, problem):
    import flows.serve

    from prefect.settings import PREFECT_API_URL, temporary_settings

    served = []
    monkeypatch.setattr(flows.serve, "serve", lambda *deployments, limit: served.append(deployments))
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:4200/api"}), pytest.raises(SystemExit):
        flows.serve.main(["--cron", cron])  # was a pydantic traceback, or served
    assert not served and f"--cron {cron!r}: {problem}" in capsys.readouterr().err
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:4200/api"}):
        flows.serve.main(["--cron", "30 2 * * 1-5"])
        flows.serve.main(["--cron", ""])
    assert served[0][0].schedules[0].schedule.cron == "30 2 * * 1-5" and not served[1][0].schedules


def test_serve_without_a_prefect_server_is_an_error_not_a_schedule_that_never_fires(monkeypatch, capsys):
    import flows.serve

    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.setattr(flows.serve, "serve", lambda *deployments, limit: pytest.fail("served"))
    with temporary_settings(restore_defaults={PREFECT_API_URL}), pytest.raises(SystemExit):
        flows.serve.main([])
    assert "PREFECT_API_URL=http://127.0.0.1:4200/api" in capsys.readouterr().err


def test_a_pipeline_run_with_a_missing_profile_is_an_error_naming_it(monkeypatch):
    import flows.pipeline

    monkeypatch.setattr(flows.pipeline, "configure", lambda params: pytest.fail("ran"))
    with pytest.raises(ParamsError, match=r"profile 'configs/params.smok.yaml': no such file"):
        flows.pipeline.pipeline.fn(["report"], profile="configs/params.smok.yaml")


def test_a_second_pipeline_run_stops_at_once_and_leaves_the_first_ones_params(tmp_path, monkeypatch,
                                                                            restore_tracking_uri):
    """A run with a profile or overrides (the smoke deployment, a custom run from the UI) started while another ran
    rewrote params.yaml under it: the first run's remaining stages ran, and DVC locked, with the second's params."""
    import subprocess
    import sys
    import threading

    import mlflow

    import flows.pipeline
    from posttrain.errors import UserError

    root = Path(__file__).resolve().parents[1]
    for name in ("params.yaml", "dvc.yaml", "configs/params.smoke.yaml"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((root / name).read_text())
    monkeypatch.chdir(tmp_path)
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], check=True)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    experiment_id = mlflow.create_experiment("posttrain", artifact_location=str(tmp_path / "artifacts"))
    monkeypatch.setattr(flows.pipeline, "configure", lambda params: experiment_id)
    before = (tmp_path / "params.yaml").read_text()
    second, started = [], []

    def run_stage(name, parent):
        if threading.current_thread() is not threading.main_thread():
            return {"stage": name, "ran": True, "seconds": 0}  # the second run's own stage
        if not started:  # while the first run's stage runs, a second run starts with the smoke profile
            started.append(name)
            def start_second():
                try:
                    second.append(flows.pipeline.pipeline.fn(["prepare"], profile="configs/params.smoke.yaml"))
                except Exception as e:  # noqa: BLE001 - the outcome is the finding
                    second.append(e)
            thread = threading.Thread(target=start_second)
            thread.start()
            thread.join()
        assert (tmp_path / "params.yaml").read_text() == before, f"params.yaml rewritten under stage {name}"
        return {"stage": name, "ran": True, "seconds": 0}

    monkeypatch.setattr(flows.pipeline, "run_stage", run_stage)
    flows.pipeline.pipeline.fn(["prepare", "base_model"])
    assert isinstance(second[0], UserError) and "another pipeline run" in str(second[0])



# --- a system's own choice and its summary, in evaluate and the report ------------------------------------

def scored_rows(fmt: str, correct: list[bool]) -> list[dict]:
    return [{"id": str(i), "difficulty": 1 + i % 2, "format": fmt, "trajectory": "cot", "correct": c}
            for i, c in enumerate(correct)]


def test_a_policy_scored_on_every_format_shows_its_own_choice_in_the_stage_table():
    from stages.report import accuracy_by_stage

    # evaluate.models: [warmup, rlhf] (a valid config): rlhf is scored on every format, as the warm-up is
    rlhf = summarize(scored_rows("own_choice", [True] * 4) + scored_rows("cot", [False] * 4)
                     + scored_rows("pot", [False] * 4), [1] * 12)
    external = summarize(scored_rows("external", [True, False]), [1, 1])
    table = accuracy_by_stage({"rlhf": rlhf, "dots_external": external}, None, None)
    # was 0.333 for routed RLHF: the mean over its three formats, in the table of own-choice accuracy
    assert table.set_index("stage")["accuracy"].to_dict() == {"DOTS external planner": 0.5, "routed RLHF": 1.0}
    static_only = summarize(scored_rows("cot", [True, False]), [1, 1])
    fallback = {"rlhf_test": {"accuracy": 0.25, "by_difficulty": {"1": 0.25}}}
    # scored on static trajectories alone: the stage's own test figure, not the static one's
    table = accuracy_by_stage({"rlhf": static_only}, fallback, None)
    # measured by its stage (its own max_new_tokens), not by evaluate, and named so
    assert table.to_dict("records") == [{"stage": "routed RLHF (its stage's test figure)", "accuracy": 0.25, "d1": 0.25}]


def test_a_model_scored_on_static_trajectories_alone_has_no_own_choice_to_show(tmp_path, monkeypatch):
    import stages.evaluate as evaluate

    cot = summarize(scored_rows("cot", [True, True, True, False]), [1] * 4)
    both = summarize(scored_rows("cot", [True] * 4) + scored_rows("pot", [False] * 4), [1] * 8)
    assert own_choice(cot) is None and own_choice(both) is None  # was the cot / the mean figures
    assert own_choice(summarize(scored_rows("vanilla", [True, False]), [1, 1]))["accuracy"] == 0.5
    figures = []
    monkeypatch.setattr(evaluate.plt, "close", figures.append)
    evaluate.plot_accuracy({"warmup": cot, "sft": both}, tmp_path / "acc.png")
    # was 'warmup: own choice 0.75' and 'sft: own choice 0.50, mean over 2 formats 0.50'
    assert [ax.get_title() for ax in figures[0].axes] == ["warmup: cot 0.75", "sft: mean over 2 formats 0.50"]


def test_mean_actions_count_the_trajectories_the_system_chose_not_the_static_ones():
    # the warm-up scored on every format chose cot (1 action) on its own: the 12 static rows name theirs in the prompt
    rows = [{"id": "q", "difficulty": 1, "format": "own_choice", "trajectory": "cot", "correct": True}]
    rows += [{"id": "q", "difficulty": 1, "format": t.name, "trajectory": t.name, "correct": False} for t in TRAJECTORIES]
    rows += [{"id": "r", "difficulty": 2, "format": "external", "trajectory": "rewrite+pot+verify", "correct": True},
             {"id": "s", "difficulty": 2, "format": "vanilla", "trajectory": None, "correct": True}]
    summary = summarize(rows, [1] * len(rows))
    assert summary["mean_actions_by_difficulty"] == {"1": 1.0, "2": 3.0}  # d1 was 2.077: the static formats' mean
    assert summary["by_difficulty"] == {"1": round(1 / 13, 4), "2": 1.0}  # accuracy still over every row


def test_a_report_missing_a_stages_metrics_says_which_sections_are_left_out(tmp_path, monkeypatch):
    import stages.report as report

    (tmp_path / "reports/metrics").mkdir(parents=True)
    own = {"accuracy": 0.5, "by_difficulty": {"1": 0.5}}
    (tmp_path / "reports/metrics/evaluate.json").write_text(json.dumps({"rlvr": {**own, "by_format": {"own_choice": own}}}))
    monkeypatch.chdir(tmp_path)
    report.write_report()
    page = (tmp_path / "reports/README.md").read_text()
    assert "RLVR (AR3PO)" in page  # the sections it has are there
    (line,) = [line for line in page.splitlines() if line.startswith("Not in this page")]  # was silent
    assert "train_rm.json" in line and "rlhf_routed.json" in line and "rlvr_ar3po.json" in line
    assert "evaluate.json" not in line


def test_accuracy_by_question_kind_in_the_summary_and_the_report(tmp_path, monkeypatch):
    """The test split's kinds need not follow train's (test held half train's share of repeat questions), so each
    kind's accuracy is given: over every row, per format, and in the report per stage and per static trajectory."""
    import stages.report as report

    def row(i, fmt, kind, correct):
        return {"id": f"q{i}", "difficulty": 1, "format": fmt, "trajectory": "pot", "kind": kind, "correct": correct}

    rows = [row(0, "own_choice", "chain", True), row(1, "own_choice", "repeat", True),
            row(2, "own_choice", "repeat", False),
            row(0, "pot", "chain", True), row(1, "pot", "repeat", False), row(2, "pot", "repeat", False)]
    summary = summarize(rows, [1] * 6)
    assert summary["questions_by_kind"] == {"chain": 1, "repeat": 2}  # questions, not responses
    assert summary["by_format"]["own_choice"]["by_kind"] == {"chain": 1.0, "repeat": 0.5}
    assert summary["by_format"]["pot"]["by_kind"] == {"chain": 1.0, "repeat": 0.0}
    assert summary["by_kind"] == {"chain": 1.0, "repeat": 0.25}
    assert "by_kind" not in summarize([{k: v for k, v in r.items() if k != "kind"} for r in rows], [1] * 6)
    table, counts = report.accuracy_by_kind({"warmup": summary})
    assert counts == {"chain": 1, "repeat": 2}
    assert table.to_dict("records") == [{"system": "warm-up (own choice)", "chain": 1.0, "repeat": 0.5},
                                        {"system": "warm-up, static pot", "chain": 1.0, "repeat": 0.0}]
    (tmp_path / "reports/metrics").mkdir(parents=True)
    (tmp_path / "reports/metrics/evaluate.json").write_text(json.dumps({"warmup": summary}))
    monkeypatch.chdir(tmp_path)
    report.write_report()
    page = (tmp_path / "reports/README.md").read_text()
    assert "## Accuracy by question kind" in page and "test questions per kind: chain 1, repeat 2" in page


def test_the_accuracy_plot_puts_systems_three_to_a_row(tmp_path, monkeypatch):
    import stages.evaluate as evaluate

    figures = []
    monkeypatch.setattr(evaluate.plt, "close", figures.append)
    own = {"accuracy": 0.4, "by_difficulty": {"1": 0.4}}
    evaluate.plot_accuracy({f"s{i}": {"accuracy": 0.4, "by_format": {"own_choice": own}} for i in range(4)},
                           tmp_path / "acc.png")
    (fig,) = figures
    assert len(fig.axes) == 4 and tuple(fig.get_size_inches()) == (15, 7.6)  # was one row, 24 inches wide


@pytest.mark.parametrize("tail, retried", [
    ("ERROR: failed to reproduce 'warmup': failed to run: python3 -m stages.warmup, exited with -9", True),  # killed
    ("ERROR: failed to reproduce 'prepare': failed to run: python3 -m stages.prepare, exited with 2", False),
    ("ERROR: Unable to acquire lock. Most likely another DVC process is running", False),
    ("ERROR: 'models/warmup' is busy, it is being blocked by: (PID 42): dvc repro", False),
])
def test_a_stage_is_retried_only_where_a_retry_can_succeed(tail, retried):
    """A stage that stopped on a bad row or on another run's lock ran twice more, 5 s apart, before the one error."""
    from prefect.states import Failed

    from flows.pipeline import worth_retrying
    from posttrain.orchestration import CommandFailed

    failure = CommandFailed(f"stage x failed (exit 255):\n{tail}")
    assert worth_retrying(None, None, Failed(data=failure)) is retried


def test_the_report_page_shows_other_stages_figures_from_copies_git_tracks(tmp_path, monkeypatch):
    """It linked dots/, evaluate/, rm/ and routing/ PNGs: DVC outputs, absent from a clone, so the committed page
    showed four broken images. It copies them beside itself; a figure no stage drew is left out, not linked."""
    import stages.report as report

    monkeypatch.chdir(tmp_path)
    (tmp_path / "reports/metrics").mkdir(parents=True)
    (tmp_path / "reports/dots").mkdir()
    (tmp_path / "reports/dots/optimal_trajectories.png").write_bytes(b"\x89PNG dots")
    own = {"accuracy": 0.5, "by_difficulty": {"1": 0.5}}
    (tmp_path / "reports/metrics/evaluate.json").write_text(json.dumps(
        {"warmup": {**own, "by_format": {"own_choice": own, "cot": own}}}))
    report.write_report()
    page = (tmp_path / "reports/README.md").read_text()
    assert "![optimal trajectories](report/dots_optimal_trajectories.png)" in page
    assert (tmp_path / "reports/report/dots_optimal_trajectories.png").read_bytes() == b"\x89PNG dots"
    assert "evaluate/accuracy_by_difficulty.png" not in page  # evaluate drew none here
