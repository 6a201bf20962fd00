"""rope_tutor: the companion package of the rope-tutor book.

Position encodings for transformers (learned absolute, sinusoidal, RoPE, ALiBi) and the methods
that stretch a RoPE model's context window, each verified against its paper and the reference
implementations. Every public name is introduced in a chapter of the book.
"""

from rope_tutor import exercises
from rope_tutor.attention import SelfAttention, attention, causal_mask
from rope_tutor.runtime import get_device, notebook_setup, seed_everything, use_book_style

# Part I: foundations
from rope_tutor.absolute import LearnedPositionalEmbedding, sinusoidal_encoding

# Part II: RoPE
from rope_tutor.rope import rope_frequencies

# Part III: ALiBi

# Part IV: context extension
from rope_tutor.scaling import SCALINGS, rope_parameters

__version__ = "0.1.0"
