"""What every params section shares: strict parsing, and the field types more than one section uses (a DeepSpeed
config file, an http(s) endpoint). The sections are in ``posttrain.params_schema`` and ``posttrain.online_params``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict


class Section(BaseModel):
    # allow_inf_nan=False: every float here (limits, rates, weights, probabilities) must be finite; YAML's .inf or
    # .nan passed the bounds that only look one way (gt=0 lets inf through) and crashed a stage later, naming no key
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


DEEPSPEED_DOC = ("a DeepSpeed JSON config for this trainer (configs/deepspeed/zero2.json, zero3.json; "
                 "zero1_cpu.json runs on a CPU); null = plain PyTorch")


def existing_json(path: str | None) -> str | None:
    """A DeepSpeed config path must name a readable JSON file (relative to the repository root)."""
    if path is not None:
        try:
            json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ValueError(f"{path!r} is not a readable JSON file ({type(e).__name__})") from None
    return path


DeepSpeedConfig = Annotated[str | None, AfterValidator(existing_json)]


def http_url(url: str | None) -> str | None:
    """An endpoint must be an http:// or https:// URL with a host, and a port (if any) in 1-65535."""
    if url is not None:
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:  # not a number, or past 65535
            port = 0
        # not quoted: the URL may hold credentials
        if url != url.strip() or parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
            raise ValueError("expected an http:// or https:// URL with a host and, if given, a port in 1-65535 "
                             "(e.g. http://127.0.0.1:8000/v1)")
    return url
