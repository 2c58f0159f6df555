"""Stage `evaluate`: test-split accuracy of each model, per difficulty and per trajectory format.

For every model in ``evaluate.models`` (directories under models/) and every format (each of the 12
trajectories named in the prompt, and ``own_choice``, where the model names its trajectory), the
model answers every test question greedily; ``pot`` programs run in the sandbox. With
``evaluate.dots``, also the DOTS planners of the `sft` stage: the internalized planner (its own choice)
and the external planner naming the trajectory the warm-up solver then follows. Writes
reports/metrics/evaluate.json (DVC metrics), reports/plots/accuracy_by_difficulty.csv (DVC plot),
reports/evaluate/responses.jsonl (every response and its verdict) and a PNG plot.
"""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import mlflow

from posttrain.atomic import atomic_write_json, atomic_write_text
from posttrain.errors import stage_main
from posttrain.evaluation import OWN_CHOICE, score_responses, summarize
from posttrain.generation import HFGenerator
from posttrain.modeling import load_pretrained
from posttrain.params import EvaluateParams, SandboxParams, load_params
from posttrain.sandbox import sandbox_limits
from posttrain.task.records import DataError
from posttrain.tracking import stage_run
from posttrain.trajectories import BY_NAME, TRAJECTORIES, Trajectory, plain_prompt, prompt, split_choice

TEST = "data/prepared/test.jsonl"
SOLVER, INTERNAL, PLANNER, VANILLA = "models/warmup", "models/sft", "models/planner", "models/sft_vanilla"
METRICS = Path("reports/metrics/evaluate.json")
PLOT_CSV = Path("reports/plots/accuracy_by_difficulty.csv")
RESPONSES = Path("reports/evaluate/responses.jsonl")
PLOT_PNG = Path("reports/evaluate/accuracy_by_difficulty.png")


def resolve_formats(formats) -> list[str]:
    if formats == "all":
        return [t.name for t in TRAJECTORIES] + [OWN_CHOICE]
    if formats == OWN_CHOICE:
        return [OWN_CHOICE]
    for name in formats:
        if name != OWN_CHOICE and name not in BY_NAME:
            raise DataError(f"evaluate.formats: {name!r} is not a trajectory; expected one of {sorted(BY_NAME)}")
    return list(formats)


def generator_for(model_dir: str, cfg: EvaluateParams, max_new_tokens: int | None = None) -> HFGenerator:
    tokenizer, model = load_pretrained(model_dir)
    return HFGenerator(model, tokenizer, cfg.batch_size, max_new_tokens or cfg.max_new_tokens)


def evaluate_model(model_dir: str, records: list[dict], formats: list[str], cfg: EvaluateParams,
                   sandbox: SandboxParams, seed: int):
    """(rows, summary) for one model: generate every (question, format) and score it."""
    generator = generator_for(model_dir, cfg)
    jobs = [(rec, fmt) for fmt in formats for rec in records]
    prompts = [prompt(rec["question"], None if fmt == OWN_CHOICE else Trajectory.from_name(fmt)) for rec, fmt in jobs]
    completions = generator.generate(prompts, seed=seed, desc=f"evaluate {Path(model_dir).name}")
    rows = score_responses([r for r, _ in jobs], [f for _, f in jobs], [c.text for c in completions],
                           sandbox_limits(sandbox), sandbox.workers)
    for row, c in zip(rows, completions):
        row["n_tokens"] = c.n_tokens
    return rows, summarize(rows, [c.n_tokens for c in completions])


def evaluate_external(planner_dir: str, solver_dir: str, records: list[dict], cfg: EvaluateParams,
                      sandbox: SandboxParams, seed: int):
    """(rows, summary) for DOTS with an external planner: it names a trajectory, the solver follows it
    (when the planner names none, the solver chooses its own)."""
    plans = generator_for(planner_dir, cfg, max_new_tokens=16).generate(
        [prompt(r["question"]) for r in records], seed=seed, desc="evaluate planner")
    chosen = [split_choice(p.text)[0] for p in plans]
    completions = generator_for(solver_dir, cfg).generate(
        [prompt(r["question"], t) for r, t in zip(records, chosen)], seed=seed, desc="evaluate planner+solver")
    rows = score_responses(records, [t.name if t else OWN_CHOICE for t in chosen], [c.text for c in completions],
                           sandbox_limits(sandbox), sandbox.workers)
    for row, c, t in zip(rows, completions, chosen):
        row.update(n_tokens=c.n_tokens, format="external", trajectory=t.name if t else row["trajectory"])
    return rows, summarize(rows, [c.n_tokens for c in completions])


def evaluate_vanilla(model_dir: str, records: list[dict], cfg: EvaluateParams, sandbox: SandboxParams, seed: int):
    """(rows, summary) for the vanilla SFT baseline: the question alone in, a plain solution out."""
    completions = generator_for(model_dir, cfg).generate([plain_prompt(r["question"]) for r in records], seed=seed,
                                                         desc="evaluate vanilla")
    rows = score_responses(records, ["cot"] * len(records), [c.text for c in completions],
                           sandbox_limits(sandbox), sandbox.workers)
    for row, c in zip(rows, completions):
        row.update(n_tokens=c.n_tokens, format="vanilla", trajectory=None)
    return rows, summarize(rows, [c.n_tokens for c in completions])


def plot_accuracy(summaries: dict[str, dict], path: Path) -> None:
    """Accuracy by difficulty: one panel per model, a thin line per trajectory, bold own choice."""
    fig, axes = plt.subplots(1, len(summaries), figsize=(6 * len(summaries), 4.2), squeeze=False)
    for ax, (name, s) in zip(axes[0], summaries.items()):
        for fmt, fs in s["by_format"].items():
            d = sorted(fs["by_difficulty"], key=int)
            bold = fmt == OWN_CHOICE
            ax.plot([int(x) for x in d], [fs["by_difficulty"][x] for x in d], marker="o" if bold else None,
                    lw=2.5 if bold else 1, alpha=1 if bold else 0.6, label=fmt, color="k" if bold else None)
        ax.set(title=f"{name}: accuracy {s['accuracy']:.2f}", xlabel="difficulty (operations)",
               ylabel="test accuracy", ylim=(-0.02, 1.02))
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="upper right", ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


@stage_main
def main() -> None:
    params = load_params()
    cfg = params.evaluate
    with stage_run("evaluate", params, sections=["seed", "sandbox", "evaluate"]):
        with open(TEST, encoding="utf-8") as f:
            records = [json.loads(line) for line in f]
        records = records[: cfg.n_test] if cfg.n_test else records
        formats = resolve_formats(cfg.formats)
        systems = {name: lambda name=name: evaluate_model(f"models/{name}", records, formats, cfg, params.sandbox,
                                                           params.seed) for name in cfg.models}
        if cfg.dots:
            systems["dots_internal"] = lambda: evaluate_model(INTERNAL, records, [OWN_CHOICE], cfg, params.sandbox,
                                                              params.seed)
            systems["dots_external"] = lambda: evaluate_external(PLANNER, SOLVER, records, cfg, params.sandbox,
                                                                 params.seed)
            systems["sft_vanilla"] = lambda: evaluate_vanilla(VANILLA, records, cfg, params.sandbox, params.seed)
        all_rows, summaries = [], {}
        for name, run in systems.items():
            rows, summary = run()
            all_rows += [{"model": name, **r} for r in rows]
            summaries[name] = summary
            mlflow.log_metrics({f"{name}.accuracy": summary["accuracy"],
                                f"{name}.mean_response_tokens": summary["mean_response_tokens"],
                                **{f"{name}.d{d}.accuracy": a for d, a in summary["by_difficulty"].items()},
                                # MLflow metric names cannot hold '+': rewrite+cot -> rewrite-cot
                                **{f"{name}.{fmt.replace('+', '-')}.accuracy": fs["accuracy"]
                                   for fmt, fs in summary["by_format"].items()}})
            print(f"evaluate: {name}: accuracy {summary['accuracy']:.3f} over {len(rows)} responses; by "
                  f"difficulty {summary['by_difficulty']}")
        first = summaries[cfg.models[0]]
        own = first["by_format"].get(OWN_CHOICE, {}).get("by_difficulty", {})
        csv = "difficulty,accuracy,own_choice\n" + "".join(
            f"{d},{a},{own.get(d, '')}\n" for d, a in first["by_difficulty"].items())
        atomic_write_text(PLOT_CSV, csv)
        atomic_write_text(RESPONSES, "".join(json.dumps(r) + "\n" for r in all_rows))
        plot_accuracy(summaries, PLOT_PNG)
        atomic_write_json(METRICS, summaries)
        mlflow.log_artifact(str(PLOT_PNG))
        mlflow.log_artifact(str(METRICS))


if __name__ == "__main__":
    main()
