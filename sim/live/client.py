"""What every live client of ``sim.live`` sends: prompts of an exact token count.

The stand-in language models use byte-level tokenizers, one token per ASCII character, so a prompt of ``n``
characters is a prompt of ``n`` tokens.
"""

from __future__ import annotations

import numpy as np

PROMPT_ALPHABET = np.array(list("abcdefghijklmnopqrstuvwxyz     "))


def prompt_text(n_tokens: int, rng: np.random.Generator) -> str:
    """``n_tokens`` ASCII characters (one token each under the byte-level tokenizers)."""
    return "".join(rng.choice(PROMPT_ALPHABET, n_tokens))
