"""Models for ``headcount profile``: the embedded default, local directories
and Hugging Face hub ids.

The default model is built from a config with random weights (the cost of
attention does not depend on the weights' values); ``--model DIR`` reads a
local directory (``config.json``, plus weights when present); ``--model
org/name`` is a hub id, fetched through transformers' own cache (``HF_HOME``,
``HF_HUB_CACHE``; ``HF_HUB_OFFLINE=1`` reads the cache only). A directory or
repository without weights gets random weights, and the description says so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from headcount.common.errors import HeadcountError

DEFAULT_MODEL = "default"

IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")

# the --dtype spellings → torch dtype names (looked up on torch when a model is loaded)
DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
          "bfloat16": "bfloat16", "bf16": "bfloat16"}

_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_WEIGHTS = re.compile(r"(^|/)(model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)(\.index\.json)?$")
# what a hub id looks like (huggingface_hub's own rule, without its length limit): name or org/name
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


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


@dataclass(frozen=True)
class ModelChoice:
    """A model resolved from ``--model`` without building it: its config
    (cheap to read) for checking the options, and how to build it.

    Attributes:
        spec: what the user passed (``None`` for the embedded default).
        config: the transformers config.
        cls: the model class to build.
        description: one line for the progress output and the run metadata.
        path: the local directory (``None`` for embedded and hub models).
        has_weights: the directory or hub repository holds weights (else random weights are used).
        repo: the Hugging Face hub id (``None`` unless ``spec`` is one).
        revision: the hub revision (branch, tag or commit; ``None``: the default branch).
    """

    spec: str | None
    config: object
    cls: type
    description: str
    path: Path | None = None
    has_weights: bool = False
    repo: str | None = None
    revision: str | None = None

    @property
    def max_positions(self) -> int | None:
        """Longest sequence the model's position embeddings allow (``None``: no limit, e.g. relative positions)."""
        c = self.config
        return getattr(c, "max_position_embeddings", None) or getattr(c, "n_positions", None)


def choose_model(spec: str | None, revision: str | None = None) -> ModelChoice:
    """Resolve ``--model`` to a config and a class, reading no weights.

    Args:
        spec: ``None``/``default``, a preset name, a local directory, or a
            Hugging Face hub id (``org/name``) when no such directory exists.
        revision: for a hub id: a branch, tag or commit (default: the repository's default branch).

    Raises:
        HeadcountError: the path is not a model directory or its config cannot
            be read; the hub id is unknown, not cached (offline), or unreachable.
    """
    import transformers
    from transformers import AutoConfig

    if spec in (None, DEFAULT_MODEL):
        return ModelChoice(spec, default_config(), transformers.LlamaForCausalLM,
                           "default (Llama, 4 layers, 8 query heads, 2 kv heads, random weights)")
    if spec in PRESETS:
        build, description = PRESETS[spec]
        return ModelChoice(spec, build(), transformers.BertForMaskedLM, description)
    path = Path(spec)
    if revision is not None and path.exists():
        raise HeadcountError(f"--revision {revision}: --model {spec} is a local directory, not a hub id", hint="drop --revision")
    if not path.exists():
        if _HUB_ID.match(spec) and not spec.startswith("."):
            return _hub_model(spec, revision)
        raise HeadcountError(f"--model {spec}: no such directory or embedded model",
                             hint=f"pass a local model directory, a hub id (org/name), one of {', '.join(PRESETS)}, "
                                  "or omit --model for the embedded default")
    if not path.is_dir() or not (path / "config.json").is_file():
        raise HeadcountError(f"--model {spec}: not a model directory (no config.json)", hint="pass a directory written by save_pretrained()")
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (ValueError, OSError, KeyError, json.JSONDecodeError) as exc:
        raise HeadcountError(f"--model {spec}: config.json cannot be read ({str(exc).splitlines()[0]})", hint="check that it is a transformers config") from exc
    cls = _model_class(config)
    has_weights = any((path / f).exists() for f in _WEIGHT_FILES)
    return ModelChoice(spec, config, cls, str(path), path, has_weights)


def _hub_model(repo: str, revision: str | None) -> ModelChoice:
    """A hub model's config (fetched into the hub cache, or read from it
    offline) and whether the repository has weights."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from transformers import AutoConfig

    offline = constants.HF_HUB_OFFLINE
    where = f"{repo}@{revision}" if revision else repo
    try:
        folder = Path(snapshot_download(repo, revision=revision, allow_patterns=["config.json"]))
        if offline:
            files = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
        else:
            from huggingface_hub import HfApi

            files = HfApi().list_repo_files(repo, revision=revision)
    except GatedRepoError as exc:
        raise HeadcountError(f"--model {where}: a gated hub repository you have no access to",
                             hint="accept its terms on huggingface.co and log in with `hf auth login`") from exc
    except RevisionNotFoundError as exc:
        raise HeadcountError(f"--model {repo}: no revision {revision!r} on the hub", hint="check --revision") from exc
    except RepositoryNotFoundError as exc:
        raise HeadcountError(f"--model {repo}: no such local directory, embedded model or hub model (or it is private)",
                             hint=f"check the id; a private model needs `hf auth login`; embedded: {', '.join(PRESETS)}") from exc
    except LocalEntryNotFoundError as exc:
        if offline:
            raise HeadcountError(f"--model {where}: no such local directory, and not in the Hugging Face cache "
                                 f"({constants.HF_HUB_CACHE}; HF_HUB_OFFLINE is set)",
                                 hint="download it once with network access (`hf download ID`), or unset HF_HUB_OFFLINE") from exc
        raise HeadcountError(f"--model {where}: no such local directory, the hub cannot be reached and the model is not in "
                             f"the Hugging Face cache ({constants.HF_HUB_CACHE})",
                             hint="check the network, or download it where there is one (`hf download ID`) and copy the cache") from exc
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise HeadcountError(f"--model {where}: cannot be fetched from the hub ({str(exc).splitlines()[0]})",
                             hint="check the id and the network, or pass a local directory") from exc
    if not (folder / "config.json").is_file():
        raise HeadcountError(f"--model {where}: the hub repository has no config.json", hint="pass a transformers model repository")
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except (ValueError, OSError, KeyError, json.JSONDecodeError) as exc:
        raise HeadcountError(f"--model {where}: its config.json cannot be read ({str(exc).splitlines()[0]})",
                             hint="check that it is a transformers model repository") from exc
    has_weights = any(_WEIGHTS.search(f) for f in files)
    return ModelChoice(repo, config, _model_class(config), where, None, has_weights, repo, revision)


def check_options(choice: ModelChoice, implementations, seq: int, device) -> None:
    """Check ``--impl`` and ``--seq`` against the model and ``--device``
    before anything is built or run.

    Args:
        device: the resolved ``torch.device``.

    Raises:
        HeadcountError: an implementation that cannot run on this device or
            this model, or a sequence longer than the model's positions.
    """
    limit = choice.max_positions
    if limit and seq > limit:
        raise HeadcountError(f"--seq {seq} exceeds the model's {limit} positions", hint=f"use --seq {limit} or less")
    from transformers import utils as hf_utils

    for impl in implementations:
        if impl not in IMPLEMENTATIONS:
            raise HeadcountError(f"--impl {impl}: unknown attention implementation", hint=f"choose from {', '.join(IMPLEMENTATIONS)}")
        if impl.startswith("flash_attention"):
            import torch

            if torch.device(device).type != "cuda":
                raise HeadcountError(f"--impl {impl} runs on a CUDA GPU only and --device is {device}",
                                     hint="use --impl eager,sdpa,flex_attention here, or --device cuda on a GPU machine")
            available = getattr(hf_utils, f"is_flash_attn_{impl[-1]}_available", lambda: False)
            if not available():
                package = "flash-attn" if impl.endswith("2") else "flash-attn 3 (flash_attn_interface)"
                raise HeadcountError(f"--impl {impl}: {package} is not installed", hint="install it, or choose another --impl")
        support = {"sdpa": "_supports_sdpa", "flex_attention": "_supports_flex_attn"}.get(impl)
        if impl.startswith("flash_attention"):
            support = "_supports_flash_attn"
        if support and getattr(choice.cls, support, True) is False:
            raise HeadcountError(f"--impl {impl}: {choice.cls.__name__} does not support it", hint="choose another --impl")


def load_model(spec: "str | ModelChoice | None", dtype: str = "float32", seed: int = 0, device=None):
    """Build the model to profile, on ``device``.

    Args:
        spec: ``None`` or ``"default"`` for the embedded default, a name of
            :data:`PRESETS` (``bert-base``, ``bert-tiny``), a local model
            directory, or a :class:`ModelChoice` already made by :func:`choose_model`.
        dtype: ``float32``, ``float16`` or ``bfloat16`` (aliases fp32/fp16/bf16).
        device: where parameters go (a ``torch.device`` or string; default cpu).

    Returns:
        ``(model, description)``; the model is in training mode with dropout off.

    Raises:
        HeadcountError: the path does not exist, is not a model directory, or cannot be loaded.
    """
    if dtype not in DTYPES:
        raise HeadcountError(f"unknown dtype {dtype!r}", hint=f"choose one of {', '.join(sorted(set(DTYPES)))}")
    import torch

    torch_dtype = getattr(torch, DTYPES[dtype])
    choice = spec if isinstance(spec, ModelChoice) else choose_model(spec)
    torch.manual_seed(seed)
    description = choice.description
    try:
        if choice.path is not None and choice.has_weights:
            model = choice.cls.from_pretrained(choice.path, local_files_only=True, dtype=torch_dtype)
            description = f"{choice.path} ({type(model).__name__})"
        elif choice.repo is not None and choice.has_weights:
            model = choice.cls.from_pretrained(choice.repo, revision=choice.revision, dtype=torch_dtype)
            description = f"{choice.description} ({type(model).__name__}, from the Hugging Face hub)"
        else:
            cls = choice.cls
            model = cls.from_config(choice.config) if hasattr(cls, "from_config") else cls(choice.config)
            if choice.path is not None:
                description = f"{choice.path} ({type(model).__name__}, no weights in the directory: random weights)"
            elif choice.repo is not None:
                description = f"{choice.description} ({type(model).__name__}, no weights in the hub repository: random weights)"
    except (ValueError, OSError, KeyError, RuntimeError) as exc:
        raise HeadcountError(f"--model {choice.spec}: cannot build the model ({str(exc).splitlines()[0]})", hint="check the directory's files") from exc
    model = model.to(device=torch.device(device) if device is not None else None, dtype=torch_dtype)
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
    if implementation.startswith("flash_attention") and next(model.parameters()).device.type != "cuda":
        raise HeadcountError(f"{implementation} needs the model on a CUDA GPU", hint="use --impl eager,sdpa here, or --device cuda")
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
    import torch

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
