"""TRL's GRPOConfig as the GRPO stages (``rlhf_routed``, ``rlvr_ar3po``) hand it to their trainers.

transformers' MLflow callback logs ``to_dict()`` of the training arguments as the run's params, and ``to_dict``
hides only fields named ``*_token``: a vLLM server URL holding its credentials (``http://user:key@host:8000``) went
to MLflow whole. Here it goes without them; the attribute keeps them, for TRL's client to connect with.

Example:
    >>> config = CredentialFreeGRPOConfig(output_dir="/tmp/x", use_cpu=True, bf16=False, use_vllm=True,
    ...                                   vllm_mode="server", vllm_server_base_url="http://u:key@host:8000")
    >>> config.to_dict()["vllm_server_base_url"], config.vllm_server_base_url
    ('http://***@host:8000', 'http://u:key@host:8000')
"""
from __future__ import annotations

from trl import GRPOConfig

from posttrain.tracking import without_credentials


class CredentialFreeGRPOConfig(GRPOConfig):
    """GRPOConfig whose serialised form (what MLflow and the checkpoints' trainer state record) has no credentials."""

    def to_dict(self):
        d = super().to_dict()
        d["vllm_server_base_url"] = without_credentials(d.get("vllm_server_base_url"))
        return d
