"""The ``posttrain`` command: user errors end in one ``error:`` line and exit 2, never a traceback; the standalone
judge serves as the rlhf_routed stage's does; Ctrl-C stops a UI without a traceback."""
import contextlib
import inspect
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import posttrain.judge_server as judge_server
from posttrain.cli import main

ROOT = Path(__file__).resolve().parents[1]


def workspace(tmp_path, monkeypatch, prepared=True, **judge):
    """``tmp_path`` as the working directory: params.yaml (``judge`` keys changed, seed 7), data/prepared if asked."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["seed"] = 7
    params["judge"].update(judge)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    if prepared:
        (tmp_path / "data/prepared").mkdir(parents=True)
        for split in ("train", "dev", "test"):
            (tmp_path / f"data/prepared/{split}.jsonl").write_text("")
    monkeypatch.chdir(tmp_path)
    return params


def no_server(*args, **kwargs):
    raise AssertionError("no server may start")


@pytest.mark.parametrize("argv", [["check-params"], ["ui", "mlflow"], ["judge", "serve"]])
def test_invalid_params_end_every_command_with_one_error(tmp_path, monkeypatch, capsys, argv):
    """ui mlflow and judge serve ended in a ParamsError traceback."""
    (tmp_path / "params.yaml").write_text("seed: x\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(subprocess, "Popen", no_server)
    monkeypatch.setattr(judge_server, "JudgeService", no_server)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: params.yaml: seed: got 'x', expected an integer\n") and "Traceback" not in err


def test_judge_serve_before_prepare_says_what_to_run(tmp_path, monkeypatch, capsys):
    """It was a FileNotFoundError traceback."""
    workspace(tmp_path, monkeypatch, prepared=False)
    monkeypatch.setattr(judge_server, "JudgeService", no_server)
    assert main(["judge", "serve"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: data/prepared/train.jsonl: no such file") and "python3 -m dvc repro prepare" in err


def test_judge_serve_draws_faults_as_the_stage_does(tmp_path, monkeypatch):
    """The standalone server seeded its faults with 0 whatever params' seed, the stage's service with params' seed:
    the two failed different requests."""
    params = workspace(tmp_path, monkeypatch, faults={"http_500": 0.3, "timeout": 0.1})
    real_build_app = judge_server.build_app
    built = []

    def build_app(*args, **kwargs):
        arguments = inspect.signature(real_build_app).bind(*args, **kwargs)
        arguments.apply_defaults()
        built.append({k: v for k, v in arguments.arguments.items() if k != "judge"})
        return "app"

    @contextlib.contextmanager
    def service(app, port=None):
        yield type("Service", (), {"base_url": "http://127.0.0.1:1/v1"})

    def ctrl_c(seconds):
        raise KeyboardInterrupt
    monkeypatch.setattr(judge_server, "build_app", build_app)
    monkeypatch.setattr(judge_server, "JudgeService", service)
    monkeypatch.setattr(time, "sleep", ctrl_c)
    assert main(["judge", "serve"]) == 0
    from posttrain.params import load_params
    loaded = load_params()
    with judge_server.judge_endpoint(loaded.judge, [], loaded.seed):  # as stages/rlhf_routed.py starts it
        pass
    served, stage = built
    assert served == stage and served["seed"] == params["seed"]


def test_judge_serve_on_a_port_in_use(tmp_path, monkeypatch, capsys):
    """It was a RuntimeError traceback; the README's vLLM example serves on the default port, 8000."""
    workspace(tmp_path, monkeypatch)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["judge", "serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err  # uvicorn may have logged the bind error above ours
    assert err.splitlines()[-1].startswith("error: the local judge service") and str(port) in err and "--port" in err
    assert "Traceback" not in err


def test_ctrl_c_lets_the_ui_server_shut_down(tmp_path, monkeypatch):
    """subprocess.call killed the server at once on Ctrl-C, and the interrupt ended the command in a traceback."""
    workspace(tmp_path, monkeypatch, prepared=False)
    calls = []

    class Server:
        def __init__(self, cmd, **kwargs):
            calls.append(("start", cmd[2]))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def wait(self, timeout=None):
            calls.append(("wait", timeout))
            if len(calls) == 2:
                raise KeyboardInterrupt  # the terminal's Ctrl-C: the server got it too and shuts down
            return 0

        def kill(self):
            calls.append(("kill",))
    monkeypatch.setattr(subprocess, "Popen", Server)
    try:
        code = main(["ui", "mlflow"])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped as a traceback")
    assert code == 0
    assert calls[0] == ("start", "mlflow") and ("kill",) not in calls and calls[-1][0] == "wait"


@pytest.mark.parametrize("argv", [["judge", "serve", "--port", "70000"], ["ui", "mlflow", "--port", "-1"]])
def test_a_port_out_of_range_is_a_usage_error(tmp_path, monkeypatch, capsys, argv):
    """judge serve --port 70000 ended in an OverflowError traceback from the socket's bind."""
    workspace(tmp_path, monkeypatch)
    monkeypatch.setattr(subprocess, "Popen", no_server)
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and f"argument --port: {argv[-1]} is not a port number" in capsys.readouterr().err


def test_a_failed_stage_ends_run_with_its_output_not_a_traceback(tmp_path, monkeypatch, capsys):
    """A stage that failed under `posttrain run` ended in a RuntimeError traceback after the stage's own output."""
    import flows.pipeline
    from posttrain.orchestration import run_dvc

    workspace(tmp_path, monkeypatch)
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], check=True)
    (tmp_path / "dvc.yaml").write_text("stages:\n  boom:\n    cmd: python3 -c \"raise SystemExit('stage boom broke')\"\n")

    def pipeline(stages):
        run_dvc(["repro", "--single-item", "boom"], {}, lambda line: None, what="stage boom")

    monkeypatch.setattr(flows.pipeline, "pipeline", pipeline)
    monkeypatch.setattr("posttrain.cli.start_prefect_server", lambda: None)  # no flow runs: no API server to start
    assert main(["run", "boom"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: stage boom failed") and "stage boom broke" in err and "Traceback" not in err


def test_a_bad_sweep_file_is_one_error_line_before_any_flow_starts(tmp_path, monkeypatch, capsys):
    """The sweep file was first read inside the Prefect flow: a typo printed a failed flow run's traceback."""
    import flows.sweep

    workspace(tmp_path, monkeypatch)
    (tmp_path / "bad.yaml").write_text("name: s\ngrid: {rlhf.budgett: [0.1]}\ntargets: [rlhf_routed]\n")

    def no_flow(path):
        raise AssertionError("the flow must not start")

    monkeypatch.setattr(flows.sweep, "sweep", no_flow)
    assert main(["sweep", "bad.yaml"]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_python_m_flows_sweep_reports_a_bad_sweep_file_as_the_cli_does(tmp_path, monkeypatch):
    """README names `python3 -m flows.sweep <file>` beside `posttrain sweep`: it printed the ParamsError's traceback."""
    workspace(tmp_path, monkeypatch)
    proc = subprocess.run([sys.executable, "-m", "flows.sweep", "missing.yaml"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and proc.stderr.startswith("error: missing.yaml: ") and "Traceback" not in proc.stderr


@pytest.mark.parametrize("params, stage, said", [
    (None, "evalute", "error: unknown stage(s) 'evalute'; the stages are: prepare, "),
    ("seed: x\n", "evaluate", "error: params.yaml: seed: got 'x', expected an integer\n")])
def test_a_mistyped_stage_or_bad_params_is_one_error_line_before_the_flow_starts(tmp_path, monkeypatch, capsys,
                                                                                 params, stage, said):
    """Both were first found inside the Prefect flow: a minute of starting Prefect's server on 2 cores, then a failed
    flow run's traceback."""
    import flows.pipeline

    workspace(tmp_path, monkeypatch)
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], check=True)
    (tmp_path / "dvc.yaml").write_text((ROOT / "dvc.yaml").read_text())
    if params:
        (tmp_path / "params.yaml").write_text(params)

    def no_flow(stages):
        raise AssertionError("the flow must not start")

    monkeypatch.setattr(flows.pipeline, "pipeline", no_flow)
    assert main(["run", stage]) == 2
    err = capsys.readouterr().err
    assert err.startswith(said) and "Traceback" not in err


def test_run_outside_the_repository_is_one_error_line(tmp_path, monkeypatch, capsys):
    """With a params.yaml but no DVC repository around it, `posttrain run` ended in a NotDvcRepoError traceback."""
    workspace(tmp_path, monkeypatch)
    assert main(["run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "repository root" in err and "Traceback" not in err
