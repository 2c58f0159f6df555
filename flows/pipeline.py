"""The Prefect flow that runs the DVC pipeline: one task per stage, in graph order.

Each task calls ``dvc repro --single-item <stage>``, so DVC's cache decides whether the stage runs
(an unchanged stage is skipped in about a second); a failed stage is retried (long stages resume from
their checkpoints). All stage runs nest under one MLflow parent run for this pipeline execution, and
the flow returns the final evaluation metrics.

Runs with no Prefect server (ephemeral) or against one (set PREFECT_API_URL):

    python -m flows.pipeline            # or: posttrain run
    python -m flows.serve               # deployments for the Prefect UI (parameters, schedule); see README

``profile`` (a params file, e.g. configs/params.smoke.yaml) and ``overrides`` (dotted keys) rewrite params.yaml
before the stages run, as ``dvc exp run --set-param`` would; without them params.yaml is used as it is.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from posttrain.orchestration import apply_prefect_settings, pipeline_lock, quiet_explained_failures, run_dvc

apply_prefect_settings()

import mlflow  # noqa: E402
import networkx as nx  # noqa: E402
from prefect import flow, get_run_logger, task  # noqa: E402

from posttrain.accuracy_summary import SYSTEM_ORDER, own_choice  # noqa: E402
from posttrain.params import ParamsError, load_params, with_overrides  # noqa: E402
from posttrain.tracking import (PARENT_ENV, close_interrupted_runs, configure, git_state,  # noqa: E402
                                process_tags)

quiet_explained_failures()  # a failed stage: its last lines and the CLI's one line, without Prefect's two tracebacks
METRICS = Path("reports/metrics/evaluate.json")


def stage_order(repo_root: str = ".") -> list[str]:
    """The pipeline's stage names (dvc.yaml) in dependency order."""
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo

    try:
        repo = Repo(repo_root)
    except NotDvcRepoError as e:  # a traceback would not say what to do
        raise ParamsError(f"{e}: run from the repository root (where dvc.yaml is)") from None
    with repo:
        graph = repo.index.graph  # edges point from a stage to the stages it depends on
        stages = [s for s in reversed(list(nx.topological_sort(graph))) if getattr(s, "name", None)]
        return [s.name for s in stages if s.path_in_repo.endswith("dvc.yaml")]


def check_stages(stages: list[str] | None, every: list[str]) -> None:
    """A ParamsError unless ``stages`` is None (all of them) or names some of ``every``, and only those."""
    if stages is not None and not stages:  # an emptied list in the Prefect UI would run nothing and exit green
        raise ParamsError(f"no stages named; leave stages unset for all of them ({', '.join(every)})")
    unknown = sorted(set(stages or []) - set(every))
    if unknown:  # a typo would otherwise run nothing and report the old metrics as this run's
        raise ParamsError(f"unknown stage(s) {', '.join(map(repr, unknown))}; the stages are: {', '.join(every)}")


# a stage that stopped on the user's input (exit 2), a Ctrl-C (130) or another run's DVC lock fails the same way again
NOT_WORTH_RETRYING = ("exited with 2", "exited with 130", "Unable to acquire lock", "is busy, it is being blocked by")


def worth_retrying(task, task_run, state) -> bool:
    """Prefect's retry condition: retry a stage that crashed (killed, out of memory: it resumes from its checkpoint),
    not one that would fail again at once, after the retry delays and two more rounds of log."""
    return not any(sign in str(state.result(raise_on_failure=False)) for sign in NOT_WORTH_RETRYING)


@task(retries=2, retry_delay_seconds=5, retry_condition_fn=worth_retrying, task_run_name="{name}")
def run_stage(name: str, parent_run_id: str) -> dict:
    """``dvc repro`` one stage; returns whether it ran and how long it took."""
    logger = get_run_logger()
    start = time.perf_counter()
    output = run_dvc(["repro", "--single-item", name], {PARENT_ENV: parent_run_id},
                     lambda line: logger.info("%s | %s", name, line), what=f"stage {name}")
    seconds = time.perf_counter() - start
    restored = "is cached - skipping run" in output  # DVC's run cache had this stage's outputs: checked out, not run
    skipped = restored or "didn't change, skipping" in output
    logger.info("%s: %s in %.1f s", name, "restored from DVC's run cache" if restored
                else "unchanged, skipped" if skipped else "ran", seconds)
    return {"stage": name, "ran": not skipped, "seconds": round(seconds, 2)}


@flow(name="posttrain-pipeline", log_prints=True)
def pipeline(stages: list[str] | None = None, profile: str | None = None,
             overrides: dict[str, Any] | None = None) -> dict:
    """Run the pipeline (or the named stages, in graph order); return the final metrics.

    ``profile``: a params file to start from (default: params.yaml as it is); ``overrides``: dotted keys set on it
    (``{"rlhf.budget": 0.2}``). Either one rewrites params.yaml before the stages run."""
    every = stage_order()  # reads dvc.yaml through DVC's Repo: once
    check_stages(stages, every)
    if profile and not Path(profile).is_file():  # typed in the Prefect UI: say what it is, not a bare OSError
        raise ParamsError(f"profile {profile!r}: no such file (a params file such as configs/params.smoke.yaml, "
                          "relative to the repository)")
    with pipeline_lock():  # before params.yaml is rewritten: a second run must not rewrite it under this one
        params = with_overrides(profile or "params.yaml", overrides) if profile or overrides else load_params()
        order = [s for s in every if stages is None or s in stages]
        experiment_id = configure(params)
        close_interrupted_runs(experiment_id, "pipeline")  # a killed `posttrain run` left its parent run RUNNING
        with mlflow.start_run(experiment_id=experiment_id, run_name="pipeline",
                              tags={"posttrain.stage": "pipeline", **process_tags(), **git_state()}) as parent:
            results = []
            for name in order:
                results.append(run_stage(name, parent.info.run_id))
            mlflow.log_dict({"stages": results}, "stages.json")
            # evaluate's figures belong to this run only if it ran evaluate: after `posttrain run prepare` the file
            # on disk measured other data or models
            metrics = json.loads(METRICS.read_text()) if "evaluate" in order and METRICS.exists() else {}
            for model, summary in metrics.items():
                # its own choice, as the report gives it; a warm-up's mean over its 13 formats is another system, and
                # a model told its trajectory each time has no accuracy of its own to log
                if (own := own_choice(summary)) is not None:
                    mlflow.log_metric(f"{model}.accuracy", own["accuracy"])
    return {"stages": results, "metrics": metrics}


def accuracy_lines(metrics: dict) -> list[str]:
    """One line per evaluated model: its own-choice test accuracy (what the report's table gives), and for a model
    scored on several formats their mean beside it; in the pipeline's order (evaluate.json sorts its keys)."""
    rank = {name: i for i, name in enumerate(SYSTEM_ORDER)}
    lines = []
    for model, summary in sorted(metrics.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0])):
        formats, own = summary.get("by_format") or {}, own_choice(summary)
        if own is None:  # told its trajectory each time: no figure is its own
            lines.append(f"{model}: no own-choice accuracy; mean over its {len(formats)} static formats "
                         f"{summary['accuracy']:.3f}")
        elif len(formats) > 1:
            lines.append(f"{model}: test accuracy {own['accuracy']:.3f} (own choice; mean over its "
                         f"{len(formats)} formats {summary['accuracy']:.3f})")
        else:
            lines.append(f"{model}: test accuracy {own['accuracy']:.3f}")
    return lines


if __name__ == "__main__":  # as `posttrain run`: a mistyped stage or a bad params.yaml is one line, Ctrl-C too
    from posttrain.cli import main

    sys.exit(main(["run", *sys.argv[1:]]))
