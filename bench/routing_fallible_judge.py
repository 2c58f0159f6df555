"""The routing curve on the preference benchmark when the judge is fallible, as every real judge is.

The stage's default judge, the task verifier, is right on every pair, so judge_only scores 1.0 and the gap
rm_only -> judge_only is every pair the PM gets wrong (20.6% on the committed run): judging 10% of the pairs can
close at most 48.6% of it. The paper's judge (DeepSeek-R1) is right on 92.3% of RewardBench. Here the local
verifier service judges a share of the pairs wrong (``judge.mistake_rate``, a fixed draw per pair, the same in
both orders), and the stage's routing curve (``stages.rlhf_routed.evaluate_routing``: the same PM, benchmark,
client over HTTP, budgets and random seeds) is measured per mistake rate over several draws of which pairs the
judge gets wrong. Beside it, an oracle router that knows where the PM is wrong (not where the judge is) at each
budget: the most any router could close with this PM.

    python3 bench/routing_fallible_judge.py                  # after `dvc repro train_rm`
    python3 bench/routing_fallible_judge.py --rates 0 0.077 --draws 20

Writes reports/bench/routing_fallible_judge.json and a PNG beside it (share of the gap closed at 10% of the calls
against the mistake rate; the curves at rates 0 and 0.077); nothing here is asserted.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import matplotlib
import mlflow
import torch

from posttrain.jsonl import read_jsonl
from posttrain.judge_client import JudgeCache, JudgeClient
from posttrain.judge_server import JudgeService, build_app, verifier_backend
from posttrain.params import load_params
from posttrain.preference_model import PreferenceModel
from posttrain.routing_eval import routing_curve, summarize_curve
from posttrain.tracking import bench_run
from stages.rlhf_routed import BENCH, DATA, PM_DIR, SCORES, evaluate_routing

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OUT = Path("reports/bench/routing_fallible_judge.json")


def oracle_inputs() -> tuple[list[tuple], list[str], torch.Tensor, torch.Tensor]:
    """The decisive pairs (question, a, b), their labels, the PM's logits and an oracle's u: 1 where the PM is
    wrong, else 0 (ties broken at random), so a budget takes the PM's errors first; the judge's own errors are not
    known to it."""
    decisive = [(p, s) for p, s in zip(read_jsonl(BENCH), read_jsonl(SCORES), strict=True) if p["label"] != "tie"]
    triples = [(p["question"], p["a"], p["b"]) for p, _ in decisive]
    labels = [p["label"] for p, _ in decisive]
    g = torch.tensor([s["g"] for _, s in decisive])
    pm_wrong = torch.tensor([float((g_i > 0) != (label == "A")) for g_i, label in zip(g.tolist(), labels)])
    jitter = torch.rand(len(labels), generator=torch.Generator().manual_seed(0)) * 1e-3  # ties broken at random
    return triples, labels, g, pm_wrong + jitter


def measure(params, pm, records, rate: float, draw: int, oracle) -> dict:
    """One fallible judge (this rate, this draw of its mistakes): the stage's routing curve and the oracle's, with
    the verdicts that judge gives over HTTP (a cache of its own: each draw is another judge)."""
    cfg, rlhf = params.judge.model_copy(update={"mistake_rate": rate}), params.rlhf
    with tempfile.TemporaryDirectory() as tmp, \
            JudgeService(build_app(verifier_backend(records, rate, draw), cfg.model)) as svc:
        client = JudgeClient(cfg, svc.base_url, JudgeCache(Path(tmp) / "judge.sqlite"))
        rows, summary = evaluate_routing(client, pm, rlhf.eval_budgets, rlhf.eval_seeds, rlhf.uncertainty_reduce)
        calls = client.ledger.calls
        triples, labels, g, u_oracle = oracle
        verdicts = client.judge(triples)  # the same verdicts, from the cache
    oracle_rows = routing_curve(labels, g, u_oracle, verdicts, rlhf.eval_budgets, [0])
    oracle_summary = summarize_curve(oracle_rows)
    return {"rate": rate, "draw": draw, "rm_only": summary["rm_only"], "judge_only": summary["judge_only"],
            "n_pairs": summary["n_pairs"], "judge_calls": calls, "judge_failures": dict(client.ledger.failures),
            "budgets": {b: {**v, "gap_closed_oracle": oracle_summary["budgets"][b]["gap_closed_uncertainty"]}
                        for b, v in summary["budgets"].items()}}


def aggregate(runs: list[dict]) -> dict:
    """Per mistake rate, per budget: the mean and sd over draws of each router's share of the gap closed."""
    out = {}
    for rate in sorted({r["rate"] for r in runs}):
        mine = [r for r in runs if r["rate"] == rate]
        row = {"draws": len(mine), "rm_only": mine[0]["rm_only"],
               "judge_only_mean": statistics.mean(r["judge_only"] for r in mine), "budgets": {}}
        for b in mine[0]["budgets"]:
            for key in ("gap_closed_uncertainty", "gap_closed_random", "gap_closed_oracle"):
                values = [r["budgets"][b][key] for r in mine if r["budgets"][b][key] is not None]
                row["budgets"].setdefault(b, {})[key] = {
                    "mean": statistics.mean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0}
        out[str(rate)] = row
    return out


def plot(summary: dict, path: Path, budget: str = "0.1") -> None:
    rates = sorted(float(r) for r in summary)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, label, style in (("gap_closed_oracle", "oracle router (knows the PM's errors)", "k:"),
                              ("gap_closed_uncertainty", "uncertainty routing (the stage's)", "o-"),
                              ("gap_closed_random", "random routing", "s--")):
        stats = [summary[str(r)]["budgets"][budget][key] for r in rates]
        left.errorbar(rates, [100 * s["mean"] for s in stats], yerr=[100 * s["sd"] for s in stats], fmt=style,
                      capsize=3, label=label)
    left.axhline(50, color="grey", lw=0.8)
    left.set_ylim(0, 150)  # as the judge nears the PM the gap shrinks to a few pairs, and its share swings wide
    left.set(xlabel="judge mistake rate (share of pairs judged wrong)", ylabel="% of rm_only -> judge_only gap closed",
             title=f"At {float(budget):.0%} of the pairs judged (mean ± sd over draws)")
    left.legend(fontsize=8)
    for rate, colour in zip([r for r in rates if r in (0.0, 0.077)] or rates[:2], ("tab:blue", "tab:green")):
        budgets = sorted(float(b) for b in summary[str(rate)]["budgets"])
        for key, style in (("gap_closed_uncertainty", "o-"), ("gap_closed_random", "s--")):
            right.plot([100 * b for b in budgets],
                       [100 * summary[str(rate)]["budgets"][str(b)][key]["mean"] for b in budgets], style,
                       color=colour, label=f"{key.removeprefix('gap_closed_')}, mistake rate {rate:g}")
    right.axhline(50, color="grey", lw=0.8)
    right.set(xlabel="% of pairs judged", ylabel="% of the gap closed", title="The routing curve")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[0.0, 0.025, 0.05, 0.077, 0.1, 0.15])
    parser.add_argument("--draws", type=int, default=10, help="draws of the judge's mistakes per rate above 0")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    params = load_params()
    records = [r for s in ("train", "dev", "test") for r in read_jsonl(DATA / f"{s}.jsonl")]
    pm = PreferenceModel.from_pretrained(PM_DIR)
    oracle = oracle_inputs()
    runs = []
    with bench_run("routing_fallible_judge", params):
        for rate in args.rates:
            for draw in range(args.draws if rate > 0 else 1):  # a faultless judge has no draws
                runs.append(measure(params, pm, records, rate, draw, oracle))
                ten = runs[-1]["budgets"]["0.1"]
                print(f"mistake rate {rate:g}, draw {draw}: judge_only {runs[-1]['judge_only']:.3f}, rm_only "
                      f"{runs[-1]['rm_only']:.3f}; gap closed at 10%: uncertainty {ten['gap_closed_uncertainty']:.3f}, "
                      f"random {ten['gap_closed_random']:.3f}, oracle {ten['gap_closed_oracle']:.3f}", flush=True)
        summary = aggregate(runs)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"summary": summary, "runs": runs}, indent=1))
        plot(summary, args.out.with_suffix(".png"))
        mlflow.log_artifact(str(args.out))
        mlflow.log_artifact(str(args.out.with_suffix(".png")))
    print(f"\n{'mistake rate':>12} {'judge_only':>10} | gap closed at 10%: {'uncertainty':>17} {'random':>17} "
          f"{'oracle':>17}")
    for rate, row in summary.items():
        cells = [row["budgets"]["0.1"][k] for k in ("gap_closed_uncertainty", "gap_closed_random", "gap_closed_oracle")]
        print(f"{float(rate):>12g} {row['judge_only_mean']:>10.3f} | {'':>18}"
              + " ".join(f"{100 * c['mean']:>8.1f} ± {100 * c['sd']:>4.1f}%" for c in cells))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
