"""Stage `rlhf_routed`: uncertainty-routed online RLHF from the SFT policy (METHODS.md section 3).

1. Judge: ``judge.base_url`` (a vLLM server, a hosted model) or, by default, the local judge service started
   here on a free loopback port (the verifier backend stands in for a strong reasoning judge).
2. Routing evaluation on the preference benchmark: the PM's calibrated uncertainty decides which pairs the
   judge sees; accuracy against the judge-call fraction for uncertainty vs random routing (``rlhf.eval_seeds``
   seeds) at ``rlhf.eval_budgets`` -> reports/routing/routing_curve.png, reports/routing/routing.json.
3. Policy optimisation: TRL's GRPOTrainer with ``RoutedPairwiseReward`` (pairwise PM + routed judge verdicts,
   A_i = scale/(n-1) sum_j s_ij), clipped updates, KL to the SFT policy; checkpoints every
   ``rlhf.save_steps`` (a killed run resumes); dev accuracy every ``rlhf.dev_every`` steps.
4. Test accuracy of the SFT and the RLHF policy (own choice, per difficulty) and the judge's cost ->
   reports/metrics/rlhf_routed.json; models/rlhf.
"""
from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path

import mlflow
import torch

from posttrain.atomic import atomic_dir, atomic_write_json
from posttrain.curves import CURVE_DIR
from posttrain.errors import stage_main
from posttrain.jsonl import read_jsonl
from posttrain.judge_client import JudgeCache, JudgeClient
from posttrain.judge_cost import CostLedger
from posttrain.judge_server import judge_endpoint
from posttrain.params import load_params
from posttrain.preference_model import PreferenceModel, reduce_variance
from posttrain.policy_accuracy import own_choice_accuracy
from posttrain.process_group import is_main_process
from posttrain.rlhf import RoutedPairwiseReward, train_routed_policy
from posttrain.routing_eval import plot_curve, routing_curve, summarize_curve
from posttrain.tracking import stage_run

DATA = Path("data/prepared")
POLICY, PM_DIR, OUT = "models/sft", "models/rm", "models/rlhf"
BENCH, SCORES = Path("data/preference_benchmark/pairs.jsonl"), Path("reports/rm/benchmark_scores.jsonl")
REPORTS, METRICS = Path("reports/routing"), Path("reports/metrics/rlhf_routed.json")
CHECKPOINTS = Path("checkpoints/rlhf_routed")


def evaluate_routing(client: JudgeClient, pm: PreferenceModel, budgets: list[float], n_seeds: int,
                     reduce: str) -> tuple[list, dict]:
    """The routing curve from train_rm's benchmark scores, each pair's u from both orders' variances as training
    reduces them (``rlhf.uncertainty_reduce``)."""
    bench, scores = read_jsonl(BENCH), read_jsonl(SCORES)
    decisive = [(p, s) for p, s in zip(bench, scores, strict=True) if p["label"] != "tie"]
    g = torch.tensor([s["g"] for _, s in decisive])
    var = reduce_variance(*(torch.tensor([s[k] for _, s in decisive]) for k in ("var_ab", "var_ba")), reduce)
    u = pm.uncertainty(g, var)
    verdicts = client.judge([(p["question"], p["a"], p["b"]) for p, _ in decisive])
    rows = routing_curve([p["label"] for p, _ in decisive], g, u, verdicts, budgets, list(range(n_seeds)))
    return rows, {"n_pairs": len(decisive), **summarize_curve(rows)}


def routing_report(client: JudgeClient, pm: PreferenceModel, cfg) -> dict:
    """The routing curve on the benchmark into ``REPORTS`` (plot and table) and MLflow; returns its summary."""
    rows, summary = evaluate_routing(client, pm, cfg.eval_budgets, cfg.eval_seeds, cfg.uncertainty_reduce)
    with atomic_dir(REPORTS) as tmp:
        plot_curve(rows, tmp / "routing_curve.png",
                   f"Routing on the preference benchmark ({summary['n_pairs']} decisive pairs)")
        (tmp / "routing.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    mlflow.log_artifacts(str(REPORTS), "routing")
    ten = summary["budgets"].get("0.1", {})
    print(f"rlhf_routed: routing PM only {summary['rm_only']:.3f}, judge on all {summary['judge_only']:.3f}, "
          f"at 10%: uncertainty {ten.get('uncertainty', float('nan')):.3f} vs random "
          f"{ten.get('random_mean', float('nan')):.3f}")
    return summary


def judge_figures(routing_totals: dict, ledger: CostLedger) -> dict:
    """The run's routing totals (``RoutedPairwiseReward.summary``) and the judge's bill as one flat dict.

    Two failure counts, kept apart: ``judge_failures`` (the routing's) are routed pairs that got no verdict and fell
    back to the PM; ``judge_failed_requests`` (the ledger's ``failures``; by kind ``judge_failed_requests.<kind>``)
    are judge requests (each order of a pair is one) that failed after their retries; the two need not agree.
    """
    bill = {k.replace("judge_failures", "judge_failed_requests"): v for k, v in ledger.as_metrics("judge_").items()}
    return {**routing_totals, **bill}


@stage_main
def main() -> None:
    params = load_params()
    cfg = params.rlhf
    with stage_run("rlhf_routed", params, sections=["seed", "judge", "rlhf"]):
        train, dev, test = (read_jsonl(DATA / f"{s}.jsonl") for s in ("train", "dev", "test"))
        # under a multi-process launch rank 0 alone asks the judge (RoutedPairwiseReward routes the whole step there)
        main_process = is_main_process()
        with judge_endpoint(params.judge, train + dev + test, params.seed) if main_process else nullcontext("") \
                as base_url:
            cache = JudgeCache(params.judge.cache) if main_process else None
            pm = PreferenceModel.from_pretrained(PM_DIR) if main_process else None  # the other ranks never score
            # 1. routing evaluation on the benchmark (rank 0's alone, before the Trainer brings up the process group)
            summary = routing_report(JudgeClient(params.judge, base_url, cache), pm, cfg) if main_process else {}

            # 2. GRPO with the routed pairwise reward
            ledger = CostLedger(params.judge.price_in_per_1k, params.judge.price_out_per_1k)
            judge = JudgeClient(params.judge, base_url, cache, ledger) if main_process else None
            reward = RoutedPairwiseReward(pm, judge, cfg, params.seed, params.sandbox)
            dev_cb = train_routed_policy(POLICY, reward, train, dev, params, OUT, CHECKPOINTS,
                                         key_files=[Path(PM_DIR), DATA / "train.jsonl"],
                                         curve=CURVE_DIR / "rlhf_routed.csv")

        if not main_process:
            return  # the test evaluation and the run's figures are rank 0's
        # 3. test accuracy before and after, and what the judge cost
        before = own_choice_accuracy(POLICY, test, cfg.max_new_tokens, params.sandbox)
        after = own_choice_accuracy(OUT, test, cfg.max_new_tokens, params.sandbox)
        metrics = {"routing": summary, "sft_test": before, "rlhf_test": after, "dev_accuracy": dev_cb.history,
                   **judge_figures(reward.summary(), ledger)}
        atomic_write_json(METRICS, metrics)
        mlflow.log_metrics({"sft_test_accuracy": before["accuracy"], "rlhf_test_accuracy": after["accuracy"],
                            **ledger.as_metrics("judge_total.")})
        print(f"rlhf_routed: test accuracy {before['accuracy']:.3f} (sft) -> {after['accuracy']:.3f} (rlhf, "
              f"{cfg.routing}); judge {ledger.calls} calls, ${ledger.cost:.4f}, "
              f"routed {metrics['routed_fraction']:.3f} of pairs ({metrics['identical_pair_share']:.3f} were "
              f"pairs of identical responses, never routed); the judge overruled the PM on "
              f"{metrics['judge_overrule_share']:.3f} of its verdicts, {metrics['judge_tie_share']:.3f} were ties")


if __name__ == "__main__":
    main()
