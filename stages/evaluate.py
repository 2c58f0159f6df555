"""Stage `evaluate`: test-split accuracy of each model, per difficulty, per trajectory format and per question kind.

For every model in ``evaluate.models`` (directories under models/) and every format (each of the 12
trajectories named in the prompt, and ``own_choice``, where the model names its trajectory), the
model answers every test question greedily; ``pot`` programs run in the sandbox. With
``evaluate.dots``, also the DOTS planners of the `sft` stage: the internalized planner (its own choice)
and the external planner naming the trajectory the warm-up solver then follows; and each later policy in
``evaluate.policies`` (rlhf, rlvr) on its own choice. The work is cut into shards run by a Prefect task runner on
Ray (``posttrain.sharded_evaluation``: ``evaluate.workers`` local workers or ``evaluate.ray_address``). Writes
reports/metrics/evaluate.json (DVC metrics), reports/plots/accuracy_by_difficulty.csv (DVC plot),
reports/evaluate/responses.jsonl (every response and its verdict) and a PNG plot. A system's accuracy is its own
choice's (``own_choice``: MLflow's ``<system>.accuracy``, the plot's and the report's); for a system scored on every
format, evaluate.json's top-level ``accuracy`` is the mean over its formats, logged as
``<system>.mean_over_formats.accuracy``.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import matplotlib.pyplot as plt

import mlflow
from posttrain.accuracy_summary import OWN_CHOICE, own_choice, summarize
from posttrain.atomic import atomic_write_bytes, atomic_write_json, atomic_write_text
from posttrain.checkpoints import claim_checkpoint_dir, result_params
from posttrain.errors import stage_main
from posttrain.jsonl import read_jsonl
from posttrain.params import load_params
from posttrain.params_schema import EvaluateParams
from posttrain.sharded_evaluation import SOLVER, plan_shards, run_shards
from posttrain.task.records import DataError
from posttrain.tracking import stage_run
from posttrain.trajectories import BY_NAME, TRAJECTORIES

TEST = "data/prepared/test.jsonl"
INTERNAL, PLANNER, VANILLA = "models/sft", "models/planner", "models/sft_vanilla"
METRICS = Path("reports/metrics/evaluate.json")
PLOT_CSV = Path("reports/plots/accuracy_by_difficulty.csv")
RESPONSES = Path("reports/evaluate/responses.jsonl")
PLOT_PNG = Path("reports/evaluate/accuracy_by_difficulty.png")
CHECKPOINTS = Path("checkpoints/evaluate")  # finished shards of a killed evaluation
RESUME_SECTIONS = ("sandbox", "evaluate", "generation")  # the params a resumed run must share


def resolve_formats(formats) -> list[str]:
    if formats == "all":
        return [t.name for t in TRAJECTORIES] + [OWN_CHOICE]
    if formats == OWN_CHOICE:
        return [OWN_CHOICE]
    for name in formats:
        if name != OWN_CHOICE and name not in BY_NAME:
            raise DataError(f"evaluate.formats: {name!r} is not a trajectory; expected one of {sorted(BY_NAME)}")
    return list(formats)


def panel_title(name: str, summary: dict) -> str:
    """A plot panel's heading: the system's own-choice accuracy, and the mean over its formats where it has several
    (or its one static format's, named, where it has no own choice)."""
    own, n_formats = own_choice(summary), len(summary["by_format"])
    figures = [f"own choice {own['accuracy']:.2f}"] if own else []
    if n_formats > 1:
        figures.append(f"mean over {n_formats} formats {summary['accuracy']:.2f}")
    elif own is None:
        figures.append(f"{next(iter(summary['by_format']))} {summary['accuracy']:.2f}")
    return f"{name}: {', '.join(figures)}"


def plot_accuracy(summaries: dict[str, dict], path: Path) -> None:
    """Accuracy by difficulty: one panel per model (three to a row: six in one row were 3,960 px wide, unreadable at
    page width), a thin line per trajectory, bold own choice."""
    cols = min(3, len(summaries))
    rows = -(-len(summaries) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows), squeeze=False)
    panels = list(axes.flat)
    for ax in panels[len(summaries):]:
        fig.delaxes(ax)
    for ax, (name, s) in zip(panels, summaries.items()):
        for fmt, fs in s["by_format"].items():
            d = sorted(fs["by_difficulty"], key=int)
            bold = fmt == OWN_CHOICE
            ax.plot([int(x) for x in d], [fs["by_difficulty"][x] for x in d], marker="o" if bold else None,
                    lw=2.5 if bold else 1, alpha=1 if bold else 0.6, label=fmt, color="k" if bold else None)
        ax.set(title=panel_title(name, s), xlabel="difficulty (operations)",
               ylabel="test accuracy", ylim=(-0.02, 1.02))
        ax.grid(alpha=0.3)
    max(fig.axes, key=lambda ax: len(ax.get_lines())).legend(fontsize=7, loc="upper right", ncol=2)  # the most lines
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, png.getvalue())


def systems_to_evaluate(cfg: EvaluateParams, formats: list[str]) -> tuple[dict, dict]:
    """(name -> (kind, formats), name -> model dir) for everything ``evaluate`` scores."""
    systems = {name: ("model", tuple(formats)) for name in cfg.models}
    dirs = {}
    if cfg.dots:
        systems.update(dots_internal=("model", (OWN_CHOICE,)), dots_external=("external", ()),
                       sft_vanilla=("vanilla", ()))
        dirs.update(dots_internal=INTERNAL, dots_external=PLANNER, sft_vanilla=VANILLA)
    systems.update({name: ("model", (OWN_CHOICE,)) for name in cfg.policies})
    return systems, dirs


@stage_main
def main() -> None:
    params = load_params()
    cfg = params.evaluate
    with stage_run("evaluate", params, sections=["seed", "sandbox", "evaluate", "generation"]):
        records = read_jsonl(TEST)
        records = records[: cfg.n_test] if cfg.n_test else records
        if not records:  # prepare's on_overlap: drop can empty it; every accuracy would read 0.0
            raise DataError(f"{TEST}: no test questions to evaluate")
        formats = resolve_formats(cfg.formats)
        systems, dirs = systems_to_evaluate(cfg, formats)
        shards = plan_shards(systems, len(records), cfg.shard_size, dirs)
        print(f"evaluate: {len(shards)} shards of up to {cfg.shard_size} questions on "
              f"{cfg.ray_address or f'{cfg.workers} local Ray workers' if cfg.workers else 'this process'}")
        done_dir = claim_checkpoint_dir(CHECKPOINTS, result_params(params, RESUME_SECTIONS), params.seed,
                                  [Path(TEST), *sorted({Path(s.model_dir) for s in shards} | {Path(PLANNER), SOLVER})])
        already = sum((done_dir / s.filename).is_file() for s in shards)
        if already:
            print(f"evaluate: resuming, {already} of {len(shards)} shards already scored")
            mlflow.set_tag("resumed_shards", already)
        results = run_shards(shards, records, params, done_dir)
        all_rows, summaries = [], {}
        for name in systems:
            rows = [r for shard, part in zip(shards, results) if shard.system == name for r in part]
            summary = summarize(rows, [r["n_tokens"] for r in rows])
            all_rows += rows
            summaries[name] = summary
            own = own_choice(summary)
            mlflow.log_metrics({f"{name}.mean_response_tokens": summary["mean_response_tokens"],
                                **({f"{name}.accuracy": own["accuracy"],
                                    **{f"{name}.d{d}.accuracy": a for d, a in own["by_difficulty"].items()},
                                    **{f"{name}.kind_{k}.accuracy": a for k, a in own.get("by_kind", {}).items()}}
                                   if own else {}),
                                **({f"{name}.mean_over_formats.accuracy": summary["accuracy"]}
                                   if len(summary["by_format"]) > 1 else {}),
                                # MLflow metric names cannot hold '+': rewrite+cot -> rewrite-cot
                                **{f"{name}.{fmt.replace('+', '-')}.accuracy": fs["accuracy"]
                                   for fmt, fs in summary["by_format"].items()}})
            print(f"evaluate: {name}: accuracy {own['accuracy']:.3f} (own choice; over all {len(rows)} responses "
                  f"{summary['accuracy']:.3f}); by difficulty {own['by_difficulty']}"
                  + (f"; by kind {own['by_kind']}" if "by_kind" in own else "") if own else
                  f"evaluate: {name}: no own choice scored; accuracy over all {len(rows)} responses "
                  f"{summary['accuracy']:.3f}; by difficulty {summary['by_difficulty']}")
        first = summaries[cfg.models[0]]
        own = (own_choice(first) or {"by_difficulty": {}})["by_difficulty"]  # the accuracy column: own choice alone
        csv = "difficulty,accuracy,mean_over_formats\n" + "".join(
            f"{d},{own.get(d, '')},{a}\n" for d, a in first["by_difficulty"].items())
        atomic_write_text(PLOT_CSV, csv)
        atomic_write_text(RESPONSES, "".join(json.dumps(r) + "\n" for r in all_rows))
        plot_accuracy(summaries, PLOT_PNG)
        atomic_write_json(METRICS, summaries)
        mlflow.log_artifact(str(PLOT_PNG))
        mlflow.log_artifact(str(METRICS))


if __name__ == "__main__":
    main()
