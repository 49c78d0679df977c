"""Greedy speculative decoding (Leviathan et al., 2023; Chen et al., 2023) over two real ONNX GPT-2 graphs.

Each round the draft LM proposes ``k`` tokens autoregressively from its own KV cache; the target, whose graph
returns logits for every new position (``gpt2.build_graph(..., all_logits=True)``), scores the pending token
plus all ``k`` proposals in ONE forward call over its past KV (``k + 1`` positions). The longest prefix of
proposals equal to the target's own greedy choices is accepted, followed by the target's next token (so every
round yields at least one token); the KV of rejected positions is cut off both caches (rollback). Because
every emitted token is the target's argmax given the tokens before it, the output equals plain greedy
decoding of the target (up to floating-point summation order of a multi-position call).

Batch size 1, greedy only: this is the latency technique of a single stream (see
docs/techniques.md for measured speed-ups and acceptance rates).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dataplane.errors import CapacityError, InvalidInputError
from dataplane.runtime import LanguageModel
from dataplane.session import SessionConfig


@dataclass
class SpeculativeResult:
    """Generated ids and the speculation counters: ``accepted`` of ``proposed`` draft tokens over ``rounds``
    target calls, ``rejections`` rounds that ended on a mismatch (the others accepted all their proposals)."""

    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str
    proposed: int = 0
    accepted: int = 0
    rounds: int = 0
    rejections: int = 0
    accepted_per_round: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed draft tokens (falls with ``k``: later proposals need all earlier ones right)."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def agreement(self) -> float:
        """Per-token agreement alpha: P(the next proposal is accepted | the ones before it were)."""
        tried = self.accepted + self.rejections
        return self.accepted / tried if tried else 0.0


def load_pair(draft: str = "tiny", widen: int = 2, depth: int = 2, noise: float = 0.2, seed: int = 0,
              config: SessionConfig | None = None) -> tuple[LanguageModel, LanguageModel]:
    """(target, draft) language models of :mod:`dataplane.models.gpt2_pair` (built once, cached on disk).

    Sessions default to ``allow_spinning=False``: the two alternate, and a spinning idle pool would burn the
    cores the other one needs."""
    from dataplane.models.gpt2_pair import pair_paths

    config = config or SessionConfig(allow_spinning=False)
    t_path, d_path, t_spec, d_spec = pair_paths(draft, widen, depth, noise, seed)
    return (LanguageModel(f"gpt2-{draft}-net2net", t_spec, Path(t_path), config),
            LanguageModel(f"gpt2-{draft}", d_spec, Path(d_path), config))


def _last(logits: np.ndarray) -> np.ndarray:
    """Last-position logits of a ``[1,V]`` or ``[1,T,V]`` output."""
    return logits[0, -1] if logits.ndim == 3 else logits[0]


def _call(model: LanguageModel, tokens: list[int], past: list[np.ndarray]):
    """Feed ``tokens`` after ``past`` (batch of one, no padding)."""
    p = past[0].shape[2]
    n = p + len(tokens)
    return model.step(np.array([tokens], np.int64), np.ones((1, n), np.int64),
                      np.arange(p, n, dtype=np.int64)[None], past)


def _check(model: LanguageModel, prompt: list[int], max_tokens: int) -> int:
    if not prompt or any(not 0 <= t < model.spec.vocab_size for t in prompt):
        raise InvalidInputError(f"prompt must be a non-empty list of token ids in [0, {model.spec.vocab_size})")
    if len(prompt) >= model.spec.n_ctx:
        raise CapacityError(f"prompt has {len(prompt)} tokens; the context holds {model.spec.n_ctx}")
    if max_tokens < 1:
        raise InvalidInputError(f"max_tokens must be positive, got {max_tokens}")
    return min(max_tokens, model.spec.n_ctx - len(prompt))


def generate_greedy(model: LanguageModel, prompt: list[int], max_tokens: int, stop_on_eos: bool = False) -> list[int]:
    """Plain greedy decoding, one token per call over the KV cache: the reference speculation must match."""
    max_tokens = _check(model, prompt, max_tokens)
    logits, past = _call(model, list(prompt), model.empty_past(1))
    out: list[int] = []
    while True:
        tok = int(np.argmax(_last(logits)))
        if stop_on_eos and tok == model.tokenizer.eos_id:
            return out
        out.append(tok)
        if len(out) >= max_tokens:
            return out
        logits, past = _call(model, [tok], past)


def generate_speculative(target: LanguageModel, draft: LanguageModel, prompt: list[int], k: int = 4,
                         max_tokens: int = 64, stop_on_eos: bool = False) -> SpeculativeResult:
    """Greedy generation of ``target`` sped up by ``draft`` proposing ``k`` tokens per round (module docstring).

    ``target``'s graph must return per-position logits (``all_logits=True``); both models share a tokenizer."""
    if target.spec.vocab_size != draft.spec.vocab_size:
        raise InvalidInputError("target and draft must share a vocabulary")
    if k < 1:
        raise InvalidInputError(f"k must be a positive integer, got {k}")
    max_tokens = min(_check(target, prompt, max_tokens), _check(draft, prompt, max_tokens))
    eos = target.tokenizer.eos_id
    res = SpeculativeResult([], len(prompt), "length")
    seq = list(prompt)
    logits, t_past = _call(target, seq, target.empty_past(1))  # target KV covers seq
    pending = [int(np.argmax(_last(logits)))]  # target-chosen tokens not yet emitted
    d_past = draft.empty_past(1)  # draft KV covers seq[:d_len]
    while True:
        for tok in pending:  # emit: every one of these is the target's greedy choice
            if stop_on_eos and tok == eos:
                res.finish_reason = "stop"
                return res
            res.token_ids.append(tok)
            seq.append(tok)
            if len(res.token_ids) >= max_tokens:
                return res
        # target KV covers seq[:-1]; the last emitted token is fed with the proposals
        kk = min(k, max_tokens - len(res.token_ids))
        props: list[int] = []
        feed = seq[d_past[0].shape[2]:]
        for _ in range(kk):
            d_logits, d_past = _call(draft, feed, d_past)
            props.append(int(np.argmax(_last(d_logits))))
            feed = props[-1:]
        logits, t_present = _call(target, [seq[-1]] + props, t_past)  # ONE call verifies all kk proposals
        choice = np.argmax(logits[0], axis=-1)  # [kk+1]: the target's token after each prefix
        m = 0
        while m < kk and props[m] == int(choice[m]):
            m += 1
        res.rounds += 1
        res.proposed += kk
        res.accepted += m
        res.rejections += m < kk
        res.accepted_per_round.append(m)
        keep = len(seq) + m  # rollback: drop KV of rejected proposals in both caches
        t_past = [a[:, :, :keep] for a in t_present]
        d_past = [a[:, :, :min(keep, a.shape[2])] for a in d_past]
        pending = props[:m] + [int(choice[m])]


def run_cli(args: argparse.Namespace) -> int:
    """``edgepop speculate``: check the flags, generate with and without speculation and print the text
    and one JSON line of figures."""
    if not 0 <= args.noise <= 10:
        raise InvalidInputError(f"--noise must be in [0, 10], got {args.noise}")
    if args.k < 1 or args.max_tokens < 1:
        raise InvalidInputError(f"--k and --max-tokens must be positive, got {args.k} and {args.max_tokens}")
    if not args.prompt:  # (byte tokens: no text, no token to continue from; EOS in its place only repeats EOS)
        raise InvalidInputError("--prompt is empty: give some text to continue")
    try:
        args.prompt.encode("utf-8")  # argv bytes that are not UTF-8 arrive as lone surrogates
    except UnicodeEncodeError:
        raise InvalidInputError("--prompt is not valid UTF-8 text") from None
    target, draft = load_pair(noise=args.noise)
    prompt = target.tokenizer.encode(args.prompt)
    room = min(target.spec.n_ctx, draft.spec.n_ctx) - len(prompt)
    if room < 1:  # the prompt alone fills the context: no --max-tokens would fit
        raise InvalidInputError(f"--prompt takes {len(prompt)} tokens; the context holds "
                                f"{min(target.spec.n_ctx, draft.spec.n_ctx)}: shorten it")
    if args.max_tokens > room:
        raise InvalidInputError(f"--max-tokens {args.max_tokens} does not fit: the context holds "
                                f"{min(target.spec.n_ctx, draft.spec.n_ctx)} tokens and the prompt takes "
                                f"{len(prompt)}, leaving {max(room, 0)}")
    generate_greedy(target, prompt, 2)  # warm-up
    t0 = time.perf_counter()
    want = generate_greedy(target, prompt, args.max_tokens)
    t1 = time.perf_counter()
    res = generate_speculative(target, draft, prompt, k=args.k, max_tokens=args.max_tokens)
    t2 = time.perf_counter()
    print(repr(target.tokenizer.decode(res.token_ids)))
    print(json.dumps({"k": args.k, "tokens": len(res.token_ids), "identical_to_greedy": res.token_ids == want,
                      "acceptance": round(res.acceptance_rate, 3), "agreement": round(res.agreement, 3),
                      "greedy_ms": round((t1 - t0) * 1e3, 1), "speculative_ms": round((t2 - t1) * 1e3, 1),
                      "speedup": round((t1 - t0) / (t2 - t1), 2)}))
    return 0
