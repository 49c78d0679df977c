"""Async batch on idle GPUs: ``batch_policy = "night"`` moves queueRequest-style batch rows to night-side sites.

Interactive traffic follows the sun, so a site where the local solar time is between 22:00 and 06:00 has idle GPUs.
Under the ``night`` policy every workload row with ``batch = True`` enters at a site that hosts its model and is
either at night at the request's arrival (solar time from the site's longitude, ``utc + lon / 15``) or, on the
day side, lightly loaded (its load per replica in the previous window under ``low_util`` times the hosts' mean).
Among those candidates the least loaded per replica wins (recent interactive arrivals plus the batch rows already
sent there; the nearest to the user on ties). When the chosen site is on the day side only because no hosting
site is at night, and it is not lightly loaded, the request is *held* until the first night window opens.
Interactive rows never move.

The request's network path is charged honestly: its access RTT grows by the backbone RTT from its own PoP to the
chosen site. Completion latency of a batch request is measured from its original arrival (hold included); the
request frame keeps that arrival in ``arrival_s`` and the hold in ``held_s`` (:func:`with_send_times`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from edgepop.registry import Registry
from sim.techniques.base import TECHNIQUES, Technique

# Where and when batch rows are served; each policy is called as
# policy(frame, topo, fleet, table, start_utc, day_s, site_rtt, **options) -> (frame, original arrivals, info).
BATCH_POLICIES = Registry("batch policy", skip=7)

NIGHT_START_H, NIGHT_END_H = 22.0, 6.0


def solar_hour(lon, utc_hours):
    """Local mean solar time (hours, 0-24) at longitude ``lon`` (degrees east)."""
    return (np.asarray(utc_hours) + np.asarray(lon) / 15.0) % 24.0


def hours_until_night(local_hour):
    """0 at night (22:00-06:00 local), else the hours until 22:00."""
    h = np.asarray(local_hour, dtype=float)
    night = (h >= NIGHT_START_H) | (h < NIGHT_END_H)
    return np.where(night, 0.0, NIGHT_START_H - h)


def _start_hour(start_utc) -> float:
    start = pd.Timestamp(start_utc) if start_utc is not None else pd.Timestamp("2024-01-01T00:00:00+00:00")
    return start.hour + start.minute / 60.0 + start.second / 3600.0


def local_hour(lon, start_h: float, t_s, day_s: float):
    """Solar hour at ``lon`` at simulated second ``t_s`` of a run starting at UTC hour ``start_h``."""
    return solar_hour(lon, start_h + np.asarray(t_s) * 24.0 / day_s)


def first_night_s(lon: float, start_h: float, t_s: float, day_s: float) -> float:
    """The first simulated second at or after ``t_s`` that :func:`local_hour` puts in the night at ``lon``.

    ``t_s`` plus the hours until 22:00 can round to a hair before 22:00; stepping to the next float until the
    same test says night keeps a held row's release and the night-share check in agreement."""
    t = t_s + float(hours_until_night(local_hour(lon, start_h, t_s, day_s))) * day_s / 24.0
    while hours_until_night(local_hour(lon, start_h, t, day_s)) > 0:
        t = float(np.nextafter(t, np.inf))
    return t


@BATCH_POLICIES.register("none")
def serve_in_place(frame: pd.DataFrame, topo, fleet, table, start_utc, day_s: float, site_rtt):
    """Batch rows are served like interactive ones, where and when they arrive."""
    return frame, None, {}


@BATCH_POLICIES.register("night")
def apply_night_policy(frame: pd.DataFrame, topo, fleet, table: pd.DataFrame, start_utc, day_s: float,
                       site_rtt: np.ndarray, window_s: float = 10.0,
                       low_util: float = 0.5) -> tuple[pd.DataFrame, np.ndarray, dict]:
    """Re-enter the batch rows of ``frame`` at night-side (or lightly loaded) sites hosting their model.

    ``table``: the placement (model, node); ``site_rtt``: PoP x site RTT (ms) of the edge deployment. Load of a
    site is what it saw in the previous ``window_s`` seconds (interactive arrivals at their nearest hosting site,
    plus the batch rows already sent there), per replica of the model: causal, as a live utilisation signal
    would be. A day-side site whose load is under ``low_util`` times the hosts' mean also qualifies.
    Returns the new frame, the original arrival times, and counts for the report: ``moved`` (rows sent to another
    PoP), ``held`` (rows delayed to the first night window), ``day_side_low_load`` (rows served at a quiet day-side
    site, whether or not a night-side host existed) and ``sites_used``.
    """
    orig = frame.arrival_s.to_numpy(dtype=np.float64).copy()
    if "batch" not in frame or not frame.batch.any():
        return frame, orig, {"batch_requests": 0}
    out = frame.copy()
    node_site = fleet.nodes.site.to_numpy()
    pop_row = {pid: i for i, pid in enumerate(topo.pops.id.tolist())}
    site_pop = np.array([pop_row.get(s, -1) for s in fleet.sites.site_id.tolist()])
    site_lon = fleet.sites.lon.to_numpy(dtype=np.float64)
    n_sites, n_bins = len(site_lon), int(orig.max() // window_s) + 2
    ingress = out.ingress.to_numpy(dtype=np.int64).copy()
    batch = out.batch.to_numpy(dtype=bool)
    models = out.model.to_numpy()
    hosts, reps, inter = {}, {}, {}
    sent = np.zeros((n_bins, n_sites))  # batch rows sent to each site per window
    for m, g in table.groupby("model"):
        sites, counts = np.unique(node_site[g.node.to_numpy()], return_counts=True)
        keep = site_pop[sites] >= 0
        if not keep.any():
            continue
        hosts[m] = sites[keep]
        reps[m] = np.ones(n_sites)
        reps[m][sites[keep]] = counts[keep]
        rows = np.flatnonzero((models == m) & ~batch)
        nearest = hosts[m][np.argmin(site_rtt[np.ix_(ingress[rows], hosts[m])], axis=1)]
        inter[m] = np.zeros((n_bins, n_sites))
        np.add.at(inter[m], ((orig[rows] // window_s).astype(int), nearest), 1.0)
    start_h = _start_hour(start_utc)
    used = np.zeros(n_sites)
    access = out.access_rtt_ms.to_numpy(dtype=np.float64).copy()
    arrival = orig.copy()
    held, moved, low = 0, 0, 0
    for k in np.flatnonzero(batch):
        sites = hosts.get(models[k])
        if sites is None:
            continue
        wait_h = hours_until_night(local_hour(site_lon[sites], start_h, orig[k], day_s))
        b = int(orig[k] // window_s)
        seen = (inter[models[k]][b - 1] + sent[b - 1] if b else 0.0) + sent[b]  # previous window + batch sent now
        per_rep = (seen * np.ones(n_sites))[sites] / reps[models[k]][sites]
        # without a window of history yet, nothing is known to be quiet: night sites only
        quiet = (per_rep <= low_util * per_rep.mean()) if b else np.zeros(len(sites), bool)
        soonest = wait_h.min()
        ok = (wait_h <= soonest + 1e-9) | quiet
        cand = sites[ok]
        # the least loaded candidate per replica; nearest to the user on ties
        s = int(cand[np.argmin(per_rep[ok] + 1e-9 * site_rtt[ingress[k], cand])])
        # a day-side choice is either quiet (served now, even when a night-side host exists) or, when no host is
        # at night and none is quiet, held until the first night window
        if wait_h[sites == s][0] > 0:
            if quiet[sites == s][0]:
                low += 1
            else:
                held += 1
                arrival[k] = first_night_s(site_lon[s], start_h, orig[k], day_s)
        used[s] += 1
        sent[b, s] += 1.0
        access[k] += site_rtt[ingress[k], s]
        moved += int(site_pop[s] != ingress[k])
        ingress[k] = site_pop[s]
    out["ingress"], out["access_rtt_ms"], out["arrival_s"] = ingress, access, arrival
    info = {"batch_requests": int(batch.sum()), "moved": moved, "held": held, "day_side_low_load": low,
            "sites_used": int((used > 0).sum())}
    return out, orig, info


def with_send_times(requests: pd.DataFrame, sent_s) -> pd.DataFrame:
    """``requests`` (a deployment's request frame, rows in workload order, ``arrival_s`` when each request entered
    the simulation) with ``arrival_s`` set to ``sent_s``, when its user sent it (the same for every deployment),
    and a ``held_s`` column after it: the seconds a batch policy held the request before releasing it (0 for every
    row it did not hold). The latency columns stay measured from the release, ``arrival_s + held_s``."""
    release = requests.arrival_s.to_numpy(dtype=np.float64)
    sent = np.asarray(sent_s, dtype=np.float64)
    requests["arrival_s"] = sent
    requests.insert(requests.columns.get_loc("arrival_s") + 1, "held_s", release - sent)
    return requests


def night_share(requests: pd.DataFrame, batch, fleet, start_utc, day_s: float, arrival_s) -> float:
    """Share of ok ``batch`` rows that were served at a site where it was night when they arrived there."""
    b = np.asarray(batch, dtype=bool) & (requests.outcome.to_numpy() == "ok")
    if not b.any():
        return float("nan")
    lon = fleet.sites.set_index("site_id").lon
    site_lon = lon.reindex(requests.serving_site[b]).to_numpy(dtype=float)
    at = np.asarray(arrival_s, dtype=float)[b]
    return float(np.mean(hours_until_night(local_hour(site_lon, _start_hour(start_utc), at, day_s)) == 0))


def batch_policy_applies(deployment: str) -> bool:
    """Batch policies move the edge deployment's batch rows only; another deployment serves them where it would."""
    return deployment == "edge"


@TECHNIQUES.register("batch_policy", on=lambda t: t.batch_policy != "none")
class BatchPolicy(Technique):
    """Async batch on idle GPUs: the edge deployment's batch rows move by ``batch_policy``."""

    def workload(self, name, frame, dep, topo, start_utc, day_s):
        if not batch_policy_applies(name):
            return frame, None
        from controlplane.fleet import ingress_site_rtt

        out, orig, info = BATCH_POLICIES.create(
            self.t.batch_policy, frame, topo, dep.fleet, dep.table, start_utc, day_s,
            ingress_site_rtt(topo, dep.fleet))
        self.info[name] = {"batch_policy": info}
        return out, orig

    def report(self, name, block, requests, frame, arrival_s, fleet, start_utc, day_s):
        batch = frame.batch.to_numpy(dtype=bool) if "batch" in frame else np.zeros(len(frame), bool)
        if batch.any():
            block["batch_served_at_night_share"] = round(night_share(requests, batch, fleet, start_utc, day_s,
                                                                     arrival_s), 4)
