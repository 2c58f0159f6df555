"""Building and loading the policy model: a scratch Llama with its own BPE tokenizer, or a pretrained one.

``model.base: scratch`` trains a byte-level BPE tokenizer (digits split one per token, so arithmetic
is learnable) on the training text and builds a small Llama-architecture causal LM; anything else is
a hub id or a local directory loaded with ``from_pretrained``. Either way the result is saved with
``save_pretrained``, so any Hugging Face tool or vLLM can load it.

Example:
    >>> tok = train_tokenizer(["Question: Compute 2 + 3.", "Answer: 5"], vocab_size=300)
    >>> model = build_llama(tok, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, max_position=128)
    >>> model.config.model_type
    'llama'
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import torch
from safetensors import SafetensorError
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from posttrain.errors import UserError
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

PAD, BOS, EOS = "<pad>", "<s>", "</s>"


def device_args(deepspeed: str | None = None) -> dict:
    """Device, precision and DeepSpeed arguments for every trainer config: fp32 on the CPU, bf16 on a GPU that
    has it, and the stage's DeepSpeed config (``<stage>.deepspeed`` in params.yaml) when one is set.

    TRL's configs default to ``bf16=True``; on a CPU without bf16 instructions (AMD EPYC here) autocast to
    bf16 runs a reference GEMM about 10x slower than fp32, and it would make CPU numbers differ by machine.
    """
    gpu = torch.cuda.is_available()
    # DeepSpeed brings its own accelerator: use_cpu would make the Trainer refuse it.
    return {"use_cpu": not gpu and not deepspeed, "bf16": gpu and torch.cuda.is_bf16_supported(), "deepspeed": deepspeed}


class ModelLoadError(UserError, RuntimeError):
    """A model or tokenizer directory is missing or unreadable; names the directory and the cause."""


def train_tokenizer(texts: Iterable[str], vocab_size: int, split_digits: bool = False) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on ``texts``; left padding (batched generation needs it).

    With ``split_digits`` every digit is its own token; otherwise BPE may merge frequent numbers into
    one token, which makes copying a number from the question a single lookup for a tiny model.
    """
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if split_digits else byte_level
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    # padding_side must be given to the constructor, or save_pretrained does not keep it.
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, padding_side="left",
    )


def build_llama(
    tokenizer: PreTrainedTokenizerFast, hidden_size: int, num_layers: int, num_heads: int,
    intermediate_size: int, max_position: int,
) -> LlamaForCausalLM:
    """A freshly initialised Llama sized for ``tokenizer`` (weights depend on torch's seed)."""
    if hidden_size % num_heads:
        raise ValueError(f"model.num_heads ({num_heads}) must divide model.hidden_size ({hidden_size})")
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
        max_position_embeddings=max_position, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def load_pretrained(path_or_id: str, dtype: torch.dtype = torch.float32):
    """Tokenizer and causal LM from a hub id or a directory, ready for batched generation."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(path_or_id, padding_side="left")
        model = AutoModelForCausalLM.from_pretrained(path_or_id, dtype=dtype)
    except (OSError, ValueError, EnvironmentError, SafetensorError) as e:
        hint = (" (a file there is damaged or cut short: re-run the stage that writes it, dvc repro --force <stage>)"
                if Path(path_or_id).exists() else " (not a local directory; hub downloads need network access)")
        raise ModelLoadError(f"cannot load model {path_or_id!r}{hint}: {str(e).splitlines()[0]}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return tokenizer, model


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct trainable parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
