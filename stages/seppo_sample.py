"""Stage `seppo_sample`: SePPO reference sampling (METHODS.md section 2) -> preference pairs for the RM.

The policy is the final SFT model (models/sft); the references are its earlier checkpoints: the warm-up model
(step 0) and models/sft_checkpoints/step-<n> (every sft.save_steps steps). For each of the first
``seppo_sample.n_prompts`` training prompts and each of ``samples_per_prompt`` samples:

1. pick a reference checkpoint j uniformly among the earlier ones and sample y_ref ~ pi_j(.|x);
2. the anchor y_w is the task's worked solution written in the trajectory y_ref chose, itself scored by the verifier
   (a pair against an anchor that fails it is left out);
3. h_w = log pi_policy(y_w|x) - log pi_j(y_w|x); the anchor rule (AAF) calls y_ref a winner when h_w < 0;
4. the task verifier also judges y_ref; both decisions are kept, and ``seppo_sample.label`` picks the one that
   writes chosen/rejected.

Writes data/seppo/samples.jsonl (every sample with its checkpoint, verdicts, h_w, h_r and the reference
log-probs a SePPO/DPO trainer needs), data/seppo/pairs.jsonl (the RM's training pairs), data/seppo/tie_pairs.jsonl
(pairs the label calls a tie, for ``train_rm.tie_share``) and
reports/metrics/seppo_sample.json (reference accuracy per checkpoint, AAF flip rate, AAF-verifier agreement).
Resumable: each reference's samples are saved under checkpoints/seppo_sample/<key>/ as it finishes (its sampling
seed is its own), then the anchors' verdicts and the policy's log-probs, so a killed run goes on from the last of
these and writes what an uninterrupted one would.
"""
from __future__ import annotations

import gc
import json
from collections import defaultdict
from pathlib import Path

import mlflow

from posttrain.atomic import atomic_dir, atomic_write_json, atomic_write_text
from posttrain.checkpoints import claim_checkpoint_dir, result_params
from posttrain.errors import stage_main
from posttrain.evaluation import OWN_CHOICE, score_responses
from posttrain.generation import open_generator
from posttrain.jsonl import read_jsonl
from posttrain.modeling import load_pretrained
from posttrain.params import load_params
from posttrain.preference_data import anchor_completion, assign_references, tie_pairs, training_pairs
from posttrain.sandbox import sandbox_limits
from posttrain.seppo import preference_logps, reference_checkpoints
from posttrain.task.records import DataError
from posttrain.tracking import stage_run
from posttrain.trajectories import prompt

TRAIN, POLICY, WARMUP = Path("data/prepared/train.jsonl"), "models/sft", "models/warmup"
SNAPSHOTS, OUT = Path("models/sft_checkpoints"), Path("data/seppo")
METRICS = Path("reports/metrics/seppo_sample.json")
CHECKPOINTS = Path("checkpoints/seppo_sample")  # each reference's samples, for a resume after a kill
RESUME_SECTIONS = ("seppo_sample", "sandbox", "generation")  # the params a resumed run must share


def saved_step(path: Path, what: str, compute):
    """``compute()``'s JSON-able result, saved in the run's progress directory: a resumed run reads it back. The
    directory's key covers the params and inputs, and the samples it is computed from are the saved ones."""
    if path.is_file():
        print(f"seppo_sample: resuming, {what} already")
        return json.loads(path.read_text(encoding="utf-8"))
    result = compute()
    atomic_write_json(path, result)
    return result


def agreement(samples: list[dict]) -> dict:
    n = len(samples)
    both = sum(s["anchor_wins"] and s["verifier_wins"] for s in samples)
    neither = sum(not s["anchor_wins"] and not s["verifier_wins"] for s in samples)
    return {"aaf_flip_rate": sum(s["anchor_wins"] for s in samples) / n,
            "reference_accuracy": sum(s["verifier_wins"] for s in samples) / n,
            "aaf_verifier_agreement": (both + neither) / n,
            "aaf_precision": both / max(1, sum(s["anchor_wins"] for s in samples)),
            "aaf_recall": both / max(1, sum(s["verifier_wins"] for s in samples))}


@stage_main
def main() -> None:
    params = load_params()
    cfg = params.seppo_sample
    with stage_run("seppo_sample", params, sections=["seed", "seppo_sample", "generation"]):
        records = read_jsonl(TRAIN)[:cfg.n_prompts]
        refs = reference_checkpoints(WARMUP, SNAPSHOTS)
        plan = assign_references(len(records), cfg.samples_per_prompt, len(refs), params.seed)
        jobs = defaultdict(list)  # reference index -> [(record, sample index)]
        for rec, chosen_refs in zip(records, plan):
            for k, j in enumerate(chosen_refs):
                jobs[j].append((rec, k))
        print(f"seppo_sample: {len(records)} prompts x {cfg.samples_per_prompt} samples from {len(refs)} "
              f"reference{'s' * (len(refs) != 1)}")

        # 1-2. sample from each reference, build the anchors, keep the reference log-probs of both; each reference's
        # samples are saved as they are done, so a killed run resumes at the next reference
        # the fallback key (no DVC hashes) covers every model read here: the policy's log-probs are saved too
        progress = claim_checkpoint_dir(CHECKPOINTS, result_params(params, RESUME_SECTIONS), params.seed,
                                        [TRAIN, Path(WARMUP), SNAPSHOTS, Path(POLICY)])
        samples = []
        for j, todo in sorted(jobs.items()):
            saved = progress / f"reference_{j}.jsonl"
            if saved.is_file():
                print(f"seppo_sample: resuming, reference {Path(refs[j]).name} already sampled")
                samples += read_jsonl(saved)
                continue
            tokenizer, model = load_pretrained(refs[j])
            gen = open_generator(refs[j], params.generation, cfg.batch_size, cfg.max_new_tokens, params.seed,
                                 loaded=(tokenizer, model))
            prompts = [prompt(rec["question"]) for rec, _ in todo]
            texts = [c.text for c in gen.generate(prompts, cfg.temperature, seed=params.seed + j,
                                                  desc=f"sample {Path(refs[j]).name}")]
            anchors = [anchor_completion(rec, t) for (rec, _), t in zip(todo, texts)]
            # whole sequences (this stage cannot know a trainer's max_length; seppo.pairs_dataset scores again the
            # pairs one cuts)
            ref_w, ref_r = preference_logps(model, tokenizer, prompts, anchors, texts, batch_size=cfg.batch_size,
                                            desc="ref log p(y_w), log p(y_ref)")
            verdicts = score_responses([rec for rec, _ in todo], [OWN_CHOICE] * len(todo), texts,
                                       sandbox_limits(params.sandbox), params.sandbox.workers)
            done = [{"id": rec["id"], "sample": k, "difficulty": rec["difficulty"], "question": rec["question"],
                     "prompt": p, "reference": refs[j], "anchor": a, "response": t, "ref_anchor_logp": lw,
                     "ref_response_logp": lr, "verifier_wins": v["correct"], "trajectory": v["trajectory"]}
                    for (rec, k), p, t, a, lw, lr, v in zip(todo, prompts, texts, anchors, ref_w, ref_r, verdicts)]
            atomic_write_text(saved, "".join(json.dumps(s) + "\n" for s in done))
            samples += done
            # before the next reference's engine opens: two vLLM engines would each claim gpu_memory_utilization
            del gen, model
            gc.collect()
        if not samples:
            raise DataError(f"{TRAIN}: no training prompts to sample for (seppo_sample.n_prompts={cfg.n_prompts})")
        # the anchor is the task's worked solution in the sample's trajectory, which is not always right: pot's brute
        # force of a huge repeated block runs out of CPU. A pair with an anchor that fails is no "winner" pair.
        by_id = {rec["id"]: rec for rec in records}
        anchors = sorted({(s["id"], s["anchor"]) for s in samples})

        def score_anchors() -> list[bool]:
            verdicts = score_responses([by_id[i] for i, _ in anchors], [OWN_CHOICE] * len(anchors),
                                       [a for _, a in anchors], sandbox_limits(params.sandbox), params.sandbox.workers)
            return [v["correct"] for v in verdicts]

        anchor_correct = dict(zip(anchors, saved_step(progress / "anchor_verdicts.json", "anchors scored",
                                                      score_anchors)))
        for s in samples:
            s["anchor_correct"] = anchor_correct[(s["id"], s["anchor"])]

        # 3. the policy's log-probs, then the anchor rule
        def policy_logps() -> dict[str, list[float]]:
            tokenizer, policy = load_pretrained(POLICY)
            prompts = [s["prompt"] for s in samples]
            anchor, response = preference_logps(policy, tokenizer, prompts, [s["anchor"] for s in samples],
                                                [s["response"] for s in samples], batch_size=cfg.batch_size,
                                                desc="policy log p(y_w), log p(y_ref)")
            return {"anchor": anchor, "response": response}

        logps = saved_step(progress / "policy_logps.json", "policy log-probs computed", policy_logps)
        pol_w, pol_r = logps["anchor"], logps["response"]
        for s, lw, lr in zip(samples, pol_w, pol_r):
            s["h_w"], s["h_r"] = lw - s["ref_anchor_logp"], lr - s["ref_response_logp"]
            s["anchor_wins"] = s["h_w"] < 0
        samples.sort(key=lambda s: (s["id"], s["sample"]))

        # 4. pairs by the chosen label, and the figures
        pairs, ties = training_pairs(samples, cfg.label), tie_pairs(samples, cfg.label)
        metrics = {"n_samples": len(samples), "n_pairs": len(pairs), "n_tie_pairs": len(ties), **agreement(samples),
                   "anchor_accuracy": sum(s["anchor_correct"] for s in samples) / len(samples),
                   "reference_accuracy_by_checkpoint": {
                       Path(r).name: round(sum(s["verifier_wins"] for s in samples if s["reference"] == r)
                                           / max(1, sum(s["reference"] == r for s in samples)), 4) for r in refs}}
        with atomic_dir(OUT) as tmp:
            (tmp / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples), encoding="utf-8")
            (tmp / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs), encoding="utf-8")
            (tmp / "tie_pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in ties), encoding="utf-8")
        atomic_write_json(METRICS, metrics)
        mlflow.log_metrics({k: v for k, v in metrics.items() if isinstance(v, (int, float))})
        mlflow.log_dict(metrics, "seppo_sample.json")
        print(f"seppo_sample: {len(samples)} samples, {len(pairs)} pairs, {len(ties)} tie pairs "
              f"({cfg.label} labels); reference accuracy {metrics['reference_accuracy']:.3f}, AAF flips {metrics['aaf_flip_rate']:.3f}, "
              f"AAF-verifier agreement {metrics['aaf_verifier_agreement']:.3f}")


if __name__ == "__main__":
    main()
