"""The ``posttrain`` command.

Also reachable as `python3 -m posttrain` (no PATH set-up needed).

    posttrain run [STAGE ...]      run the pipeline through Prefect (DVC skips unchanged stages)
    posttrain check-params [FILE]  validate params.yaml (or FILE) and print every problem
    posttrain sweep FILE           run an ablation sweep file as DVC experiments
    posttrain ui mlflow|prefect    open the MLflow or Prefect UI on this repository's stores
    posttrain judge serve          serve the local judge (OpenAI chat-completions protocol) until Ctrl-C

A problem the user can fix (invalid params, missing inputs) ends the command with `error: ...` and exit code 2;
a failed stage with `error: ...` (its output's last lines) and exit code 1; Ctrl-C with one line and exit code 130
(the running stage stops at its last checkpoint, and the same command resumes it).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from posttrain.errors import UserError
from posttrain.orchestration import (INTERRUPT_GRACE_SECONDS, CommandFailed, apply_prefect_settings,
                                     start_prefect_server)
from posttrain.params import load_params

PREPARED = Path("data/prepared")


def prepared_records() -> list[dict]:
    """The task's records of every split, in which the verifier judge looks up each question."""
    from posttrain.jsonl import read_jsonl

    paths = [PREPARED / f"{split}.jsonl" for split in ("train", "dev", "test")]
    for path in paths:
        if not path.exists():
            raise UserError(f"{path}: no such file; the verifier judge checks answers against the prepared "
                            "records: run `python3 -m dvc repro prepare` first")
    return [row for path in paths for row in read_jsonl(path)]


def serve_judge(port: int) -> int:
    """The judge of params.yaml (backend, latency, faults, mistake rate) over the records in data/prepared, on
    loopback."""
    import time

    from posttrain.judge_server import JudgeService, build_app, hf_backend, verifier_backend

    params = load_params()
    cfg = params.judge
    # only the verifier reads the task's records: an hf judge serves before prepare has run
    judge = (verifier_backend(prepared_records(), cfg.mistake_rate) if cfg.backend == "verifier"
             else hf_backend(cfg.hf_model))
    # faults drawn from params' seed, as the rlhf_routed stage's service draws them (judge_endpoint)
    app = build_app(judge, cfg.model, cfg.latency_s, cfg.faults, params.seed)
    try:
        with JudgeService(app, port=port) as svc:
            print(f"judge ({cfg.backend} backend, model name {cfg.model!r}) on {svc.base_url}; Ctrl-C stops it")
            while True:
                time.sleep(1)
    except KeyboardInterrupt:
        return 0
    except RuntimeError as e:  # the service could not listen or start: most often another process holds the port
        raise UserError(f"{e}; choose a free port with --port") from None


def run_server(cmd: list[str]) -> int:
    """Run a UI server in the foreground until it exits or Ctrl-C stops it."""
    print(" ".join(cmd))
    proc = subprocess.Popen(cmd)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        # the terminal's Ctrl-C reached the server too: let it shut down rather than kill it as subprocess.call does
        try:
            proc.wait(timeout=INTERRUPT_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return 0


def port_number(text: str) -> int:
    port = int(text)  # argparse words a ValueError as "invalid port_number value"
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (0-65535)")
    return port


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posttrain", description="Run, check, sweep and inspect the posttrain "
                                     "pipeline of this repository.", epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the pipeline as a Prefect flow")
    run.add_argument("stages", nargs="*", help="only these stages (default: all)")
    check = sub.add_parser("check-params", help="validate a params file")
    check.add_argument("file", nargs="?", default="params.yaml", help="a params file (default: params.yaml)")
    ui = sub.add_parser("ui", help="start a UI on loopback")
    ui.add_argument("which", choices=["mlflow", "prefect"])
    ui.add_argument("--port", type=port_number, default=None)
    sweep = sub.add_parser("sweep", help="run an ablation sweep file as DVC experiments (flows/sweep.py)")
    sweep.add_argument("file", help="e.g. configs/sweeps/routing.yaml")
    judge = sub.add_parser("judge", help="the local judge service")
    judge.add_argument("action", choices=["serve"])
    judge.add_argument("--port", type=port_number, default=8000, help="0 for a free one")
    return parser


def run_command(args: argparse.Namespace) -> int:
    if args.command == "check-params":
        load_params(args.file)
        print(f"{args.file}: ok")
        return 0
    if args.command == "run":
        apply_prefect_settings()
        from flows.pipeline import accuracy_lines, check_stages, pipeline, stage_order

        # a bad params.yaml or a mistyped stage is one error line here, not a failed flow run's traceback after a
        # minute of starting Prefect's server
        load_params()
        check_stages(args.stages or None, stage_order())
        start_prefect_server()
        result = pipeline(args.stages or None)
        for stage in result["stages"]:
            print(f"{stage['stage']}: {'ran' if stage['ran'] else 'unchanged'} ({stage['seconds']} s)")
        print("\n".join(accuracy_lines(result["metrics"])))
        return 0
    if args.command == "sweep":
        apply_prefect_settings()
        from flows.sweep import load_sweep, sweep as run_sweep

        load_sweep(args.file)  # a bad file is one error line here, not a failed flow run's traceback first
        start_prefect_server()
        print(f"report: {run_sweep(args.file)['report']}")
        return 0
    if args.command == "judge":
        return serve_judge(args.port)
    if args.which == "mlflow":
        return run_server([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", load_params().tracking.uri,
                           "--host", "127.0.0.1", "--port", str(args.port or 5000)])
    apply_prefect_settings()
    return run_server([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                       "--port", str(args.port or 4200)])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run_command(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except CommandFailed as e:  # a stage failed: its own output says why, a traceback of this process would not
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the running stage got the Ctrl-C too and stopped at its last checkpoint
        print(f"interrupted: `posttrain {args.command}` stopped; run it again (or `python3 -m dvc repro`) to resume",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
