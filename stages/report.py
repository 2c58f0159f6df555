"""Stage `report`: reports/README.md, rebuilt on every repro from the stages' metrics and figures.

One page that says in a minute what each method bought: test accuracy by stage and difficulty, the DOTS
table (static trajectories vs the searched planner), reward-model calibration, the routing curve, RLVR's
rollout cost, and the training curves (the CSVs the training stages write under reports/curves/, which DVC
tracks: not the MLflow store, which differs between workspaces). Each table is also written as CSV under
reports/report/, each figure is a PNG embedded in the markdown. A missing input (a stage not run yet) leaves its
section out with a line saying so, never a crash.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from posttrain.atomic import atomic_dir, atomic_write_text  # noqa: E402
from posttrain.curves import CURVE_DIR  # noqa: E402
from posttrain.curves import read_curve  # noqa: E402
from posttrain.errors import stage_main  # noqa: E402
from posttrain.accuracy_summary import SYSTEM_ORDER, own_choice  # noqa: E402
from posttrain.params import load_params  # noqa: E402
from posttrain.tracking import stage_run  # noqa: E402

REPORTS = Path("reports")
METRICS, OUT = REPORTS / "metrics", REPORTS / "report"
README = REPORTS / "README.md"
LABELS = {"warmup": "warm-up (own choice)", "sft_vanilla": "vanilla SFT", "dots_internal": "DOTS internalized (sft)",
          "dots_external": "DOTS external planner", "rlhf": "routed RLHF", "rlvr": "RLVR (AR3PO)"}
STAGES = [(key, LABELS[key]) for key in SYSTEM_ORDER]
# the training curves, one panel each: (title, column, {series label: curve file under reports/curves/})
CURVES = [("warm-up loss", "loss", {"": "warmup.csv"}),
          ("SFT loss", "loss", {planner: f"sft_{planner}.csv" for planner in ("internal", "external", "vanilla")}),
          ("reward model loss", "loss", {"pairwise PM": "train_rm_pm.csv", "pointwise RM": "train_rm_pointwise.csv"}),
          ("routed RLHF dev accuracy", "dev_accuracy", {"": "rlhf_routed.csv"}),
          ("RLVR reward (verifier mean)", "rollout_reward_mean", {"": "rlvr_ar3po.csv"})]
BOUNDED = {"dev_accuracy", "rollout_reward_mean"}  # curve columns that are shares in [0, 1]
# each metrics file and what the page loses without it
SECTIONS = {"evaluate": "accuracy by stage, DOTS table", "train_rm": "reward model calibration",
            "rlhf_routed": "routing, routed RLHF's test figures", "rlvr_ar3po": "RLVR rollout cost"}


def load(name: str) -> dict | None:
    path = METRICS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def accuracy_by_stage(evaluate: dict, rlhf: dict | None, rlvr: dict | None) -> pd.DataFrame:
    """One row per stage: own-choice test accuracy overall and per difficulty."""
    rows = []
    for key, label in STAGES:
        # its own choice only: the mean over static formats is another system (evaluate.models may hold any model;
        # a policy in it is scored on every format, as the warm-up is)
        summary = own_choice(evaluate[key]) if key in evaluate else None
        own_stage = {"rlhf": rlhf and rlhf["rlhf_test"], "rlvr": rlvr and rlvr["rlvr_test"]}.get(key)
        if summary is None and own_stage:  # evaluate did not score it: the figure its stage measured (its own
            summary, label = own_stage, f"{label} (its stage's test figure)"  # max_new_tokens), named as such
        if summary:
            rows.append({"stage": label, "accuracy": summary["accuracy"],
                         **{f"d{d}": a for d, a in sorted(summary["by_difficulty"].items(), key=lambda x: int(x[0]))}})
    return pd.DataFrame(rows)


def accuracy_by_kind(evaluate: dict) -> tuple[pd.DataFrame, dict[str, int]]:
    """(table, test questions per kind): each stage's own-choice accuracy per question kind, then the warm-up solver
    on each static trajectory; empty where the test rows carry no kind (a user's data without one)."""
    rows, counts = [], {}
    for key, label in STAGES:
        own = own_choice(evaluate[key]) if key in evaluate else None
        if own and own.get("by_kind"):
            rows.append({"system": label, **own["by_kind"]})
            counts = counts or evaluate[key].get("questions_by_kind", {})
    for fmt, fs in evaluate.get("warmup", {}).get("by_format", {}).items():
        if fmt != "own_choice" and fs.get("by_kind"):
            rows.append({"system": f"warm-up, static {fmt}", **fs["by_kind"]})
    return pd.DataFrame(rows), counts


def dots_table(evaluate: dict) -> pd.DataFrame:
    """Every static trajectory of the warm-up solver beside the DOTS planners and vanilla SFT."""
    rows = [{"policy": f"static {fmt}", "accuracy": fs["accuracy"]}
            for fmt, fs in evaluate.get("warmup", {}).get("by_format", {}).items() if fmt != "own_choice"]
    rows += [{"policy": label, "accuracy": evaluate[key]["accuracy"]} for key, label in STAGES[1:4] if key in evaluate]
    # no rows when evaluate ran neither the static trajectories nor the DOTS systems (evaluate.formats, .dots)
    return pd.DataFrame(rows, columns=["policy", "accuracy"]).sort_values("accuracy", ascending=False)


def plot_stages(table: pd.DataFrame, path: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.2))
    left.barh(table["stage"], table["accuracy"], color="tab:blue")
    for y, a in enumerate(table["accuracy"]):
        left.text(a + 0.005, y, f"{a:.3f}", va="center", fontsize=8)
    left.set(xlabel="test accuracy (own choice, greedy)", xlim=(0, 1))
    left.invert_yaxis()
    for _, row in table.iterrows():
        ds = [c for c in table.columns if c.startswith("d")]
        right.plot([int(c[1:]) for c in ds], [row[c] for c in ds], marker="o", label=row["stage"])
    right.set(xlabel="difficulty (operations)", ylabel="test accuracy", ylim=(0, 1.02))
    right.legend(fontsize=7)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.suptitle("What each stage bought")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_rollout_cost(rlvr: dict, path: Path) -> None:
    curve = rlvr["dev_curve"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([c["responses"] for c in curve], [c["dev_accuracy"] for c in curve], marker="o",
            label=f"{rlvr['algo']} dev accuracy")
    # test accuracy before (no responses generated yet) and after RL, on the same axis of rollout cost
    ax.plot([0, rlvr["rollout"]["responses"]], [rlvr["sft_test"]["accuracy"], rlvr["rlvr_test"]["accuracy"]],
            ls="--", marker="s", color="gray", label="test accuracy: SFT -> RLVR")
    ax.set(xlabel="cumulative generated responses", ylabel="accuracy", title="RLVR: accuracy against rollout cost",
           ylim=(-0.02, 1.02))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def training_curves(path: Path) -> list[str]:
    """One panel per training stage from its curve files; returns the titles of the panels that have data."""
    drawn = []
    fig, axes = plt.subplots(1, len(CURVES), figsize=(4 * len(CURVES), 3.4))
    for ax, (title, column, files) in zip(axes, CURVES):
        series = {label: read_curve(CURVE_DIR / name) for label, name in files.items()}
        series = {label: df.dropna(subset=[column]) for label, df in series.items() if column in df}
        series = {label: df for label, df in series.items() if len(df)}  # a model that trained no step: no legend
        smooth = any(len(df) > 30 for df in series.values())  # one rule per panel: its series read alike
        for label, df in series.items():
            # long series: the logged points faint, a centred mean over 10 of them on top (a trailing one lags: at
            # warm-up's step 100 it drew 2.66 where the loss was 1.07)
            if smooth:
                line = ax.plot(df["step"], df[column], lw=0.6, alpha=0.3)[0]
                values = df[column].rolling(10, min_periods=1, center=True).mean()
                ax.plot(df["step"], values, lw=1.2, color=line.get_color(), label=label or None)
            else:
                ax.plot(df["step"], df[column], lw=1.2, marker="o" if len(df) < 10 else None, label=label or None)
        if any(label for label in series):
            ax.legend(fontsize=7)
        if series:
            drawn.append(title)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray")
        ax.set(title=title, xlabel="step")
        if column in BOUNDED:  # a share: on its whole range, as the accuracy-by-stage plot draws it
            ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return drawn


def figure(source: str, out: Path, alt: str) -> str:
    """A markdown image of another stage's figure (a path under reports/), copied into ``out``: the stages' own
    directories are DVC outputs, absent from git, so a clone's page linked images it did not have. Empty when the
    stage drew no such figure."""
    path = REPORTS / source
    if not path.is_file():
        return ""
    name = source.replace("/", "_")
    shutil.copyfile(path, out / name)
    return f"![{alt}](report/{name})"


def build_report(out: Path) -> str:
    """The markdown of reports/README.md; its figures and CSVs are written into ``out`` (which replaces
    reports/report/ whole, so a section that is gone leaves no stale file)."""
    evaluate, rlhf, rlvr, rm = load("evaluate") or {}, load("rlhf_routed"), load("rlvr_ar3po"), load("train_rm")
    parts = ["# Reports\n", "Generated by the `report` stage on every `dvc repro` (stages/report.py); do not edit.\n"]
    missing = [f"`metrics/{name}.json` ({what})" for name, what in SECTIONS.items()
               if not (METRICS / f"{name}.json").exists()]
    if missing:  # a page without them must not read as the whole run's
        parts.append(f"Not in this page, their stages have not run: {'; '.join(missing)}.\n")

    stages = accuracy_by_stage(evaluate, rlhf, rlvr)
    if not stages.empty:
        stages.to_csv(out / "accuracy_by_stage.csv", index=False)
        plot_stages(stages, out / "accuracy_by_stage.png")
        parts += ["## Accuracy by stage\n", "Test split, greedy, the policy choosing its own trajectory "
                  "([CSV](report/accuracy_by_stage.csv)).\n", stages.to_markdown(index=False, floatfmt=".3f"),
                  "\n![accuracy by stage](report/accuracy_by_stage.png)\n"]
    kinds, counts = accuracy_by_kind(evaluate)
    if not kinds.empty:
        kinds.to_csv(out / "accuracy_by_kind.csv", index=False)
        parts += ["## Accuracy by question kind\n", "Test split, own choice (the warm-up solver also on each static "
                  f"trajectory); test questions per kind: {', '.join(f'{k} {n}' for k, n in counts.items())} "
                  "([CSV](report/accuracy_by_kind.csv)).\n", kinds.to_markdown(index=False, floatfmt=".3f") + "\n"]
    if evaluate.get("warmup"):
        dots = dots_table(evaluate)
        dots.to_csv(out / "dots.csv", index=False)
        parts += ["## DOTS: searched trajectories vs every static one\n", dots.to_markdown(index=False, floatfmt=".3f"),
                  "\n" + figure("dots/optimal_trajectories.png", out, "optimal trajectories") + "\n",
                  figure("evaluate/accuracy_by_difficulty.png", out, "accuracy by difficulty and format") + "\n"]
    if rm:
        # the score routing ranks by (train_rm.uncertainty_score), and u = sqrt(1 + lambda var) itself: they differ
        # in sign here, and a column named for u must not show the other's figure
        score = f"Spearman({rm.get('uncertainty_score', 'routing')} score, correct)"
        table = pd.DataFrame([
            {"model": "pairwise PM", "accuracy": rm["pm_accuracy"], "ECE raw": rm["pm_ece_raw"],
             "ECE calibrated": rm["pm_ece_calibrated"], score: rm["spearman_uncertainty_correct"],
             "Spearman(u, correct)": rm["spearman_variance_correct"]},
            {"model": "pointwise RM", "accuracy": rm["pointwise_accuracy"], "ECE raw": rm["pointwise_ece"],
             "ECE calibrated": float("nan"), score: float("nan"), "Spearman(u, correct)": float("nan")}])
        table.to_csv(out / "reward_model.csv", index=False)
        parts += ["## Reward model calibration\n", table.to_markdown(index=False, floatfmt=".3f"),
                  "\n" + figure("rm/reliability.png", out, "reliability") + " "
                  + figure("rm/accuracy_by_uncertainty_decile.png", out, "accuracy by uncertainty decile") + "\n"]
    if rlhf:
        budgets = pd.DataFrame([{"judge budget": float(b), "uncertainty": v["uncertainty"], "random": v["random_mean"],
                                 "random std": v["random_std"]} for b, v in rlhf["routing"]["budgets"].items()])
        budgets.to_csv(out / "routing.csv", index=False)
        parts += ["## Routing: preference accuracy against judge calls\n", budgets.to_markdown(index=False, floatfmt=".3f"),
                  f"\nRouted RLHF: test {rlhf['sft_test']['accuracy']:.3f} (SFT) -> {rlhf['rlhf_test']['accuracy']:.3f}, "
                  f"{rlhf['judge_calls']:.0f} judge calls paid (${rlhf['judge_cost']:.4f}), "
                  f"{rlhf.get('judge_cache_hits', 0):.0f} verdicts from the judge cache; of the verdicts "
                  f"{rlhf.get('judge_overrule_share', float('nan')):.3f} overruled the PM and "
                  f"{rlhf.get('judge_tie_share', float('nan')):.3f} were ties.\n",
                  figure("routing/routing_curve.png", out, "routing curve") + "\n"]
    if rlvr:
        plot_rollout_cost(rlvr, out / "rollout_cost.png")
        pd.DataFrame(rlvr["dev_curve"]).to_csv(out / "rollout_cost.csv", index=False)
        parts += ["## RLVR rollout cost\n",
                  f"`{rlvr['algo']}`: test {rlvr['sft_test']['accuracy']:.3f} (SFT) -> {rlvr['rlvr_test']['accuracy']:.3f}; "
                  f"{rlvr['rollout']['responses']} responses ({rlvr['responses_per_prompt']:.2f} per prompt), "
                  f"zero-advantage share {rlvr['zero_advantage_share']:.2f}, generation {rlvr['generation_share']:.0%} "
                  "of step time ([CSV](report/rollout_cost.csv)).\n", "![rollout cost](report/rollout_cost.png)\n"]
    drawn = training_curves(out / "training_curves.png")
    if drawn:
        parts += ["## Training curves\n", f"From the curve files the training stages write under `curves/` "
                  f"(`python3 -m dvc plots show` draws them too): {', '.join(drawn)} (a long series: each logged step "
                  "faint, a centred mean over 10 of them on top; two trainers in one panel each on its own steps).\n",
                  "![training curves](report/training_curves.png)\n"]
    parts += ["## Files\n", "- `metrics/*.json`: each stage's DVC metrics; `plots/accuracy_by_difficulty.csv` and "
              "`curves/*.csv` (each training stage's logged steps): DVC plot data (`python3 -m dvc plots show`, "
              "`dvc plots diff` against another commit).\n- `evaluate/responses.jsonl`: every test answer and its "
              "verdict (DVC-cached, git-ignored).\n- `report/`: this page's figures and tables (CSV).\n"]
    return "\n".join(parts)


def write_report() -> None:
    """reports/report/ and then reports/README.md, each replaced whole: a failure or a kill leaves the last
    complete report, never half of a new one."""
    with atomic_dir(OUT) as tmp:
        readme = build_report(tmp)
    atomic_write_text(README, readme)


@stage_main
def main() -> None:
    params = load_params()
    with stage_run("report", params, sections=["seed"]):
        import mlflow

        write_report()
        mlflow.log_artifact(str(README), "report")
        mlflow.log_artifacts(str(OUT), "report")
        print(f"report: wrote {README} and {len(list(OUT.iterdir()))} files under {OUT}")


if __name__ == "__main__":
    main()
