"""Tokenizers: a byte-level one for the GPT-2 LM, a byte-level one for synthetic encoders, and WordPiece
(through the ``tokenizers`` library) for the real MiniLM checkpoint.

Encoder tokenizers share one interface: ``encode(text, pair=None) -> Encoding`` (ids and token types of
one sequence, truncated to ``max_length``), and :func:`pad_batch` right-pads encodings into arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Encoding:
    """One tokenized sequence for an encoder."""

    ids: tuple[int, ...]
    type_ids: tuple[int, ...]
    full_length: int | None = None  # tokens before the cut to the window (specials included); None: not cut

    @property
    def truncated(self) -> bool:
        """The text was longer than the tokenizer's window and was cut to fit."""
        return self.full_length is not None

    def __len__(self) -> int:
        return len(self.ids)


def pad_batch(encodings: list[Encoding], pad_id: int = 0) -> dict[str, np.ndarray]:
    """Right-pad encodings into ``input_ids``, ``attention_mask``, ``token_type_ids`` arrays ``[B, T]``."""
    t_ = max(len(e) for e in encodings)
    ids = np.full((len(encodings), t_), pad_id, np.int64)
    mask = np.zeros((len(encodings), t_), np.int64)
    types = np.zeros((len(encodings), t_), np.int64)
    for row, e in enumerate(encodings):
        ids[row, : len(e)] = e.ids
        mask[row, : len(e)] = 1
        types[row, : len(e)] = e.type_ids
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def _truncate_pair(a: list[int], b: list[int], budget: int) -> tuple[list[int], list[int]]:
    # Hugging Face tokenizers' "longest_first" for a pair (truncate_encodings in its Rust source): only the longer
    # side is cut while the shorter fits in half the budget; otherwise the shorter keeps budget // 2 and the longer
    # the rest, so on an odd budget the side that was longer (the second one, when equal) keeps the extra token.
    if len(a) + len(b) <= budget:
        return a, b
    n1, n2 = sorted((len(a), len(b)))
    n2 = n1 if n1 > budget else max(n1, budget - n1)
    if n1 + n2 > budget:
        n1, n2 = budget // 2, budget - budget // 2
    if len(a) > len(b):
        n1, n2 = n2, n1
    return a[:n1], b[:n2]


class ByteEncoderTokenizer:
    """Byte-level tokenizer for synthetic encoders: ``[PAD]=0, [CLS]=1, [SEP]=2``, byte ``b`` is ``b + 3``."""

    pad_id, cls_id, sep_id, offset = 0, 1, 2, 3
    vocab_size = 259

    def __init__(self, max_length: int = 256):
        self.max_length = max_length

    def _ids(self, text: str) -> list[int]:
        return [b + self.offset for b in text.encode("utf-8")]

    def encode(self, text: str, pair: str | None = None) -> Encoding:
        a = self._ids(text)
        if pair is None:
            cut = a[: self.max_length - 2]
            ids = [self.cls_id, *cut, self.sep_id]
            return Encoding(tuple(ids), (0,) * len(ids), len(a) + 2 if len(cut) < len(a) else None)
        b = self._ids(pair)
        full = len(a) + len(b)
        a, b = _truncate_pair(a, b, self.max_length - 3)
        ids = [self.cls_id, *a, self.sep_id, *b, self.sep_id]
        return Encoding(tuple(ids), (0,) * (len(a) + 2) + (1,) * (len(b) + 1),
                        full + 3 if len(a) + len(b) < full else None)


class WordPieceTokenizer:
    """A Hugging Face ``tokenizer.json`` (BERT WordPiece), run by the ``tokenizers`` library."""

    def __init__(self, path: str | Path, max_length: int = 256):
        from tokenizers import Tokenizer  # imported here: only the real checkpoint needs it

        self.tok = Tokenizer.from_file(str(path))
        self.tok.no_padding()
        self.tok.enable_truncation(max_length=max_length)
        # the same tokenizer uncut, to count a cut input's full length (a pair's overflowing pieces are every
        # combination of both sides' pieces: summing them counted 803 tokens for a pair of 403)
        self._uncut = Tokenizer.from_file(str(path))
        self._uncut.no_padding()
        self._uncut.no_truncation()
        self.max_length = max_length
        self.pad_id = self.tok.token_to_id("[PAD]") or 0
        self.vocab_size = self.tok.get_vocab_size()

    def encode(self, text: str, pair: str | None = None) -> Encoding:
        enc = self.tok.encode(text) if pair is None else self.tok.encode(text, pair)
        full = None
        if enc.overflowing:  # cut to the window: count the whole input, specials included
            full = len((self._uncut.encode(text) if pair is None else self._uncut.encode(text, pair)).ids)
        return Encoding(tuple(enc.ids), tuple(enc.type_ids), full)


class ByteTokenizer:
    """GPT-2 LM tokenizer, byte level: ids 0-255 are the UTF-8 bytes, the last id is ``<|endoftext|>`` (EOS).

    Ids between 256 and ``vocab_size - 2`` stand for the merged tokens of a real BPE vocabulary (kept so
    the LM head has its real size); a model with synthetic weights may emit them and they decode as byte
    ``id % 256``. Synthetic weights give real compute but meaningless text.
    """

    def __init__(self, vocab_size: int):
        if vocab_size < 257:
            raise ValueError("a byte tokenizer needs vocab_size >= 257")
        self.vocab_size = vocab_size
        self.eos_id = vocab_size - 1

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def token_bytes(self, token_id: int) -> bytes:
        if token_id == self.eos_id:
            return b""
        return bytes([token_id % 256])

    def decode(self, ids: list[int]) -> str:
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", errors="replace")
