"""Async batch on idle GPUs: ``batch_policy = "night"`` moves queueRequest-style batch rows to night-side sites.

Interactive traffic follows the sun, so a site where the local solar time is between 22:00 and 06:00 has idle GPUs.
Under the ``night`` policy every workload row with ``batch = True`` enters at a site that hosts its model and is
at night at the request's arrival (solar time from the site's longitude, ``utc + lon / 15``); among several such
sites the one that has received the fewest batch requests so far is used (spreading the load). When no hosting
site is at night the request is *held* until the first one enters its night window. Interactive rows never move.

The request's network path is charged honestly: its access RTT grows by the backbone RTT from its own PoP to the
chosen site. Completion latency of a batch request is measured from its original arrival (hold included).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

NIGHT_START_H, NIGHT_END_H = 22.0, 6.0


def solar_hour(lon, utc_hours):
    """Local mean solar time (hours, 0-24) at longitude ``lon`` (degrees east)."""
    return (np.asarray(utc_hours) + np.asarray(lon) / 15.0) % 24.0


def hours_until_night(local_hour):
    """0 at night (22:00-06:00 local), else the hours until 22:00."""
    h = np.asarray(local_hour, dtype=float)
    night = (h >= NIGHT_START_H) | (h < NIGHT_END_H)
    return np.where(night, 0.0, NIGHT_START_H - h)


def apply_night_policy(frame: pd.DataFrame, topo, fleet, table: pd.DataFrame, start_utc, day_s: float,
                       site_rtt: np.ndarray) -> tuple[pd.DataFrame, np.ndarray, dict]:
    """Re-enter the batch rows of ``frame`` at night-side sites hosting their model.

    ``table``: the placement (model, node); ``site_rtt``: PoP x site RTT (ms) of the edge deployment.
    Returns the new frame, the original arrival times, and counts for the report.
    """
    orig = frame.arrival_s.to_numpy(dtype=np.float64).copy()
    if "batch" not in frame or not frame.batch.any():
        return frame, orig, {"batch_requests": 0}
    out = frame.copy()
    node_site = fleet.nodes.site.to_numpy()
    pop_row = {pid: i for i, pid in enumerate(topo.pops.id.tolist())}
    site_pop = np.array([pop_row.get(s, -1) for s in fleet.sites.site_id.tolist()])
    site_lon = fleet.sites.lon.to_numpy(dtype=np.float64)
    hosts = {m: np.array(sorted(s for s in set(node_site[g.node.to_numpy()]) if site_pop[s] >= 0))
             for m, g in table.groupby("model")}
    start = pd.Timestamp(start_utc) if start_utc is not None else pd.Timestamp("2024-01-01T00:00:00+00:00")
    start_h = start.hour + start.minute / 60.0 + start.second / 3600.0
    used = np.zeros(len(site_lon))
    ingress = out.ingress.to_numpy(dtype=np.int64).copy()
    access = out.access_rtt_ms.to_numpy(dtype=np.float64).copy()
    arrival = orig.copy()
    held, moved = 0, 0
    models = out.model.to_numpy()
    for k in np.flatnonzero(out.batch.to_numpy(dtype=bool)):
        sites = hosts.get(models[k])
        if sites is None or len(sites) == 0:
            continue
        utc_h = start_h + orig[k] * 24.0 / day_s
        wait_h = hours_until_night(solar_hour(site_lon[sites], utc_h))
        soonest = wait_h.min()
        cand = sites[wait_h <= soonest + 1e-9]
        s = int(cand[np.argmin(used[cand] + 1e-6 * site_rtt[ingress[k], cand])])
        used[s] += 1
        if soonest > 0:
            held += 1
            arrival[k] = orig[k] + soonest * day_s / 24.0
        access[k] += site_rtt[ingress[k], s]
        moved += int(site_pop[s] != ingress[k])
        ingress[k] = site_pop[s]
    out["ingress"], out["access_rtt_ms"], out["arrival_s"] = ingress, access, arrival
    info = {"batch_requests": int(out.batch.sum()), "moved": moved, "held": held,
            "night_sites_used": int((used > 0).sum())}
    return out, orig, info


def night_share(requests: pd.DataFrame, batch, fleet, start_utc, day_s: float, arrival_s) -> float:
    """Share of ok ``batch`` rows that were served at a site where it was night when they arrived there."""
    b = np.asarray(batch, dtype=bool) & (requests.outcome.to_numpy() == "ok")
    if not b.any():
        return float("nan")
    lon = fleet.sites.set_index("site_id").lon
    site_lon = lon.reindex(requests.serving_site[b]).to_numpy(dtype=float)
    start = pd.Timestamp(start_utc) if start_utc is not None else pd.Timestamp("2024-01-01T00:00:00+00:00")
    start_h = start.hour + start.minute / 60.0 + start.second / 3600.0
    utc_h = start_h + np.asarray(arrival_s)[b] * 24.0 / day_s
    return float(np.mean(hours_until_night(solar_hour(site_lon, utc_h)) == 0))
