"""Before any test imports Prefect: this repository's Prefect home and an ephemeral-server start timeout that a
loaded CI machine can meet (the default 20 s is not always enough with Ray and training running beside it)."""
import pytest

from posttrain.orchestration import apply_prefect_settings

apply_prefect_settings()


@pytest.fixture
def restore_tracking_uri():
    """A test that points MLflow at its own store puts the tracking URI back afterwards."""
    import mlflow

    before = mlflow.get_tracking_uri()
    yield
    mlflow.set_tracking_uri(before)


def pytest_sessionfinish(session, exitstatus):
    """Stop Prefect's temporary server (started by the in-process flows of the sharded evaluation tests) while pytest's
    streams are open: left to its own atexit hook, it logs to a closed stream and every run ends in a traceback."""
    from prefect.logging.handlers import APILogWorker
    from prefect.server.api.server import SubprocessASGIServer

    APILogWorker.drain_all(timeout=30)  # the flows' queued log lines reach the server before it stops
    for server in list(SubprocessASGIServer._instances.values()):
        server.stop()
