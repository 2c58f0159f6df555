"""dvc.yaml declares, for every stage, the code that decides its outputs: a change to a module a stage imports
(directly or through another) must re-run it. Found missing before: the verifier, which decides what is correct
in the DOTS search, the SePPO labels and the RLVR rewards, was a dep of evaluate alone."""
import ast
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
# Plumbing that cannot change a stage's numbers: params loading and validation, MLflow tracking, atomic writes,
# error types, JSONL reading, checkpoint bookkeeping and RNG snapshots for resuming, the Prefect/Ray runner, which
# rank of a multi-process launch writes.
# Declaring them would re-run the whole pipeline for a log-line change.
PLUMBING = {"posttrain/atomic.py", "posttrain/errors.py", "posttrain/params.py", "posttrain/params_schema.py",
            "posttrain/online_params.py", "posttrain/params_fields.py",
            "posttrain/tracking.py", "posttrain/jsonl.py", "posttrain/checkpoints.py", "posttrain/rng_state.py",
            "posttrain/orchestration.py", "posttrain/process_group.py"}
STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def module_file(name: str) -> Path | None:
    path = ROOT.joinpath(*name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def project_imports(path: Path) -> set[str]:
    """The posttrain / stages modules ``path`` imports (``from a import b`` counts a and a.b)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return {name for name in found if name.split(".")[0] in ("posttrain", "stages")}


def imported_files(start: Path) -> set[Path]:
    seen, todo = set(), [start]
    while todo:
        path = todo.pop()
        if path not in seen:
            seen.add(path)
            todo += [f for f in map(module_file, project_imports(path)) if f is not None]
    return seen


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_every_module_a_stage_imports_is_one_of_its_deps(stage):
    deps = [ROOT / d for d in STAGES[stage].get("deps", [])]
    files = {f for f in imported_files(ROOT / "stages" / f"{stage}.py") if f.name != "__init__.py"}
    missing = sorted(rel for f in files if (rel := str(f.relative_to(ROOT))) not in PLUMBING
                     and not any(f == d or d in f.parents for d in deps))
    assert not missing, f"dvc.yaml stage {stage!r} imports but does not declare: {missing}"
