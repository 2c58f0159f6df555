"""Routed RLHF downstream: the same SFT policy, PM and judge, trained by `rlhf_routed`'s GRPO with each routing
policy (uncertainty_budget at `rlhf.budget`, random at the same budget, rm_only, judge_only) and several seeds;
test accuracy of each resulting policy and what its judge cost.

    python3 bench/rlhf_downstream.py [--seeds 3] [--steps N] [--routings uncertainty_budget random rm_only judge_only]
                                     [--budget B] [--same-answer judge|skip|tie]
                                     [--route-score uncertainty|expected_gain] [--route-unit pair|comparison]
                                     [--extra-test 960] [--pm DIR] [--learning-rate LR] [--kl-beta B]
                                     [--unrouted pm|expected_verdict] [--judge-mistake-rate E]
    python3 bench/rlhf_downstream.py --merge A.json B.json --out C.json   # join runs made apart (in parallel)

Run after `dvc repro` (needs models/sft, models/rm). Every run has its own empty judge cache, so its cost is
its own. Prints a table, writes reports/bench/rlhf_downstream.json, a plot of test accuracy against judge cost
beside it (.png) and logs to MLflow; nothing is asserted.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from contextlib import closing
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import mlflow  # noqa: E402
import torch  # noqa: E402
from scipy import stats  # noqa: E402

from posttrain.judge_client import JudgeCache, JudgeClient  # noqa: E402
from posttrain.judge_cost import CostLedger  # noqa: E402
from posttrain.judge_server import judge_endpoint  # noqa: E402
from posttrain.params import ParamsError, with_overrides  # noqa: E402
from posttrain.policy_accuracy import own_choice_accuracy  # noqa: E402
from posttrain.preference_model import PreferenceModel  # noqa: E402
from posttrain.rlhf import RoutedPairwiseReward, train_routed_policy  # noqa: E402
from posttrain.routing import decisive_chance, right_side, upper_pairs  # noqa: E402
from posttrain.tracking import bench_run  # noqa: E402
from held_out import held_out_questions  # noqa: E402
from results_files import join_results  # noqa: E402
from posttrain.jsonl import read_jsonl  # noqa: E402
from stages.rlhf_routed import DATA, PM_DIR, POLICY  # noqa: E402

OUT = Path("reports/bench/rlhf_downstream.json")
ROUTINGS = ("uncertainty_budget", "random", "rm_only", "judge_only")
BUDGETED = ("uncertainty_budget", "random")


class AnswerMemoReward(RoutedPairwiseReward):
    """The routed reward with each response's final answer found once: routing (expected_gain, same_answer) and a
    subclass's own use ask for the same answers again, and a pot answer costs a sandbox run."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.answer_of: dict[str, int | None] = {}

    def final_answers(self, texts: list[str]) -> list[int | None]:
        new = [t for t in dict.fromkeys(texts) if t not in self.answer_of]
        if new:
            self.answer_of.update(zip(new, super().final_answers(new)))
        return [self.answer_of[t] for t in texts]


class ExpectedVerdictReward(AnswerMemoReward):
    """``--unrouted expected_verdict``: a pair the judge does not see scores what the judge is expected to say
    about it, 2 d_ij (2 q_ij - 1), in place of the PM's logit s_ij: d_ij the chance the pair is decisive at all and
    q_ij the chance i is its right side, the estimates expected_gain routing already ranks by (the PM's calibrated
    odds times the self-consistency odds of the prompt's final answers; ``posttrain.routing``). Two responses with
    the same final answer score 0, as the judge's tie; one with no answer loses to one with an answer. No reference
    answer is read: the final answers come from the responses (pot programs run in the sandbox)."""

    def score_group(self, question: str, responses: list[str]):
        s, u, p = super().score_group(question, responses)
        answers = self.final_answers(responses)
        expected = 2 * decisive_chance(answers) * (2 * right_side(p, answers) - 1)
        for i, j in upper_pairs(len(responses)):
            s[i, j], s[j, i] = expected[i, j], -expected[i, j]
        return s, u, p


def variant(run: dict) -> str:
    """What a run compares as: its routing policy, with the budget for the budgeted ones and ``rlhf.same_answer``
    where it is not ``judge``. Files written before the budget was recorded ran at 0.1, the params default then;
    before ``budget_of`` was recorded a budget was a share of all the step's pairs, identical ones included (now
    of the others: a share of judge_only's cost); before ``same_answer`` was recorded it was ``judge``, before
    ``route_score`` was, ``uncertainty`` (which only uncertainty routing reads); before ``route_unit`` was,
    ``pair``; a run routed with a PM other than the stage's (``--pm``) names it, unless it never read it
    (``reads_pm``). Runs that do not record their PM predate ``routing.right_side`` (both came in one commit):
    their expected_gain took the side from the PM's p alone. A learning rate or KL coefficient other than the
    ones every run used before they were recorded (5e-5, 0.04) is named too, and so is a run length other than 60
    steps (``rlhf.max_steps``; before it was recorded, the dev history's last step), and a fallible judge
    (``judge.mistake_rate`` above 0; before it was recorded, the judge was always right)."""
    suffix = "" if run.get("same_answer", "judge") == "judge" else f", same answer: {run['same_answer']}"
    steps = run.get("steps") or (run["dev_accuracy"][-1][0] if run.get("dev_accuracy") else 60)
    if steps != 60:
        suffix += f", {steps} steps"
    if run.get("unrouted", "pm") != "pm":
        suffix += f", unrouted: {run['unrouted']}"
    if run.get("learning_rate", 5e-5) != 5e-5:
        suffix += f", lr {run['learning_rate']:g}"
    if run.get("kl_beta", 0.04) != 0.04:
        suffix += f", KL {run['kl_beta']:g}"
    if run.get("judge_mistake_rate", 0.0) > 0:
        suffix += f", judge wrong on {run['judge_mistake_rate']:g}"
    if reads_pm(run) and Path(run.get("pm", PM_DIR)) != Path(PM_DIR):
        suffix += f", PM {Path(run['pm']).name}"
    if run["routing"] in BUDGETED and run.get("route_unit", "pair") == "comparison":
        suffix = f", per call{suffix}"
    if run["routing"] == "uncertainty_budget" and run.get("route_score", "uncertainty") != "uncertainty":
        side = " (side from p alone)" if run["route_score"] == "expected_gain" and "pm" not in run else ""
        suffix = f" by {run['route_score']}{side}{suffix}"
    if run["routing"] not in BUDGETED:
        return run["routing"] + suffix
    of_all = "" if run.get("budget_of") == "eligible" else " (all pairs)"
    return f"{run['routing']} {run.get('budget', 0.1):g}{of_all}{suffix}"


def reads_pm(run: dict) -> bool:
    """Whether the PM could have shaped a run's rewards: judge_only judges every pair of distinct responses and
    scores identical ones 0, so its PM only decides the pairs whose judge call failed."""
    return run["routing"] != "judge_only" or run.get("judge_failures", 0) > 0


def by_variant(runs: list[dict]) -> dict[str, list[dict]]:
    """Runs grouped by ``variant``, in the order each variant first appears."""
    groups: dict[str, list[dict]] = {}
    for r in runs:
        groups.setdefault(variant(r), []).append(r)
    return groups


def one_run(params, routing: str, seed: int, steps: int, base_url: str, pm_dir: str, splits: dict,
            workdir: Path, unrouted: str = "pm", reward_cls=None) -> dict:
    """Train with one routing policy and seed, routed by the PM in ``pm_dir``, the pairs the judge does not see
    scored by ``unrouted``; test accuracy and judge cost. ``reward_cls`` replaces the reward class ``unrouted``
    picks (bench/pm_drift.py watches the reward with it); its ``summary()`` joins the result."""
    pm = PreferenceModel.from_pretrained(pm_dir)
    cfg = params.rlhf.model_copy(update={"routing": routing, "max_steps": steps})
    run_params = params.model_copy(update={"rlhf": cfg})
    ledger = CostLedger(params.judge.price_in_per_1k, params.judge.price_out_per_1k)
    start = time.perf_counter()
    with closing(JudgeClient(params.judge, base_url, JudgeCache(workdir / "judge.sqlite"), ledger)) as client:
        reward_cls = reward_cls or (ExpectedVerdictReward if unrouted == "expected_verdict" else RoutedPairwiseReward)
        reward = reward_cls(pm, client, cfg, seed, params.sandbox)
        dev_cb = train_routed_policy(POLICY, reward, splits["train"], splits["dev"], run_params,
                                     str(workdir / "policy"), workdir / "checkpoints", key_files=[Path(pm_dir)],
                                     seed=seed)
    test = own_choice_accuracy(str(workdir / "policy"), splits["test"], cfg.max_new_tokens, params.sandbox)
    return {"routing": routing, "pm": str(pm_dir), "budget": cfg.budget, "budget_of": "eligible",
            "same_answer": cfg.same_answer,
            "route_score": cfg.route_score, "route_unit": cfg.route_unit, "learning_rate": cfg.learning_rate,
            "kl_beta": cfg.kl_beta, "unrouted": unrouted, "steps": steps, "seed": seed,
            "judge_mistake_rate": params.judge.mistake_rate,
            "test_accuracy": test["accuracy"],
            "test_by_difficulty": test["by_difficulty"], "test_by_kind": test.get("by_kind"),
            "dev_accuracy": dev_cb.history,
            **reward.summary(), "judge_calls": ledger.calls, "judge_cost": ledger.cost,
            "seconds": round(time.perf_counter() - start, 1)}


def summarize(sft: dict, runs: list[dict]) -> None:
    print(f"\nSFT policy: test accuracy {sft['accuracy']:.3f}")
    w = max(52, *(len(name) + 2 for name in by_variant(runs)))
    print(f"{'routing':{w}}{'seeds':>6}{'test acc mean':>14}{'sd':>7}{'judge calls':>13}{'cost $':>10}{'routed':>8}")
    for name, rs in by_variant(runs).items():
        accs = [r["test_accuracy"] for r in rs]
        print(f"{name:{w}}{len(rs):6d}{statistics.mean(accs):14.3f}{statistics.pstdev(accs):7.3f}"
              f"{statistics.mean(r['judge_calls'] for r in rs):13.0f}"
              f"{statistics.mean(r['judge_cost'] for r in rs):10.4f}"
              f"{statistics.mean(r['routed_fraction'] for r in rs):8.3f}")
    compare_paired(runs)


def compare_paired(runs: list[dict]) -> None:
    """The first variant against each other one on the seeds both ran: the per-seed differences of test accuracy
    (same seed = same prompts drawn and the same sampling RNG, so pairing removes much of the seed's noise), how
    many favour the first, and a paired t-test's two-sided p-value."""
    groups = list(by_variant(runs).items())
    if len(groups) < 2:
        return
    first, rs = groups[0]
    w = max(52, *(len(name) + 2 for name, _ in groups))
    mine = {r["seed"]: r["test_accuracy"] for r in rs}
    print(f"\npaired by seed, {first} minus:")
    for name, others in groups[1:]:
        theirs = {r["seed"]: r["test_accuracy"] for r in others}
        seeds = sorted(mine.keys() & theirs.keys())
        if len(seeds) < 2:
            print(f"  {name:{w}} fewer than 2 shared seeds")
            continue
        diffs = [mine[s] - theirs[s] for s in seeds]
        p = stats.ttest_rel([mine[s] for s in seeds], [theirs[s] for s in seeds]).pvalue
        print(f"  {name:{w}} {statistics.mean(diffs):+.3f} over {len(seeds)} seeds, ahead on "
              f"{sum(d > 0 for d in diffs)}, paired t-test p = {p:.3f} (differences: "
              f"{', '.join(f'{d:+.3f}' for d in diffs)})")


def plot(sft: dict, runs: list[dict], out: Path) -> None:
    """Test accuracy against judge cost, one marker per run, the routing policy's mean as a larger one. A variant
    and its run against a fallible judge share a colour; the fallible judge's markers are diamonds."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ax.axhline(sft["accuracy"], color="grey", ls="--", lw=1, label="SFT policy")
    colours: dict[str, str] = {}
    for name, rs in by_variant(runs).items():
        colour = colours.setdefault(variant({**rs[0], "judge_mistake_rate": 0.0}), f"C{len(colours)}")
        marker = "D" if rs[0].get("judge_mistake_rate", 0.0) > 0 else "o"
        cost, acc = [r["judge_cost"] for r in rs], [r["test_accuracy"] for r in rs]
        ax.scatter(cost, acc, color=colour, marker=marker, alpha=0.45, s=22)
        ax.scatter([statistics.mean(cost)], [statistics.mean(acc)], color=colour, marker=marker, s=90,
                   edgecolor="black", label=f"{name} (mean of {len(rs)})")
    ax.set_xlabel("judge cost per run (USD)")
    ax.set_ylabel("test accuracy after rlhf_routed")
    ax.set_title("Routed RLHF: accuracy vs judge cost")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def run() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3, help="training seeds per routing policy")
    ap.add_argument("--routings", nargs="+", default=list(ROUTINGS), choices=ROUTINGS)
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps per run (default: rlhf.max_steps)")
    ap.add_argument("--budget", type=float, default=None,
                    help="share of each step's non-identical pairs judged by the budgeted policies (default: "
                         "rlhf.budget)")
    ap.add_argument("--same-answer", choices=["judge", "skip", "tie"], default=None,
                    help="pairs whose final answers agree: judge, skip or tie (default: rlhf.same_answer)")
    ap.add_argument("--route-score", choices=["uncertainty", "expected_gain"], default=None,
                    help="what uncertainty routing ranks pairs by (default: rlhf.route_score)")
    ap.add_argument("--route-unit", choices=["pair", "comparison"], default=None,
                    help="what a budget counts: pairs or distinct comparisons (calls) (default: rlhf.route_unit)")
    ap.add_argument("--learning-rate", type=float, default=None,
                    help="the policy's learning rate (default: rlhf.learning_rate)")
    ap.add_argument("--kl-beta", type=float, default=None,
                    help="the KL penalty's coefficient to the SFT policy (default: rlhf.kl_beta)")
    ap.add_argument("--unrouted", choices=["pm", "expected_verdict"], default="pm",
                    help="what a pair the judge does not see scores: the PM's logit (METHODS.md) or the judge's "
                         "expected verdict from the PM and the prompt's final answers (ExpectedVerdictReward)")
    ap.add_argument("--extra-test", type=int, default=0,
                    help="add this many fresh held-out questions of the task to the test split (a multiple of the "
                         "difficulty count; none of them in train, dev or test), for less noise per evaluation")
    ap.add_argument("--pm", default=PM_DIR,
                    help="the PM every run routes with (e.g. one bench/preference.py --save-dir kept)")
    ap.add_argument("--judge-mistake-rate", type=float, default=None,
                    help="the local verifier judge's share of pairs judged wrong (default: judge.mistake_rate)")
    ap.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1")
    ap.add_argument("--out", type=Path, default=OUT, help="results JSON (partial results are written after each run)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads for this process (default: one per core); running two benches side by "
                         "side, give each 1: two runs of 2 threads on 2 cores spin-wait on each other, 4-5x slower")
    ap.add_argument("--merge", type=Path, nargs="+", default=None,
                    help="no training: join these results files (e.g. routings run in parallel) into --out, "
                         "plot, print")
    args = ap.parse_args()
    if args.merge:
        sft, runs = join_results(args.merge, args.out, "sft")
        summarize(sft, runs)
        plot(sft, runs, args.out.with_suffix(".png"))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    try:  # validated as params.yaml is: --budget 10 (meant as percent) stops here, naming rlhf.budget
        overrides = {"rlhf.budget": args.budget, "rlhf.same_answer": args.same_answer,
                     "rlhf.route_score": args.route_score, "rlhf.route_unit": args.route_unit,
                     "rlhf.learning_rate": args.learning_rate, "rlhf.kl_beta": args.kl_beta,
                     "judge.mistake_rate": args.judge_mistake_rate}
        params = with_overrides("params.yaml", {k: v for k, v in overrides.items() if v is not None}, out=None)
    except ParamsError as e:
        ap.error(str(e))
    splits = {s: read_jsonl(DATA / f"{s}.jsonl") for s in ("train", "dev", "test")}
    records = [r for split in splits.values() for r in split]  # the judge sees training prompts only
    if args.extra_test:
        splits["test"] = splits["test"] + held_out_questions(params, args.extra_test, records)
    results = []
    with bench_run("rlhf_downstream", params), judge_endpoint(params.judge, records, params.seed) as url:
        sft = {**own_choice_accuracy(POLICY, splits["test"], params.rlhf.max_new_tokens, params.sandbox),
               "test_questions": len(splits["test"])}
        mlflow.log_metric("sft_test_accuracy", sft["accuracy"])
        for routing in args.routings:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                with tempfile.TemporaryDirectory(prefix="rlhf_bench_") as tmp, \
                        mlflow.start_run(run_name=f"{routing} seed {seed}", nested=True,
                                         tags={"posttrain.bench.variant": routing, "seed": str(seed)}):
                    r = one_run(params, routing, seed, args.steps or params.rlhf.max_steps, url, args.pm, splits,
                                Path(tmp), args.unrouted)
                    mlflow.log_metrics({"test_accuracy": r["test_accuracy"], "judge_calls": r["judge_calls"],
                                        "judge_cost": r["judge_cost"], "routed_fraction": r["routed_fraction"]})
                results.append(r)
                print(f"{routing} seed {seed}: test accuracy {r['test_accuracy']:.3f}, judge {r['judge_calls']} calls "
                      f"${r['judge_cost']:.4f}, routed {r['routed_fraction']:.3f}, of the verdicts "
                      f"{r['judge_overrule_share']:.3f} overruled the PM and {r['judge_tie_share']:.3f} were ties "
                      f"({r['seconds']} s)")
                args.out.parent.mkdir(parents=True, exist_ok=True)
                # partial results survive a crash
                args.out.write_text(json.dumps({"sft": sft, "runs": results}, indent=1))
        mlflow.log_artifact(str(args.out))
    summarize(sft, results)
    plot(sft, results, args.out.with_suffix(".png"))

if __name__ == "__main__":
    run()
