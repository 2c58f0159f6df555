"""The ``posttrain`` command.

Also reachable as ``python3 -m posttrain`` (no PATH set-up needed).

    posttrain run [STAGE ...]      run the pipeline through Prefect (DVC skips unchanged stages)
    posttrain check-params [FILE]  validate params.yaml (or FILE) and print every problem
    posttrain ui mlflow|prefect    open the MLflow or Prefect UI on this repository's stores
    posttrain judge serve          serve the local judge (OpenAI chat-completions protocol) until Ctrl-C
"""
from __future__ import annotations

import argparse
import subprocess
import sys

from posttrain.orchestration import apply_prefect_settings
from posttrain.params import ParamsError, load_params



def serve_judge(port: int) -> int:
    """The judge of params.yaml (backend, latency, faults) over the records in data/prepared, on loopback."""
    import json
    import time
    from pathlib import Path

    from posttrain.judge_server import JudgeService, build_app, hf_backend, verifier_backend

    cfg = load_params().judge
    if cfg.backend == "verifier":  # only it reads the task's records: an hf judge serves before prepare has run
        judge = verifier_backend([json.loads(line) for split in ("train", "dev", "test") for line in
                                  Path(f"data/prepared/{split}.jsonl").read_text(encoding="utf-8").splitlines()])
    else:
        judge = hf_backend(cfg.hf_model)
    with JudgeService(build_app(judge, cfg.model, cfg.latency_s, cfg.faults), port=port) as svc:
        print(f"judge ({cfg.backend} backend, model name {cfg.model!r}) on {svc.base_url}; Ctrl-C stops it")
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="posttrain", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the pipeline as a Prefect flow")
    run.add_argument("stages", nargs="*", help="only these stages (default: all)")
    check = sub.add_parser("check-params", help="validate a params file")
    check.add_argument("file", nargs="?", default="params.yaml")
    ui = sub.add_parser("ui", help="start a UI on loopback")
    ui.add_argument("which", choices=["mlflow", "prefect"])
    ui.add_argument("--port", type=int, default=None)
    sweep = sub.add_parser("sweep", help="run an ablation sweep file as DVC experiments (flows/sweep.py)")
    sweep.add_argument("file", help="e.g. configs/sweeps/routing.yaml")
    judge = sub.add_parser("judge", help="the local judge service")
    judge.add_argument("action", choices=["serve"])
    judge.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)

    if args.command == "check-params":
        try:
            load_params(args.file)
        except ParamsError as e:
            print(e, file=sys.stderr)
            return 2
        print(f"{args.file}: ok")
        return 0
    if args.command == "run":
        apply_prefect_settings()
        from flows.pipeline import accuracy_lines, pipeline

        try:
            result = pipeline(args.stages or None)
        except ParamsError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        for stage in result["stages"]:
            print(f"{stage['stage']}: {'ran' if stage['ran'] else 'unchanged'} ({stage['seconds']} s)")
        print("\n".join(accuracy_lines(result["metrics"])))
        return 0
    if args.command == "sweep":
        apply_prefect_settings()
        from flows.sweep import sweep as run_sweep

        try:
            result = run_sweep(args.file)
        except ParamsError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"report: {result['report']}")
        return 0
    if args.command == "judge":
        return serve_judge(args.port)
    if args.which == "mlflow":
        params = load_params()
        port = str(args.port or 5000)
        cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", params.tracking.uri, "--host", "127.0.0.1",
               "--port", port]
    else:
        apply_prefect_settings()
        cmd = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
               "--port", str(args.port or 4200)]
    print(" ".join(cmd))
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
