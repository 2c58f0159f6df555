"""MLflow lineage: every stage execution is one run carrying its code, data and parameter identity.

Tags on each run: ``posttrain.stage``, ``git.commit``, ``git.dirty``, and for each DVC dependency and
output of the stage ``dvc.dep.<path>`` / ``dvc.out.<path>`` = its md5, computed with DVC's own hashing
(so the values are the ones ``dvc.lock`` records); ``posttrain.dvc_hashes_missing`` when DVC could not hash
the deps. When ``POSTTRAIN_PARENT_RUN_ID`` is set (the Prefect flow sets it) the run nests under that pipeline
run; ``POSTTRAIN_SWEEP`` / ``POSTTRAIN_VARIANT`` (set by flows/sweep.py) become the tags ``posttrain.sweep`` /
``posttrain.variant``.

A SIGKILLed stage cannot end its run, which MLflow then shows as RUNNING for ever. Each run records the
process (``posttrain.pid``, ``posttrain.host``); the next run of the same stage marks runs whose process is
gone as FAILED (tag ``posttrain.interrupted``) and links itself to them (``posttrain.resumed_from_run``).

Float results are bit-for-bit repeatable on one machine but not across CPUs (each picks its own SIMD kernels), so
each run also records what decides them: ``numerics.cpu``, ``numerics.torch_cpu_capability``,
``numerics.torch_threads``, ``numerics.device``, the versions of torch, transformers and trl, and the kernel caps
(``numerics.ATEN_CPU_CAPABILITY``, ``numerics.MKL_ENABLE_INSTRUCTIONS``, ``numerics.DNNL_MAX_CPU_ISA``). Two runs whose
weights differ with the same ``dvc.dep.*`` tags can be told apart by these.

In a multi-process launch only rank 0 logs to the configured store; the other ranks' runs go to a throwaway one
(see ``posttrain.process_group``), with the same tags, so their checkpoint keys match rank 0's.

Example:
    >>> with stage_run("prepare", params, sections=["seed", "task", "prepare"]) as run:   # doctest: +SKIP
    ...     mlflow.log_metric("n_train", 3000)
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import platform
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from mlflow.tracking import MlflowClient
from tenacity import Retrying, retry_if_not_exception_type, stop_after_attempt, wait_exponential

import mlflow
from posttrain.errors import UserError
from posttrain.params import flatten
from posttrain.params_schema import Params
from posttrain.process_group import is_main_process

PARENT_ENV = "POSTTRAIN_PARENT_RUN_ID"
PART_TAG = "posttrain.part_of"  # on a run nested in a stage's run for one of the models it trains (part_run)
HASHES_MISSING_TAG = "posttrain.dvc_hashes_missing"  # DVC could not hash the deps: checkpoint keys fall back
SWEEP_ENV, VARIANT_ENV = "POSTTRAIN_SWEEP", "POSTTRAIN_VARIANT"  # set by flows/sweep.py for each variant
log = logging.getLogger(__name__)


class TrackingError(UserError):
    """The configured MLflow store cannot take this run (the message names the params key to fix)."""


@functools.cache
def throwaway_store() -> Path:
    """A private directory for an MLflow store and its artifacts, removed at exit: where a rank other than 0 logs."""
    root = Path(tempfile.mkdtemp(prefix="posttrain-mlflow-rank"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def configure(params: Params) -> str:
    """Point MLflow at the configured store and experiment (a throwaway one on ranks other than 0); return the
    experiment id."""
    main = is_main_process()
    uri = params.tracking.uri if main else f"sqlite:///{throwaway_store() / 'mlflow.db'}"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    client = MlflowClient()
    exp = client.get_experiment_by_name(params.tracking.experiment)
    if exp is not None and exp.lifecycle_stage == "deleted":  # MLflow refuses runs in it, deep in start_run
        raise TrackingError(f"tracking.experiment: MLflow experiment {exp.name!r} (id {exp.experiment_id}) is deleted; "
                            f"restore it (MLflow UI, or `mlflow experiments restore --experiment-id "
                            f"{exp.experiment_id}`) or set another tracking.experiment")
    if exp is not None:
        return exp.experiment_id
    root = params.tracking.artifact_root if main else str(throwaway_store() / "artifacts")
    location = root if "://" in root else Path(root).resolve().as_uri()
    try:
        return client.create_experiment(params.tracking.experiment, artifact_location=location)
    except mlflow.exceptions.MlflowException:  # created concurrently by another stage
        return client.get_experiment_by_name(params.tracking.experiment).experiment_id


def git_state() -> dict[str, str]:
    def git(*args: str) -> str:
        try:
            # rstrip only: `git status --porcelain` lines start with a meaningful space
            return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.rstrip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    commit = git("rev-parse", "HEAD").strip() or "unknown"
    # dvc.lock and the git-tracked reports change during a repro; only other changes make a run dirty.
    status = [ln for ln in git("status", "--porcelain", "--untracked-files=no").splitlines()
              if not ln[3:].startswith(("dvc.lock", "reports/"))]
    return {"git.commit": commit, "git.dirty": str(bool(status)).lower()}


def dvc_hashes(stage: str, which: str, attempts: int = 3) -> dict[str, str]:
    """md5 of each dep or out of ``stage`` as DVC computes it ({} outside a DVC repo). A failure (e.g. DVC's
    state database busy while another DVC process writes it) is retried ``attempts`` times with backoff."""
    try:
        from dvc.dependency.param import ParamsDependency
        from dvc.exceptions import NotDvcRepoError
        from dvc.repo import Repo

        for attempt in Retrying(stop=stop_after_attempt(attempts), wait=wait_exponential(multiplier=0.5, max=4),
                                retry=retry_if_not_exception_type(NotDvcRepoError), reraise=True):
            with attempt, Repo(".") as repo:
                (st,) = repo.stage.collect(stage)
                items = st.deps if which == "dep" else st.outs
                # params are logged as MLflow params; a missing path has no hash yet
                return {f"dvc.{which}.{item.def_path}": item.get_hash().value for item in items
                        if not isinstance(item, ParamsDependency) and item.exists}
    except Exception as e:  # lineage must never break a stage; say what is missing instead
        log.warning("could not compute DVC %s hashes for stage %s: %s", which, stage, e)
    return {}


def _process_gone(pid: int) -> bool:
    if pid == os.getpid():  # this process has not started its run yet: the RUNNING one was a killed process's, whose
        return True         # PID we were given again (a restarted container starts the same processes in order)
    try:
        os.kill(pid, 0)  # signal 0 only checks; PermissionError means alive but owned by someone else
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return False


def without_credentials(value: object) -> object:
    """``value`` with a URL's user:password and query replaced by ``***``: an endpoint (``judge.base_url``,
    ``rlhf.vllm_server_url``) may carry its key there, and secrets never reach MLflow. Where it points stays."""
    if not isinstance(value, str):
        return value
    try:
        parts = urlsplit(value)
    except ValueError:  # not a URL (an unclosed '[' after '//')
        return value
    if not (parts.scheme and parts.netloc):
        return value
    netloc = f"***@{parts.netloc.rpartition('@')[2]}" if "@" in parts.netloc else parts.netloc
    return urlunsplit((parts.scheme, netloc, parts.path, "***" if parts.query else "", parts.fragment))


def process_tags() -> dict[str, str]:
    """Which process on which host owns a run, so a later run can tell a killed one from a concurrent one."""
    return {"posttrain.pid": str(os.getpid()), "posttrain.host": socket.gethostname()}


def cpu_model() -> str:
    """The CPU's model name, as /proc/cpuinfo gives it."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


# the variables that cap the SIMD kernels of torch, MKL and oneDNN; set to AVX2 on an AVX-512 machine they give an
# AVX2-only machine's bits (README, "Float kernels differ between CPUs"); MKL's and oneDNN's choice shows nowhere else
KERNEL_CAPS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "DNNL_MAX_CPU_ISA")


def numerics_tags() -> dict[str, str]:
    """What decides a run's float results besides its code, data and params (see the module docstring)."""
    from importlib.metadata import version

    import torch
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return {"numerics.cpu": cpu_model(), "numerics.torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "numerics.torch_threads": str(torch.get_num_threads()), "numerics.device": device,
            **{f"numerics.{lib}": version(lib) for lib in ("torch", "transformers", "trl")},
            **{f"numerics.{var}": os.environ.get(var, "unset") for var in KERNEL_CAPS}}


def close_interrupted_runs(experiment_id: str, stage: str) -> list[str]:
    """Mark FAILED the RUNNING runs of ``stage`` whose process on this host no longer exists, and their nested
    ``part_run`` runs; the ids of those stage runs and of the runs stopped with Ctrl-C since (KILLED, not yet
    resumed), newest first. A run of another host, or whose process is alive (a concurrent run), is left alone."""
    client = MlflowClient()
    runs = client.search_runs([experiment_id], f"tags.`posttrain.stage` = '{stage}' and attributes.status = 'RUNNING'",
                              order_by=["attributes.start_time DESC"])
    parts = client.search_runs([experiment_id], f"tags.`{PART_TAG}` = '{stage}' and attributes.status = 'RUNNING'")
    closed = []
    for run in [*runs, *parts]:
        pid, host = run.data.tags.get("posttrain.pid"), run.data.tags.get("posttrain.host")
        if pid and host == socket.gethostname() and _process_gone(int(pid)):
            client.set_tag(run.info.run_id, "posttrain.interrupted", "true")
            client.set_terminated(run.info.run_id, "FAILED")
            if PART_TAG not in run.data.tags:
                closed.append(run.info.run_id)
    # a run stopped with Ctrl-C closed itself (KILLED, interrupted); the next run of its stage resumes it once
    stopped = client.search_runs([experiment_id], f"tags.`posttrain.stage` = '{stage}' and attributes.status = 'KILLED' "
                                 "and tags.`posttrain.interrupted` = 'true'", order_by=["attributes.start_time DESC"])
    for run in stopped:
        if "posttrain.resumed" not in run.data.tags:
            client.set_tag(run.info.run_id, "posttrain.resumed", "true")
            closed.append(run.info.run_id)
    return sorted(closed, key=lambda run_id: -client.get_run(run_id).info.start_time)


@contextlib.contextmanager
def stage_run(stage: str, params: Params, sections: list[str]):
    """One MLflow run for this stage execution; failed runs are marked FAILED, outs hashed on success, and
    runs of this stage left RUNNING by a killed process are closed as FAILED and linked to this one."""
    experiment_id = configure(params)
    parent = os.environ.get(PARENT_ENV)
    deps = dvc_hashes(stage, "dep")
    tags = {"posttrain.stage": stage, **process_tags(), **numerics_tags(), **git_state(), **deps}
    if not deps:  # checkpoint keys fall back to file bytes and must not delete the DVC-keyed checkpoints
        tags[HASHES_MISSING_TAG] = "true"
    interrupted = close_interrupted_runs(experiment_id, stage)
    if interrupted:
        tags["posttrain.resumed_from_run"] = interrupted[0]
        print(f"{stage}: resuming after the run(s) {', '.join(interrupted)}, interrupted (killed ones marked FAILED in "
              "MLflow)")
    if parent:
        tags["mlflow.parentRunId"] = parent
    run_name = stage
    if os.environ.get(SWEEP_ENV):
        tags.update({"posttrain.sweep": os.environ[SWEEP_ENV], "posttrain.variant": os.environ.get(VARIANT_ENV, "")})
        # MLflow's compare view lists runs by name: a sweep's variants were all named after the stage
        run_name = f"{stage} {os.environ.get(VARIANT_ENV, '')}".strip()
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name, tags=tags) as run:
        logged = {}
        for name in sections:
            value = getattr(params, name)
            logged.update(flatten(value, f"{name}.") if hasattr(value, "model_dump") else {name: value})
        mlflow.log_params({k: str(without_credentials(v))[:6000] for k, v in logged.items()})
        try:
            yield run
        except KeyboardInterrupt:  # Ctrl-C: closed as stopped, and the stage's next run links itself to this one
            mlflow.set_tag("posttrain.interrupted", "true")
            mlflow.end_run("KILLED")
            raise
        mlflow.set_tags(dvc_hashes(stage, "out"))


@contextlib.contextmanager
def part_run(name: str):
    """A run nested in the active stage run, for one of several models the stage trains (sft's three planners,
    train_rm's two models). Each Trainer logs its arguments as params, which MLflow refuses to change within a run,
    and its losses under the same keys as the others'. Tagged with the stage (``posttrain.part_of``) and this
    process, so a killed stage's parts are closed as FAILED with its run. Without an active run it opens none."""
    active = mlflow.active_run()
    if active is None:
        yield None
        return
    stage = active.data.tags.get("posttrain.stage", "")
    # in the stage run's experiment: a nested run otherwise lands in the active experiment, MLflow's Default
    with mlflow.start_run(experiment_id=active.info.experiment_id, run_name=f"{stage} {name}".strip(), nested=True,
                          tags={PART_TAG: stage, **process_tags()}) as run:
        yield run


@contextlib.contextmanager
def bench_run(name: str, params: Params):
    """One MLflow run (tagged ``posttrain.bench``) holding everything a bench script trains and measures; its
    nested runs (one per variant) land in the same experiment."""
    experiment_id = configure(params)
    mlflow.set_experiment(experiment_id=experiment_id)
    with mlflow.start_run(experiment_id=experiment_id, run_name=name, tags={"posttrain.bench": name}) as run:
        yield run
