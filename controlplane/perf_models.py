"""Service-time models by name: the scenario's ``perf`` field.

``roofline`` is the calibrated analytic model (:class:`controlplane.perf.Roofline`); ``profile`` interpolates a
table measured by ``edgepop profile`` (:class:`controlplane.perf_profile.MeasuredProfile`, option ``path``). A
scenario may also give the path of a profile table directly (``perf = "profile.csv"``), which means ``profile``.
"""

from __future__ import annotations

from pathlib import Path

from edgepop.errors import UserError
from edgepop.registry import Registry

PERF_MODELS = Registry("service-time model", skip=1)  # (topo) is not an option


@PERF_MODELS.register("roofline")
def roofline(topo, engine: str = "default"):
    """The calibrated roofline over the topology's GPU table."""
    from controlplane.perf import Roofline

    return Roofline.from_topology(topo, engine=engine)


@PERF_MODELS.register("profile")
def profile(topo, path: str = "", host: str | None = None, provider: str | None = None):
    """Service times interpolated from an ``edgepop profile`` table (one host and provider)."""
    from controlplane.perf_profile import MeasuredProfile

    return MeasuredProfile.load(path, host=host, provider=provider)


def split_spec(spec: str) -> tuple[str, dict]:
    """``"roofline"`` -> (roofline, {}); a file path -> (profile, {path: ...})."""
    if spec in PERF_MODELS:
        return spec, {}
    return "profile", {"path": str(spec)}


def check_perf(spec, where: str) -> None:
    """Parse-time check of a scenario's ``perf`` value (a model name, or a profile file that exists)."""
    if not isinstance(spec, str) or not spec:
        raise UserError(f"{where}: field 'perf' must be a model name ({', '.join(PERF_MODELS.names())}) or a "
                        f"profile table path, got {spec!r}")
    name, options = split_spec(spec)
    if spec == "profile":
        raise UserError(f"{where}: field 'perf': a measured profile is given by its table's path "
                        "(perf = \"profile.csv\", written by `edgepop profile`), not by the name 'profile'")
    if name == "profile" and not Path(options["path"]).is_file():
        raise UserError(f"{where}: field 'perf': {spec!r} is neither a service-time model "
                        f"({', '.join(PERF_MODELS.names())}) nor an existing profile table")


def build_perf(spec: str, topo):
    """The perf model a scenario's ``perf`` value names."""
    name, options = split_spec(spec)
    return PERF_MODELS.create(name, topo, options=options)


def build_run_perf(spec: str, topo, prefill_scale: float = 1.0, decode_scale: float = 1.0):
    """The model a run reads, and a gateway serving its scenario: ``spec``'s, every prefill and decode step scaled
    (:mod:`controlplane.perf_scaled`), memoised (:class:`controlplane.perf_cached.CachedPerf`)."""
    from controlplane.perf_cached import CachedPerf
    from controlplane.perf_scaled import scaled_perf

    return CachedPerf(scaled_perf(build_perf(spec, topo), prefill_scale, decode_scale))
