"""Reward models on the held-out preference benchmark: pointwise RM vs pairwise PM, ECE raw vs calibrated,
Spearman(uncertainty, correct), accuracy by uncertainty decile, the routing curve each PM's uncertainty gives
(the judge, the verifier, is right on every decisive pair: accuracy with 5 / 10 / 20% of the pairs judged, the
share of the PM -> judge gap closed at 10%, random routing's over 5 seeds beside it), and the PM's pairs/s.

    python3 bench/preference.py                      # after `dvc repro`: reads reports/metrics/train_rm.json
    python3 bench/preference.py --estimators sngp mc_dropout ensemble   # also retrains the PM with each
    python3 bench/preference.py --variant tie_share=0,max_steps=800      # retrains with these train_rm values
    python3 bench/preference.py --estimators ensemble --save-dir models/rm_variants   # keeps each retrained PM
                                                     # (for bench/routing_online.py --pm models/rm_variants/...)
    python3 bench/preference.py --estimators sngp ensemble --seed 1                   # another training seed

Prints a report (and writes reports/bench/preference.json); nothing here is asserted.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import mlflow
import torch

from posttrain.params import load_params, read_yaml
from posttrain.tracking import bench_run
from posttrain.preference_model import PreferenceModel
from posttrain.preference_training import train_preference_model
from posttrain.jsonl import read_jsonl
from posttrain.routing_eval import routing_curve, summarize_curve
from posttrain.uncertainty import pair_uncertainty
from stages.train_rm import BENCHMARK, PAIRS, SFT, TIES, benchmark_report

OUT = Path("reports/bench/preference.json")
KEYS = ("pm_accuracy", "pointwise_accuracy", "pm_ece_raw", "pm_ece_calibrated", "spearman_uncertainty_correct",
        "accuracy_lowest_uncertainty_decile", "accuracy_highest_uncertainty_decile", "spearman_variance_correct",
        "accuracy_lowest_variance_decile", "accuracy_highest_variance_decile", "spearman_margin_correct",
        "tie_mean_abs_p_minus_half", "tie_mean_abs_p_raw_minus_half", "routed_5", "routed_10", "routed_20",
        "gap_closed_10", "random_gap_closed_10")
ROUTING_BUDGETS, RANDOM_SEEDS = [0.05, 0.1, 0.2], list(range(5))


def variant(spec: str) -> dict:
    """``key=value,key=value`` (train_rm keys) as a dict of YAML-parsed values."""
    out = {}
    for item in spec.split(","):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--variant {spec!r}: expected key=value[,key=value...]")
        out[key.strip()] = read_yaml(value)  # YAML 1.2, as params.yaml is read: 5e-2 is a number
    return out


def throughput(pm: PreferenceModel, bench: list[dict], batch_sizes=(16, 64)) -> dict[int, float]:
    """Benchmark pairs scored per second (both orders, antisymmetrised) at each batch size."""
    triples = [(p["question"], p["a"], p["b"]) for p in bench]
    out = {}
    for bs in batch_sizes:
        start = time.perf_counter()
        pm.score(triples, bs)
        out[bs] = len(triples) / (time.perf_counter() - start)
    return out


def routing_figures(bench: list[dict], g: torch.Tensor, var: torch.Tensor, lam: float, score: str) -> dict:
    """The benchmark's routing curve for one PM, ranked by its own routing uncertainty, with the verifier as judge
    (right on every decisive pair, so its verdict is the label)."""
    decisive = [i for i, pair in enumerate(bench) if pair["label"] != "tie"]
    labels = [bench[i]["label"] for i in decisive]
    u = pair_uncertainty(g[decisive], var[decisive], lam, score)
    summary = summarize_curve(routing_curve(labels, g[decisive], u, labels, ROUTING_BUDGETS, RANDOM_SEEDS))
    at = summary["budgets"]
    return {"routed_5": at["0.05"]["uncertainty"], "routed_10": at["0.1"]["uncertainty"],
            "routed_20": at["0.2"]["uncertainty"], "gap_closed_10": at["0.1"]["gap_closed_uncertainty"],
            "random_gap_closed_10": at["0.1"]["gap_closed_random"]}


def run() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--estimators", nargs="*", default=[], help="retrain the PM with these estimators too")
    ap.add_argument("--variant", action="append", default=[], type=variant,
                    help="retrain the PM with these train_rm values (key=value,...); repeatable")
    ap.add_argument("--save-dir", type=Path, default=None,
                    help="save each retrained PM here, in a folder named after its variant")
    ap.add_argument("--seed", type=int, default=None, help="training seed of the retrained PMs (default: params seed)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    params = load_params()
    stage = json.loads(Path("reports/metrics/train_rm.json").read_text())
    bench = read_jsonl(BENCHMARK)
    pm = PreferenceModel.from_pretrained("models/rm")
    triples = [(p["question"], p["a"], p["b"]) for p in bench]
    # the stage's own scores of the benchmark, in its order (g, var and the pointwise RM's margin per pair)
    stage_scores = read_jsonl(Path("reports/rm/benchmark_scores.jsonl"))
    g, var = (torch.tensor([s[k] for s in stage_scores]) for k in ("g", "var"))
    report = {f"stage ({params.train_rm.estimator})": {
        **{k: stage[k] for k in KEYS if k in stage}, **routing_figures(bench, g, var, pm.lam, pm.uncertainty_score)}}
    speed = throughput(pm, bench)
    deciles = json.loads(Path("reports/rm/curves.json").read_text())["deciles"]
    variants = [{"estimator": e} for e in args.estimators] + args.variant
    if variants:
        pairs, ties = read_jsonl(PAIRS), read_jsonl(TIES)
        margins = [s["pointwise_margin"] for s in stage_scores]
        for update in variants:
            cfg = params.train_rm.model_validate({**params.train_rm.model_dump(), **update})  # validated like params
            with tempfile.TemporaryDirectory() as ckpt:
                model = train_preference_model(SFT, pairs, cfg, Path(ckpt), key_files=[PAIRS, TIES],
                                               seed=params.seed if args.seed is None else args.seed, ties=ties)
            name = ",".join(f"{k}={v}" for k, v in update.items()) + ("" if args.seed is None else f",seed={args.seed}")
            if args.save_dir:
                model.save_pretrained(args.save_dir / name.replace("=", "_").replace(",", "__"))
            g, var = model.score(triples, cfg.eval_batch_size)
            metrics, _ = benchmark_report(bench, g, var, cfg.uncertainty_lambda, margins, cfg.uncertainty_score)
            metrics.update(routing_figures(bench, g, var, cfg.uncertainty_lambda, cfg.uncertainty_score))
            report["retrained " + name] = {k: metrics[k] for k in KEYS}
    print(f"benchmark: {stage['n_decisive']} decisive pairs, {stage['n_tie']} tie pairs\n")
    width = max(map(len, report)) + 2
    print(f"{'':{width}}" + "".join(f"{k.replace('accuracy', 'acc').replace('uncertainty', 'u')[:14]:>15}" for k in KEYS))
    for name, row in report.items():
        print(f"{name:{width}}" + "".join(f"{row[k]:15.3f}" if row[k] is not None else f"{'-':>15}" for k in KEYS))
    print("\nPM accuracy by uncertainty decile (1 = most certain):")
    print("  " + "  ".join(f"{d['decile']}:{d['accuracy']:.2f}" for d in deciles))
    print(f"\ntie pairs: mean |p - 0.5| = {stage['tie_mean_abs_p_minus_half']}, mean u on ties "
          f"{stage['mean_uncertainty_tie']} vs decisive {stage['mean_uncertainty_decisive']:.4f}")
    print("PM throughput: " + ", ".join(f"{v:.1f} pairs/s at batch {k}" for k, v in speed.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"report": report, "deciles": deciles, "pairs_per_s": speed}, indent=1))
    mlflow.log_artifact(str(args.out))


def main() -> None:
    with bench_run("bench/preference", load_params()):
        run()


if __name__ == "__main__":
    main()
