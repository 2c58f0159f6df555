"""A PM that also learns from the SFT policy's own samples, for routed RLHF from that policy.

`seppo_sample` samples the SFT run's earlier checkpoints, whose mistakes are not the final policy's: on stop 69's run
the committed PM is right on 0.60 of the policy's own decisive pairs in rm_only's first 25 steps, 0.28 at difficulty
5, and below 0.5 after them (bench/pm_drift.py). Here the SFT policy samples each of the first ``--prompts`` training
questions ``--samples`` times at rlhf's temperature, the verifier labels them, and their pairs, made as
`seppo_sample` makes its own (`training_pairs`, `tie_pairs`: winners against losers, each loser against the
question's worked solution where that is right), join data/seppo's before the PM is retrained with `train_rm`'s
config. The benchmark figures of the new PM print beside the stage's.

    python3 bench/own_sample_pm.py [--prompts 1500] [--samples 4] [--save-dir models/rm_variants/own_samples]
                                   [--threads 1]
    python3 bench/rlhf_downstream.py --pm models/rm_variants/own_samples ...   # then RLHF routed by it

Writes reports/bench/own_sample_pm.json; nothing is asserted.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from posttrain.evaluation import OWN_CHOICE, score_responses
from posttrain.form_balance import form_bias
from posttrain.generation import HFGenerator
from posttrain.jsonl import read_jsonl
from posttrain.modeling import load_pretrained
from posttrain.params import load_params
from posttrain.preference_data import anchor_completion, tie_pairs, training_pairs
from posttrain.preference_model import PreferenceModel
from posttrain.preference_training import train_preference_model
from posttrain.sandbox import sandbox_limits
from posttrain.tracking import bench_run
from posttrain.trajectories import prompt as open_prompt
from preference import routing_figures
from stages.rlhf_routed import DATA
from stages.train_rm import BENCHMARK, PAIRS, SFT, TIES, benchmark_report

OUT = Path("reports/bench/own_sample_pm.json")


def own_samples(params, records: list[dict], samples: int) -> list[dict]:
    """``samples`` responses of the SFT policy to each of ``records``, in `seppo_sample`'s sample format (verifier
    verdict, the worked solution in the response's trajectory as its anchor, and whether that anchor is right)."""
    tokenizer, model = load_pretrained(SFT)
    todo = [r for r in records for _ in range(samples)]
    texts = [c.text for c in HFGenerator(model, tokenizer, 64, params.rlhf.max_new_tokens).generate(
        [open_prompt(r["question"]) for r in todo], params.rlhf.temperature, seed=params.seed,
        desc="SFT policy samples")]
    limits, workers = sandbox_limits(params.sandbox), params.sandbox.workers
    verdicts = score_responses(todo, [OWN_CHOICE] * len(todo), texts, limits, workers)
    anchors = [anchor_completion(r, t) for r, t in zip(todo, texts)]
    distinct = sorted({(r["id"], a) for r, a in zip(todo, anchors)})
    by_id = {r["id"]: r for r in records}
    anchor_right = dict(zip(distinct, (v["correct"] for v in score_responses(
        [by_id[i] for i, _ in distinct], [OWN_CHOICE] * len(distinct), [a for _, a in distinct], limits, workers))))
    return [{"id": r["id"], "question": r["question"], "response": t, "verifier_wins": v["correct"],
             "anchor": a, "anchor_correct": anchor_right[(r["id"], a)]}
            for r, t, v, a in zip(todo, texts, verdicts, anchors)]


def pm_figures(bench: list[dict], g: torch.Tensor, var: torch.Tensor, pm, margins: list[float], cfg) -> dict:
    """Benchmark accuracy, the routing curve's share of the gap closed at 10% (and random's), and the form bias."""
    metrics, _ = benchmark_report(bench, g, var, cfg.uncertainty_lambda, margins, cfg.uncertainty_score)
    return {"pm_accuracy": metrics["pm_accuracy"], "pm_accuracy_by_difficulty": metrics["pm_accuracy_by_difficulty"],
            **routing_figures(bench, g, pm.uncertainty(g, var)), **form_bias(bench, g.tolist())}


def run() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=1500, help="the first this many training questions are sampled")
    ap.add_argument("--samples", type=int, default=4, help="SFT policy samples per question")
    ap.add_argument("--save-dir", type=Path, default=Path("models/rm_variants/own_samples"))
    ap.add_argument("--threads", type=int, default=None, help="torch threads (1 when two benches share 2 cores)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    params = load_params()
    cfg = params.train_rm
    with bench_run("own_sample_pm", params):
        own = own_samples(params, read_jsonl(DATA / "train.jsonl")[:args.prompts], args.samples)
        new_pairs, new_ties = training_pairs(own, "verifier"), tie_pairs(own, "verifier")
        pairs, ties = read_jsonl(PAIRS) + new_pairs, read_jsonl(TIES) + new_ties
        print(f"own samples: {len(own)}, right {sum(s['verifier_wins'] for s in own) / len(own):.3f}; "
              f"+{len(new_pairs)} pairs and +{len(new_ties)} tie pairs -> {len(pairs)} and {len(ties)}")
        with tempfile.TemporaryDirectory() as ckpt:
            pm = train_preference_model(SFT, pairs, cfg, Path(ckpt), key_files=[PAIRS, TIES], seed=params.seed,
                                        ties=ties)
        pm.save_pretrained(args.save_dir)
        bench = read_jsonl(BENCHMARK)
        stage_scores = read_jsonl(Path("reports/rm/benchmark_scores.jsonl"))
        margins = [s["pointwise_margin"] for s in stage_scores]
        g, var = pm.score([(p["question"], p["a"], p["b"]) for p in bench], cfg.eval_batch_size)
        g0, var0 = (torch.tensor([s[k] for s in stage_scores]) for k in ("g", "var"))
        report = {"stage PM (models/rm)": pm_figures(bench, g0, var0, PreferenceModel.from_pretrained("models/rm"),
                                                     margins, cfg),
                  f"+ own samples ({args.save_dir})": pm_figures(bench, g, var, pm, margins, cfg)}
    for name, row in report.items():
        print(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items() if isinstance(v, float)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"own_samples": len(own), "own_accuracy": sum(s["verifier_wins"] for s in own)
                                    / len(own), "pairs_added": len(new_pairs), "ties_added": len(new_ties),
                                    "report": report}, indent=1))


if __name__ == "__main__":
    run()
