"""How far back a real model can still look: a passkey probe and a copy probe in one prompt.

Chapter "A real model past its window". The passkey prompt has the shape of Landmark Attention's
(Mohtashami and Jaggi, 2023), also used by PI and YaRN: an instruction, repeated filler sentences,
the key sentence at a chosen depth, more filler, then the question. It is scored teacher-forced:
one forward pass gives the log-probability of the key's tokens after the question, and the key
counts as retrieved when every one of its tokens is the model's top prediction (what greedy
decoding would print). No ``generate``: no rotated keys in a cache, which dynamic scaling would
get wrong (transformers issue #25104).

The copy probe rides in the same prompt: a span of random tokens placed right after the key
sentence is repeated at the very end. Its loss on the second copy (first token excluded) falls
to near zero when the model can attend back to the first copy, the distance d tokens earlier,
and stays near the loss of random tokens (about ln 49,152 = 10.8 nats) when it cannot: a graded
measure where the passkey is all or nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rope_tutor import _checks

__all__ = ["Prompt", "build_prompt", "score_prompt"]

INSTRUCTION = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
    "them. I will quiz you about the important information there."
)
FILLER = (
    " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
)
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"


@dataclass(frozen=True)
class Prompt:
    """A passkey-and-copy prompt as token ids, with where its scored parts are.

    ``ids`` int64 ``(length,)``; ``answer``, ``copy`` and ``first_copy`` are slices of ``ids``
    (the key's tokens after the question, the second and the first copy of the random span);
    ``distance`` is the number of tokens from the key sentence's start to the question's end;
    ``key`` the passkey's digits.
    """

    ids: torch.Tensor
    answer: slice
    copy: slice
    first_copy: slice
    distance: int
    key: str


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def build_prompt(
    tokenizer: Any, length: int, depth: float, *, seed: int = 0, span: int = 32
) -> Prompt:
    """A prompt of exactly ``length`` tokens with the key at ``depth`` (0: start, 1: end).

    The key is 5 random digits and the copy span ``span`` random token ids in [1000, 40000),
    both drawn from ``seed`` (so every method sees the same prompt). Filler sentences fill
    the rest, cut at a token boundary. Raises ``ValueError`` for a depth outside [0, 1] or a
    length too short for the fixed parts.
    """
    length = _checks.integer("length", length)
    depth = _checks.real("depth", depth)
    if not 0 <= depth <= 1:
        raise ValueError(f"depth must be in [0, 1], got depth={depth!r}")
    generator = torch.Generator().manual_seed(seed)
    key = "".join(str(d) for d in torch.randint(0, 10, (5,), generator=generator).tolist())
    key = str(int(key[0]) % 9 + 1) + key[1:]  # no leading zero
    random_span = torch.randint(1000, 40000, (span,), generator=generator).tolist()

    head = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    head += _encode(tokenizer, INSTRUCTION)
    needle = _encode(tokenizer, NEEDLE.format(key=key)) + random_span
    question = _encode(tokenizer, QUESTION)
    answer = _encode(tokenizer, " " + key)
    fixed = len(head) + len(needle) + len(question) + len(answer) + span
    room = length - fixed
    if room < 0:
        raise ValueError(
            f"length={length} is shorter than the prompt's fixed parts ({fixed} tokens)"
        )
    filler_unit = _encode(tokenizer, FILLER)
    filler = (filler_unit * (room // len(filler_unit) + 1))[:room]
    before = round(depth * room)
    ids = head + filler[:before] + needle + filler[before:] + question + answer + random_span
    answer_start = len(ids) - span - len(answer)
    key_start = len(head) + before
    first_copy_start = key_start + len(needle) - span
    return Prompt(
        ids=torch.tensor(ids, dtype=torch.int64),
        answer=slice(answer_start, answer_start + len(answer)),
        copy=slice(len(ids) - span, len(ids)),
        first_copy=slice(first_copy_start, first_copy_start + span),
        distance=answer_start - key_start,
        key=key,
    )


@torch.no_grad()
def score_prompt(model: Any, prompt: Prompt) -> dict[str, float | bool]:
    """Score a prompt in one teacher-forced pass (positions 0 .. length - 1).

    Returns ``{"key_nll": summed nats of the key's tokens, "retrieved": every key token is the
    top prediction, "copy_nll": mean nats/token over the second copy (first token excluded),
    "first_copy_nll": the same over the first copy, the no-memory baseline}``.
    """
    device = next(model.parameters()).device
    ids = prompt.ids.to(device)[None]
    positions = torch.arange(ids.shape[1], device=device)[None]
    hidden = model.model(input_ids=ids, position_ids=positions, use_cache=False).last_hidden_state

    def predicted(part: slice) -> tuple[torch.Tensor, torch.Tensor]:
        # the token at index j is predicted from the hidden state at j - 1
        logits = model.lm_head(hidden[0, part.start - 1 : part.stop - 1]).float()
        targets = ids[0, part]
        nll = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
        return nll, logits.argmax(-1) == targets

    key_nll, key_hits = predicted(prompt.answer)
    copy_nll, _ = predicted(prompt.copy)
    first_nll, _ = predicted(prompt.first_copy)
    return {
        "key_nll": float(key_nll.sum()),
        "retrieved": bool(key_hits.all()),
        "copy_nll": float(copy_nll[1:].mean()),
        "first_copy_nll": float(first_nll[1:].mean()),
    }
