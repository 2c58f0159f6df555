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
metrics and, over seeds, their mean and spread. As after any ``dvc exp run``, the workspace then holds the last
variant: ``git checkout params.yaml dvc.lock reports && python3 -m dvc checkout`` returns to where it was.

    python3 -m flows.sweep configs/sweeps/routing.yaml      # or: posttrain sweep configs/sweeps/routing.yaml
"""
from __future__ import annotations

import itertools
import json
import re
import sys
import time
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from posttrain.orchestration import apply_prefect_settings, run_dvc

apply_prefect_settings()

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402
from ruamel.yaml import YAMLError  # noqa: E402
from prefect import flow, get_run_logger, task  # noqa: E402

from posttrain.params import ParamsError, read_yaml, with_overrides  # noqa: E402
from posttrain.tracking import SWEEP_ENV, VARIANT_ENV  # noqa: E402

OUT, METRICS = Path("reports/sweeps"), Path("reports/metrics")
Scalar = StrictBool | StrictInt | StrictFloat | StrictStr | None
GridValue = Scalar | list[Scalar]  # what dvc exp run -S can set (a dict param's empty {} takes no new key)


class SweepSpec(BaseModel, extra="forbid"):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]+$", description="sweep name: MLflow tag, experiment prefix, report file")
    targets: list[str] = Field(default_factory=list,
                               description="stages each variant re-runs, forced (default: the whole pipeline, as needed)")
    grid: dict[str, Annotated[list[GridValue], Field(min_length=1)]] = Field(
        min_length=1, description="dotted param -> values; variants = their product")
    metrics: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]+:[^:\s]+$")]] = Field(
        min_length=1, description="'<stage>:<dotted key>' in reports/metrics/<stage>.json")


def load_sweep(path: str | Path, dvc_yaml: str | Path = "dvc.yaml") -> SweepSpec:
    """Read and validate a sweep file before anything runs: every variant must make valid params, every target
    and metric stage must be a stage of ``dvc_yaml`` (a metric's stage one the variants re-run), and a metric key
    must be in its stage's metrics file where an earlier run wrote one."""
    try:
        spec = SweepSpec.model_validate(read_yaml(Path(path).read_text(encoding="utf-8")))  # as params.yaml is read
    except (OSError, YAMLError, ValueError) as e:
        raise ParamsError(f"{path}: {e}") from None
    for overrides in variants(spec):  # every combination: a check across keys (heads divide width) fails in some only
        with_overrides("params.yaml", overrides, out=None)  # raises naming a bad key or value
    stages = list(yaml.safe_load(Path(dvc_yaml).read_text(encoding="utf-8"))["stages"])
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
        if (METRICS / f"{stage}.json").exists():  # an earlier run wrote it: the key must be there
            missing = read_metric(ref)[1]
            if missing:
                raise ParamsError(f"{path}: metric {ref!r}: {missing}")
    return spec


def read_metric(ref: str) -> tuple[float | None, str | None]:
    """The number ``<stage>:<dotted key>`` names in reports/metrics/<stage>.json, or None and why it is not there."""
    stage, dotted = ref.split(":", 1)
    path = METRICS / f"{stage}.json"
    if not path.exists():
        return None, f"{path} does not exist"
    value: Any = json.loads(path.read_text(encoding="utf-8"))
    for i, key in enumerate(dotted.split(".")):
        if not isinstance(value, dict) or key not in value:
            where = ".".join(dotted.split(".")[:i]) or "the top level"
            keys = sorted(value) if isinstance(value, dict) else []
            return None, f"no key {key!r} at {where} of {path} (keys there: {', '.join(keys[:20]) or 'none'})"
        value = value[key]
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


@task(task_run_name="{label}")
def run_variant(spec: SweepSpec, label: str, overrides: dict[str, Any]) -> dict:
    """``dvc exp run`` one variant; its metrics as the workspace holds them right after."""
    logger = get_run_logger()
    sets = set_param_args(overrides)
    env = {SWEEP_ENV: spec.name, VARIANT_ENV: label}
    start = time.perf_counter()
    # a sweep run again replaces its variants (DVC refuses a new experiment under an existing name)
    if label in run_dvc(["exp", "list", "--name-only"], env, logger.debug, what="dvc exp list").split():
        run_dvc(["exp", "remove", label], env, logger.debug, what=f"removing the earlier experiment {label}")
    which = ["--force", "--single-item", *spec.targets] if spec.targets else []
    run_dvc(["exp", "run", *which, *sets, "--name", label], env, lambda line: logger.info("%s | %s", label, line),
            what=f"variant {label}")
    shown = {k: json.dumps(v) if isinstance(v, list) else v for k, v in overrides.items()}  # groupable
    row = {"variant": label, **shown, **{m: read_metric(m)[0] for m in spec.metrics},
           "seconds": round(time.perf_counter() - start, 1)}
    logger.info("%s: %s", label, {m: row[m] for m in spec.metrics})
    return row


def summarise(spec: SweepSpec, rows: list[dict]) -> pd.DataFrame:
    """Mean and standard deviation of each metric over seeds, per setting of the other grid keys."""
    df = pd.DataFrame(rows)
    group = [k for k in spec.grid if k != "seed"]
    if not group:
        return df[spec.metrics].agg(["mean", "std"]).T.reset_index(names="metric")
    # dropna=False: a grid value may be null (rlvr.vllm: [null, colocate]); pandas would drop its group unseen
    agg = df.groupby(group, sort=False, dropna=False)[spec.metrics].agg(["mean", "std", "count"])
    agg.columns = [f"{m} {stat}" for m, stat in agg.columns]
    return agg.reset_index()


def write_report(spec: SweepSpec, rows: list[dict], planned: int) -> Path:
    """reports/sweeps/<name>.md, .csv and .png from the variants run so far (``planned`` in all)."""
    OUT.mkdir(parents=True, exist_ok=True)
    df, summary = pd.DataFrame(rows), summarise(spec, rows)
    df.to_csv(OUT / f"{spec.name}.csv", index=False)
    group = [k for k in spec.grid if k != "seed"]
    fig, axes = plt.subplots(1, len(spec.metrics), figsize=(5 * len(spec.metrics), 3.8), squeeze=False)
    for ax, metric in zip(axes[0], spec.metrics):
        labels = [" / ".join(str(r[k]) for k in group) or "all" for _, r in summary.iterrows()] if group else ["all"]
        means = summary[f"{metric} mean"] if group else [df[metric].mean()]
        stds = summary[f"{metric} std"].fillna(0) if group else [df[metric].std()]
        ax.bar(labels, means, yerr=stds, capsize=4, color="tab:blue", alpha=0.8)
        ax.set(title=metric, ylabel="mean over seeds (bar: std)")
        ax.tick_params(axis="x", rotation=20)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"sweep {spec.name}: {len(rows)} of {planned} variants")
    fig.tight_layout()
    fig.savefig(OUT / f"{spec.name}.png", dpi=110)
    plt.close(fig)
    # variants run in order and the first failure stops the sweep: the rest did not fail, they never ran
    done = (f"{len(rows)} variants" if len(rows) == planned
            else f"{len(rows)} of {planned} variants (the sweep stopped at {spec.name}-{len(rows)})")
    md = [f"# Sweep `{spec.name}`\n", f"{done} of {', '.join(spec.grid)}; stages "
          f"{', '.join(spec.targets) or 'all'}. MLflow: filter `tags.\"posttrain.sweep\" = '{spec.name}'`.\n",
          "## Mean and spread over seeds\n", summary.to_markdown(index=False, floatfmt=".4f"),
          f"\n![{spec.name}]({spec.name}.png)\n", "## Every variant\n", df.to_markdown(index=False, floatfmt=".4f")]
    path = OUT / f"{spec.name}.md"
    path.write_text("\n".join(md) + "\n", encoding="utf-8")
    return path


@flow(name="posttrain-sweep", log_prints=True)
def sweep(sweep_file: str) -> dict:
    """Run every variant of ``sweep_file`` as a DVC experiment; write reports/sweeps/<name>.md."""
    spec = load_sweep(sweep_file)
    planned, rows = variants(spec), []
    try:
        for i, overrides in enumerate(planned):
            rows.append(run_variant(spec, f"{spec.name}-{i}", overrides))
    finally:  # a failed variant keeps the report of those that ran
        if rows:
            report = write_report(spec, rows, len(planned))
    print(f"sweep {spec.name}: {len(rows)} variants -> {report}; the workspace holds the last variant "
          "(`python3 -m dvc exp show` lists them all)")
    return {"report": str(report), "rows": rows}


if __name__ == "__main__":
    sweep(sys.argv[1])
