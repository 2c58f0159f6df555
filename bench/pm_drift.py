"""What the reward says about the policy's own responses while `rlhf_routed` trains, step by step: of the pairs
whose responses differ in correctness (one right, one wrong, by the verifier and the reference answer, which the
reward never reads), the share the PM's s_ij favours the right one and the share the step's final reward does
(after routing and the judge's verdicts); by difficulty; and what the policy moves toward (its training accuracy,
its share of `pot` responses, and which side the PM takes between a `pot` and a `cot` response that are equally
right).

It asks why a routing collapses: on stop 69's policy rm_only falls from 0.818 to 0.694 (d5 0.750 -> 0.353) where a
judge on 3% of the pairs rescues it (docs/results.md). A PM that is wrong on the policy's own decisive pairs from the
start is weak; one that starts right and falls as the policy trains is exploited.

    python3 bench/pm_drift.py [--routings rm_only uncertainty_budget] [--seed 0] [--steps N] [--pm DIR] [--window 25]
                              [--extra-test 960] [--threads 1] [--out reports/bench/pm_drift.json]
    python3 bench/pm_drift.py --merge A.json B.json --out C.json   # routings run apart (in parallel)

Each run is `bench/rlhf_downstream.py`'s (same seed, same rewards and updates: its test accuracy should repeat that
bench's), with the reward watched. Prints windows of steps, writes the JSON and a plot beside it; nothing asserted.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from collections import defaultdict
from contextlib import closing
from functools import partial
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from posttrain.form_balance import solution_form  # noqa: E402
from posttrain.jsonl import read_jsonl  # noqa: E402
from posttrain.judge_server import judge_endpoint  # noqa: E402
from posttrain.params import load_params  # noqa: E402
from posttrain.routing import upper_pairs  # noqa: E402
from posttrain.tracking import bench_run  # noqa: E402
from held_out import held_out_questions  # noqa: E402
from rlhf_downstream import ROUTINGS, AnswerMemoReward, one_run  # noqa: E402
from results_files import join_results  # noqa: E402
from stages.rlhf_routed import DATA, PM_DIR  # noqa: E402

OUT = Path("reports/bench/pm_drift.json")


class DiagnosedReward(AnswerMemoReward):
    """The routed reward, unchanged, with each step's PM scores kept and measured against the reference answers
    (``references``: question -> its training record). ``summary()`` carries the per-step figures (``diagnostics``)."""

    def __init__(self, *args, references: dict[str, dict], **kwargs):
        super().__init__(*args, **kwargs)
        self.references = references
        self.pm_scores: dict[tuple[str, tuple[str, ...]], torch.Tensor] = {}
        self.steps: list[dict] = []

    def score_group(self, question: str, responses: list[str]):
        s, u, p = super().score_group(question, responses)
        self.pm_scores[(question, tuple(responses))] = s
        return s, u, p

    def step_rewards(self, prompts, completions, question, log_metric=None) -> list[float]:
        self.pm_scores, self.answer_of = {}, {}
        rewards = super().step_rewards(prompts, completions, question, log_metric)
        groups: dict[str, list[int]] = defaultdict(list)
        for k, p in enumerate(prompts):
            groups[p].append(k)
        answers = self.final_answers(list(completions))
        pot = [solution_form(c) == "pot" for c in completions]
        # per difficulty: decisive pairs, PM on the right side, final reward on the right side
        decisive: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])
        form_pairs = pm_prefers_pot = 0  # a pot and a cot response, both right or both wrong
        right_count = 0
        for idx in groups.values():
            ref = self.references[question[idx[0]]]
            s = self.pm_scores[(question[idx[0]], tuple(completions[k] for k in idx))]
            right = [answers[k] is not None and answers[k] == ref["answer"] for k in idx]
            right_count += sum(right)
            for i, j in upper_pairs(len(idx)):
                a, b = idx[i], idx[j]
                if right[i] != right[j]:
                    toward = 1.0 if right[i] else -1.0  # the sign of a preference for the right response
                    t = decisive[ref["difficulty"]]
                    t[0] += 1
                    t[1] += toward * float(s[i, j]) > 0
                    t[2] += toward * (rewards[a] - rewards[b]) > 0
                elif pot[a] != pot[b]:
                    form_pairs += 1
                    pm_prefers_pot += (float(s[i, j]) > 0) == pot[a]
        self.steps.append({"step": len(self.steps) + 1, "responses": len(completions),
                           "right_share": right_count / len(completions), "pot_share": sum(pot) / len(completions),
                           "mean_chars": sum(map(len, completions)) / len(completions),
                           "decisive": {str(d): t for d, t in sorted(decisive.items())},
                           "form_pairs": form_pairs, "pm_prefers_pot": pm_prefers_pot})
        return rewards

    def summary(self) -> dict:
        return {**super().summary(), "diagnostics": self.steps}


def windows(steps: list[dict], width: int) -> list[dict]:
    """The per-step figures pooled over windows of ``width`` steps: pair counts summed, shares of responses averaged."""
    out = []
    for start in range(0, len(steps), width):
        w = steps[start:start + width]
        pooled: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        for s in w:
            for d, t in s["decisive"].items():
                pooled[d] = [x + y for x, y in zip(pooled[d], t)]
        total = [sum(t[k] for t in pooled.values()) for k in range(3)]
        form = sum(s["form_pairs"] for s in w)
        out.append({"steps": f"{w[0]['step']}-{w[-1]['step']}", "last_step": w[-1]["step"],
                    "right_share": sum(s["right_share"] for s in w) / len(w),
                    "pot_share": sum(s["pot_share"] for s in w) / len(w),
                    "mean_chars": sum(s["mean_chars"] for s in w) / len(w),
                    "decisive_pairs": total[0], "pm_right": total[1] / max(total[0], 1),
                    "reward_right": total[2] / max(total[0], 1),
                    "pm_right_by_difficulty": {d: (t[1] / t[0], t[0]) for d, t in sorted(pooled.items())},
                    "form_pairs": form, "pm_prefers_pot": sum(s["pm_prefers_pot"] for s in w) / max(form, 1)})
    return out


def report(runs: list[dict], width: int, out: Path) -> None:
    """A table of windows per run, and a plot of the PM's and the reward's accuracy on decisive pairs, the policy's
    training accuracy and its pot share against the step."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for k, r in enumerate(runs):
        ws = windows(r["diagnostics"], width)
        pm = "" if Path(r["pm"]) == Path(PM_DIR) else f", PM {Path(r['pm']).name}"
        name = f"{r['routing']} seed {r['seed']}{pm}"
        print(f"\n{name}: test accuracy {r['test_accuracy']:.3f} "
              f"(by difficulty {', '.join(f'd{d} {a:.2f}' for d, a in r['test_by_difficulty'].items())})")
        print(f"{'steps':>9}{'right':>7}{'pot':>6}{'chars':>7}{'decisive':>9}{'PM right':>9}{'reward right':>13}"
              f"{'PM prefers pot':>15}  PM right by difficulty (pairs)")
        for w in ws:
            by_d = ", ".join(f"d{d} {a:.2f} ({n})" for d, (a, n) in w["pm_right_by_difficulty"].items())
            print(f"{w['steps']:>9}{w['right_share']:7.3f}{w['pot_share']:6.2f}{w['mean_chars']:7.0f}"
                  f"{w['decisive_pairs']:9d}{w['pm_right']:9.3f}{w['reward_right']:13.3f}"
                  f"{w['pm_prefers_pot']:9.3f} ({w['form_pairs']:3d})  {by_d}")
        x = [w["last_step"] for w in ws]
        axes[0].plot(x, [w["pm_right"] for w in ws], "o-", color=f"C{k}", label=f"{name}: PM")
        axes[0].plot(x, [w["reward_right"] for w in ws], "s--", color=f"C{k}", alpha=0.6, label=f"{name}: reward")
        axes[1].plot(x, [w["right_share"] for w in ws], "o-", color=f"C{k}", label=name)
        axes[2].plot(x, [w["pot_share"] for w in ws], "o-", color=f"C{k}", label=name)
    axes[0].set_title("decisive pairs favouring the right response")
    axes[1].set_title("policy's training responses right")
    axes[2].set_title("share of pot responses")
    for ax in axes:
        ax.set_xlabel(f"step (windows of {width})")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def run() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--routings", nargs="+", default=["rm_only", "uncertainty_budget"], choices=ROUTINGS)
    ap.add_argument("--seed", type=int, default=0, help="training seed (the same for every routing)")
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps per run (default: rlhf.max_steps)")
    ap.add_argument("--pm", default=PM_DIR, help="the PM the reward scores with (e.g. one bench/preference.py "
                                                 "--save-dir kept)")
    ap.add_argument("--window", type=int, default=25, help="steps pooled per row and plot point")
    ap.add_argument("--extra-test", type=int, default=960,
                    help="fresh held-out questions added to the test split, as in bench/rlhf_downstream.py")
    ap.add_argument("--out", type=Path, default=OUT, help="results JSON (the plot goes beside it)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (1 when two benches share 2 cores)")
    ap.add_argument("--merge", type=Path, nargs="+", default=None, help="no training: join these results files")
    args = ap.parse_args()
    if args.merge:
        _, runs = join_results(args.merge, args.out, "sft")
        report(runs, args.window, args.out.with_suffix(".png"))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    params = load_params("params.yaml")
    splits = {s: read_jsonl(DATA / f"{s}.jsonl") for s in ("train", "dev", "test")}
    records = [r for split in splits.values() for r in split]
    if args.extra_test:
        splits["test"] = splits["test"] + held_out_questions(params, args.extra_test, records)
    reward_cls = partial(DiagnosedReward, references={r["question"]: r for r in splits["train"]})
    steps, runs = args.steps or params.rlhf.max_steps, []
    with bench_run("pm_drift", params), judge_endpoint(params.judge, records, params.seed) as url:
        for routing in args.routings:
            with tempfile.TemporaryDirectory(prefix="pm_drift_") as tmp:
                runs.append(one_run(params, routing, args.seed, steps, url, args.pm, splits, Path(tmp),
                                    reward_cls=reward_cls))
            args.out.parent.mkdir(parents=True, exist_ok=True)
            # partial results survive a crash; "sft" names the test set for --merge (no SFT evaluation here)
            args.out.write_text(json.dumps({"sft": {"accuracy": None, "test_questions": len(splits["test"])},
                                            "runs": runs}, indent=1))
    report(runs, args.window, args.out.with_suffix(".png"))


if __name__ == "__main__":
    run()
