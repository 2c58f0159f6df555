"""Which CPU kernels decide the pipeline's float results: the same training steps run under each kernel setting,
in fresh processes (the settings are read when torch loads), and the bits compared.

On x86, torch picks its SIMD kernels (``ATEN_CPU_CAPABILITY``), and MKL and oneDNN pick theirs
(``MKL_ENABLE_INSTRUCTIONS``, ``DNNL_MAX_CPU_ISA``), by what the CPU offers, so a machine with AVX-512 sums in
another order than one with AVX2 only and its weights part from the other's within tens of steps. Capping all
three at AVX2 makes an AVX-512 machine compute what an AVX2-only one does.

    python3 bench/cpu_numerics.py [--steps 30] [--out reports/bench/cpu_numerics.json] [--reference other.json]

Each setting trains the pipeline's base model (models/base, else a fresh one of params.yaml's ``model`` size, seeded)
for --steps AdamW steps on seeded random token batches at the pipeline's thread count, and reports a hash of its
final weights, the first step whose loss differs bit for bit from the default setting's, and the largest weight
difference. --out keeps the hashes; run it on another machine with --reference <that file> to see which setting
reproduces the first machine's bits (equal hashes: `dvc repro` there gives the same bytes).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from posttrain.tracking import KERNEL_CAPS, cpu_model

SETTINGS = {
    "default": {},
    "aten_avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "all_avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2"},
}

_CHILD = r"""
import hashlib, json, sys
import torch, yaml
from transformers import LlamaConfig, LlamaForCausalLM
steps, weights_out = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
try:
    model = LlamaForCausalLM.from_pretrained("models/base")
except OSError:  # no pipeline run here: a fresh model of the configured size
    m = yaml.safe_load(open("params.yaml"))["model"]
    model = LlamaForCausalLM(LlamaConfig(vocab_size=m["vocab_size"], hidden_size=m["hidden_size"],
        intermediate_size=m["intermediate_size"], num_hidden_layers=m["num_layers"], num_attention_heads=m["num_heads"],
        num_key_value_heads=m["num_heads"], max_position_embeddings=m["max_position"], tie_word_embeddings=True))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
gen = torch.Generator().manual_seed(0)
losses = []
for _ in range(steps):
    batch = torch.randint(0, model.config.vocab_size, (8, 128), generator=gen)
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item().hex())
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
torch.save(flat, weights_out)
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
                  "losses": losses, "weights_sha256": hashlib.sha256(flat.numpy().tobytes()).hexdigest()}))
"""


def run_setting(env_vars: dict, steps: int, weights_out: str) -> dict:
    """One fresh interpreter under ``env_vars`` (the kernel variables not named are unset)."""
    env = {k: v for k, v in os.environ.items() if k not in KERNEL_CAPS} | env_vars
    done = subprocess.run([sys.executable, "-c", _CHILD, str(steps), weights_out], env=env, capture_output=True,
                          text=True, check=False)
    if done.returncode:
        raise SystemExit(f"setting {env_vars}: the child failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", type=Path, default=Path("reports/bench/cpu_numerics.json"))
    ap.add_argument("--reference", type=Path, help="another machine's --out, to compare hashes with")
    args = ap.parse_args()
    reference = json.loads(args.reference.read_text()) if args.reference else None
    if reference and reference["steps"] != args.steps:
        ap.error(f"--reference {args.reference} ran {reference['steps']} steps: pass --steps {reference['steps']}")
    import torch  # only the parent's: each setting's torch loads in its own process

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, env in SETTINGS.items():
            results[name] = run_setting(env, args.steps, f"{tmp}/{name}.pt")
            results[name]["env"] = env
        base = torch.load(f"{tmp}/default.pt")
        for name, r in results.items():
            other = torch.load(f"{tmp}/{name}.pt")
            r["max_abs_weight_diff_vs_default"] = float((other - base).abs().max())
            differ = [i + 1 for i, (a, b) in enumerate(zip(r["losses"], results["default"]["losses"])) if a != b]
            r["first_loss_differing_from_default"] = differ[0] if differ else None
    cpu = cpu_model()
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    report = {"cpu": cpu, "avx512": " avx512f" in flags, "amx": " amx_tile" in flags, "steps": args.steps,
              "torch": torch.__version__, "settings": results}

    print(f"{cpu} (avx512 {report['avx512']}, amx {report['amx']}), torch {torch.__version__}, {args.steps} steps")
    print(f"{'setting':<10} {'kernels':<8} {'threads':>7} {'weights sha256':<16} {'1st loss != default':>19} "
          f"{'max |dw| vs default':>19}" + ("  same bits as reference" if reference else ""))
    for name, r in results.items():
        same = ""
        if reference:
            ref = reference["settings"].get(name, {}).get("weights_sha256")
            same = f"  {ref == r['weights_sha256']} ({reference['cpu']})"
        first = r["first_loss_differing_from_default"]
        print(f"{name:<10} {r['capability']:<8} {r['threads']:>7} {r['weights_sha256'][:16]:<16} "
              f"{'none' if first is None else first:>19} {r['max_abs_weight_diff_vs_default']:>19.3g}{same}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
