"""Before any test imports Prefect: this repository's Prefect home and an ephemeral-server start timeout that a
loaded CI machine can meet (the default 20 s is not always enough with Ray and training running beside it)."""
from posttrain.orchestration import apply_prefect_settings

apply_prefect_settings()
