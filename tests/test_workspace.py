"""The kill-and-resume checks: killing a command's whole process group at a chosen moment, finding a damaged DVC
cache, finding output files that do not parse."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import matplotlib
import torch
import yaml
from safetensors.torch import save_file

from posttrain.workspace import damaged_cache_objects, invalid_outputs, run_and_kill

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _cache_object(repo: Path, content: bytes, suffix: str = "") -> str:
    md5 = hashlib.md5(content).hexdigest()
    path = repo / ".dvc/cache/files/md5" / md5[:2] / (md5[2:] + suffix)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return md5 + suffix


def _repo_with_cache(tmp_path: Path) -> tuple[Path, str, str]:
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"s": {"cmd": "x", "outs": ["out", "f.txt"],
                                                                     "metrics": [{"m.json": {"cache": False}}]}}}))
    inner = _cache_object(tmp_path, b"weights")
    manifest = _cache_object(tmp_path, json.dumps([{"md5": inner, "relpath": "w.bin"}]).encode(), ".dir")
    single = _cache_object(tmp_path, b"text\n")
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump({"schema": "2.0", "stages": {"s": {"cmd": "x", "outs": [
        {"path": "out", "md5": manifest}, {"path": "f.txt", "md5": single}, {"path": "m.json", "md5": "0" * 32}]}}}))
    return tmp_path, inner, single


def test_a_whole_cache_has_no_findings(tmp_path):
    repo, _, _ = _repo_with_cache(tmp_path)
    assert damaged_cache_objects(repo) == []  # m.json is not cached (cache: false), so its absence is fine


def test_a_cut_short_object_a_leftover_temporary_and_a_missing_object_are_each_found(tmp_path):
    repo, inner, single = _repo_with_cache(tmp_path)
    cut = repo / ".dvc/cache/files/md5" / inner[:2] / inner[2:]
    cut.write_bytes(b"wei")
    (cut.parent / "tmp-8f3a.partial").write_bytes(b"")
    (repo / ".dvc/cache/files/md5" / single[:2] / single[2:]).unlink()
    problems = damaged_cache_objects(repo)
    assert any("does not match its hash" in p and inner[2:] in p for p in problems)
    assert any("not a cache object" in p and "tmp-8f3a.partial" in p for p in problems)
    assert any(p.startswith("s: f.txt has no cache object") for p in problems)
    assert len(problems) == 3


def test_invalid_outputs_names_each_file_that_does_not_parse(tmp_path):
    (tmp_path / "ok.jsonl").write_text('{"a": 1}\n')
    (tmp_path / "cut.jsonl").write_text('{"a": 1}\n{"a": ')
    (tmp_path / "cut.json").write_text('{"a": [1, 2')
    save_file({"w": torch.zeros(64)}, str(tmp_path / "model.safetensors"))
    whole = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(whole[: len(whole) - 100])
    torch.save({"x": 1}, tmp_path / "optimizer.pt")
    (tmp_path / "cut.pt").write_bytes((tmp_path / "optimizer.pt").read_bytes()[:50])
    plt.figure().savefig(tmp_path / "plot.png")
    (tmp_path / "cut.png").write_bytes((tmp_path / "plot.png").read_bytes()[:200])
    bad = invalid_outputs([tmp_path])
    assert sorted(Path(b.split(":")[0]).name for b in bad) == ["cut.json", "cut.jsonl", "cut.png", "cut.pt",
                                                                "cut.safetensors"]


def test_run_and_kill_kills_the_whole_process_group_at_the_chosen_moment(tmp_path):
    pidfile = tmp_path / "child.pid"
    script = ("import os, subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              f"open({str(pidfile)!r}, 'w').write(str(child.pid))\n"
              "time.sleep(60)\n")
    ran = run_and_kill([sys.executable, "-c", script], tmp_path, dict(os.environ), lambda _: pidfile.exists())
    assert ran.killed and ran.returncode is None and ran.seconds < 30
    child = int(pidfile.read_text())
    for _ in range(50):  # the grandchild went with the group (it may linger briefly as a zombie of init)
        try:
            os.kill(child, 0)
            state = Path(f"/proc/{child}/stat").read_text().split()[2]
        except (ProcessLookupError, FileNotFoundError):
            break
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"child {child} survived the kill")


def test_run_and_kill_reports_a_command_that_exits_first(tmp_path):
    ran = run_and_kill([sys.executable, "-c", "raise SystemExit(3)"], tmp_path, dict(os.environ), lambda _: False)
    assert not ran.killed and ran.returncode == 3


def test_a_workspace_copy_takes_names_with_spaces_and_non_ascii(tmp_path):
    from posttrain.workspace import clone_workspace

    src, dest = tmp_path / "src", tmp_path / "dest"
    (src / "user_data").mkdir(parents=True)
    names = ["plain.txt", "user_data/user data.jsonl", "é.txt"]
    for name in names:
        (src / name).write_text(name)
    subprocess.run(["git", "init", "-q"], cwd=src, check=True)
    dest.mkdir()
    clone_workspace(src, dest)
    assert all((dest / name).read_text() == name for name in names)  # only plain.txt came across
