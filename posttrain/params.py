"""Loading params.yaml: parsed with the schema in ``posttrain.params_schema``, validated strictly, and each problem
reported on one line::

    params.yaml: warmup.learning_rate: got 'fast', expected a number

Example:
    >>> p = load_params("params.yaml")   # doctest: +SKIP
    >>> p.warmup.max_steps               # doctest: +SKIP
    1500
"""
from __future__ import annotations

import difflib
import io
from collections.abc import Callable
from pathlib import Path
from typing import get_args, get_origin

from pydantic import BaseModel, ValidationError
from ruamel.yaml import YAML, YAMLError
from ruamel.yaml.comments import CommentedSeq

from posttrain.errors import UserError
from posttrain.params_schema import Params


class ParamsError(UserError, ValueError):
    """params.yaml is unreadable or invalid; the message names each bad key on its own line."""


_EXPECTED = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer", "float_type": "a number", "float_parsing": "a number",
    "string_type": "a string", "bool_type": "true or false", "list_type": "a list", "dict_type": "a mapping",
    "model_type": "a mapping", "missing": "a value (the key is missing)", "extra_forbidden": "no such key",
}


def _short(value: object, limit: int = 80) -> str:
    """A value's repr cut to ``limit`` characters: a misspelt section's whole contents made one line of hundreds."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _keys_beside(parts: list[str]) -> list[str]:
    """The keys the schema allows where ``parts`` (a key path) ends, for a did-you-mean; none below a free mapping."""
    model: type[BaseModel] | None = Params
    for name in parts[:-1]:
        field = model.model_fields.get(name) if model else None
        kinds = [field.annotation, *get_args(field.annotation)] if field else []
        model = next((k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)), None)
    return list(model.model_fields) if model else []


def _describe(err: dict) -> str:
    # Union members (e.g. 'int' in 'int | None') appear in loc; keep only the key path. A key that is not
    # plain printable text (a stray control character, say) is shown quoted so the message stays one line.
    parts = [str(p) for p in err["loc"] if not str(p).startswith(("function-", "literal["))
             and str(p) not in {"int", "float", "str", "list[str]", "JsonlFiles"}]
    loc = ".".join(p if p.isprintable() and p.strip() == p and p else repr(p) for p in parts)
    kind = err["type"]
    if kind == "missing":
        return f"{loc}: missing, expected a value"
    if kind == "extra_forbidden":
        known = difflib.get_close_matches(parts[-1], _keys_beside(parts), n=1) if parts else []
        hint = f"did you mean {known[0]!r}?" if known else "check the spelling against configs/params.smoke.yaml"
        return f"{loc}: unknown key (got {_short(err['input'])}); {hint}"
    if isinstance(err["input"], dict) or kind == "value_error":  # our own checks: their message says it all
        return f"{loc}: {err['msg'].removeprefix('Value error, ')}"
    expected = _EXPECTED.get(kind) or err["msg"].removeprefix("Input should be ").removeprefix("Value error, ")
    return f"{loc}: got {err['input']!r}, expected {expected}"


def _require_mapping(raw: object, source: str) -> None:
    if not isinstance(raw, dict):
        got = "nothing (the file is empty)" if raw is None else "a list" if isinstance(raw, list) else f"{raw!r:.60}"
        raise ParamsError(f"{source}: expected a mapping of sections at the top level, got {got}")


def parse_params(raw: object, source: str = "params.yaml") -> Params:
    """Validate an already-parsed mapping; raise ParamsError with one line per bad key."""
    _require_mapping(raw, source)
    try:
        return Params.model_validate(raw)
    except ValidationError as e:
        lines, seen = [], set()
        for err in e.errors():
            line = f"{source}: {_describe(err)}"
            if line not in seen:
                seen.add(line)
                lines.append(line)
        raise ParamsError("\n".join(lines)) from None


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate params.yaml; raise ParamsError (YAML syntax errors name line and column)."""
    path = Path(path)
    return parse_params(_parse_yaml(path, _read_text(path), read_yaml), str(path))


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if not Path("dvc.yaml").is_file():
            raise ParamsError(f"{path}: no such file (run from the repository root)") from None
        near = difflib.get_close_matches(str(path), [str(p) for p in path.parent.glob("*.y*ml")], n=1)
        raise ParamsError(f"{path}: no such file" + (f"; did you mean {near[0]}?" if near else "")) from None
    except UnicodeDecodeError as e:
        line = path.read_bytes()[:e.start].count(b"\n") + 1
        raise ParamsError(f"{path}:{line}: not UTF-8 text (byte {e.object[e.start]:#04x})") from None
    except OSError as e:  # a directory, a file we may not read
        raise ParamsError(f"{path}: cannot read it ({e.strerror or e})") from None


def _parse_yaml(path: Path, text: str, parse: Callable[[str], object]):
    try:
        return parse(text)
    except YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        raise ParamsError(f"{path}{where}: not valid YAML: {getattr(e, 'problem', None) or e}") from None
    except RecursionError:  # the parser recurses once per level of nesting
        raise ParamsError(f"{path}: not valid YAML: nested too deeply") from None
    except ValueError as e:  # a number Python will not read (an integer of more than 4,300 digits)
        raise ParamsError(f"{path}: not valid YAML: {e}") from None


def read_yaml(text: str):
    """YAML 1.2, as DVC reads params.yaml and writes ``dvc exp run -S`` values (ruamel): ``1e-05`` is a number and
    ``on`` or ``yes`` a string, where YAML 1.1 (PyYAML) reads a string and a boolean."""
    return YAML(typ="safe", pure=True).load(text)


def _round_trip_yaml() -> YAML:
    """ruamel's round-trip YAML as params.yaml is written: quotes, null and long comment lines kept."""
    rt = YAML()
    rt.preserve_quotes, rt.width = True, 4096
    rt.representer.add_representer(type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null"))
    return rt


def _flow_style(value: object) -> object:
    """A list written inline (``[8, 3]``), as params.yaml writes its lists."""
    if isinstance(value, list):
        seq = CommentedSeq(_flow_style(v) for v in value)
        seq.fa.set_flow_style()
        return seq
    return value


def _is_dict_parameter(path: list[str]) -> bool:
    """Whether the schema makes the key at ``path`` a mapping parameter (keys of the user's choosing, as
    ``judge.faults``) rather than a section (a fixed set of keys)."""
    model = Params
    for key in path:
        field = model.model_fields.get(key)
        if field is None:
            return False
        model = field.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return get_origin(model) is dict
    return False


def with_overrides(base: str | Path, overrides: dict[str, object] | None,
                   out: str | Path | None = "params.yaml") -> Params:
    """Write ``base`` (a params file) with dotted ``overrides`` (``{"rlhf.budget": 0.2}``) applied to ``out``,
    after validating the result; as ``dvc exp run --set-param`` does, the workspace's params.yaml changes.
    ``out=None`` only validates and returns them (a bench's command-line overrides).

    A key that names no existing parameter is an error naming it (a typo must not start a long run); a mapping
    parameter (``judge.faults.http_500``) may gain a key, which validation then checks. The file is rewritten
    round-trip, its comments (the one-line docs of the keys) and key order kept."""
    text = _read_text(Path(base))
    # parsed as load_params will parse it first: the round-trip parser keeps a tag that the safe one refuses
    _require_mapping(_parse_yaml(Path(base), text, read_yaml), str(base))
    raw = _round_trip_yaml().load(text)
    for dotted, value in (overrides or {}).items():
        *parents, leaf = dotted.split(".")
        node = raw
        for key in parents:
            if not isinstance(node.get(key), dict):
                raise ParamsError(f"override {dotted!r}: no section {key!r} in {base}")
            node = node[key]
        if leaf not in node and not _is_dict_parameter(parents):
            raise ParamsError(f"override {dotted!r}: no parameter {leaf!r} in {base}")
        node[leaf] = _flow_style(value)
    written = io.StringIO()
    _round_trip_yaml().dump(raw, written)
    params = parse_params(read_yaml(written.getvalue()), f"{base} with overrides {sorted(overrides or {})}")
    if out is None:
        return params
    tmp = Path(out).with_suffix(".yaml.tmp")
    tmp.write_text(written.getvalue(), encoding="utf-8")
    tmp.replace(out)
    return params


def flatten(section: BaseModel | dict, prefix: str = "") -> dict[str, object]:
    """``{'a': {'b': 1}}`` -> ``{'a.b': 1}``, for MLflow params."""
    data = section.model_dump() if isinstance(section, BaseModel) else section
    out: dict[str, object] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out
