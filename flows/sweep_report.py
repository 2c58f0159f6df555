"""A sweep's report: reports/sweeps/<name>.md (+ .csv, .png), each variant's metrics and, over seeds, their mean
and spread, opened by how far the sweep got (flows/sweep.py writes it before each variant and when it stops)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

if TYPE_CHECKING:
    from flows.sweep import SweepSpec

OUT = Path("reports/sweeps")


def frame(spec: SweepSpec, rows: list[dict]) -> pd.DataFrame:
    # a null or missing metric is NaN, never an object column; no row at all is still a table with its columns
    return pd.DataFrame(rows, columns=["variant", *spec.grid, *spec.metrics, "seconds"]).astype(
        dict.fromkeys(spec.metrics, float))


def summarise(spec: SweepSpec, rows: list[dict]) -> pd.DataFrame:
    """Mean and standard deviation of each metric over seeds, per setting of the other grid keys."""
    df = frame(spec, rows)
    group = [k for k in spec.grid if k != "seed"]
    if not group:
        return df[spec.metrics].agg(["mean", "std"]).T.reset_index(names="metric")
    # dropna=False: a grid value may be null (rlvr.vllm: [null, colocate]); pandas would drop its group unseen
    agg = df.groupby(group, sort=False, dropna=False)[spec.metrics].agg(["mean", "std", "count"])
    agg.columns = [f"{m} {stat}" for m, stat in agg.columns]
    return agg.reset_index()


def markdown(df: pd.DataFrame, figures: list[str]) -> str:
    """``df`` as a table: the ``figures`` columns to 4 decimals, the others as written (a learning rate of 1e-05 was
    0.0000), a missing value as n/a in every column (a NaN was 'nan' in one column and blank in another)."""
    formats = [".4f" if c in figures else "g" for c in df.columns]
    return df.astype(object).where(df.notna(), None).to_markdown(index=False, floatfmt=formats, missingval="n/a")


def status(spec: SweepSpec, done: int, planned: int, started: str, error: BaseException | None = None,
           running: bool = False, workspace: str | None = None) -> str:
    """The report's opening: how far the sweep got, why it stopped, and what became of the workspace."""
    if running:
        return (f"**Running** since {started}: {done} of {planned} variants done, `{spec.name}-{done}` running. "
                "A report still saying so after the sweep's process ended was cut short by a kill.")
    if error is None:
        text = f"{planned} variants, started {started}."
    else:  # variants run in order and the first failure stops the sweep: the rest did not fail, they never ran
        how = (f"failed:\n\n```\n{error}\n```" if isinstance(error, Exception)
               else f"was interrupted ({type(error).__name__}).")
        text = (f"**Stopped**: {done} of {planned} variants ran (started {started}); the variants after "
                f"`{spec.name}-{done}` did not run, `{spec.name}-{done}` {how}")
    if workspace:
        return text + f"\n\n**The workspace could not be put back as it was before the sweep**: {workspace}\n"
    return text + (f"\n\nThe workspace is as it was before the sweep; `python3 -m dvc exp apply {spec.name}-<i>` "
                   "brings a variant's params and outputs in.")


def write_report(spec: SweepSpec, rows: list[dict], planned: int, opening: str) -> Path:
    """reports/sweeps/<name>.md, .csv and .png from the variants run so far (``planned`` in all)."""
    OUT.mkdir(parents=True, exist_ok=True)
    df, summary = frame(spec, rows), summarise(spec, rows)
    df.to_csv(OUT / f"{spec.name}.csv", index=False)
    figure = OUT / f"{spec.name}.png"
    if rows:
        plot(spec, df, summary, figure, f"sweep {spec.name}: {len(rows)} of {planned} variants")
    else:  # an earlier run's figure would pass for this one's
        figure.unlink(missing_ok=True)
    figures = [c for c in summary.columns if c not in spec.grid]
    md = [f"# Sweep `{spec.name}`\n", opening + "\n", f"Grid {', '.join(spec.grid)}; stages "
          f"{', '.join(spec.targets) or 'all'}. MLflow: filter `tags.\"posttrain.sweep\" = '{spec.name}'`. "
          "n/a: a metric its stage wrote as null or did not write (the sweep's log says which), or a spread over "
          "one value.\n", "## Mean and spread over seeds\n", markdown(summary, figures),
          f"\n![{spec.name}]({figure.name})\n" if rows else "", "## Every variant\n",
          markdown(df, spec.metrics)]
    path = OUT / f"{spec.name}.md"
    path.write_text("\n".join(md) + "\n", encoding="utf-8")
    return path


def plot(spec: SweepSpec, df: pd.DataFrame, summary: pd.DataFrame, path: Path, title: str) -> None:
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
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
