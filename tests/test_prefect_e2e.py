"""End to end with Prefect: the pipeline flow in-process and against a `prefect server` on loopback, and a
deployment run created through the API (as the UI's Run button does)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

from smoke_workspace import STAGES, mlflow_runs, run, smoke_env, smoke_repo

pytestmark = pytest.mark.e2e


def test_prefect_flow_runs_the_pipeline(tmp_path):
    repo = smoke_repo(tmp_path)
    out = run([sys.executable, "-m", "flows.pipeline"], repo)
    assert "warmup: test accuracy" in out
    runs = mlflow_runs(repo)
    (parent,) = [r for r in runs if r.data.tags["posttrain.stage"] == "pipeline"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.data.tags["posttrain.stage"] for r in children) == sorted(STAGES)
    assert parent.info.status == "FINISHED" and "warmup.accuracy" in parent.data.metrics

    # Against a `prefect server start` on loopback: the flow run is recorded there, every stage skipped.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = smoke_env(tmp_path)
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                               "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    api = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if urllib.request.urlopen(f"{api}/health", timeout=2).status == 200:
                    break
            except OSError:
                time.sleep(1)
        env["PREFECT_API_URL"] = api
        proc = subprocess.run([sys.executable, "-m", "flows.pipeline"], cwd=repo, env=env, capture_output=True,
                              text=True, timeout=600)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-3000:]
        assert out.count("unchanged, skipped") == len(STAGES)
        flow_runs = api_call(f"{api}/flow_runs/filter", {"flows": {"name": {"any_": ["posttrain-pipeline"]}}})
        # the server shares Prefect's state in the workspace: it shows the earlier ephemeral run too (the
        # evaluate stage's own shard flow runs are not counted here)
        assert [r["state_type"] for r in flow_runs] == ["COMPLETED", "COMPLETED"]
        check_deployment_runs_from_the_api(repo, env, api)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def _server_busy(exc: BaseException) -> bool:
    """A Prefect server on a loaded machine answers 503 (its database timed out) or 429; it recovers."""
    return isinstance(exc, urllib.error.HTTPError) and exc.code in (429, 502, 503)


@retry(retry=retry_if_exception(_server_busy), wait=wait_exponential(max=10), stop=stop_after_delay(120),
       reraise=True)
def api_call(url: str, body: dict | None = None, method: str = "POST"):
    req = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method=method,
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=10).read())


def check_deployment_runs_from_the_api(repo: Path, env: dict, api: str) -> None:
    """`flows.serve` registers the deployments; a run created through the API (as the UI's Run button does)
    with parameters is picked up by the serving process and completes."""
    serving = subprocess.Popen([sys.executable, "-m", "flows.serve", "--cron", ""], cwd=repo, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline, deployment = time.time() + 120, None
        while deployment is None and time.time() < deadline:
            found = [d for d in api_call(f"{api}/deployments/filter") if d["name"] == "default"]
            deployment = found[0] if found else time.sleep(1)
        assert deployment is not None, "the deployment never registered"
        # the idempotency key makes a retried POST (a 503 after the run was created) return that run, not a second
        run = api_call(f"{api}/deployments/{deployment['id']}/create_flow_run",
                       {"parameters": {"stages": ["prepare", "base_model"], "overrides": {"prepare.n_dev": 12}},
                        "idempotency_key": f"test-run-{uuid.uuid4()}"})
        deadline, state = time.time() + 300, None
        while time.time() < deadline and state not in ("COMPLETED", "FAILED", "CRASHED"):
            time.sleep(2)
            state = api_call(f"{api}/flow_runs/{run['id']}", method="GET")["state_type"]
        assert state == "COMPLETED", state
        assert yaml.safe_load((repo / "params.yaml").read_text())["prepare"]["n_dev"] == 12  # the override applied
    finally:
        os.killpg(serving.pid, signal.SIGTERM)
        serving.wait(timeout=30)
