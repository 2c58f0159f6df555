"""RLVR rollout cost: ar3po vs grpo vs dapo from the same SFT policy with the same seeds; test accuracy against
cumulative generated responses and tokens, zero-advantage share, generation throughput and its share of step time;
and the RLVR policy vs the SFT policy per difficulty over seeds.

    python3 bench/rlvr.py [--algos ar3po grpo dapo] [--seeds 1] [--first-seed 0] [--steps N] [--eval-every N] [--out F]
                          [--learning-rate LR] [--buffer-seed none|reference] [--k K] [--stages S] [--extra-test N]
                          [--zero-advantage-groups keep|drop] [--prompts-per-step P] [--baseline-prompts-per-step 8]
                          [--num-iterations MU]   # optimizer steps per rollout (--steps counts optimizer steps)
                          [--vllm colocate]       # rollouts from TRL's vLLM engine (on a CPU: .venv-vllm's python)
                          [--policy models/warmup]   # start from another policy than the SFT policy
                          [--extra-train N]   # N fresh training questions besides the prepared 3,000
    python3 bench/rlvr.py --merge A.json B.json --out C.json     # join runs made apart (e.g. seeds in parallel)

Run after `dvc repro` (needs models/sft, or the --policy given). Test accuracy is measured every --eval-every steps on
the test split (240 questions by default, one question = 0.004; --extra-test N adds N fresh held-out questions of the
same task).
Writes reports/rlvr/rlvr_bench.json (partial results survive a crash), the plot beside it (rlvr_bench.png) and
logs to MLflow; prints a table. Nothing here is asserted. Each run checkpoints every rlvr.save_steps under
checkpoints/rlvr_bench/ (--checkpoints), so a killed bench, re-run with the same command, resumes where it stopped.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import mlflow  # noqa: E402
import torch  # noqa: E402

from posttrain.params import ParamsError, with_overrides  # noqa: E402
from posttrain.policy_accuracy import own_choice_accuracy  # noqa: E402
from posttrain.tracking import bench_run  # noqa: E402
from held_out import TRAIN_SEED_OFFSET, held_out_questions  # noqa: E402
from results_files import join_results  # noqa: E402
from posttrain.jsonl import read_jsonl  # noqa: E402
from stages.rlvr_ar3po import DATA, POLICY, train_rlvr  # noqa: E402

OUT = Path("reports/rlvr")
CHECKPOINTS = Path("checkpoints/rlvr_bench")


def variant(run: dict) -> str:
    """What a run compares as: the algorithm, with the settings that differ between runs of one algorithm, and its
    steps (a linearly decaying learning rate reaches 0 by the last, so a longer run is another schedule, not a
    continuation)."""
    seeded = run["algo"] == "ar3po" and run.get("buffer_seed", "none") != "none"  # only ar3po has a buffer
    name = run["algo"] + (" + seeded buffer" if seeded else "")
    schedule = f", k {run['k']} x {run['stages']} stages" if run["algo"] == "ar3po" else ""
    batch = run.get("prompts_per_step", 8)  # runs recorded before it was varied all took 8 prompts a step
    schedule += f", {batch} prompts/step" if batch != 8 else ""
    engine = f", vLLM {run['vllm']}" if run.get("vllm") else ""
    extras = ", zero-advantage groups dropped" if run.get("zero_advantage_groups") == "drop" else ""
    # stop 92's runs with GRESO's pre-rollout filter (rlvr.skip_solved at f726cce, reverted: no gain, results.md)
    extras += f", solved prompts skipped at p {run['skip_solved']:g}" if run.get("skip_solved") else ""
    # stop 94's runs with reuse both ways (rlvr.reuse: both at 1ee41be, reverted: no gain, results.md)
    if run.get("reuse") == "both":
        extras += ", reuse both ways" + (" (incorrect buffer seeded)" if run["incorrect_seed"] != "none" else "")
    questions = run.get("train_questions", 3_000)  # runs recorded before --extra-train all trained on the 3,000
    extras += f", {questions:,} training questions" if questions != 3_000 else ""
    mu = run.get("num_iterations", 1)  # runs recorded before --num-iterations took one optimizer step a rollout
    extras += f", {mu} optimizer steps a rollout" if mu != 1 else ""
    # runs recorded before --lr-schedule all decayed linearly
    rate = f"{run['learning_rate']:g}" + (" constant" if run.get("lr_schedule", "linear") == "constant" else "")
    return f"{name}, lr {rate}{schedule}{engine}{extras}, {len(run['steps']) * mu} steps"


def reach(curve: list[dict], target: float, key: str) -> float | None:
    """The cumulative ``key`` (responses or tokens) at which test accuracy first reaches ``target``."""
    return next((c[key] for c in curve if c["test_accuracy"] >= target), None)


def mean_curve(runs: list[dict]) -> list[dict]:
    """The seed mean (cumulative responses and tokens, accuracy) at each step all the runs evaluated: runs evaluated
    every 20 steps and every 40 meet every 40 (zipped point by point, they paired step 20 with step 40)."""
    by_step = [{c["step"]: c for c in r["curve"]} for r in runs]
    shared = sorted(set.intersection(*(set(b) for b in by_step)))
    keys = ("responses", "tokens", "test_accuracy")
    return [{"step": s, **{k: statistics.fmean(b[s][k] for b in by_step) for k in keys}} for s in shared]


def baseline_target(runs: list[dict]) -> tuple[float, float]:
    """What ar3po is measured against: the baseline runs' mean final accuracy and mean responses generated."""
    return (statistics.mean(r["final_test"]["accuracy"] for r in runs),
            statistics.mean(r["totals"]["responses"] for r in runs))


def smoothed(curve: list[dict], width: int = 3) -> list[dict]:
    """The curve with each accuracy replaced by the mean of its last ``width`` evaluations (fewer at the start):
    one evaluation on the test split moves by a question or two of noise, a mean of three less so."""
    accs = [c["test_accuracy"] for c in curve]
    return [{**c, "test_accuracy": statistics.fmean(accs[max(0, j - width + 1):j + 1])} for j, c in enumerate(curve)]


def signal_responses(run: dict) -> list[float] | None:
    """Cumulative responses with an advantage (the ones a step learns from) at each point of the run's curve, or None
    for runs made before they were counted. Per step the run kept only the share; each step's responses are spread
    evenly over the rollouts between evaluations (one a step, or one every num_iterations steps), then scaled so the
    last point is the counted total."""
    if "signal_share" not in run["steps"][0] or "signal_responses" not in run["totals"]:
        return None
    cum, out = 0.0, [0.0]
    for prev, c in zip(run["curve"], run["curve"][1:]):
        shares = [s["signal_share"] for s in run["steps"] if prev["step"] < s["step"] <= c["step"]]
        cum += (c["responses"] - prev["responses"]) * statistics.fmean(shares) if shares else 0.0
        out.append(cum)
    scale = run["totals"]["signal_responses"] / max(out[-1], 1e-9) \
        if run["steps"][-1]["step"] <= run["curve"][-1]["step"] \
        else 1.0  # its last evaluation came before its last rollout: the total counts responses after it
    return [x * scale for x in out]


def plot(runs: list[dict], path: Path) -> None:
    fig, axes = plt.subplots(1, 4, figsize=(24, 5.5))
    base = {"ar3po": "tab:green", "ar3po + seeded buffer": "tab:purple", "grpo": "tab:blue", "dapo": "tab:orange"}
    spare, colors = ["tab:brown", "tab:red", "tab:olive", "tab:cyan", "tab:gray"], {}
    for name in dict.fromkeys(map(variant, runs)):  # one colour per algorithm; another learning rate takes a spare
        key = name.split(", lr")[0]
        colors[name] = base.get(key) if base.get(key) not in colors.values() else spare[len(colors) % len(spare)]
    markers, window = "osD^v", 10
    for r in runs:
        c = r["curve"]
        kw = dict(color=colors[variant(r)], marker=markers[r["seed"] % len(markers)], alpha=0.8, linewidth=1.2,
                  label=f"{variant(r)}, seed {r['seed']}")
        axes[0].plot([p["responses"] for p in c], [p["test_accuracy"] for p in c], **kw)
        axes[1].plot([p["tokens"] for p in c], [p["test_accuracy"] for p in c], **kw)
        if (signal := signal_responses(r)) is not None:
            axes[2].plot(signal, [p["test_accuracy"] for p in c], **kw)
    for name, color in colors.items():
        # per step the share jumps in 1/8ths: the mean over seeds and a moving mean over steps show the trend; dashed,
        # its unsolved part (runs that recorded it): the groups AR3PO's reuse is there to give an advantage
        for key, style in (("zero_advantage_share", "-"), ("zero_advantage_unsolved_share", "--")):
            recorded = [r for r in runs if variant(r) == name and key in r["steps"][0]]
            if not recorded:
                continue
            per_seed = [[p[key] for p in r["steps"]] for r in recorded]
            z = [statistics.fmean(col) for col in zip(*per_seed)]
            smooth = [statistics.fmean(z[max(0, j - window + 1):j + 1]) for j in range(len(z))]
            axes[3].plot([p["step"] for p in recorded[0]["steps"]], smooth, color=color, linestyle=style,
                         label=f"{name} ({len(per_seed)} seeds)" if style == "-" else "_nolegend_")
    axes[0].set(xlabel="cumulative generated responses", ylabel="test accuracy (own choice, greedy)")
    axes[1].set(xlabel="cumulative generated tokens", ylabel="test accuracy")
    # responses with an advantage are what a step learns from: cost in them shows what each algorithm gets out of them
    axes[2].set(xlabel="cumulative responses with an advantage (the ones trained on)", ylabel="test accuracy")
    axes[3].set(xlabel="step", ylabel=f"zero-advantage share ({window}-step mean; dashed: unsolved)")
    axes[3].legend(fontsize=7)  # the dashed lines are named in the axis label
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=4, fontsize=8)
    # runs recorded before --policy existed all started from the SFT policy
    start = ", ".join(dict.fromkeys(r.get("policy", POLICY) for r in runs))
    fig.suptitle(f"RLVR from {start}: accuracy against rollout cost")
    fig.tight_layout(rect=(0, 0.03 * (len(runs) // 4 + 2), 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def one_run(params, algo: str, seed: int, steps: int, eval_every: int, train, test, policy: str = POLICY,
            checkpoints: Path = CHECKPOINTS) -> dict:
    """One training run; its checkpoints go under ``checkpoints`` (one directory per run: the stage's checkpoint
    claim removes other keys' directories under its root), so a killed bench re-run with the same command resumes."""
    cfg = params.rlvr.model_copy(update={"algo": algo, "max_steps": steps, "dev_every": eval_every,
                                         "n_dev": len(test)})
    run_params = params.model_copy(update={"rlvr": cfg})
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rlvr_bench_") as tmp:
        trainer, dev_cb = train_rlvr(run_params, train, test, f"{tmp}/policy", checkpoints, seed=seed,
                                     policy=policy)
        final = own_choice_accuracy(f"{tmp}/policy", test, cfg.max_new_tokens, params.sandbox)
    totals = dict(trainer.totals)
    # the dev callback ran on the test split here: accuracy at each eval step with the cost so far
    curve = [{"step": 0, "test_accuracy": None, "responses": 0, "tokens": 0, "zero_advantage_share": 0.0}]
    cost_keys = ("responses", "tokens", "zero_advantage_share")
    curve += [{"step": s, "test_accuracy": a, **{k: cost[k] for k in cost_keys}}
              for s, a in dev_cb.history if (cost := trainer.cost_at(s))]
    gen_s, train_s = totals.get("generation_seconds", 0.0), totals.get("training_seconds", 0.0)
    shares = ("zero_advantage_share", "zero_advantage_unsolved_share", "signal_share")
    steps = [{"step": c["step"], **{k: c[k] for k in shares}} for c in trainer.curve]
    return {"algo": algo, "seed": seed, "policy": policy, "learning_rate": cfg.learning_rate,
            "lr_schedule": cfg.lr_schedule, "buffer_seed": cfg.buffer_seed,
            "zero_advantage_groups": cfg.zero_advantage_groups, "k": cfg.k, "stages": cfg.stages, "vllm": cfg.vllm,
            "num_iterations": cfg.num_iterations,
            "prompts_per_step": cfg.prompts_per_step, "train_questions": len(train),
            "curve": curve, "steps": steps, "final_test": final, "totals": totals,
            "responses_per_prompt": totals["responses"] / max(totals["prompts"], 1),
            "zero_advantage_share": totals["zero_advantage_prompts"] / max(totals["prompts"], 1),
            "zero_advantage_unsolved_share": totals["zero_advantage_unsolved_prompts"] / max(totals["prompts"], 1),
            "signal_share": totals["signal_responses"] / max(totals["responses"], 1),
            "generation_tokens_per_s": totals["tokens"] / max(gen_s, 1e-9),
            "generation_share": gen_s / max(gen_s + train_s, 1e-9), "seconds": round(time.perf_counter() - start, 1)}


def census(runs: list[dict]) -> str:
    """The zero-advantage share's unsolved part and the share of generated responses with an advantage, over the
    runs that recorded them (runs made before they were counted did not)."""
    rs = [r for r in runs if "signal_share" in r]
    if not rs:
        return ""
    return (f" ({statistics.mean(r['zero_advantage_unsolved_share'] for r in rs):.2f} unsolved), signal share "
            f"{statistics.mean(r['signal_share'] for r in rs):.2f} ({len(rs)} of {len(runs)} runs)")


def summarize(sft: dict, runs: list[dict]) -> None:
    """Print the comparison: per variant (algorithm, learning rate, buffer seed) the final test accuracy over seeds
    (per difficulty, beside the SFT policy's), and the responses each ar3po variant needed to reach each baseline's
    final accuracy, seed by seed."""
    variants = list(dict.fromkeys(map(variant, runs)))
    print(f"\nSFT policy test accuracy {sft['accuracy']:.3f}; by difficulty "
          + " ".join(f"d{d} {a:.2f}" for d, a in sft["by_difficulty"].items()))
    for name in variants:
        rs = [r for r in runs if variant(r) == name]
        accs = [r["final_test"]["accuracy"] for r in rs]
        by_d = {d: [r["final_test"]["by_difficulty"][d] for r in rs] for d in rs[0]["final_test"]["by_difficulty"]}
        print(f"{name}: final test {statistics.mean(accs):.3f} ± {statistics.pstdev(accs):.3f} over seeds "
              f"{[r['seed'] for r in rs]} (gain over SFT {statistics.mean(accs) - sft['accuracy']:+.3f}); responses "
              f"{statistics.mean(r['totals']['responses'] for r in rs):.0f} "
              f"({statistics.mean(r['responses_per_prompt'] for r in rs):.2f}/prompt); zero-advantage share "
              f"{statistics.mean(r['zero_advantage_share'] for r in rs):.2f}{census(rs)}; buffer hits "
              f"{statistics.mean(r['totals'].get('buffer_hits', 0) for r in rs):.0f}; by difficulty "
              + " ".join(f"d{d} {statistics.mean(a):.2f}±{statistics.pstdev(a):.2f}" for d, a in by_d.items()))
    baselines = [name for name in variants if not name.startswith("ar3po")]
    for mine in (r for r in runs if r["algo"] == "ar3po"):
        for name in baselines:
            # the baseline run of the same seed, else the mean over the seeds it was run with
            rs = [r for r in runs if variant(r) == name and r["seed"] == mine["seed"]] or \
                 [r for r in runs if variant(r) == name]
            target, cost = baseline_target(rs)
            got = reach(mine["curve"], target, "responses")
            verdict = (" (not reached)" if got is None else " (the SFT policy already had it)" if got == 0
                       else f" -> {cost / got:.1f}x fewer")
            print(f"seed {mine['seed']}: {variant(mine)} reaches {name}'s final accuracy {target:.3f} (seeds "
                  f"{[r['seed'] for r in rs]}) at {'-' if got is None else got} responses vs its {cost:.0f}{verdict}")
    # one seed's curve crosses a target early or late by test noise (1 question = 0.004); the seed means less so,
    # and 3-evaluation means (the baseline's final then being the mean of its last three evaluations) less still
    for mine in (name for name in variants if name.startswith("ar3po")):
        curve = mean_curve([r for r in runs if variant(r) == mine])
        for name in baselines:
            rs = [r for r in runs if variant(r) == name]
            target, cost = baseline_target(rs)
            last_three = smoothed(mean_curve(rs)[1:])[-1]["test_accuracy"]
            for label, goal, line in (("seed mean", target, curve),
                                      ("seed mean, 3-evaluation means", last_three, smoothed(curve[1:]))):
                got = reach(line, goal, "responses")
                verdict = " (not reached)" if got is None else f" -> {cost / max(got, 1):.1f}x fewer"
                print(f"{label}: {mine} reaches {name}'s mean final accuracy {goal:.3f} at "
                      f"{'-' if got is None else f'{got:.0f}'} responses vs its {cost:.0f}{verdict}")


def run() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algos", nargs="+", default=["ar3po", "grpo", "dapo"], choices=["ar3po", "grpo", "dapo"])
    ap.add_argument("--seeds", type=int, default=1, help="seeds per algorithm")
    ap.add_argument("--first-seed", type=int, default=0, help="seeds run are first-seed .. first-seed + seeds - 1")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps (default: rlvr.max_steps)")
    ap.add_argument("--learning-rate", type=float, default=None,
                    help="override rlvr.learning_rate (e.g. dapo, whose batches hold no zero-advantage group, "
                         "takes larger steps at the same rate)")
    ap.add_argument("--lr-schedule", choices=["linear", "constant"], default=None,
                    help="override rlvr.lr_schedule, every algorithm (constant: no decay toward the last step, so "
                         "the late steps learn as much as the early ones)")
    ap.add_argument("--buffer-seed", choices=["none", "reference"], default=None,
                    help="override rlvr.buffer_seed (ar3po: start the replay buffer from the verified reference "
                         "solutions)")
    ap.add_argument("--zero-advantage-groups", choices=["keep", "drop"], default=None,
                    help="override rlvr.zero_advantage_groups (ar3po / grpo: drop takes groups without advantage out "
                         "of the batch and its token count)")
    ap.add_argument("--k", type=int, default=None,
                    help="ar3po: responses per active prompt per stage (default: rlvr.k)")
    ap.add_argument("--num-iterations", type=int, default=None,
                    help="optimizer steps per rollout, every algorithm (GRPO's mu; default: rlvr.num_iterations); "
                         "--steps counts optimizer steps, so --steps 800 --num-iterations 2 makes 400 rollouts")
    ap.add_argument("--stages", type=int, default=None, help="ar3po: rollout stages S (default: rlvr.stages)")
    ap.add_argument("--prompts-per-step", type=int, default=None,
                    help="override rlvr.prompts_per_step (prompts per optimizer step: more gives each step more "
                         "responses with an advantage)")
    ap.add_argument("--baseline-prompts-per-step", type=int, default=8,
                    help="grpo and dapo: prompts per optimizer step unless --prompts-per-step is given (default 8, "
                         "their stronger setting: grpo at 16 ends 0.020 lower after the same 12,800 responses, "
                         "docs/results.md stop 86), so that ar3po at rlvr.prompts_per_step meets each at its best")
    ap.add_argument("--vllm", choices=["colocate", "server"], default=None,
                    help="rollouts through TRL's vLLM engine (rlvr.vllm); on a CPU, run with bench/vllm_cpu.sh's venv")
    ap.add_argument("--policy", default=POLICY,
                    help="the starting policy (a model directory; default the SFT policy, models/sft): e.g. "
                         "models/warmup, to measure the algorithms from a stronger or another policy")
    ap.add_argument("--eval-every", type=int, default=10, help="test accuracy every this many steps")
    ap.add_argument("--extra-test", type=int, default=0,
                    help="add this many fresh held-out questions to the test split (less noise per evaluation)")
    ap.add_argument("--extra-train", type=int, default=0,
                    help="train on N fresh questions of the task besides the prepared training split (3,000 questions "
                         "saturate by a 400-step run's second pass over them)")
    ap.add_argument("--out", type=Path, default=OUT / "rlvr_bench.json", help="results JSON (the plot goes beside it)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads for this process (default: one per core); running two benches side by "
                         "side, give each 1: two runs of 2 threads on 2 cores spin-wait on each other, 4-5x slower")
    ap.add_argument("--checkpoints", type=Path, default=CHECKPOINTS,
                    help="checkpoint root (each run under <root>/<--out's stem>/<algo>_s<seed>): a killed bench "
                         "re-run with the same command resumes each run from its last checkpoint (rlvr.save_steps)")
    ap.add_argument("--merge", type=Path, nargs="+", default=None,
                    help="no training: join these results files (e.g. runs of other seeds) into --out, plot, print")
    args = ap.parse_args()
    if args.merge:
        sft, runs = join_results(args.merge, args.out, "sft_test")
        plot(runs, args.out.with_suffix(".png"))
        summarize(sft, runs)
        return
    if not (Path(args.policy) / "config.json").exists():
        ap.error(f"--policy {args.policy}: no model there (no config.json); run `dvc repro` first, or name a model dir")
    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = {f"rlvr.{k}": v for k, v in (("learning_rate", args.learning_rate), ("lr_schedule", args.lr_schedule),
                                             ("buffer_seed", args.buffer_seed),
                                             ("zero_advantage_groups", args.zero_advantage_groups), ("k", args.k),
                                             ("stages", args.stages), ("vllm", args.vllm),
                                             ("prompts_per_step", args.prompts_per_step),
                                             ("num_iterations", args.num_iterations))
                 if v is not None}
    # an explicit --prompts-per-step holds for every algorithm; without it the baselines take their own
    baseline_overrides = overrides if args.prompts_per_step is not None else \
        {**overrides, "rlvr.prompts_per_step": args.baseline_prompts_per_step}
    try:  # validated as params.yaml is (--k 0 stops here, naming rlvr.k)
        params = with_overrides("params.yaml", overrides, out=None)
    except ParamsError as e:
        ap.error(str(e))
    try:
        baseline_params = with_overrides("params.yaml", baseline_overrides, out=None)
    except ParamsError as e:
        ap.error(f"--baseline-prompts-per-step {args.baseline_prompts_per_step}: {e}")
    params_by_algo = {"ar3po": params, "grpo": baseline_params, "dapo": baseline_params}
    steps = args.steps or params.rlvr.max_steps
    splits = {s: read_jsonl(DATA / f"{s}.jsonl") for s in ("train", "dev", "test")}
    train = splits["train"][:params.rlvr.n_prompts]
    taken = [r for s in splits.values() for r in s]
    test = splits["test"] + held_out_questions(params, args.extra_test, taken) if args.extra_test else splits["test"]
    if args.extra_train:  # fresh questions, disjoint from every split and the extra test ones, after the prepared
        train = train + held_out_questions(params, args.extra_train, taken + test, TRAIN_SEED_OFFSET, "train-extra")
    runs = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with bench_run("rlvr", params):
        sft = {**own_choice_accuracy(args.policy, test, params.rlvr.max_new_tokens, params.sandbox),
               "test_questions": len(test), "policy": args.policy}
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for algo in args.algos:
                with mlflow.start_run(run_name=f"{algo} seed {seed}", nested=True,
                                      tags={"posttrain.bench.variant": algo, "seed": str(seed),
                                            "train_questions": str(len(train))}):
                    r = one_run(params_by_algo[algo], algo, seed, steps, args.eval_every, train, test, args.policy,
                                args.checkpoints / args.out.stem / f"{algo}_s{seed}")
                    r["curve"][0]["test_accuracy"] = sft["accuracy"]
                    mlflow.log_metrics({"test_accuracy": r["final_test"]["accuracy"],
                                        "responses": r["totals"]["responses"], "tokens": r["totals"]["tokens"],
                                        "zero_advantage_share": r["zero_advantage_share"]})
                runs.append(r)
                print(f"{algo} seed {seed}: test {sft['accuracy']:.3f} -> {r['final_test']['accuracy']:.3f}, "
                      f"{r['totals']['responses']} responses ({r['responses_per_prompt']:.2f}/prompt), "
                      f"{r['totals']['tokens']} tokens, zero-adv share {r['zero_advantage_share']:.2f}, "
                      f"{r['generation_tokens_per_s']:.0f} gen tokens/s, generation {r['generation_share']:.0%} "
                      f"of step time ({r['seconds']} s)")
                args.out.write_text(json.dumps({"sft_test": sft, "runs": runs}, indent=1))  # survives a crash
        plot(runs, args.out.with_suffix(".png"))
        mlflow.log_artifact(str(args.out), "rlvr")
        mlflow.log_artifact(str(args.out.with_suffix(".png")), "rlvr")
    summarize(sft, runs)


if __name__ == "__main__":
    run()
