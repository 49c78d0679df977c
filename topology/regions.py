"""Centralized cloud regions (AWS, GCP, Azure) and the named baseline sets edge deployments are compared to."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from edgepop.errors import UserError
from topology.pops import country_code
from topology.tables import DATA_DIR, Field, in_range, number, read_table

REGION_FIELDS = [
    Field("id"),
    Field("provider"),
    Field("code"),
    Field("name", required=False, default=""),
    Field("cc", country_code, required=False, default=""),  # the provider's documented country of the region
    Field("lat", number, in_range(-90, 90)),
    Field("lon", number, in_range(-180, 180)),
]

# us-east: the single most common "centralized" baseline. big3: the three regions the Workers AI launch
# compared against. global-6: one region per major demand centre on five continents. global-12: a dense cloud,
# global-6 plus the regions nearest the next largest demand (India, Hong Kong, the Gulf, South Africa, Australia,
# Indonesia): the strongest named set, since a central budget is split between its regions by their users' demand.
BASELINE_SETS: dict[str, tuple[str, ...]] = {
    "us-east": ("aws:us-east-1",),
    "big3": ("aws:us-east-1", "aws:us-west-2", "aws:eu-west-1"),
    "global-6": ("aws:us-east-1", "aws:us-west-2", "aws:eu-central-1", "aws:ap-northeast-1",
                 "aws:ap-southeast-1", "aws:sa-east-1"),
    "global-12": ("aws:us-east-1", "aws:us-west-2", "aws:eu-central-1", "aws:ap-northeast-1",
                  "aws:ap-southeast-1", "aws:sa-east-1", "aws:ap-south-1", "aws:ap-east-1", "aws:me-central-1",
                  "aws:af-south-1", "aws:ap-southeast-2", "aws:ap-southeast-3"),
}


def load_regions(path: str | Path | None = None) -> pd.DataFrame:
    """Cloud regions: id (``provider:code``), provider, code, name, cc, lat, lon. ``cc`` (optional) is the country
    the border rule gives the region (:mod:`topology.borders`); a region without one takes its nearest city's."""
    path = Path(path) if path else DATA_DIR / "regions.csv"
    return read_table(path, REGION_FIELDS, unique="id")


def _region_ids(name: str) -> tuple[str, ...]:
    """The region ids ``name`` stands for: a named set's, or a comma-separated list's (whitespace around the name
    and each id ignored; an empty id, as a stray comma leaves, is an error), not yet checked against the table."""
    text = name.strip()
    if text in BASELINE_SETS:
        return BASELINE_SETS[text]
    if not text:
        raise UserError(f"baseline {name!r} is empty: name a region set ({', '.join(BASELINE_SETS)}) or region ids")
    ids = tuple(s.strip() for s in text.split(","))
    if "" in ids:
        raise UserError(f"baseline {name!r}: an empty region id in the list (a stray comma?)")
    return ids


def baseline(name: str, regions: pd.DataFrame | None = None) -> pd.DataFrame:
    """The regions of a named baseline set, or of a comma-separated list of region ids (whitespace around the name
    and each id is ignored)."""
    regions = regions if regions is not None else load_regions()
    ids = _region_ids(name)
    known = set(regions.id)
    missing = [i for i in ids if i not in known]
    if missing and name.strip() in BASELINE_SETS:  # a known set name: the region file lacks some of its regions
        raise UserError(f"baseline {name.strip()!r} needs region id(s) {', '.join(map(repr, missing))}, which the "
                        "region table does not hold")
    if missing:
        listed = f" (unknown region id(s): {', '.join(map(repr, missing))})" if len(ids) > 1 else ""
        raise UserError(f"unknown baseline {name.strip()!r}: choose one of {', '.join(BASELINE_SETS)} "
                        f"or comma-separated region ids{listed}")
    return regions.set_index("id").loc[list(ids)].reset_index()
