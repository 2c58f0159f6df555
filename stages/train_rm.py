"""Stage `train_rm`: the pairwise preference model with uncertainty, the pointwise RM baseline, and both
measured on the held-out preference benchmark.

1. PM (models/rm): the SFT model's transformer + the ``train_rm.estimator`` head (ensemble by default), trained
   with the Bradley-Terry loss on data/seppo/pairs.jsonl in both orders, and on ``train_rm.tie_share`` of its rows
   from data/seppo/tie_pairs.jsonl with target 1/2; for sngp one more pass accumulates the Laplace precision.
   With ``train_rm.reference_lm`` (models/warmup) its logit is joined with that LM's log-likelihood ratio, the
   two weights fitted on the decisive training pairs (``posttrain.reference_likelihood``).
   Loads with ``PreferenceModel.from_pretrained("models/rm")``.
2. Pointwise RM (models/rm_pointwise): TRL RewardTrainer on the same pairs, an ordinary
   ``AutoModelForSequenceClassification`` with one label.
3. Benchmark (data/preference_benchmark/pairs.jsonl): accuracy, ECE raw vs calibrated (g vs g/u), Spearman
   correlation between uncertainty and correctness, accuracy per uncertainty decile, per difficulty, and how
   close to 0.5 the PM stays on tie pairs; PM throughput in pairs/s. Written to reports/metrics/train_rm.json,
   reports/rm/*.png (reliability diagram, accuracy by uncertainty decile) and MLflow; each benchmark pair's g and
   variances (mean, and each order's, for ``rlhf_routed``'s routing curve) in reports/rm/benchmark_scores.jsonl.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import mlflow
import torch

from posttrain.atomic import atomic_dir, atomic_write_json
from posttrain.calibration import (accuracy_by_decile, expected_calibration_error, pair_correct,
                                   plot_decile_accuracy, plot_reliability, reliability_bins, spearman)
from posttrain.curves import CURVE_DIR
from posttrain.errors import stage_main
from posttrain.jsonl import read_jsonl
from posttrain.params import load_params
from posttrain.preference_model import reduce_variance
from posttrain.preference_training import pointwise_scores, train_pointwise_rm, train_preference_model
from posttrain.reference_likelihood import ReferenceLikelihood, fit_likelihood_weights
from posttrain.task.records import DataError
from posttrain.tracking import stage_run
from posttrain.uncertainty import calibrated_logit, pair_uncertainty

SFT, PAIRS, TIES = "models/sft", Path("data/seppo/pairs.jsonl"), Path("data/seppo/tie_pairs.jsonl")
BENCHMARK = Path("data/preference_benchmark/pairs.jsonl")
PM_OUT, POINTWISE_OUT = "models/rm", "models/rm_pointwise"
CHECKPOINTS, REPORTS, METRICS = Path("checkpoints/train_rm"), Path("reports/rm"), Path("reports/metrics/train_rm.json")


def decisive_figures(p: list[float], label_a: list[bool], n_bins: int = 10) -> dict:
    return {"accuracy": float(pair_correct(p, label_a).mean()), "ece": expected_calibration_error(p, label_a, n_bins)}


def benchmark_report(pairs: list[dict], g: torch.Tensor, var: torch.Tensor, lam: float,
                     pointwise_margin: list[float], score: str = "predictive") -> tuple[dict, dict]:
    """(metrics, curves): every figure of the benchmark for the PM and the pointwise RM.

    The uncertainty figures use ``score`` (the routing score); the GP variance's own Spearman and extreme
    deciles are reported beside it (``*_variance``), and the margin's (-|g|) as a reference.
    """
    g_cal, _ = calibrated_logit(g, var, lam)
    u = pair_uncertainty(g, var, lam, score)
    p_raw, p_cal, p_pw = torch.sigmoid(g).tolist(), torch.sigmoid(g_cal).tolist(), \
        torch.sigmoid(torch.tensor(pointwise_margin)).tolist()
    decisive = [i for i, pair in enumerate(pairs) if pair["label"] != "tie"]
    ties = [i for i, pair in enumerate(pairs) if pair["label"] == "tie"]
    label_a = [pairs[i]["label"] == "A" for i in decisive]
    correct = pair_correct([p_raw[i] for i in decisive], label_a).tolist()
    pointwise_correct = pair_correct([p_pw[i] for i in decisive], label_a).tolist()
    unc = [u[i].item() for i in decisive]
    deciles = accuracy_by_decile(unc, correct)
    variance = [var[i].item() for i in decisive]
    variance_deciles = accuracy_by_decile(variance, correct)
    pm_raw = decisive_figures([p_raw[i] for i in decisive], label_a)
    metrics = {
        "n_decisive": len(decisive), "n_tie": len(ties),
        "pm_accuracy": pm_raw["accuracy"], "pm_ece_raw": pm_raw["ece"],
        "pm_ece_calibrated": decisive_figures([p_cal[i] for i in decisive], label_a)["ece"],
        "pointwise_accuracy": decisive_figures([p_pw[i] for i in decisive], label_a)["accuracy"],
        "pointwise_ece": decisive_figures([p_pw[i] for i in decisive], label_a)["ece"],
        "spearman_uncertainty_correct": spearman(unc, correct),
        "accuracy_lowest_uncertainty_decile": deciles[0]["accuracy"],
        "accuracy_highest_uncertainty_decile": deciles[-1]["accuracy"],
        "uncertainty_score": score,
        "spearman_variance_correct": spearman(variance, correct),
        "accuracy_lowest_variance_decile": variance_deciles[0]["accuracy"],
        "accuracy_highest_variance_decile": variance_deciles[-1]["accuracy"],
        "spearman_margin_correct": spearman([-abs(g[i].item()) for i in decisive], correct),
        "mean_uncertainty_decisive": sum(unc) / len(unc),
        "mean_uncertainty_tie": sum(u[i].item() for i in ties) / len(ties) if ties else None,
        # on ties: the calibrated p = sigmoid(g/u), and the raw sigmoid(g) whose logit RLHF's advantages are made of
        "tie_mean_abs_p_minus_half": sum(abs(p_cal[i] - 0.5) for i in ties) / len(ties) if ties else None,
        "tie_mean_abs_p_raw_minus_half": sum(abs(p_raw[i] - 0.5) for i in ties) / len(ties) if ties else None,
        "pm_accuracy_by_difficulty": {}, "pointwise_accuracy_by_difficulty": {},
    }
    for d in sorted({pairs[i]["difficulty"] for i in decisive}):
        idx = [k for k, i in enumerate(decisive) if pairs[i]["difficulty"] == d]
        metrics["pm_accuracy_by_difficulty"][str(d)] = round(sum(correct[k] for k in idx) / len(idx), 4)
        metrics["pointwise_accuracy_by_difficulty"][str(d)] = round(sum(pointwise_correct[k] for k in idx) / len(idx), 4)
    curves = {"deciles": deciles, "variance_deciles": variance_deciles, "reliability": {
        "PM raw": reliability_bins([p_raw[i] for i in decisive], label_a),
        "PM calibrated (g/u)": reliability_bins([p_cal[i] for i in decisive], label_a),
        "pointwise RM": reliability_bins([p_pw[i] for i in decisive], label_a)}}
    return metrics, curves


def join_reference(pm, reference_lm: str, pairs: list[dict], batch_size: int) -> dict:
    """Attach ``reference_lm`` to the PM with (a, b) fitted on the decisive training pairs; the fit's figures."""
    reference = ReferenceLikelihood.from_pretrained(reference_lm, batch_size)
    triples = [(p["question"], p["chosen"], p["rejected"]) for p in pairs]
    g, _, _ = pm.score_orders_alone(triples, batch_size)
    ratio = reference.ratio(triples)
    a, b = fit_likelihood_weights(g, ratio)
    pm.attach_reference(reference, (a, b))
    return {"likelihood_weight_pm": a, "likelihood_weight_ratio": b,
            "train_pairs_pm_alone_accuracy": float((g > 0).float().mean()),
            "train_pairs_ratio_accuracy": float((ratio > 0).float().mean()),
            "train_pairs_joined_accuracy": float((a * g + b * ratio > 0).float().mean())}


@stage_main
def main() -> None:
    params = load_params()
    cfg = params.train_rm
    if cfg.reference_lm and not Path(cfg.reference_lm).is_dir():  # before the PM's training, not after it
        raise DataError(f"train_rm.reference_lm: {cfg.reference_lm!r} is not a model directory (null = the PM alone)")
    with stage_run("train_rm", params, sections=["seed", "train_rm"]):
        pairs = read_jsonl(PAIRS)
        if not pairs:
            raise DataError(f"{PAIRS}: no preference pairs (every reference sample got the same label); "
                            "raise seppo_sample.n_prompts or samples_per_prompt")
        ties = read_jsonl(TIES) if cfg.tie_share > 0 else []  # unread at 0: the paper's decisive-only PM
        bench = read_jsonl(BENCHMARK)
        mlflow.log_metrics({"n_train_pairs": len(pairs), "n_benchmark_pairs": len(bench)})
        print(f"train_rm: {len(pairs)} training pairs, {len(bench)} benchmark pairs, estimator {cfg.estimator}, "
              f"tie share {cfg.tie_share} (of {len(ties)} tie pairs read)")

        # 1. the pairwise PM (+ its uncertainty posterior)
        pm = train_preference_model(SFT, pairs, cfg, CHECKPOINTS / "pm", key_files=[PAIRS, TIES], seed=params.seed,
                                    ties=ties, curve=CURVE_DIR / "train_rm_pm.csv")
        joined = join_reference(pm, cfg.reference_lm, pairs, cfg.eval_batch_size) if cfg.reference_lm else {}
        if joined:
            mlflow.log_metrics(joined)
            print(f"train_rm: the PM's logit joined with {cfg.reference_lm}'s likelihood ratio: "
                  f"{joined['likelihood_weight_pm']:.3f} g + {joined['likelihood_weight_ratio']:.3f} (l_A - l_B)")
        with atomic_dir(PM_OUT) as tmp:
            pm.save_pretrained(tmp)
        # 2. the pointwise baseline
        with atomic_dir(POINTWISE_OUT) as tmp:
            rm, rm_tok = train_pointwise_rm(SFT, pairs, cfg, tmp, CHECKPOINTS / "pointwise", key_files=[PAIRS],
                                            seed=params.seed, curve=CURVE_DIR / "train_rm_pointwise.csv")

        # 3. the benchmark
        triples = [(p["question"], p["a"], p["b"]) for p in bench]
        start = time.perf_counter()
        g, var_ab, var_ba = pm.score_orders(triples, cfg.eval_batch_size)
        var = reduce_variance(var_ab, var_ba, "mean")  # the PM's own report; routing reduces as rlhf says
        pairs_per_s = len(triples) / (time.perf_counter() - start)
        r_a = pointwise_scores(rm, rm_tok, [(p["question"], p["a"]) for p in bench], cfg.max_response_tokens,
                               cfg.eval_batch_size)
        r_b = pointwise_scores(rm, rm_tok, [(p["question"], p["b"]) for p in bench], cfg.max_response_tokens,
                               cfg.eval_batch_size)
        metrics, curves = benchmark_report(bench, g, var, cfg.uncertainty_lambda, [a - b for a, b in zip(r_a, r_b)],
                                           cfg.uncertainty_score)
        metrics["pm_pairs_per_s"] = pairs_per_s
        g_alone, ratio = g, torch.zeros_like(g)
        if pm.reference is not None:  # each part alone, beside the joined PM
            g_alone, ratio = pm.score_orders_alone(triples, cfg.eval_batch_size)[0], pm.reference.ratio(triples)
            decisive = [i for i, p in enumerate(bench) if p["label"] != "tie"]
            for name, x in (("pm_alone_accuracy", g_alone), ("reference_ratio_accuracy", ratio)):
                metrics[name] = sum((x[i] > 0).item() == (bench[i]["label"] == "A") for i in decisive) / len(decisive)
            metrics.update(joined)
        with atomic_dir(REPORTS) as tmp:
            plot_reliability(curves["reliability"], tmp / "reliability.png",
                             f"Preference benchmark ({metrics['n_decisive']} decisive pairs)")
            plot_decile_accuracy(curves["deciles"], tmp / "accuracy_by_uncertainty_decile.png",
                                 f"PM ({cfg.estimator}, {cfg.uncertainty_score}) accuracy by uncertainty decile")
            (tmp / "curves.json").write_text(json.dumps(curves, indent=1))
            (tmp / "benchmark_scores.jsonl").write_text("".join(
                json.dumps({"id": p["id"], "kind": p["kind"], "label": p["label"], "g": gi, "var": vi,
                            "var_ab": v1, "var_ba": v2, "pointwise_margin": a - b, "g_pm_alone": ga,
                            "likelihood_ratio": lr}) + "\n"
                for p, gi, vi, v1, v2, a, b, ga, lr in zip(bench, g.tolist(), var.tolist(), var_ab.tolist(),
                                                           var_ba.tolist(), r_a, r_b, g_alone.tolist(), ratio.tolist())))
        atomic_write_json(METRICS, metrics)
        mlflow.log_metrics({k: v for k, v in metrics.items() if isinstance(v, (int, float))})
        mlflow.log_dict(metrics, "train_rm.json")
        mlflow.log_artifacts(str(REPORTS), "rm")
        alone = (f" (its head alone {metrics['pm_alone_accuracy']:.3f}, the likelihood ratio alone "
                 f"{metrics['reference_ratio_accuracy']:.3f})" if pm.reference is not None else "")
        print(f"train_rm: PM accuracy {metrics['pm_accuracy']:.3f}{alone} (pointwise {metrics['pointwise_accuracy']:.3f}), "
              f"ECE raw {metrics['pm_ece_raw']:.3f} -> calibrated {metrics['pm_ece_calibrated']:.3f}, "
              f"Spearman(uncertainty, correct) {metrics['spearman_uncertainty_correct']:.3f} ({cfg.uncertainty_score}; "
              f"variance alone {metrics['spearman_variance_correct']:.3f}), {pairs_per_s:.1f} pairs/s")


if __name__ == "__main__":
    main()
