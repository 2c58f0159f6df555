"""Joining bench results written apart (seeds or variants run in parallel processes) into one file."""
from __future__ import annotations

import json
from pathlib import Path


def join_results(paths: list[Path], out: Path, sft_key: str) -> tuple[dict, list[dict]]:
    """(sft, runs) of every file in ``paths``, also written to ``out``; refuses files whose runs started from SFT
    policies of different test accuracy (``sft_key`` names that record in the files), which do not compare."""
    parts = [json.loads(p.read_text()) for p in paths]
    sft, runs = parts[0][sft_key], [r for part in parts for r in part["runs"]]
    for p, part in zip(paths, parts):
        if part[sft_key]["accuracy"] != sft["accuracy"]:
            raise SystemExit(f"{p}: started from a policy with test accuracy {part[sft_key]['accuracy']:.3f}, "
                             f"{paths[0]} from {sft['accuracy']:.3f}; runs from different SFT policies do not compare")
    out.write_text(json.dumps({sft_key: sft, "runs": runs}, indent=1))
    return sft, runs
