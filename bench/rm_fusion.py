"""Would a fast model made of both of train_rm's models route better than the PM alone? On the preference
benchmark's decisive pairs, from the stage's own scores (reports/rm/benchmark_scores.jsonl, so nothing is
retrained): each fast model's accuracy alone, the share of its -> judge gap that routing by its own uncertainty
closes at each budget (random routing over 5 seeds beside it), the oracle's ceiling at 10% (every routed pair
one of its errors) and the accuracy routing by its own score reaches at 10%. The verifier judge is right on every decisive pair, as in ``bench/preference.py``.

Fast models, none fitted on the benchmark:
- ``pm``: the stage's PM, routed by its predictive score (what rlhf_routed does);
- ``pointwise``: TRL's pointwise RM, m = r_A - r_B, routed by -|m|;
- ``mixture``: the two models' mean probability (p_PM = sigmoid(g/u), p_RM = sigmoid(m)), routed by 1 - |2p - 1|,
  the predictive score of a two-member ensemble;
- ``product``: the product of the two experts (logit g/u + m), routed by -|logit|;
- ``*_disagree_first``: the same decision, but the pairs where the PM and the pointwise RM pick different sides
  are routed before any other (then by the model's own score);
- with ``train_rm.reference_lm`` (the PM's logit joined with a reference LM's likelihood ratio, so ``pm`` is the
  joined PM): ``pm_head_alone``, the PM's own head routed by its own predictive score, and ``likelihood_ratio``,
  l_A - l_B alone, routed by -|l_A - l_B|.

    python3 bench/rm_fusion.py            # after `dvc repro train_rm`; writes reports/bench/rm_fusion.json

Prints a table; nothing here is asserted.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import mlflow
import torch

from posttrain.jsonl import read_jsonl
from posttrain.params import load_params
from posttrain.routing_eval import routing_curve, summarize_curve
from posttrain.tracking import bench_run
from posttrain.uncertainty import calibrated_logit, pair_uncertainty

SCORES, OUT = Path("reports/rm/benchmark_scores.jsonl"), Path("reports/bench/rm_fusion.json")
METRICS = Path("reports/metrics/train_rm.json")
BUDGETS, RANDOM_SEEDS = [0.05, 0.1, 0.2, 0.4], list(range(5))


def fast_models(rows: list[dict], lam: float, score: str,
                weight_pm: float | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per fast model, (decision logit, routing score: higher is routed first) on ``rows`` (decisive pairs);
    ``weight_pm``: a in the joined PM's a * g + b * (l_A - l_B), when train_rm joined one."""
    g, var, m = (torch.tensor([r[k] for r in rows]) for k in ("g", "var", "pointwise_margin"))
    g_cal = calibrated_logit(g, var, lam)[0]
    p_pm = torch.sigmoid(g_cal)
    p_mix = (p_pm + torch.sigmoid(m)) / 2
    product = g_cal + m  # the two logits summed: the PM's and the pointwise RM's evidence multiplied as odds
    disagree = ((g > 0) != (m > 0)).float()
    u_pm, u_mix = pair_uncertainty(g, var, lam, score), 1 - (2 * p_mix - 1).abs()
    mixture = torch.logit(p_mix.clamp(1e-6, 1 - 1e-6))
    # the scores are bounded below 1e3, so adding 1e3 puts every disagreement ahead of every agreement
    models = {"pm": (g, u_pm), "pointwise": (m, -m.abs()), "mixture": (mixture, u_mix),
              "product": (product, -product.abs()), "pm_disagree_first": (g, 1e3 * disagree + u_pm),
              "pointwise_disagree_first": (m, 1e3 * disagree - m.abs()),
              "mixture_disagree_first": (mixture, 1e3 * disagree + u_mix)}
    if weight_pm is not None:
        g_alone, ratio = (torch.tensor([r[k] for r in rows]) for k in ("g_pm_alone", "likelihood_ratio"))
        # the stage scales the head's variances by a^2 with its g: undone here
        models["pm_head_alone"] = (g_alone, pair_uncertainty(g_alone, var / weight_pm ** 2, lam, score))
        models["likelihood_ratio"] = (ratio, -ratio.abs())
    return models


def fusion_report(rows: list[dict], lam: float, score: str, weight_pm: float | None = None) -> dict:
    """Per fast model: accuracy, the gap closed by its routing and by random routing at each budget, and the
    oracle's ceiling at 10%."""
    labels = [r["label"] for r in rows]
    label_a = torch.tensor([label == "A" for label in labels])
    out, models = {}, fast_models(rows, lam, score, weight_pm)
    for name, (logit, u) in models.items():
        summary = summarize_curve(routing_curve(labels, logit, u, labels, BUDGETS, RANDOM_SEEDS))
        errors = int(((logit > 0) != label_a).sum())
        out[name] = {"accuracy": summary["rm_only"], "errors": errors,
                     "accuracy_routed_10": summary["budgets"]["0.1"]["uncertainty"],
                     "oracle_gap_closed_10": min(round(0.1 * len(rows)), errors) / errors if errors else None,
                     **{f"gap_closed_{b:g}": summary["budgets"][str(b)]["gap_closed_uncertainty"] for b in BUDGETS},
                     **{f"random_gap_closed_{b:g}": summary["budgets"][str(b)]["gap_closed_random"] for b in BUDGETS}}
    g, m = models["pm"][0], models["pointwise"][0]
    both_wrong = ((g > 0) != label_a) & ((m > 0) != label_a)
    out["overlap"] = {"decisive": len(rows), "disagree": int(((g > 0) != (m > 0)).sum()),
                      "both_wrong": int(both_wrong.sum())}
    return out


def run() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scores", type=Path, default=SCORES, help="train_rm's per-pair benchmark scores")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if not args.scores.exists():
        raise SystemExit(f"{args.scores}: no benchmark scores; run `dvc repro train_rm` first")
    params = load_params()
    rows = [r for r in read_jsonl(args.scores) if r["label"] != "tie"]
    weight_pm = json.loads(METRICS.read_text()).get("likelihood_weight_pm") if METRICS.exists() else None
    report = fusion_report(rows, params.train_rm.uncertainty_lambda, params.train_rm.uncertainty_score, weight_pm)
    overlap = report.pop("overlap")
    print(f"{overlap['decisive']} decisive pairs; the PM and the pointwise RM pick different sides on "
          f"{overlap['disagree']}, both are wrong on {overlap['both_wrong']}\n")
    print(f"{'fast model':26}{'accuracy':>9}  gap closed at " + " / ".join(f"{b:.0%}" for b in BUDGETS)
          + "  (random)  oracle at 10%  accuracy at 10%")
    def share(x):
        return "-" if x is None else f"{x:.1%}"  # None: a model with no errors has no gap to close

    for name, row in report.items():
        print(f"{name:26}{row['accuracy']:9.3f}  " + " / ".join(share(row[f"gap_closed_{b:g}"]) for b in BUDGETS)
              + "  (" + " / ".join(share(row[f"random_gap_closed_{b:g}"]) for b in BUDGETS) + ")"
              + f"  {share(row['oracle_gap_closed_10'])}  {row['accuracy_routed_10']:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"overlap": overlap, "fast_models": report}, indent=1))
    mlflow.log_artifact(str(args.out))


def main() -> None:
    with bench_run("bench/rm_fusion", load_params()):
        run()


if __name__ == "__main__":
    main()
