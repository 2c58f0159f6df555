"""Ablation sweeps: every variant of a sweep file run as a DVC experiment, tagged in MLflow, and summarised.

A sweep file (configs/sweeps/*.yaml) names the sweep, the stages to reproduce, a grid of dotted params and
the metrics to tabulate (``<stage metrics file>:<dotted key>``)::

    name: rlvr
    targets: [rlvr_ar3po]
    grid: {rlvr.algo: [ar3po, grpo, dapo], seed: [0, 1, 2]}
    metrics: ["rlvr_ar3po:rlvr_test.accuracy", "rlvr_ar3po:rollout.responses"]

Each variant is a DVC experiment run in this workspace, one after another (variants share the DVC cache and the
MLflow store). With ``targets``, it is ``dvc exp run --force --single-item <targets> -S key=value ...``: exactly
the target stages re-run, forced (so every variant has its own runs, even one equal to the workspace or to a
run DVC has cached), on the workspace's upstream outputs; a ``seed`` in the grid is then the seed of the
targets only, not a new dataset. Without ``targets`` the whole pipeline is reproduced as far as the overrides
reach. Every stage run carries the MLflow tags ``posttrain.sweep`` and ``posttrain.variant``, so the MLflow
compare view shows the variants side by side; reports/sweeps/<name>.md (+ .csv, .png) holds each variant's
metrics and, over seeds, their mean and spread. A sweep run again replaces the earlier run's experiments and
report; the report says from the start that the sweep is running, and if it stops, where and why.

Afterwards, finished or stopped, the workspace is put back as it was before the sweep (params.yaml, dvc.lock, the
metrics and curves, the targets' outputs), so the next ``dvc repro`` or sweep starts from the user's params, not
the last variant's; ``python3 -m dvc exp apply <name>-<i>`` brings a variant in.

    python3 -m flows.sweep configs/sweeps/routing.yaml      # or: posttrain sweep configs/sweeps/routing.yaml
"""
from __future__ import annotations

import contextlib
import itertools
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

from posttrain.orchestration import apply_prefect_settings, pipeline_lock, quiet_explained_failures, run_dvc

apply_prefect_settings()

import yaml  # noqa: E402
from ruamel.yaml import YAMLError  # noqa: E402
from prefect import flow, get_run_logger, task  # noqa: E402

from posttrain.params import ParamsError, read_yaml, with_overrides  # noqa: E402
from posttrain.tracking import SWEEP_ENV, VARIANT_ENV  # noqa: E402
from flows.sweep_report import status, write_report  # noqa: E402

quiet_explained_failures()
METRICS = Path("reports/metrics")
Scalar = StrictBool | StrictInt | StrictFloat | StrictStr | None
GridValue = Scalar | list[Scalar]  # what dvc exp run -S can set (a dict param's empty {} takes no new key)


class SweepSpec(BaseModel, extra="forbid"):
    # a leading '-' would make `dvc exp run --name -x-0` read the name as an option
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$",
                      description="sweep name: MLflow tag, experiment prefix, report file")
    targets: list[str] = Field(default_factory=list,
                               description="stages each variant re-runs, forced (default: the whole pipeline, as needed)")
    grid: dict[str, Annotated[list[GridValue], Field(min_length=1)]] = Field(
        min_length=1, description="dotted param -> values; variants = their product")
    metrics: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]+:[^:\s]+$")]] = Field(
        min_length=1, description="'<stage>:<dotted key>' in reports/metrics/<stage>.json")


EXPECTED = {"name": "letters, digits, '_' and '-', starting with a letter or digit",
            "metrics": "'<stage>:<dotted key>'",
            "grid": "a number, string, true/false or null, or a list of them (what `dvc exp run -S` sets)"}


def spec_problems(err: ValidationError) -> list[str]:
    """One line per problem, naming the key: pydantic reports a bad grid value once per type it could have had."""
    lines: dict[tuple, str] = {}
    for e in err.errors():
        loc = e["loc"]
        grid_value = loc[:1] == ("grid",) and len(loc) > 2 and isinstance(loc[2], int)
        loc = loc[:3] if grid_value else loc  # past a grid value: the types it was tried as
        where = ": ".join(str(p) if i == 1 and loc[0] == "grid" else f"item {p + 1}" if isinstance(p, int) else str(p)
                          for i, p in enumerate(loc))
        if not loc:
            line = f"expected a mapping of name, grid, metrics (and targets), got {type(e['input']).__name__}"
        elif loc[-1] == "[key]":
            line = f"grid: {loc[1]!r}: expected a param's dotted name"
        elif e["type"] == "missing":
            line = f"{where}: missing"
        elif e["type"] == "extra_forbidden":
            line = f"{where}: unknown key (the keys are {', '.join(SweepSpec.model_fields)})"
        elif grid_value or e["type"] == "string_pattern_mismatch":
            line = f"{where}: got {e['input']!r}, expected {EXPECTED[loc[0]]}"
        else:
            line = f"{where}: got {e['input']!r}: {e['msg']}"
        lines.setdefault(loc, line)
    return list(lines.values())


def load_sweep(path: str | Path, dvc_yaml: str | Path = "dvc.yaml") -> SweepSpec:
    """Read and validate a sweep file before anything runs: every variant must make valid params of its own,
    every target and metric stage must be a stage of ``dvc_yaml`` (a metric's stage one the variants re-run and
    that writes a metrics file), and a metric key must be in its stage's metrics file where an earlier run wrote
    one (its value may be null: a figure that run could not compute)."""
    try:
        raw = read_yaml(Path(path).read_text(encoding="utf-8"))  # as params.yaml is read
    except (OSError, YAMLError, ValueError) as e:
        raise ParamsError(f"{path}: {e}") from None
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as e:
        raise ParamsError("\n".join(f"{path}: {line}" for line in spec_problems(e))) from None
    for field in ("targets", "metrics"):
        listed = getattr(spec, field)
        twice = sorted({v for v in listed if listed.count(v) > 1})
        if twice:
            raise ParamsError(f"{path}: {field}: {', '.join(map(repr, twice))} listed twice")
    same: dict[str, int] = {}
    for i, overrides in enumerate(variants(spec)):  # every combination: a check across keys fails in some only
        try:
            params = with_overrides("params.yaml", overrides, out=None)
        except ParamsError as e:
            shown = ", ".join(f"{k}={json.dumps(v)}" for k, v in overrides.items())
            raise ParamsError(f"{path}: variant {shown}: {e}") from None
        # a value listed twice (or 1 and 1.0 for a float) would run the same experiment twice under two names
        first = same.setdefault(params.model_dump_json(), i)
        if first != i:
            raise ParamsError(f"{path}: variants {first} and {i} give the same params: a grid value is listed twice")
    stages = yaml.safe_load(Path(dvc_yaml).read_text(encoding="utf-8"))["stages"]
    for target in spec.targets:
        if target not in stages:
            raise ParamsError(f"{path}: target {target!r} is not a stage of {dvc_yaml} ({', '.join(stages)})")
    for ref in spec.metrics:
        stage = ref.split(":", 1)[0]
        if stage not in stages:
            raise ParamsError(f"{path}: metric {ref!r}: {stage!r} is not a stage of {dvc_yaml} ({', '.join(stages)})")
        if spec.targets and stage not in spec.targets:
            raise ParamsError(f"{path}: metric {ref!r}: stage {stage} is not among the targets {spec.targets}, so "
                              "every variant would read the same file")
        wanted = (METRICS / f"{stage}.json").as_posix()
        if wanted not in [next(iter(m)) if isinstance(m, dict) else m for m in stages[stage].get("metrics", [])]:
            raise ParamsError(f"{path}: metric {ref!r}: stage {stage} writes no {wanted}, so every variant would "
                              "read it missing")
        if (METRICS / f"{stage}.json").exists():  # an earlier run wrote it: the key must be there
            problem = read_metric(ref)[1]
            if problem:
                raise ParamsError(f"{path}: metric {ref!r}: {problem}")
    return spec


def read_metric(ref: str) -> tuple[float | None, str | None]:
    """The number ``<stage>:<dotted key>`` names in reports/metrics/<stage>.json, or None: with no reason for a
    null or NaN (a figure undefined on that run, as the metrics files write it), else why it is not there."""
    stage, dotted = ref.split(":", 1)
    path = METRICS / f"{stage}.json"
    try:
        value: Any = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"{path} does not exist"
    except ValueError as e:
        return None, f"{path} is not valid JSON ({e})"
    for i, key in enumerate(dotted.split(".")):
        if not isinstance(value, dict) or key not in value:
            where = ".".join(dotted.split(".")[:i]) or "the top level"
            keys = sorted(value) if isinstance(value, dict) else []
            return None, f"no key {key!r} at {where} of {path} (keys there: {', '.join(keys[:20]) or 'none'})"
        value = value[key]
    if value is None or isinstance(value, float) and math.isnan(value):
        return None, None
    return (float(value), None) if isinstance(value, (int, float)) else (None, f"{dotted} in {path} is not a number")


def hydra_value(value: Any) -> str:
    """A value as Hydra's override grammar (what ``dvc exp run -S`` parses) reads it back unchanged: strings
    quoted, so '1.0', 'null' or a sentence with commas stay strings; lists in its own syntax."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)  # inf and nan as Hydra reads them (json's Infinity and NaN are strings to it)
    if isinstance(value, list):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    # the grammar's escapes: a quote and an interpolation's ${ take a backslash (a quoted '${x}' is still resolved),
    # and backslashes are doubled before them or the end
    escaped = {"'": "\\'", "${": "\\${", "": ""}
    return "'" + re.sub(r"(\\*)('|\$\{|\Z)", lambda m: 2 * m[1] + escaped[m[2]], value) + "'"


def set_param_args(overrides: dict[str, Any]) -> list[str]:
    """``-S key=value`` arguments for ``dvc exp run``."""
    return [a for k, v in overrides.items() for a in ("-S", f"{k}={hydra_value(v)}")]


def variants(spec: SweepSpec) -> list[dict[str, Any]]:
    """The grid's cartesian product, in file order."""
    keys = list(spec.grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(spec.grid[k] for k in keys))]


def remove_earlier_experiments(spec: SweepSpec, log) -> None:
    """Drop the experiments of an earlier run of this sweep: DVC refuses a new experiment under an existing name,
    and those of a larger grid's or of variants this run does not reach would pass for this run's."""
    names = run_dvc(["exp", "list", "--name-only"], {}, log, what="dvc exp list").split()
    earlier = [n for n in names if re.fullmatch(rf"{re.escape(spec.name)}-\d+", n)]
    if earlier:
        run_dvc(["exp", "remove", *earlier], {}, log, what=f"removing the earlier experiments {', '.join(earlier)}")


@task(task_run_name="{label}")
def run_variant(spec: SweepSpec, label: str, overrides: dict[str, Any]) -> dict:
    """``dvc exp run`` one variant; its metrics as the workspace holds them right after."""
    logger = get_run_logger()
    env = {SWEEP_ENV: spec.name, VARIANT_ENV: label}
    start = time.perf_counter()
    which = ["--force", "--single-item", *spec.targets] if spec.targets else []
    run_dvc(["exp", "run", *which, *set_param_args(overrides), "--name", label], env,
            lambda line: logger.info("%s | %s", label, line), what=f"variant {label}")
    # groupable, and a null grid value shown as the value it is, not as a missing cell
    shown = {k: json.dumps(v) if isinstance(v, list) or v is None else v for k, v in overrides.items()}
    row = {"variant": label, **shown}
    for ref in spec.metrics:
        row[ref], problem = read_metric(ref)
        if problem:
            logger.warning("%s: metric %s is missing: %s", label, ref, problem)
    row["seconds"] = round(time.perf_counter() - start, 1)
    logger.info("%s: %s", label, {m: row[m] for m in spec.metrics})
    return row


def workspace_files(dvc_yaml: str | Path = "dvc.yaml") -> list[Path]:
    """What ``dvc exp run`` changes in the workspace that ``dvc checkout`` cannot bring back: params.yaml, dvc.lock
    and every output DVC does not cache (metrics, curves, the report; files or directories)."""
    stages = yaml.safe_load(Path(dvc_yaml).read_text(encoding="utf-8"))["stages"]
    uncached = [path for stage in stages.values() for kind in ("outs", "metrics", "plots")
                for entry in stage.get(kind, []) if isinstance(entry, dict)
                for path, opts in entry.items() if isinstance(opts, dict) and opts.get("cache") is False]
    return [Path("params.yaml"), Path("dvc.lock"), *map(Path, uncached)]


def files_under(roots: list[Path]) -> list[Path]:
    return [f for root in roots for f in ([root] if root.is_file() else sorted(root.rglob("*"))) if f.is_file()]


def restore_files(roots: list[Path], saved: dict[Path, bytes]) -> None:
    for f in files_under(roots):
        if f not in saved:  # the variants wrote it
            f.unlink()
    for f, data in saved.items():
        if not f.is_file() or f.read_bytes() != data:
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(data)


@contextlib.contextmanager
def dvc_lock():
    """DVC's repository lock: while another DVC command runs here (a `dvc repro`, a second sweep), the sweep neither
    saves that command's half-written files nor writes its own back over them (DVC's LockError instead)."""
    from dvc.repo import Repo

    with Repo(".") as repo, repo.lock:
        yield


def put_back(spec: SweepSpec, roots: list[Path], saved: dict[Path, bytes], log) -> str | None:
    """The workspace as it was before the sweep: its files, then the targets' (or every stage's) cached outputs
    as its dvc.lock records them. None, or why it could not."""
    try:
        with dvc_lock():
            restore_files(roots, saved)
        # --force: what the last variant left is in its experiment (an interrupted one's is not worth a prompt)
        run_dvc(["checkout", "--force", *spec.targets], {}, log, what="dvc checkout")
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


@flow(name="posttrain-sweep", log_prints=True)
def sweep(sweep_file: str) -> dict:
    """Run every variant of ``sweep_file`` as a DVC experiment; write reports/sweeps/<name>.md; put the workspace
    back as it was."""
    spec = load_sweep(sweep_file)
    logger = get_run_logger()
    planned, rows, error = variants(spec), [], None
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    # a pipeline run (or another sweep) in this repository meanwhile would rewrite params.yaml under a variant, and
    # put_back would then undo its outputs: one at a time
    with pipeline_lock():
        roots = workspace_files()
        with dvc_lock():
            saved = {f: f.read_bytes() for f in files_under(roots)}
        try:
            for i, overrides in enumerate(planned):
                # before each variant, so that a killed sweep's report (or the earlier run's) does not pass for this one
                write_report(spec, rows, len(planned), status(spec, i, len(planned), started, running=True))
                if not i:
                    remove_earlier_experiments(spec, logger.debug)
                rows.append(run_variant(spec, f"{spec.name}-{i}", overrides))
        except BaseException as e:
            error = e
            raise
        finally:
            workspace = put_back(spec, roots, saved, logger.debug)
            if workspace:
                logger.error("the workspace could not be put back as it was before the sweep: %s", workspace)
            report = write_report(spec, rows, len(planned), status(spec, len(rows), len(planned), started, error,
                                                                   workspace=workspace))
    print(f"sweep {spec.name}: {len(rows)} variants -> {report}; `python3 -m dvc exp show` lists them, "
          f"`python3 -m dvc exp apply {spec.name}-<i>` brings one into the workspace")
    return {"report": str(report), "rows": rows}


if __name__ == "__main__":  # as `posttrain sweep`: a bad sweep file or params.yaml is one line, Ctrl-C too
    from posttrain.cli import main

    sys.exit(main(["sweep", *sys.argv[1:]]))
