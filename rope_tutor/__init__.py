"""rope_tutor: the companion package of the rope-tutor book.

Position encodings for transformers (learned absolute, sinusoidal, RoPE, ALiBi) and the methods
that stretch a RoPE model's context window, each verified against its paper and the reference
implementations. Every public name is introduced in a chapter of the book.
"""

from rope_tutor import exercises, results
from rope_tutor import palette
from rope_tutor.attention import SelfAttention, attention, causal_mask
from rope_tutor.runtime import (
    animation_html,
    show_animation,
    get_device,
    glue,
    notebook_setup,
    seed_everything,
    use_book_style,
)

# Part I: foundations
from rope_tutor.absolute import (
    LearnedPositionalEmbedding,
    sinusoidal_encoding,
    sinusoidal_frequencies,
    sinusoidal_relative_map,
)

# Part II: RoPE
from rope_tutor.rope import (
    LAYOUTS,
    RotaryEmbedding,
    apply_rope,
    apply_rope_complex,
    half_to_interleaved_permutation,
    interleaved_to_half_permutation,
    rope_frequencies,
    rope_matrix,
    rope_with_bfloat16_angles,
    rotate_half,
    rotate_interleaved,
)

# Part III: ALiBi
from rope_tutor.alibi import alibi_attention, alibi_bias, alibi_slopes

# Part IV: context extension
from rope_tutor.scaling import (
    SCALINGS,
    effective_scale_factors,
    ntk_scaled_base,
    rope_parameters,
    rotations_per_window,
    yarn_correction_range,
    yarn_mscale,
    yarn_ramp,
)

# Part VI: making RoPE fast
from rope_tutor.fast import apply_rope_fast

__version__ = "0.2.0"
