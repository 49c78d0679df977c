"""Billing: Workers AI neurons per request, dollars with the daily free allowance, and fleet GPU cost.

Workers AI charges $0.011 per 1,000 neurons with 10,000 free neurons per account per day (UTC day). A model's
neurons are listed per million input and output tokens (or per million units: images, audio minutes).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from controlplane.catalog import Catalog, ModelSpec
from edgepop.errors import UserError, is_real

USD_PER_1000_NEURONS = 0.011
FREE_NEURONS_PER_DAY = 10_000


def neurons(spec: ModelSpec, input_units: float, output_tokens: float = 0.0) -> float:
    """Neurons one request costs: input tokens (or units) and generated tokens at the catalog's rates."""
    return (input_units * spec.neurons_per_m_input + output_tokens * spec.neurons_per_m_output) / 1e6


def neurons_array(catalog: Catalog, models, input_units, output_tokens) -> np.ndarray:
    """Vectorised :func:`neurons` over arrays of model ids and token counts."""
    models = pd.Series(models)
    # Each distinct id's rates looked up once and gathered by code (a string column's own map() visits every row
    # in Python: 0.1-0.2 s per 150,000 requests).
    codes, ids = pd.factorize(models)  # (a missing id: code -1)
    specs = {s.id: s for s in catalog}
    known = np.array([i in specs for i in ids] + [False], dtype=bool)[codes]  # (index -1: the trailing False)
    if not known.all():  # (its rate would be NaN, and NaN neurons bill nothing)
        raise UserError(f"neurons: no model {models.iloc[int(np.argmin(known))]!r} in the catalog")
    rate_in = np.array([specs[i].neurons_per_m_input for i in ids], dtype=np.float64)[codes]
    rate_out = np.array([specs[i].neurons_per_m_output for i in ids], dtype=np.float64)[codes]
    return (np.asarray(input_units) * rate_in + np.asarray(output_tokens) * rate_out) / 1e6


def usd(neuron_count: float) -> float:
    """Dollars for ``neuron_count`` neurons at the Workers AI price (no free allowance)."""
    return neuron_count * USD_PER_1000_NEURONS / 1000


def check_free_per_day(value, where: str) -> None:
    """The daily free allowance: a finite non-negative number of neurons (NaN would bill NaN dollars)."""
    if not (is_real(value) and 0 <= value < np.inf):
        raise UserError(f"{where}: free_per_day must be a finite non-negative number of neurons, got {value!r}")


@dataclass
class Ledger:
    """Neurons per account per day; the invoice applies the daily free allowance."""

    free_per_day: float = FREE_NEURONS_PER_DAY
    usage: dict = field(default_factory=lambda: defaultdict(float))

    def __post_init__(self):
        check_free_per_day(self.free_per_day, "ledger")

    def charge(self, account: str, day: int, amount: float) -> None:
        if not amount >= 0:  # (NaN too)
            raise UserError(f"ledger: neurons charged must be a non-negative number, got {amount!r}")
        self.usage[(account, day)] += amount

    def invoice(self) -> pd.DataFrame:
        """One row per (account, day): neurons, free neurons used, billable neurons and dollars."""
        rows = []
        for (account, day), n in sorted(self.usage.items()):
            free = min(n, self.free_per_day)
            rows.append({"account": account, "day": day, "neurons": n, "free_neurons": free,
                         "billable_neurons": n - free, "usd": usd(n - free)})
        return pd.DataFrame(rows, columns=["account", "day", "neurons", "free_neurons", "billable_neurons", "usd"])


def invoice_requests(frame: pd.DataFrame, day_s: float = 86_400.0, free_per_day: float = FREE_NEURONS_PER_DAY,
                     account_col: str = "account", start_utc=None) -> pd.DataFrame:
    """Invoice a table of requests (columns ``neurons``, ``arrival_s`` and optionally ``account``) per account
    and UTC day. ``start_utc`` (a datetime or ISO string) is the wall-clock time of ``arrival_s`` 0: ``day`` is
    then the UTC day since 1970-01-01; without it, time 0 is taken as a UTC midnight and ``day`` counts whole days
    from it. ``day_s``: the simulated seconds of a day (a compressed day)."""
    for col in ("neurons", "arrival_s"):
        if col not in frame:
            raise UserError(f"invoice: the requests table has no {col!r} column (columns: {', '.join(map(str, frame))})")
    # (a NaN or negative amount would bill nothing or a credit; a day of 0 s divides by zero)
    if not (is_real(day_s) and 0 < day_s < np.inf):
        raise UserError(f"invoice: day_s must be a positive number of seconds, got {day_s!r}")
    check_free_per_day(free_per_day, "invoice")
    for col, low in (("neurons", 0.0), ("arrival_s", -np.inf)):
        values = pd.to_numeric(frame[col], errors="coerce").to_numpy(dtype=float)
        bad = ~(np.isfinite(values) & (values >= low))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            need = "a finite non-negative number" if col == "neurons" else "a finite number of seconds"
            cell = frame[col].iloc[i]
            got = repr(cell) if isinstance(cell, str) else str(cell)
            raise UserError(f"invoice: row {i}: {col} must be {need}, got {got}")
    accounts = frame[account_col] if account_col in frame else pd.Series("default", index=frame.index)
    missing = accounts.isna().to_numpy()
    if missing.any():  # (groupby would drop these rows: their neurons would bill no one)
        raise UserError(f"invoice: row {int(np.flatnonzero(missing)[0])}: {account_col} is missing (None or NaN): "
                        "give every request an account")
    offset = 0.0
    if start_utc is not None:
        try:
            start = pd.Timestamp(start_utc)
        except (TypeError, ValueError):
            raise UserError(f"invoice: start_utc must be a datetime or an ISO 8601 time, got {start_utc!r}") from None
        start = start.tz_localize("UTC") if start.tzinfo is None else start.tz_convert("UTC")
        # seconds since the epoch, in simulated seconds (a compressed day stretches the clock by day_s / 86400)
        offset = start.timestamp() * day_s / 86_400.0
    day = ((frame.arrival_s.to_numpy() + offset) // day_s).astype(int)
    g = pd.DataFrame({"account": accounts.to_numpy(), "day": day, "neurons": frame.neurons.to_numpy()})
    g = g.groupby(["account", "day"], as_index=False).neurons.sum()
    g["free_neurons"] = np.minimum(g.neurons, free_per_day)
    g["billable_neurons"] = g.neurons - g.free_neurons
    g["usd"] = g.billable_neurons * USD_PER_1000_NEURONS / 1000
    return g


def fleet_cost(fleet, seconds: float) -> dict:
    """GPU-hours and dollars of keeping every GPU of ``fleet`` for ``seconds`` (GPUs bill whether busy or not)."""
    if not (is_real(seconds) and 0 <= seconds < np.inf):
        raise UserError(f"fleet cost: seconds must be a finite non-negative number, got {seconds!r}")
    hours = seconds / 3600.0
    gpu_hours = float(fleet.nodes.gpus.sum()) * hours
    by_type = (fleet.nodes.groupby("gpu").gpus.sum() * hours).round(3).to_dict()
    return {"gpu_hours": gpu_hours, "gpu_hours_by_type": by_type,
            "usd": float(fleet.nodes.price_usd_hr.sum()) * hours}
