"""Reward models on the held-out preference benchmark: pointwise RM vs pairwise PM, ECE raw vs calibrated,
Spearman(uncertainty, correct), accuracy by uncertainty decile, the routing curve each PM's uncertainty gives
(the judge, the verifier, is right on every decisive pair: accuracy with 5 / 10 / 20% of the pairs judged, the
share of the PM -> judge gap closed at 10%, random routing's over 5 seeds beside it), and the PM's pairs/s.
For each PM it also sets u_ij as METHODS.md writes it, the mean of the two orders' u, beside the stage's u of the
two orders' mean variance (``PreferenceModel.score``): how far apart they are and what each routes. And how far each
PM scores the form rather than the answer (``posttrain.form_balance.form_bias``: on pairs of a pot and a cot response,
its accuracy where the pot one is right and where the cot one is, and its pot side on ties).

    python3 bench/preference.py                      # after `dvc repro`: reads reports/metrics/train_rm.json
    python3 bench/preference.py --estimators sngp mc_dropout ensemble   # also retrains the PM with each
    python3 bench/preference.py --variant tie_share=0,max_steps=800      # retrains with these train_rm values
    python3 bench/preference.py --estimators ensemble --save-dir models/rm_variants   # keeps each retrained PM
                                                     # (for bench/routing_online.py --pm models/rm_variants/...)
    python3 bench/preference.py --estimators sngp ensemble --seed 1                   # another training seed
    python3 bench/preference.py --variant tie_share=0.25 --balance-forms              # pairs balanced by form
                                                     # (posttrain.form_balance)
    python3 bench/preference.py --samples reports/bench/routing_online_draw0_samples.json   # u_ij on the policy's
                                                     # own pairs too (a draw bench/routing_online.py --samples kept)

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
from posttrain.form_balance import balance_solution_forms, form_bias
from posttrain.preference_model import PreferenceModel
from posttrain.preference_training import train_preference_model
from posttrain.jsonl import read_jsonl
from posttrain.routing import upper_pairs
from posttrain.routing_eval import routing_curve, summarize_curve
from routing_online import draw_fingerprint, draw_records, kept_draw
from stages.rlhf_routed import DATA
from stages.train_rm import BENCHMARK, PAIRS, SFT, TIES, benchmark_report, join_reference

OUT = Path("reports/bench/preference.json")
KEYS = ("pm_accuracy", "pointwise_accuracy", "pm_ece_raw", "pm_ece_calibrated", "spearman_uncertainty_correct",
        "accuracy_lowest_uncertainty_decile", "accuracy_highest_uncertainty_decile", "spearman_variance_correct",
        "accuracy_lowest_variance_decile", "accuracy_highest_variance_decile", "spearman_margin_correct",
        "tie_mean_abs_p_minus_half", "tie_mean_abs_p_raw_minus_half", "routed_5", "routed_10", "routed_20",
        "gap_closed_10", "random_gap_closed_10", "pm_accuracy_pot_right", "pm_accuracy_cot_right", "tie_pot_side_share")
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


def routing_figures(bench: list[dict], g: torch.Tensor, u: torch.Tensor) -> dict:
    """The benchmark's routing curve for one PM, ranked by the routing uncertainty u, with the verifier as judge
    (right on every decisive pair, so its verdict is the label)."""
    decisive = [i for i, pair in enumerate(bench) if pair["label"] != "tie"]
    labels = [bench[i]["label"] for i in decisive]
    summary = summarize_curve(routing_curve(labels, g[decisive], u[decisive], labels, ROUTING_BUDGETS, RANDOM_SEEDS))
    at = summary["budgets"]
    return {"routed_5": at["0.05"]["uncertainty"], "routed_10": at["0.1"]["uncertainty"],
            "routed_20": at["0.2"]["uncertainty"], "gap_closed_10": at["0.1"]["gap_closed_uncertainty"],
            "random_gap_closed_10": at["0.1"]["gap_closed_random"]}


def order_reduce(pm: PreferenceModel, pairs: list[dict], batch_size: int) -> dict:
    """u_ij as METHODS.md writes it (the mean of the two orders' u, each from the antisymmetrised g) against the
    stage's u of the two orders' mean variance, on ``pairs`` (question, a, b): the variance's median and 99th
    percentile, the largest lambda var, the largest difference of the two u, and how many of the top-k pairs the
    two share at each budget; with labels (the benchmark's decisive pairs), also Spearman and the gap each closes
    at 10%."""
    triples = [(p["question"], p["a"], p["b"]) for p in pairs]
    torch.manual_seed(0)  # mc_dropout's variance is drawn: both definitions read the same draws
    g_ab, v_ab = pm.head.predict(pm.features(triples, batch_size))
    g_ba, v_ba = pm.head.predict(pm.features([(q, b, a) for q, a, b in triples], batch_size))
    g = (g_ab - g_ba) / 2
    var = (v_ab + v_ba) / 2
    u_stage = pm.uncertainty(g, var)
    u_spec = (pm.uncertainty(g, v_ab) + pm.uncertainty(g, v_ba)) / 2
    out = {"pairs": len(pairs), "var_median": var.median().item(), "var_p99": var.quantile(0.99).item(),
           "max_lambda_var": (pm.lam * torch.maximum(v_ab, v_ba)).max().item(),
           "max_abs_diff": (u_spec - u_stage).abs().max().item()}
    for budget in ROUTING_BUDGETS:
        k = round(budget * len(pairs))
        tops = [set(u.topk(k).indices.tolist()) for u in (u_stage, u_spec)]
        out[f"top_{budget:g}_shared"] = f"{len(tops[0] & tops[1])}/{k}"
    if all("label" in p for p in pairs):
        out["spearman"] = torch.corrcoef(torch.stack([u.argsort().argsort().double() for u in (u_stage, u_spec)]))[
            0, 1].item()
        out["gap_closed_10_stage"] = routing_figures(pairs, g, u_stage)["gap_closed_10"]
        out["gap_closed_10_spec"] = routing_figures(pairs, g, u_spec)["gap_closed_10"]
    return out


def draw_pairs(path: Path, params) -> list[dict]:
    """The distinct pairs of one draw ``bench/routing_online.py --samples`` kept (refused if another SFT policy
    or sampling setting made it)."""
    fingerprint = json.loads(path.read_text())["fingerprint"]
    records = draw_records(read_jsonl(DATA / "train.jsonl"), fingerprint["prompts"], fingerprint["sample_seed"])
    groups, _, _ = kept_draw(path, draw_fingerprint(params, len(records), fingerprint["sample_seed"]), None)
    triples = dict.fromkeys((r["question"], g[i], g[j]) for r, g in zip(records, groups)
                            for i, j in upper_pairs(len(g)) if g[i] != g[j])
    return [{"question": q, "a": a, "b": b} for q, a, b in triples]


def run() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--estimators", nargs="*", default=[], help="retrain the PM with these estimators too")
    ap.add_argument("--variant", action="append", default=[], type=variant,
                    help="retrain the PM with these train_rm values (key=value,...); repeatable")
    ap.add_argument("--save-dir", type=Path, default=None,
                    help="save each retrained PM here, in a folder named after its variant")
    ap.add_argument("--seed", type=int, default=None, help="training seed of the retrained PMs (default: params seed)")
    ap.add_argument("--balance-forms", action="store_true",
                    help="retrain on the pairs balanced by solution form (as many pot-over-cot pairs as cot-over-pot: "
                         "posttrain.form_balance)")
    ap.add_argument("--samples", type=Path, nargs="*", default=[],
                    help="draws kept by bench/routing_online.py --samples: compare the two u_ij there too")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    for path in args.samples:
        if not path.exists():
            raise SystemExit(f"{path}: no kept draw there; keep one first with `python3 bench/routing_online.py "
                             f"--sample-seed S --samples {path}`")
    params = load_params()
    stage = json.loads(Path("reports/metrics/train_rm.json").read_text())
    bench = read_jsonl(BENCHMARK)
    pm = PreferenceModel.from_pretrained("models/rm")
    triples = [(p["question"], p["a"], p["b"]) for p in bench]
    # the stage's own scores of the benchmark, in its order (g, var and the pointwise RM's margin per pair)
    stage_scores = read_jsonl(Path("reports/rm/benchmark_scores.jsonl"))
    g, var = (torch.tensor([s[k] for s in stage_scores]) for k in ("g", "var"))
    report = {f"stage ({params.train_rm.estimator})": {
        **{k: stage[k] for k in KEYS if k in stage}, **routing_figures(bench, g, pm.uncertainty(g, var)),
        **form_bias(bench, g.tolist())}}
    decisive = [p for p in bench if p["label"] != "tie"]
    reduces = {f"stage ({params.train_rm.estimator})": order_reduce(pm, decisive, params.train_rm.eval_batch_size)}
    for path in args.samples:  # the policy's own pairs, where rlhf_routed routes
        reduces[f"stage ({params.train_rm.estimator}), {path.name}"] = order_reduce(
            pm, draw_pairs(path, params), params.train_rm.eval_batch_size)
    speed = throughput(pm, bench)
    deciles = json.loads(Path("reports/rm/curves.json").read_text())["deciles"]
    variants = [{"estimator": e} for e in args.estimators] + args.variant
    if variants:
        pairs, ties = read_jsonl(PAIRS), read_jsonl(TIES)
        seed = params.seed if args.seed is None else args.seed
        if args.balance_forms:
            print(f"balanced by solution form: {len(pairs)} pairs -> ", end="")
            pairs = balance_solution_forms(pairs, seed)
            print(len(pairs))
        margins = [s["pointwise_margin"] for s in stage_scores]
        for update in variants:
            cfg = params.train_rm.model_validate({**params.train_rm.model_dump(), **update})  # validated like params
            with tempfile.TemporaryDirectory() as ckpt:
                model = train_preference_model(SFT, pairs, cfg, Path(ckpt), key_files=[PAIRS, TIES],
                                               seed=seed, ties=ties)
            if cfg.reference_lm:  # joined as the stage joins it (`--variant reference_lm=null`: the head alone)
                join_reference(model, cfg.reference_lm, pairs, cfg.eval_batch_size)
            name = ",".join(f"{k}={v}" for k, v in update.items()) + ("" if args.seed is None else f",seed={args.seed}")
            name += ",balance_forms" * args.balance_forms
            if args.save_dir:
                model.save_pretrained(args.save_dir / name.replace("=", "_").replace(",", "__"))
            g, var = model.score(triples, cfg.eval_batch_size)
            metrics, _ = benchmark_report(bench, g, var, cfg.uncertainty_lambda, margins, cfg.uncertainty_score)
            metrics.update(routing_figures(bench, g, model.uncertainty(g, var)), **form_bias(bench, g.tolist()))
            # which pairs it learnt from: a variant file is read beside the seppo_sample run that wrote them
            report["retrained " + name] = {k: metrics[k] for k in KEYS} | {"training_pairs": len(pairs),
                                                                             "training_tie_pairs": len(ties)}
            reduces["retrained " + name] = order_reduce(model, decisive, cfg.eval_batch_size)
    print(f"benchmark: {stage['n_decisive']} decisive pairs, {stage['n_tie']} tie pairs\n")
    width = max(map(len, report)) + 2
    print(f"{'':{width}}" + "".join(f"{k.replace('accuracy', 'acc').replace('uncertainty', 'u')[:14]:>15}" for k in KEYS))
    for name, row in report.items():
        print(f"{name:{width}}" + "".join(f"{row[k]:15.3f}" if row[k] is not None else f"{'-':>15}" for k in KEYS))
    for name, row in report.items():
        if "training_pairs" in row:
            print(f"{name}: trained on {row['training_pairs']} pairs and {row['training_tie_pairs']} tie pairs")
    print("\nPM accuracy by uncertainty decile (1 = most certain):")
    print("  " + "  ".join(f"{d['decile']}:{d['accuracy']:.2f}" for d in deciles))
    print(f"\ntie pairs: mean |p - 0.5| = {stage['tie_mean_abs_p_minus_half']}, mean u on ties "
          f"{stage['mean_uncertainty_tie']} vs decisive {stage['mean_uncertainty_decisive']:.4f}")
    print("PM throughput: " + ", ".join(f"{v:.1f} pairs/s at batch {k}" for k, v in speed.items()))
    print("\nu_ij from the two orders: METHODS.md's mean of their u (spec) against the stage's u of their mean "
          "variance (stage)")
    for name, row in reduces.items():
        print(f"  {name}: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"report": report, "deciles": deciles, "pairs_per_s": speed,
                                    "order_reduce": reduces}, indent=1))
    mlflow.log_artifact(str(args.out))


def main() -> None:
    with bench_run("bench/preference", load_params()):
        run()


if __name__ == "__main__":
    main()
