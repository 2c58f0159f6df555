"""Prefect deployments of the pipeline, served from this repository, so runs are started and scheduled from the
Prefect UI (or its API) with their parameters: ``stages``, ``profile``, ``overrides``.

    posttrain ui prefect &                                  # the UI and API on http://127.0.0.1:4200
    PREFECT_API_URL=http://127.0.0.1:4200/api python3 -m flows.serve [--cron "0 3 * * *"]

Two deployments: ``posttrain-pipeline/default`` (params.yaml as it is, on the cron schedule, daily at 03:00 by
default) and ``posttrain-pipeline/smoke`` (the smoke profile, unscheduled: a quick check from the UI). The
serving process runs each flow run here, in this checkout; stop it with Ctrl-C.
"""
from __future__ import annotations

import argparse

from pydantic import ValidationError

from posttrain.orchestration import apply_prefect_settings

apply_prefect_settings()

from prefect import serve  # noqa: E402
from prefect.client.schemas.schedules import CronSchedule  # noqa: E402
from prefect.settings import PREFECT_API_URL  # noqa: E402

from flows.pipeline import pipeline  # noqa: E402


def deployments(cron: str | None):
    return [
        pipeline.to_deployment(name="default", cron=cron, tags=["posttrain"],
                               parameters={"stages": None, "profile": None, "overrides": {}},
                               description="The DVC pipeline with params.yaml; override any key from the UI."),
        pipeline.to_deployment(name="smoke", tags=["posttrain", "smoke"],
                               parameters={"stages": None, "profile": "configs/params.smoke.yaml", "overrides": {}},
                               description="The smoke profile (minutes): rewrites params.yaml to it first."),
    ]


def cron_problem(cron: str) -> str | None:
    """Why ``cron`` is no schedule for the pipeline, or None."""
    try:
        CronSchedule(cron=cron)
    except ValidationError:
        return "not a cron expression"
    if not cron.startswith("@") and len(cron.split()) != 5:
        # Prefect's croniter reads a sixth field as seconds: '0 3 * * * *' is every second from 03:00:00 to
        # 03:00:59, sixty pipeline runs a night
        return f"{len(cron.split())} fields, where a cron expression has 5"
    return None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cron", default="0 3 * * *", help="schedule of the default deployment, in UTC ('' = none)")
    args = ap.parse_args(argv)
    problem = args.cron and cron_problem(args.cron)
    if problem:
        ap.error(f"--cron {args.cron!r}: {problem} (minute hour day-of-month month day-of-week, e.g. '0 3 * * *', "
                 "or '' for no schedule)")
    if not PREFECT_API_URL.value():
        # without a server Prefect serves from a temporary one of its own: no UI to start runs from, and no
        # scheduler, so the schedule never fires, silently
        ap.error("no Prefect server: start one with `posttrain ui prefect`, then run this with "
                 "PREFECT_API_URL=http://127.0.0.1:4200/api")
    # one run at a time: a run with a profile or overrides rewrites params.yaml under another's remaining stages,
    # and two `dvc repro` in one workspace would fight over DVC's lock
    serve(*deployments(args.cron or None), limit=1)


if __name__ == "__main__":
    main()
