"""Atomic outputs: readable like any file the user writes, and nothing half-done left behind on a failure."""
import json
import os
import stat

import pytest

from posttrain.atomic import atomic_dir, atomic_write_json


@pytest.fixture(params=[0o022, 0o027])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_outputs_take_the_users_umask_not_a_private_mode(tmp_path, umask):
    atomic_write_json(tmp_path / "metrics.json", {"accuracy": 0.5})
    with atomic_dir(tmp_path / "model") as d:
        (d / "config.json").write_text("{}")
    assert mode(tmp_path / "metrics.json") == 0o666 & ~umask
    assert mode(tmp_path / "model") == 0o777 & ~umask


def test_a_failed_directory_build_keeps_the_old_one_and_leaves_no_temporary(tmp_path):
    with atomic_dir(tmp_path / "model") as d:
        (d / "weights").write_text("old")
    with pytest.raises(RuntimeError), atomic_dir(tmp_path / "model") as d:
        (d / "weights").write_text("half")
        raise RuntimeError("killed mid-save")
    assert (tmp_path / "model" / "weights").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_rewrite_replaces_the_file_and_leaves_no_temporary(tmp_path):
    atomic_write_json(tmp_path / "state.json", {"step": 1})
    atomic_write_json(tmp_path / "state.json", {"step": 2})
    assert (tmp_path / "state.json").read_text() == '{\n  "step": 2\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_swap_cut_between_its_two_renames_is_undone_by_the_next_write(tmp_path, monkeypatch):
    import posttrain.atomic

    with atomic_dir(tmp_path / "model") as d:
        (d / "weights").write_text("old")
    renames = []

    def cut_after_one(src, dst):  # the process dies after moving the old directory aside
        if renames:
            raise KeyboardInterrupt("killed")
        renames.append(src)
        os.rename(src, dst)
    monkeypatch.setattr(posttrain.atomic.os, "replace", cut_after_one)
    with pytest.raises(KeyboardInterrupt), atomic_dir(tmp_path / "model") as d:
        (d / "weights").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".model.old"]  # no temporary left
    monkeypatch.undo()
    with pytest.raises(RuntimeError), atomic_dir(tmp_path / "model") as d:
        raise RuntimeError("the next build fails too")
    assert (tmp_path / "model" / "weights").read_text() == "old"


def test_a_kill_while_the_old_directory_is_removed_never_brings_half_of_it_back(tmp_path, monkeypatch):
    import shutil

    import posttrain.atomic

    with atomic_dir(tmp_path / "model") as d:
        for name in ("config", "weights"):
            (d / name).write_text("v1")

    rmtree = shutil.rmtree

    def killed_midway(path, ignore_errors=False):  # removing the old directory: one file gone, then the process dies
        if ".model.old" not in str(path) or not os.path.isdir(path):
            return rmtree(path, ignore_errors=ignore_errors)
        os.unlink(min(p.path for p in os.scandir(path)))
        raise KeyboardInterrupt("killed")
    monkeypatch.setattr(posttrain.atomic.shutil, "rmtree", killed_midway)
    with pytest.raises(KeyboardInterrupt), atomic_dir(tmp_path / "model") as d:
        (d / "weights").write_text("v2")
    monkeypatch.undo()
    assert (tmp_path / "model" / "weights").read_text() == "v2"  # the swap itself was done
    shutil.rmtree(tmp_path / "model")  # DVC removes a stage's outputs before it runs the stage again
    with pytest.raises(RuntimeError), atomic_dir(tmp_path / "model"):
        raise RuntimeError("the re-run fails")
    assert not (tmp_path / "model").exists()  # was the half-deleted v1: config gone, weights v1


def test_json_is_strict_an_undefined_figure_is_null(tmp_path):
    """A NaN (a Spearman on a constant column) must not make the metrics file unreadable to strict parsers."""
    path = tmp_path / "metrics.json"
    atomic_write_json(path, {"spearman": float("nan"), "curve": [0.5, float("inf")], "by": {"d1": -float("inf")},
                             "accuracy": 0.75})

    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    assert json.loads(path.read_text(), parse_constant=refuse) == {
        "spearman": None, "curve": [0.5, None], "by": {"d1": None}, "accuracy": 0.75}


def test_only_rank_0_of_a_multi_process_launch_writes(tmp_path, monkeypatch):
    """Every rank runs the stage's writes; a rank other than 0 builds in a throwaway directory and keeps nothing."""
    with atomic_dir(tmp_path / "model") as d:
        (d / "weights").write_text("rank 0's")
    monkeypatch.setenv("RANK", "1")
    atomic_write_json(tmp_path / "metrics.json", {"accuracy": 0.5})
    with atomic_dir(tmp_path / "model") as d:
        assert d.parent != tmp_path
        (d / "weights").write_text("rank 1's")
    thrown_away = d
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    assert (tmp_path / "model" / "weights").read_text() == "rank 0's" and not thrown_away.exists()
    monkeypatch.setenv("RANK", "0")
    atomic_write_json(tmp_path / "metrics.json", {"accuracy": 0.5})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "model"]


KILLED_MID_BUILD = """
import os, signal, sys
from pathlib import Path
from posttrain.atomic import atomic_dir
with atomic_dir(Path(sys.argv[1]) / "model") as d:
    (d / "weights").write_bytes(b"x" * 4096)
    os.kill(os.getpid(), signal.SIGKILL)  # as a kill while a stage saves its model
"""


def test_a_build_killed_midway_leaves_no_temporary_after_the_next_write(tmp_path):
    """A SIGKILL while a directory was built left its hidden temporary (a whole model, for a hub model gigabytes) beside
    the output for ever: each kill during a save cost another copy of the disk, until it was full."""
    import subprocess
    import sys

    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", KILLED_MID_BUILD, str(tmp_path)], capture_output=True, timeout=120)
        assert done.returncode == -9, done.stderr[-2000:]
    assert len(list(tmp_path.iterdir())) == 1  # the second build removed the first's temporary; its own is left
    (tmp_path / "other").mkdir()  # another output's files are not ours to remove
    (tmp_path / ".other.0123456789ab.tmp").mkdir()
    with atomic_dir(tmp_path / "model") as d:
        (d / "weights").write_text("whole")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.0123456789ab.tmp", "model", "other"]
    assert (tmp_path / "model" / "weights").read_text() == "whole"
