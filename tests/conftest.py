"""Before any test imports Prefect: this repository's Prefect home and an ephemeral-server start timeout that a
loaded CI machine can meet (the default 20 s is not always enough with Ray and training running beside it)."""
from posttrain.orchestration import apply_prefect_settings

apply_prefect_settings()


def pytest_sessionfinish(session, exitstatus):
    """Stop Prefect's temporary server (started by the in-process flows of the sharded evaluation tests) while pytest's
    streams are open: left to its own atexit hook, it logs to a closed stream and every run ends in a traceback."""
    from prefect.logging.handlers import APILogWorker
    from prefect.server.api.server import SubprocessASGIServer

    APILogWorker.drain_all(timeout=30)  # the flows' queued log lines reach the server before it stops
    for server in list(SubprocessASGIServer._instances.values()):
        server.stop()
