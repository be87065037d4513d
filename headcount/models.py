"""Models for ``headcount profile``: the embedded default and local directories.

No hub access: the default model is built from a config with random weights
(the cost of attention does not depend on the weights' values), and
``--model DIR`` reads a local directory (``config.json``, plus weights when
present).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from headcount.errors import HeadcountError

DEFAULT_MODEL = "default"

IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}

_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def default_config():
    """The embedded default: a small Llama with grouped-query attention
    (8 query heads sharing 2 key/value heads, 4 layers, head dim 32), sized so
    that a full ``headcount profile`` runs in well under a minute on 2 CPU cores."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=2048, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
        attention_dropout=0.0, tie_word_embeddings=False,
    )


def bert_config(size: str = "base"):
    """BERT configs for comparisons and the GPU check: ``base`` is bert-base
    (12 layers, 12 heads of 64, hidden 768); ``tiny`` has 2 layers of 2 heads
    of 32 (seconds on a CPU)."""
    from transformers import BertConfig

    if size == "base":
        return BertConfig(attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)
    return BertConfig(vocab_size=2048, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                      max_position_embeddings=512, attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)


# embedded models (random weights, no download): name → (builder, description)
PRESETS = {
    "bert-base": (lambda: bert_config("base"), "bert-base (BertForMaskedLM, 12 layers, 12 heads, random weights)"),
    "bert-tiny": (lambda: bert_config("tiny"), "bert-tiny (BertForMaskedLM, 2 layers, 2 heads, random weights)"),
}


def _model_class(config):
    import transformers

    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    if getattr(config, "is_encoder_decoder", False):
        return transformers.AutoModelForSeq2SeqLM
    for auto in (transformers.AutoModelForCausalLM, transformers.AutoModelForMaskedLM):
        if type(config) in auto._model_mapping:
            return auto
    return transformers.AutoModel


def load_model(spec: str | None, dtype: str = "float32", seed: int = 0):
    """Build the model to profile.

    Args:
        spec: ``None`` or ``"default"`` for the embedded default, a name of
            :data:`PRESETS` (``bert-base``, ``bert-tiny``), else a local model directory.
        dtype: ``float32``, ``float16`` or ``bfloat16`` (aliases fp32/fp16/bf16).

    Returns:
        ``(model, description)``; the model is in training mode with dropout off.

    Raises:
        HeadcountError: the path does not exist, is not a model directory, or cannot be loaded.
    """
    if dtype not in DTYPES:
        raise HeadcountError(f"unknown dtype {dtype!r}", hint=f"choose one of {', '.join(sorted(set(DTYPES)))}")
    torch_dtype = DTYPES[dtype]
    torch.manual_seed(seed)
    from transformers import AutoConfig

    if spec in (None, DEFAULT_MODEL):
        config = default_config()
        from transformers import LlamaForCausalLM

        model = LlamaForCausalLM(config)
        description = "default (Llama, 4 layers, 8 query heads, 2 kv heads, random weights)"
    elif spec in PRESETS:
        from transformers import BertForMaskedLM

        build, description = PRESETS[spec]
        model = BertForMaskedLM(build())
    else:
        path = Path(spec)
        if not path.exists():
            raise HeadcountError(f"--model {spec}: no such directory or embedded model",
                                 hint=f"pass a local model directory, one of {', '.join(PRESETS)}, or omit --model for the embedded default")
        if not path.is_dir() or not (path / "config.json").is_file():
            raise HeadcountError(f"--model {spec}: not a model directory (no config.json)", hint="pass a directory written by save_pretrained()")
        try:
            config = AutoConfig.from_pretrained(path, local_files_only=True)
        except (ValueError, OSError, KeyError, json.JSONDecodeError) as exc:
            raise HeadcountError(f"--model {spec}: config.json cannot be read ({str(exc).splitlines()[0]})", hint="check that it is a transformers config") from exc
        cls = _model_class(config)
        has_weights = any((path / f).exists() for f in _WEIGHT_FILES)
        try:
            if has_weights:
                model = cls.from_pretrained(path, local_files_only=True, dtype=torch_dtype)
                description = f"{path} ({type(model).__name__})"
            else:
                model = cls.from_config(config) if hasattr(cls, "from_config") else cls(config)
                description = f"{path} ({type(model).__name__}, no weights in the directory: random weights)"
        except (ValueError, OSError, KeyError, RuntimeError) as exc:
            raise HeadcountError(f"--model {spec}: cannot build the model ({str(exc).splitlines()[0]})", hint="check the directory's files") from exc
    model = model.to(torch_dtype)
    for module in model.modules():  # dropout off: profiles of identical steps stay comparable
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    model.train()
    return model, description


def set_implementation(model, implementation: str) -> None:
    """Switch the model's attention implementation.

    Raises:
        HeadcountError: the implementation is unknown or cannot run on this machine.
    """
    if implementation not in IMPLEMENTATIONS:
        raise HeadcountError(f"unknown attention implementation {implementation!r}", hint=f"choose from {', '.join(IMPLEMENTATIONS)}")
    if implementation.startswith("flash_attention") and not torch.cuda.is_available():
        raise HeadcountError(f"{implementation} needs a CUDA GPU and this machine has none", hint="use --impl eager,sdpa here")
    try:
        model.set_attn_implementation(implementation)
    except (ImportError, ValueError) as exc:
        raise HeadcountError(f"{implementation} is not available: {str(exc).splitlines()[0][:200]}", hint="choose another --impl") from exc


def make_inputs(model, batch: int, seq: int, seed: int = 0) -> dict:
    """Random token ids (and labels) for one training step of ``model``."""
    config = model.config
    vocab = getattr(config, "vocab_size", None) or 1000
    max_pos = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if max_pos and seq > max_pos:
        raise HeadcountError(f"--seq {seq} exceeds the model's {max_pos} positions", hint=f"use --seq {max_pos} or less")
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen).to(device)
    inputs = {"input_ids": ids, "labels": ids.clone()}
    if getattr(config, "is_encoder_decoder", False) and getattr(config, "decoder_start_token_id", None) is None:
        config.decoder_start_token_id = getattr(config, "pad_token_id", None) or 0
    return inputs


def config_dict(model) -> dict:
    """The model config as a plain dict (for the run metadata)."""
    try:
        return model.config.to_diff_dict()
    except Exception:  # noqa: BLE001 - metadata must never fail a run
        return {"model_type": getattr(model.config, "model_type", None)}
