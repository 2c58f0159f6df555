"""Joining bench results written apart (seeds or variants run in parallel processes) into one file."""
from __future__ import annotations

import json
from pathlib import Path


def join_results(paths: list[Path], out: Path, sft_key: str) -> tuple[dict, list[dict]]:
    """(sft, runs) of every file in ``paths``, also written to ``out``; refuses files tested on different test sets
    (``--extra-test``) or whose runs started from SFT policies of different test accuracy (``sft_key`` names that
    record in the files), which do not compare. A run found in two files (a merged file joined again with its
    parts) is kept once, so no seed counts twice."""
    parts = [json.loads(p.read_text()) for p in paths]
    sft = parts[0][sft_key]
    runs = list({json.dumps(r, sort_keys=True): r for part in parts for r in part["runs"]}.values())
    if dropped := sum(len(part["runs"]) for part in parts) - len(runs):
        print(f"merge: {dropped} run(s) found in more than one file, kept once")
    for p, part in zip(paths, parts):
        sizes = part[sft_key].get("test_questions"), sft.get("test_questions")  # older files did not record it
        if all(sizes) and sizes[0] != sizes[1]:  # --extra-test: another test set
            raise SystemExit(f"{p}: tested on {sizes[0]} questions, {paths[0]} on {sizes[1]}; runs on different "
                             "test sets do not compare")
        if part[sft_key]["accuracy"] != sft["accuracy"]:
            raise SystemExit(f"{p}: started from a policy with test accuracy {part[sft_key]['accuracy']:.3f}, "
                             f"{paths[0]} from {sft['accuracy']:.3f}; runs from different SFT policies do not compare")
    out.write_text(json.dumps({sft_key: sft, "runs": runs}, indent=1))
    return sft, runs
