"""Why requests did not end ok: each deployment's rejected and failed requests by error code, with the code's
meaning (:data:`controlplane.outcomes.MEANINGS`), as summary.json, report.md and the terminal state them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from controlplane.outcomes import MEANINGS, MESSAGES, Code

# A request that had streamed tokens and was still running when the run ended (its last arrival plus the drain
# time) fails with 3007: not a queue's timeout.
STILL_STREAMING = "still streaming when the run ended (the last arrival plus the drain time)"


def _too_large(rows: pd.DataFrame, catalog) -> str:
    """3006's meaning for these rows: the context window, named with its size, when every row is over its model's
    window (one model), else the general meaning."""
    models = rows.model.unique()
    try:
        windows = np.array([catalog[m].context_window for m in rows.model])
    except Exception:  # (a model outside the catalog: the general meaning)
        return MEANINGS[Code.TOO_LARGE]
    over = (rows.prompt_tokens.to_numpy() + rows.output_tokens.to_numpy()) > windows
    if not over.all():
        return MEANINGS[Code.TOO_LARGE]
    if len(models) == 1:
        return f"prompt + output over {models[0]}'s {int(windows[0]):,}-token context window"
    return "prompt + output over the model's context window"


def not_ok_codes(frame: pd.DataFrame, catalog) -> list[dict]:
    """Per outcome (rejected, then failed) and error code, most requests first: ``outcome``, ``code``,
    ``requests``, ``message`` (Workers AI's) and ``meaning`` (what it means here)."""
    out = []
    for outcome in ("rejected", "failed"):
        rows = frame[(frame.outcome == outcome).to_numpy() & (frame.error_code.to_numpy() > 0)]
        for code, n in rows.error_code.value_counts().items():
            code = Code(int(code))
            if code == Code.TOO_LARGE:
                meaning = _too_large(rows[rows.error_code == code], catalog)
            elif code == Code.TIMEOUT and outcome == "failed":  # (a queue's timeout ends a request rejected)
                meaning = STILL_STREAMING
            else:
                meaning = MEANINGS[code]
            out.append({"outcome": outcome, "code": int(code), "requests": int(n), "message": MESSAGES[code],
                        "meaning": meaning})
    return out


def not_ok_lines(summary: dict) -> list[str]:
    """``edge: 500 rejected: 500 x 3006 prompt + output over ...`` for each deployment with requests that did
    not end ok (nothing for a deployment whose requests all did)."""
    lines = []
    for name, block in summary.get("deployments", {}).items():
        parts = []
        for outcome in ("rejected", "failed"):
            codes = [c for c in block.get("not_ok", []) if c["outcome"] == outcome]
            n = (block.get("outcomes") or {}).get(outcome, 0)
            if n:
                why = "; ".join(f"{c['requests']:,} x {c['code']} {c['meaning']}" for c in codes)
                parts.append(f"{n:,} {outcome}" + (f": {why}" if why else ""))
        if parts:
            lines.append(f"{name}: {'; '.join(parts)}.")
    return lines
