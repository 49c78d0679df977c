"""Pooling live-host profiles: several measurements of the same rows, per row the median.

One profile's rows scatter by 10-40% even on a quiet machine (docs/fidelity.md), so the replay matrix pools
the profiles of a deployment's cells and ``edgepop replay --profile-repeats N`` pools N profiles measured back to
back. Host-sharing rows (the slowdown of k engines decoding at once, and what the event loop and the client used
meanwhile) and every other row (engine and gateway costs) can be pooled separately.
"""

from __future__ import annotations

import pandas as pd

HOST_ROWS = ("host_share", "host_share_loop", "host_share_client", "host_share_merge")
_KEY = ["model", "phase", "batch_size", "tokens", "context"]


def _pooled(profiles: list[pd.DataFrame], host: bool) -> pd.DataFrame:
    rows = pd.concat([p[p.phase.isin(HOST_ROWS) == host] for p in profiles], ignore_index=True)
    first = rows.drop_duplicates(_KEY).set_index(_KEY)  # provider and host columns, as measured
    out = rows.groupby(_KEY).ms.median().to_frame().join(first.drop(columns="ms"))
    return out.reset_index()


def pooled_host_rows(profiles: list[pd.DataFrame]) -> pd.DataFrame:
    """The host-sharing rows of ``profiles``, per (row kind, k) the median over the profiles that have it."""
    return _pooled(profiles, host=True)


def pooled_engine_rows(profiles: list[pd.DataFrame]) -> pd.DataFrame:
    """Every other row of ``profiles`` (engine and gateway costs), per row the median over the profiles that
    have it: for a machine whose speed does not drift between cells, where one cell's profile scatters."""
    return _pooled(profiles, host=False)


def with_engine_rows(profile: pd.DataFrame, engine_rows: pd.DataFrame | None) -> pd.DataFrame:
    """``profile`` with every row but the host-sharing ones replaced by ``engine_rows`` (None: as measured)."""
    if engine_rows is None or not len(engine_rows):
        return profile
    return pd.concat([engine_rows[profile.columns], profile[profile.phase.isin(HOST_ROWS)]], ignore_index=True)


def with_host_rows(profile: pd.DataFrame, host_rows: pd.DataFrame | None) -> pd.DataFrame:
    """``profile`` with its host-sharing rows replaced by ``host_rows`` (None: as measured)."""
    if host_rows is None or not len(host_rows):
        return profile
    return pd.concat([profile[~profile.phase.isin(HOST_ROWS)], host_rows[profile.columns]], ignore_index=True)


def pooled_profile(profiles: list[pd.DataFrame]) -> pd.DataFrame:
    """Every row of ``profiles``, per row the median over the profiles that have it (one profile: itself)."""
    if len(profiles) == 1:
        return profiles[0]
    return with_host_rows(with_engine_rows(profiles[0], pooled_engine_rows(profiles)), pooled_host_rows(profiles))
