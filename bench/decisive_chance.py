"""Can a fitted estimate of the chance that a pair is decisive route the judge better than answer shares?

``rlhf.route_score: expected_gain`` weighs a verdict's gain by two estimates: the chance that the pair is decisive
(exactly one response right, so the judge will not call a tie), from self-consistency's answer shares
(``posttrain.routing.decisive_chance``), and which side is right (``right_side``). `bench/routing_online.py
--oracle-split` shows that knowing the chance closes nearly all of what separates expected_gain from the oracle,
and knowing the side almost none. This bench asks whether anything the pipeline has predicts the chance better
than the shares: per kept draw, a logistic model of P(decisive) is fitted on the pairs of the *other* draws
(cross-fitted, so no draw routes with a model that saw its own truth) and expected_gain is replayed with it, by
comparison, on that draw's samples, beside the shares and the true chance. Feature sets, on the pairs whose final
answers differ (two responses with one answer are never decisive):

- shares: decisive_chance and the smaller and larger of the two answers' shares (so the fit can calibrate them);
- + pm: the PM's |s_ij| and u_ij (the PM learnt ties, and scores them near 0);
- + pointwise: the pointwise RM's rewards of the two responses (smaller, larger), an absolute score of each
  response where the pairwise PM gives only a difference.

    python3 bench/decisive_chance.py --samples reports/bench/routing_online_draw{0,1,2}_samples.json
                                     [--pm DIR] [--budgets 0.05 0.1 0.2] [--threads 1]

Keep the draws first with ``bench/routing_online.py --sample-seed S --samples FILE`` (needs models/sft, models/rm,
models/rm_pointwise). The judge is the verifier in process, deciding as the local judge service does by default (a
tie unless exactly one response is right). Prints the share of the rm_only -> judge_only separation gap closed
per draw, feature set and budget; writes reports/bench/decisive_chance.json; nothing is asserted.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import mlflow
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from posttrain.jsonl import read_jsonl
from posttrain.params import load_params
from posttrain.preference_model import PreferenceModel
from posttrain.preference_training import pointwise_scores
from posttrain.routing import answer_shares, decisive_chance, expected_gain, right_side
from posttrain.tracking import bench_run
from routing_online import (OracleReward, ReplayedReward, ScoredOnce, draw_fingerprint, draw_records, kept_draw,
                            replay, separation)
from stages.rlhf_routed import DATA, PM_DIR
from stages.train_rm import POINTWISE_OUT

OUT = Path("reports/bench/decisive_chance.json")
FEATURE_SETS = {"shares": 3, "shares + pm": 5, "shares + pm + pointwise": 7}  # how many leading features each uses


class VerifierJudge:
    """The local judge service's default decision, in process: a tie unless exactly one response is right. The routed
    reward asks about texts stripped of surrounding whitespace (as the service's prompt strips them)."""

    def __init__(self, right: dict[tuple[str, str], bool]):
        self.right = {(q, t.strip()): ok for (q, t), ok in right.items()}

    def judge(self, asks: list[tuple[str, str, str]]) -> list[str]:
        return ["tie" if self.right[q, a] == self.right[q, b] else "A" if self.right[q, a] else "B"
                for q, a, b in asks]


def pair_features(s: torch.Tensor, u: torch.Tensor, answers: list, rewards: torch.Tensor) -> torch.Tensor:
    """n x n x 7: decisive_chance, the smaller and larger answer share, |s|, u, the smaller and larger pointwise
    reward of the two responses."""
    share, d = answer_shares(answers), decisive_chance(answers)
    return torch.stack([d, torch.minimum(share[:, None], share[None, :]), torch.maximum(share[:, None], share[None, :]),
                        s.abs(), u, torch.minimum(rewards[:, None], rewards[None, :]),
                        torch.maximum(rewards[:, None], rewards[None, :])], -1)


def differ(answers: list) -> torch.Tensor:
    return torch.tensor([[a != b for b in answers] for a in answers])


class FittedChanceReward(ReplayedReward):
    """expected_gain with the decisive chance predicted by a fitted model (0 where the answers agree)."""

    def __init__(self, *args, model, width: int, rewards: dict[tuple[str, str], float], **kwargs):
        super().__init__(*args, **kwargs)
        self.model, self.width, self.rewards = model, width, rewards

    def route_scores(self, scored, answers, questions, responses):
        out = []
        for (s, u, p), a, question, texts in zip(scored, answers, questions, responses):
            x = pair_features(s, u, a, torch.tensor([self.rewards[question, t] for t in texts]))
            n = len(a)
            chance = torch.tensor(self.model.predict_proba(x.reshape(n * n, -1)[:, :self.width].numpy())[:, 1])
            out.append(expected_gain(s, right_side(p, a), differ(a) * chance.reshape(n, n).float()))
        return out


def load_draw(path: Path, params, train: list[dict]) -> dict:
    """A draw kept by bench/routing_online.py --samples: its questions, groups, checks and answers (refused when
    the SFT policy or the sampling settings changed since)."""
    if not path.exists():
        raise SystemExit(f"{path}: no kept draw; make it with bench/routing_online.py --sample-seed S --samples {path}")
    fingerprint = json.loads(path.read_text())["fingerprint"]
    prompts, seed = fingerprint["prompts"], fingerprint["sample_seed"]
    groups, correct, answers = kept_draw(path, draw_fingerprint(params, prompts, seed), sample=lambda: None)
    records = draw_records(train, prompts, seed)
    return {"name": path.stem, "questions": [r["question"] for r in records], "groups": groups, "correct": correct,
            "answers": answers}


def training_pairs(draw: dict, reward: ReplayedReward, rewards: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Every pair with different answers in the draw: its features and whether it is decisive."""
    xs, ys = [], []
    for q, group, ok in zip(draw["questions"], draw["groups"], draw["correct"]):
        a = [draw["answers"][t] for t in group]
        s, u, _ = reward.score_group(q, group)
        x = pair_features(s, u, a, torch.tensor([rewards[q, t] for t in group]))
        c = torch.tensor(ok, dtype=torch.float)
        upper = torch.triu(differ(a), diagonal=1)
        xs.append(x[upper])
        ys.append((c[:, None] != c[None, :])[upper])
    return torch.cat(xs), torch.cat(ys)


def run() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=Path, nargs="+", required=True,
                    help="draws kept by bench/routing_online.py --samples (at least two: each is routed with a "
                         "model fitted on the others)")
    ap.add_argument("--pm", default=PM_DIR, help="the PM to route with")
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.05, 0.1, 0.2])
    ap.add_argument("--threads", type=int, default=None, help="torch threads")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if len(args.samples) < 2:
        ap.error("--samples needs at least two draws: each is routed with a model fitted on the others")
    if args.threads:
        torch.set_num_threads(args.threads)
    params = load_params()
    cfg = params.rlhf.model_copy(update={"same_answer": "judge", "route_score": "expected_gain",
                                         "route_unit": "comparison", "routing": "uncertainty_budget"})
    train = read_jsonl(DATA / "train.jsonl")
    draws = [load_draw(path, params, train) for path in args.samples]
    pm = ScoredOnce(PreferenceModel.from_pretrained(args.pm))
    rm_tokenizer = AutoTokenizer.from_pretrained(POINTWISE_OUT)
    rm = AutoModelForSequenceClassification.from_pretrained(POINTWISE_OUT).eval()
    texts = [(q, t) for d in draws for q, g in zip(d["questions"], d["groups"]) for t in g]
    rewards = dict(zip(texts, pointwise_scores(rm, rm_tokenizer, texts, params.train_rm.max_response_tokens)))
    for d in draws:
        d["right"] = {(q, t): ok for q, g, oks in zip(d["questions"], d["groups"], d["correct"])
                      for t, ok in zip(g, oks)}
        d["pairs"] = training_pairs(d, ReplayedReward(pm, None, cfg, 0, answers=d["answers"]), rewards)

    results = {}
    for k, d in enumerate(draws):
        judge = VerifierJudge(d["right"])

        def gap(reward_class=ReplayedReward, **kwargs) -> list[float]:
            seps = []
            for budget in args.budgets:
                reward = reward_class(pm, judge, cfg.model_copy(update={"budget": budget}), 0, answers=d["answers"],
                                      **kwargs)
                seps.append(separation(replay(reward, d["questions"], d["groups"], cfg.prompts_per_step), d["correct"]))
            return seps

        ends = [separation(replay(ReplayedReward(pm, judge, cfg.model_copy(update={"routing": r}), 0,
                                                 answers=d["answers"]), d["questions"], d["groups"],
                                  cfg.prompts_per_step), d["correct"]) for r in ("rm_only", "judge_only")]
        rows = {"shares (the stage's)": gap()}
        # how well each estimate tells this draw's decisive pairs from the rest (AUC over its pairs with different
        # answers), beside what routing with it closes
        held_x, held_y = (t.numpy() for t in d["pairs"])
        auc = {"shares (the stage's)": roc_auc_score(held_y, held_x[:, 0])}
        x = torch.cat([o["pairs"][0] for o in draws if o is not d]).numpy()
        y = torch.cat([o["pairs"][1] for o in draws if o is not d]).numpy()
        for name, width in FEATURE_SETS.items():
            model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(x[:, :width], y)
            auc[f"fitted on {name}"] = roc_auc_score(held_y, model.predict_proba(held_x[:, :width])[:, 1])
            rows[f"fitted on {name}"] = gap(FittedChanceReward, model=model, width=width, rewards=rewards)
        rows["true chance (oracle)"] = gap(OracleReward, right=d["right"], knows="chance")
        results[d["name"]] = {name: {"gap_closed": [(v - ends[0]) / (ends[1] - ends[0]) for v in seps],
                                     "auc": auc.get(name)} for name, seps in rows.items()}
        print(f"\n{d['name']}: {held_y.mean():.3f} of its {len(held_y)} pairs with different answers decisive; "
              "share of the rm_only -> judge_only separation gap closed at "
              + " / ".join(f"{100 * b:g}%" for b in args.budgets) + " of judge_only's calls, and the AUC")
        for name, row in results[d["name"]].items():
            print(f"  {name:34}" + " / ".join(f"{100 * g:5.1f}" for g in row["gap_closed"])
                  + ("" if row["auc"] is None else f"   AUC {row['auc']:.3f}"))
    names = list(next(iter(results.values())))
    print("\nmean over draws at " + " / ".join(f"{100 * b:g}%" for b in args.budgets))
    for name in names:
        print(f"  {name:34}" + " / ".join(
            f"{100 * statistics.mean(r[name]['gap_closed'][i] for r in results.values()):5.1f}"
            for i in range(len(args.budgets))))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"pm": str(args.pm), "budgets": args.budgets, "draws": results}, indent=1))
    with bench_run("decisive_chance", params):
        mlflow.log_artifact(str(args.out))


if __name__ == "__main__":
    run()
