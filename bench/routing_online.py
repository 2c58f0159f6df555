"""Routing on the policy's own samples: how much of the judge's training signal each routing policy keeps.

The routing curve of `rlhf_routed` (reports/routing/) is measured on the preference benchmark's decisive pairs.
Online, the PM and the judge see the SFT policy's samples instead, and many of their distinct pairs are ties
(both right, or both wrong). This bench samples `rlhf.n_responses` responses per training prompt from the SFT
policy, checks each with the verifier, and replays every routing policy at every budget on the same PM scores
and judge verdicts (asked once, then served by the judge cache), step by step as `rlhf_routed` routes
(`rlhf.prompts_per_step` prompts per step, `posttrain.rlhf.RoutedPairwiseReward` itself). Per policy and budget:

- separation: mean advantage A_i of the right responses minus that of the wrong ones, over the prompts whose
  samples hold both (the signal that moves the policy towards right answers), and the share of the
  rm_only -> judge_only gap in separation that the policy closes;
- correlation of its advantages with judge_only's, over all responses;
- of the verdicts it buys: the share that overruled the PM (chose the response the PM scored lower) and the
  share that were ties (which leave the PM's near-zero score about where it was).

Beside them, an oracle that knows which samples are right (``OracleReward``: the expected-gain ranking with the
truth for its estimates) marks the ceiling any routing score can reach at each budget. ``--oracle-split`` adds
two half-oracles that know one of expected_gain's two estimates and take the other from the routing: the chance
that a pair is decisive, or which side of a decisive pair is right; they tell which estimate the rest of the
ceiling's lead lies in.

Each is replayed under every ``rlhf.same_answer`` asked for (judge: pairs with the same final answer are routed
like any other; skip: never routed; tie: scored 0 without a call), and uncertainty routing under every
``train_rm.uncertainty_score`` and ``rlhf.route_score`` asked for; budget policies under every ``rlhf.route_unit``
asked for (pair: a budget is a share of the pairs; comparison: of the distinct comparisons, the calls paid).
The x axis is always the calls paid (distinct comparisons judged) as a share of judge_only's.

    python3 bench/routing_online.py [--prompts 400] [--seeds 5] [--budgets 0.05 0.1 0.2 0.4] [--threads 1] [--pm DIR]
                                    [--same-answer judge skip tie] [--uncertainty-scores predictive variance]
                                    [--route-scores uncertainty expected_gain] [--route-units pair comparison]
                                    [--oracle-split] [--samples FILE]

Run after `dvc repro` (needs models/sft, models/rm). Prints a table, writes reports/bench/routing_online.json and
the plot beside it (.png), logs to MLflow; nothing is asserted. Sampling and checking the draw takes about half of
a run (10 of 22 minutes on one thread): ``--samples FILE`` keeps the draw in FILE and replays from it when it
exists (with another PM, or other route scores); a FILE made from another SFT policy, draw or sampling setting is
refused, naming what differs.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import tempfile
from contextlib import closing
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import mlflow  # noqa: E402
import torch  # noqa: E402

from posttrain.atomic import atomic_write_json  # noqa: E402
from posttrain.evaluation import OWN_CHOICE, score_responses  # noqa: E402
from posttrain.generation import open_generator  # noqa: E402
from posttrain.jsonl import read_jsonl  # noqa: E402
from posttrain.judge_client import JudgeCache, JudgeClient  # noqa: E402
from posttrain.judge_server import judge_endpoint  # noqa: E402
from posttrain.params import load_params  # noqa: E402
from posttrain.preference_model import PreferenceModel  # noqa: E402
from posttrain.rlhf import RoutedPairwiseReward  # noqa: E402
from posttrain.routing import decisive_chance, expected_gain, right_side, upper_pairs  # noqa: E402
from posttrain.sandbox import sandbox_limits  # noqa: E402
from posttrain.tracking import bench_run  # noqa: E402
from posttrain.trajectories import prompt as open_prompt  # noqa: E402
from stages.rlhf_routed import DATA, PM_DIR, POLICY  # noqa: E402

OUT = Path("reports/bench/routing_online.json")
ORACLE_NAMES = {"oracle": "oracle (right answers known)",
                "oracle_chance": "oracle, chance known (side: q)",
                "oracle_side": "oracle, side known (chance: shares)"}


class ScoredOnce:
    """The PM with its pair scores remembered, so every replay sees the same scores and pays for them once."""

    def __init__(self, pm: PreferenceModel):
        self.pm, self.memo, self.lam = pm, {}, pm.lam

    def score(self, triples, batch_size=64, reduce="mean"):
        todo = [(t, reduce) for t in dict.fromkeys(triples) if (t, reduce) not in self.memo]
        if todo:
            g, var = self.pm.score([t for t, _ in todo], batch_size, reduce)
            self.memo.update(zip(todo, zip(g.tolist(), var.tolist())))
        g, var = zip(*(self.memo[t, reduce] for t in triples))
        return torch.tensor(g), torch.tensor(var)

    def uncertainty(self, g, var):
        return self.pm.uncertainty(g, var)


class ReplayedReward(RoutedPairwiseReward):
    """The routed reward with each response's final answer looked up (found once, when the samples were checked)
    instead of running its program again in every replay."""

    def __init__(self, *args, answers: dict[str, int | None], **kwargs):
        super().__init__(*args, **kwargs)
        self.answers = answers

    def final_answers(self, texts: list[str]) -> list[int | None]:
        return [self.answers[t] for t in texts]


class OracleReward(ReplayedReward):
    """Routing that knows which responses are right: the ceiling of any routing score. Ranks by the expected-gain
    formula with the truth in place of estimates: the pair is decisive or not, and the right side is known, so
    it buys the verdicts that move the most advantage from wrong responses to right ones."""

    def __init__(self, *args, right: dict[tuple[str, str], bool], knows: str = "both", **kwargs):
        super().__init__(*args, **kwargs)
        self.right, self.knows = right, knows  # knows: both, chance (q estimated) or side (the chance estimated)

    def route_scores(self, scored, answers, questions, responses):
        out = []
        for (s, _, p), a, question, texts in zip(scored, answers, questions, responses):
            # keyed by question too: one short text ("The answer is 4.") can be right for one prompt, wrong for another
            c = torch.tensor([float(self.right[question, t]) for t in texts])
            decisive = (c[:, None] != c[None, :]).float()
            side = c[:, None] * (1 - c[None, :]) + 0.5 * (1 - decisive)  # a non-decisive pair has no right side
            out.append(expected_gain(s, right_side(p, a) if self.knows == "chance" else side,
                                     decisive_chance(a) if self.knows == "side" else decisive))
        return out


def sample_groups(params, records: list[dict], seed: int) -> tuple[list[list[str]], list[list[bool]], dict]:
    """``rlhf.n_responses`` samples per record from the SFT policy at ``rlhf.temperature`` (as rlhf_routed's GRPO
    draws them), whether the verifier finds each one right, and each sample's final answer."""
    cfg = params.rlhf
    gen = open_generator(POLICY, params.generation, batch_size=64, max_new_tokens=cfg.max_new_tokens, seed=seed)
    repeated = [r for r in records for _ in range(cfg.n_responses)]
    texts = [c.text for c in gen.generate([open_prompt(r["question"]) for r in repeated], cfg.temperature, seed,
                                          desc="policy samples")]
    rows = score_responses(repeated, [OWN_CHOICE] * len(texts), texts, sandbox_limits(params.sandbox),
                           params.sandbox.workers)
    n = cfg.n_responses
    return ([texts[k:k + n] for k in range(0, len(texts), n)],
            [[row["correct"] for row in rows[k:k + n]] for k in range(0, len(rows), n)],
            {row["response"]: row["predicted"] for row in rows})


def replay(reward: RoutedPairwiseReward, questions: list[str], groups: list[list[str]],
           per_step: int) -> list[list[float]]:
    """The advantages ``reward`` gives every group, fed to it ``per_step`` prompts at a time as GRPO does."""
    out = []
    for start in range(0, len(groups), per_step):
        chunk = range(start, min(start + per_step, len(groups)))
        keys = [str(k) for k in chunk for _ in groups[k]]
        rewards = reward(prompts=keys, completions=[t for k in chunk for t in groups[k]],
                         question=[questions[k] for k in chunk for _ in groups[k]])
        sizes = [len(groups[k]) for k in chunk]
        out += [rewards[sum(sizes[:i]):sum(sizes[:i + 1])] for i in range(len(sizes))]
    return out


def draw_records(train: list[dict], prompts: int, seed: int) -> list[dict]:
    """The seeded draw of training prompts a run samples responses for."""
    return random.Random(seed).sample(train, min(prompts, len(train)))


def draw_fingerprint(params, prompts: int, sample_seed: int) -> dict:
    """What a kept draw must match to be reused: the SFT policy's bytes, the draw and the sampling settings."""
    h = hashlib.sha256()
    for f in sorted(Path(POLICY).rglob("*")):
        if f.is_file():
            h.update(f.relative_to(POLICY).as_posix().encode() + f.read_bytes())
    cfg = params.rlhf
    return {"policy_sha256": h.hexdigest(), "prompts": prompts, "sample_seed": sample_seed,
            "n_responses": cfg.n_responses, "temperature": cfg.temperature, "max_new_tokens": cfg.max_new_tokens,
            "generation": params.generation.model_dump(mode="json")}


def kept_draw(path: Path | None, fingerprint: dict, sample) -> tuple[list[list[str]], list[list[bool]], dict]:
    """``sample()``'s (groups, correct, answers), read from ``path`` when it holds this fingerprint's draw, else
    sampled and written there (atomically, so a killed run leaves no half file)."""
    if path is not None and path.exists():
        kept = json.loads(path.read_text())
        differ = [k for k in fingerprint if kept.get("fingerprint", {}).get(k) != fingerprint[k]]
        if differ:
            raise SystemExit(f"{path}: a draw made with other {', '.join(differ)} than this run's; "
                             "delete it or name another --samples file")
        answers = {t: a for group, found in zip(kept["groups"], kept["answers"]) for t, a in zip(group, found)}
        print(f"{path}: the draw's {len(kept['groups'])} groups reused")
        return kept["groups"], kept["correct"], answers
    groups, correct, answers = sample()
    if path is not None:
        atomic_write_json(path, {"fingerprint": fingerprint, "groups": groups, "correct": correct,
                                 "answers": [[answers[t] for t in group] for group in groups]})
    return groups, correct, answers


def separation(advantages: list[list[float]], correct: list[list[bool]]) -> float:
    """Mean over mixed groups of (mean A of the right responses - mean A of the wrong ones)."""
    gaps = [statistics.mean(a for a, c in zip(adv, ok) if c) - statistics.mean(a for a, c in zip(adv, ok) if not c)
            for adv, ok in zip(advantages, correct) if any(ok) and not all(ok)]
    return statistics.mean(gaps) if gaps else 0.0


def correlation(a: list[list[float]], b: list[list[float]]) -> float:
    x, y = torch.tensor([v for g in a for v in g]), torch.tensor([v for g in b for v in g])
    return float(torch.corrcoef(torch.stack([x, y]))[0, 1]) if x.std() > 0 and y.std() > 0 else 0.0


def plot(rows: list[dict], out: Path) -> None:
    """Separation gap closed and overrule share against the judge calls paid (distinct comparisons judged, a share
    of judge_only's), per routing policy and same_answer (mean and sd over seeds)."""
    lines = list(dict.fromkeys((r["policy"], r["same_answer"]) for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5 + 0.2 * len(lines)))
    # one colour per policy and same_answer; dashed: budgets in pairs, where comparisons are shown beside them
    colours = {key: f"C{k}" for k, key in enumerate(dict.fromkeys((p.removesuffix(", per call"), s) for p, s in lines))}
    both_units = len({r.get("route_unit", "pair") for r in rows}) > 1
    for ax, key, label in ((axes[0], "gap_closed", "share of the rm_only -> judge_only separation gap closed"),
                           (axes[1], "judge_overrule_share", "share of verdicts that overruled the PM")):
        for policy, same in lines:
            dashed = both_units and not policy.endswith(", per call")
            budgets = sorted({r["budget"] for r in rows if (r["policy"], r["same_answer"]) == (policy, same)})
            points = [[r for r in rows if (r["policy"], r["same_answer"], r["budget"]) == (policy, same, b)]
                      for b in budgets]
            vals = [[r[key] for r in rs] for rs in points]
            ax.errorbar([100 * statistics.mean(r["call_share"] for r in rs) for rs in points],
                        [statistics.mean(v) for v in vals],
                        yerr=[statistics.pstdev(v) for v in vals], marker="o", capsize=3,
                        color=colours[policy.removesuffix(", per call"), same], linestyle="--" if dashed else "-",
                        label=f"{policy}, same answer: {same}")
        ax.set_xlabel("judge calls paid (distinct comparisons, % of judge_only's)")
        ax.set_ylabel(label, fontsize=9)
    # one legend for both panels, below them: inside, a dozen lines' labels hid the curves
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=8)
    fig.suptitle("Routing on the SFT policy's own samples")
    fig.tight_layout(rect=(0, 0.03 + 0.028 * ((len(lines) + 1) // 2), 1, 1))
    fig.savefig(out, dpi=120)
    plt.close(fig)


def run() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=400, help="training prompts sampled (a seeded draw)")
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.4])
    ap.add_argument("--seeds", type=int, default=5, help="seeds of random routing per budget")
    ap.add_argument("--sample-seed", type=int, default=0, help="seed of the prompt draw and the policy's sampling")
    ap.add_argument("--same-answer", nargs="+", choices=["judge", "skip", "tie"], default=["judge", "skip", "tie"],
                    help="rlhf.same_answer settings to replay (gaps are measured against rm_only and judge_only "
                         "with judge)")
    ap.add_argument("--uncertainty-scores", nargs="+", choices=["predictive", "variance"], default=None,
                    help="scores to rank pairs by for uncertainty routing (default: train_rm.uncertainty_score)")
    ap.add_argument("--route-scores", nargs="+", choices=["uncertainty", "expected_gain"], default=None,
                    help="rlhf.route_score settings for uncertainty routing (default: rlhf.route_score)")
    ap.add_argument("--route-units", nargs="+", choices=["pair", "comparison"], default=None,
                    help="rlhf.route_unit settings for budget policies (default: rlhf.route_unit)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (give 1 beside another bench)")
    ap.add_argument("--pm", default=PM_DIR, help="the PM to route with (e.g. one bench/preference.py --save-dir kept)")
    ap.add_argument("--oracle-split", action="store_true",
                    help="add the half-oracles that know only the decisive chance or only the right side")
    ap.add_argument("--samples", type=Path, default=None,
                    help="keep the draw (samples, the verifier's checks, final answers) in this JSON file; reuse it "
                         "when there")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    params = load_params()
    cfg = params.rlhf
    splits = {s: read_jsonl(DATA / f"{s}.jsonl") for s in ("train", "dev", "test")}
    records = draw_records(splits["train"], args.prompts, args.sample_seed)
    questions = [r["question"] for r in records]
    with bench_run("routing_online", params), tempfile.TemporaryDirectory(prefix="routing_online_") as tmp, \
            judge_endpoint(params.judge, [r for s in splits.values() for r in s], params.seed) as url, \
            closing(JudgeClient(params.judge, url, JudgeCache(Path(tmp) / "judge.sqlite"))) as client:
        groups, correct, answers = kept_draw(args.samples, draw_fingerprint(params, len(records), args.sample_seed),
                                             lambda: sample_groups(params, records, args.sample_seed))
        pm = ScoredOnce(PreferenceModel.from_pretrained(args.pm))
        pm.score([(q, g[i], g[j]) for q, g in zip(questions, groups) for i, j in upper_pairs(len(g))],
                 cfg.pm_batch_size)
        default_score = pm.pm.uncertainty_score
        scores = args.uncertainty_scores or [default_score]
        ranks = args.route_scores or [cfg.route_score]
        units = args.route_units or [cfg.route_unit]

        right = {(q, t): ok for q, g, oks in zip(questions, groups, correct) for t, ok in zip(g, oks)}

        def measure(policy: str, budget: float = 0.0, seed: int = 0, same: str = "judge",
                    score: str | None = None, rank: str = "uncertainty", unit: str = "pair") -> tuple[dict, list]:
            update = {"routing": policy, "budget": budget, "same_answer": same, "route_score": rank,
                      "route_unit": unit}
            pm.pm.uncertainty_score = score or default_score
            config = cfg.model_copy(update=update)
            if rank.startswith("oracle"):
                config = config.model_copy(update={"route_score": "expected_gain"})  # the answers are looked up
                reward = OracleReward(pm, client, config, seed, answers=answers, right=right,
                                      knows=rank.removeprefix("oracle").removeprefix("_") or "both")
            else:
                reward = ReplayedReward(pm, client, config, seed, answers=answers)
            adv = replay(reward, questions, groups, cfg.prompts_per_step)
            name = ORACLE_NAMES[rank] if rank.startswith("oracle") else policy + (
                f" ({score})" if score and len(scores) > 1 else "") + (f" by {rank}" if rank != "uncertainty" else "")
            name += ", per call" if unit == "comparison" else ""
            return {"policy": name, "budget": budget, "seed": seed, "same_answer": same, "route_unit": unit,
                    "verdicts": reward.totals["judge_verdicts"], "separation": separation(adv, correct),
                    **reward.summary()}, adv

        judge_row, judge_adv = measure("judge_only")  # asks every pair once; later replays hit the judge cache
        rows = [judge_row]
        for same in dict.fromkeys(["judge", *args.same_answer]):  # judge: the baseline the gaps are measured on
            for policy in ("rm_only", "judge_only") if same != "judge" else ("rm_only",):
                row, adv = measure(policy, same=same)
                rows.append({**row, "correlation_with_judge_only": correlation(adv, judge_adv)})
            ranked = [("uncertainty_budget", s, r) for s in scores for r in ranks]
            ceiling = [("uncertainty_budget", None, o) for o in ORACLE_NAMES
                       if o == "oracle" or args.oracle_split] if same == "judge" else []
            for unit in units:
                for policy, score, rank in ranked + ceiling + [("random", None, "uncertainty")]:
                    for budget in args.budgets:
                        for seed in range(1 if policy == "uncertainty_budget" else args.seeds):
                            row, adv = measure(policy, budget, seed, same, score, rank, unit)
                            rows.append({**row, "correlation_with_judge_only": correlation(adv, judge_adv)})
        rm_row = next(r for r in rows if r["policy"] == "rm_only" and r["same_answer"] == "judge")
        gap = judge_row["separation"] - rm_row["separation"]
        for row in rows:
            row["gap_closed"] = (row["separation"] - rm_row["separation"]) / gap if gap else None
            # the bill: distinct comparisons judged (copies of one are one call), a share of judge_only's
            row["call_share"] = row["judged_comparisons"] / max(judge_row["judged_comparisons"], 1)
            row["pair_share"] = row["verdicts"] / max(judge_row["verdicts"], 1)
        decisive = judge_row["verdicts"] * (1 - judge_row["judge_tie_share"])
        facts = {"pm": str(args.pm), "prompts": len(groups),
                 "responses_right": sum(map(sum, correct)) / sum(map(len, correct)),
                 "mixed_prompts": sum(any(c) and not all(c) for c in correct) / len(correct),
                 "judgeable_pairs": judge_row["verdicts"], "judge_only_calls": judge_row["judged_comparisons"],
                 "judge_tie_share_of_judgeable": judge_row["judge_tie_share"],
                 "pm_accuracy_on_decisive": 1 - judge_row["verdicts"] * judge_row["judge_overrule_share"] / decisive}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"facts": facts, "rows": rows}, indent=1))
        plot([r for r in rows if r["policy"].startswith(("uncertainty_budget", "random", "oracle"))],
             args.out.with_suffix(".png"))
        mlflow.log_metrics({f"facts.{k}": v for k, v in facts.items() if k != "pm"})
        mlflow.log_artifact(str(args.out))
        mlflow.log_artifact(str(args.out.with_suffix(".png")))
    summarize(facts, rows)


def summarize(facts: dict, rows: list[dict]) -> None:
    print(f"\n{facts['prompts']} prompts: {facts['responses_right']:.3f} of samples right, "
          f"{facts['mixed_prompts']:.3f} of prompts mixed; {facts['judgeable_pairs']:.0f} judgeable pairs "
          f"({facts['judge_only_calls']:.0f} distinct comparisons, the calls judge_only pays), "
          f"{facts['judge_tie_share_of_judgeable']:.3f} of them ties; PM accuracy on the decisive ones "
          f"{facts['pm_accuracy_on_decisive']:.3f}")
    print(f"{'policy':46}{'same answer':>12}{'budget':>7}{'seeds':>6}{'separation':>11}{'gap closed':>11}"
          f"{'corr w/ judge':>14}{'overruled':>10}{'ties':>7}{'pairs %':>8}{'calls %':>8}")
    keys = dict.fromkeys((r["policy"], r["same_answer"], r["budget"]) for r in rows)
    for policy, same, budget in keys:
        rs = [r for r in rows if (r["policy"], r["same_answer"], r["budget"]) == (policy, same, budget)]
        def mean(key):
            return statistics.mean(r[key] for r in rs)
        corr = mean("correlation_with_judge_only") if "correlation_with_judge_only" in rs[0] else 1.0
        print(f"{policy:46}{same:>12}{budget:7.2f}{len(rs):6d}{mean('separation'):11.3f}{mean('gap_closed'):11.3f}"
              f"{corr:14.3f}"
              f"{mean('judge_overrule_share'):10.3f}{mean('judge_tie_share'):7.3f}{100 * mean('pair_share'):8.1f}"
              f"{100 * mean('call_share'):8.1f}")


if __name__ == "__main__":
    run()
