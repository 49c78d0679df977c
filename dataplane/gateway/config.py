"""Gateway settings: one dataclass, read from a small TOML file and/or command-line flags.

Example ``gateway.toml`` (every key optional)::

    pops = ["FRA", "LHR", "IAD"]
    models = ["@cf/meta/llama-3.2-1b-instruct", "@cf/baai/bge-base-en-v1.5"]
    default_location = [50.11, 8.68]        # lat, lon of clients that send no location header
    slots = 8                               # concurrent requests per replica (default: the catalog's max_batch)
    queue_timeout_s = 30
    max_wait_s = 2                          # shed (429/3040) requests whose estimated wait is longer (0: off)
    neuron_budget_per_day = 10000           # per account; 429/3036 once spent (default 0: no budget)
    db = "edgepop-batch.sqlite"

    [rate_limits]                           # requests per minute per account (0: none) over Workers AI's figures
    "text-generation" = 600                 # a task ...
    "@cf/baai/bge-base-en-v1.5" = 100       # ... or one model

    [placement]                             # which PoPs hold which model (default: every model on every PoP)
    "@cf/meta/llama-3.2-1b-instruct" = ["FRA"]

    [stand_ins]                             # run a catalog model on another data-plane model
    "@edgepop/bert-small-classify" = "bert-tiny-classify"

    [lora_adapters."@edgepop/gpt2-tiny"]    # LoRA adapters of an LM, by name (paths relative to this file);
    support = "adapters/support.npz"        # requests pick one with `lora` (/ai/run) or model "<id>:<name>"

A bad key or value raises one :class:`~edgepop.errors.UserError` naming the file and the field.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from controlplane.deployment import DeploymentConfig
from dataplane.gateway.auth import SHORT, token_problem
from dataplane.gateway.limits import WORKERS_AI_TASK_RPM
from dataplane.gateway.scenario_plan import ScenarioPlan
from edgepop.errors import UserError

DEFAULT_POPS = ("FRA", "LHR", "IAD", "SJC", "NRT", "SIN")
DEFAULT_MODELS = (
    "@edgepop/gpt2-tiny",
    "@cf/meta/llama-3.2-1b-instruct",
    "@cf/baai/bge-base-en-v1.5",
    "@edgepop/all-minilm-l6-v2",
    "@edgepop/bert-small-classify",
    "@cf/baai/bge-reranker-base",
    "@cf/microsoft/resnet-50",
    "@cf/openai/whisper",
)
ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # no ':' (OpenAI "<model>:<adapter>" splits on it)
OVERRIDDEN = " with its command-line overrides"
DEFAULT_LOCATION = (50.11, 8.68)  # Frankfurt: clients that say nothing about where they are


# Upper bounds of the times and scales a gateway waits on: a day of seconds, its milliseconds, a 1000x delay.
_UPPER = {"queue_timeout_s": 86_400.0, "request_timeout_s": 86_400.0, "max_wait_s": 86_400.0,
          "drain_timeout_s": 86_400.0, "keep_alive_s": 86_400.0, "body_timeout_s": 86_400.0, "last_mile_ms": 86_400_000.0,
          "encoder_max_wait_ms": 86_400_000.0, "delay_scale": 1000.0}


@dataclass
class GatewayConfig:
    """Everything ``edgepop serve`` needs. Times in seconds; sizes in bytes.

    ``slots``: concurrent requests per replica (None: the catalog's ``max_batch``). ``delay``: inject the
    topology's RTT (False with ``--no-delay``); ``delay_scale`` multiplies it. ``tokens``: bearer token ->
    account id; ``no_auth`` serves everyone as account ``local``. ``db``: SQLite file of async batch jobs
    (None: a file in the working directory). ``lm_max_batch``: sequences one LM engine runs together.
    ``lm_prefix_cache_mb``/``lm_prefix_block``: prefix KV reuse per LM engine (MiB, 0: off; block size in tokens).
    ``lora_adapters``: model id -> {adapter name -> ``.npz`` path} (see :mod:`dataplane.lora`); ``lora_slots``:
    adapters each replica's control-plane slots hold (the ``adapter-aware`` router prefers replicas holding one).
    ``placement_policy``/``placement_options``, ``router``/``router_options``, ``autoscaler``/
    ``autoscaler_options``, ``queue_limit`` and ``queue_timeout_s`` are the deployment's
    (:class:`controlplane.deployment.DeploymentConfig`, the same defaults as a scenario's ``[edge]`` table except
    the placement: ``per-pop``, every served model at every PoP, or at the PoPs ``placement`` lists for it).
    ``threads``/``provider``: onnxruntime intra-op threads (0: one per core) and execution provider.
    ``last_mile`` (mode), ``gpu_inventory_scale``, ``anycast_misroute`` and ``demand_weight`` shape the topology as
    a scenario's fields of those names do (``--scenario`` sets them). ``scenario``/``scenario_plan``: the scenario's name and
    its demand and estimate inputs (:class:`~dataplane.gateway.scenario_plan.ScenarioPlan`), set by
    ``--scenario`` only (None: the gateway's own plan).

    Overload and shutdown (see :mod:`dataplane.gateway.limits`, :mod:`dataplane.gateway.shedding`):
    ``rate_limit`` turns the per-minute limits on (Workers AI's figures; ``rate_limits`` overrides them per task
    or model id, 0 meaning none); ``auth_failures_per_minute``: failed authentications a client may make per
    minute before it is refused unchecked (0: no brake); ``neuron_budget_per_day``: per account (0: none);
    ``max_wait_s``: the bound on a new request's estimated wait beyond which it is shed (0: off);
    ``drain_timeout_s``: how long a SIGTERM/SIGINT waits for in-flight requests and streams;
    ``keep_alive_s``: how long an idle client connection is kept (longer than clients keep theirs, so a client
    never reuses a connection the server is closing); ``body_timeout_s``: how long a request body may pause
    between two pieces before the request is answered 408/3007 (a client that stops mid-body would otherwise
    hold its connection, and a shutdown, indefinitely); ``open_ops``: serve ``/metrics`` and
    ``/edgepop/deployment`` without a token.
    """

    pops: list[str] = field(default_factory=lambda: list(DEFAULT_POPS))
    models: list[str] = field(default_factory=lambda: list(DEFAULT_MODELS))
    placement: dict[str, list[str]] = field(default_factory=dict)
    stand_ins: dict[str, str] = field(default_factory=dict)
    lora_adapters: dict[str, dict[str, str]] = field(default_factory=dict)
    default_location: tuple[float, float] = DEFAULT_LOCATION
    placement_policy: str = "per-pop"
    placement_options: dict = field(default_factory=dict)
    router: str = "nearest-with-capacity"
    router_options: dict = field(default_factory=dict)
    autoscaler: str = "none"
    autoscaler_options: dict = field(default_factory=dict)
    slots: int | None = None
    queue_limit: int = 64
    queue_timeout_s: float = 30.0
    request_timeout_s: float = 120.0
    delay: bool = True
    delay_scale: float = 1.0
    last_mile_ms: float = 10.0
    last_mile: str = "fixed"
    gpu_inventory_scale: float = 1.0
    anycast_misroute: float = 0.0
    demand_weight: str = "population"
    tokens: dict[str, str] = field(default_factory=dict)
    no_auth: bool = False
    db: str | None = None
    batch_concurrency: int = 4
    max_body_bytes: int = 10 * 1024 * 1024
    lm_max_batch: int = 32
    lm_kv_budget_tokens: int = 32768
    lm_prefix_cache_mb: int = 0
    lm_prefix_block: int = 16
    lora_slots: int = 8
    encoder_max_batch: int = 32
    encoder_max_wait_ms: float = 2.0
    threads: int = 0
    provider: str = "auto"
    seed: int = 0
    scenario: str | None = None
    scenario_plan: ScenarioPlan | None = None
    rate_limit: bool = True
    rate_limits: dict[str, int] = field(default_factory=dict)
    auth_failures_per_minute: int = 20
    neuron_budget_per_day: float = 0.0
    max_wait_s: float = 2.0
    drain_timeout_s: float = 30.0
    keep_alive_s: float = 75.0
    body_timeout_s: float = 15.0
    open_ops: bool = False
    source: str = field(default="gateway config", compare=False)  # what errors name: the TOML file, when read

    def __post_init__(self):
        self.validate(self.source)

    def validate(self, where: str) -> None:
        """Check every value; raise one UserError naming ``where`` and the field."""
        def bad(name, problem):
            raise UserError(f"{where}: field {name!r}: {problem}")

        if not isinstance(self.pops, list | tuple) or not self.pops or not all(
                isinstance(p, str) and p for p in self.pops):
            bad("pops", f"{self.pops!r} is not a non-empty list of PoP ids")
        if len(set(self.pops)) != len(self.pops):
            bad("pops", f"{self.pops!r} names a PoP twice")
        if not isinstance(self.models, list | tuple) or not self.models or not all(
                isinstance(m, str) and m for m in self.models):
            bad("models", f"{self.models!r} is not a non-empty list of catalog model ids")
        if len(set(self.models)) != len(self.models):  # (one deployment per model: a second would be served as the first)
            bad("models", f"{self.models!r} names a model twice")
        if not isinstance(self.placement, dict):
            bad("placement", "must be a table of model id -> list of PoP ids")
        for model, pops in self.placement.items():
            if not isinstance(pops, list) or not all(isinstance(p, str) for p in pops):
                bad("placement", f"{model!r} -> {pops!r} is not a list of PoP ids")
        if not isinstance(self.stand_ins, dict) or not all(isinstance(v, str) for v in self.stand_ins.values()):
            bad("stand_ins", "must be a table of model id -> data-plane model name")
        if not isinstance(self.lora_adapters, dict):
            bad("lora_adapters", "must be a table of model id -> table of adapter name -> .npz path")
        for model, table in self.lora_adapters.items():
            if not isinstance(table, dict) or not table:
                bad("lora_adapters", f"{model!r} -> {table!r} is not a non-empty table of adapter name -> path")
            for name, path in table.items():
                if not ADAPTER_NAME.fullmatch(name):
                    bad("lora_adapters", f"{model!r}: adapter name {name!r} must match {ADAPTER_NAME.pattern}")
                if not isinstance(path, str) or not path:
                    bad("lora_adapters", f"{model!r}.{name}: {path!r} is not a file path")
        loc = self.default_location
        if (not isinstance(loc, list | tuple) or len(loc) != 2
                or not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in loc)
                or not -90 <= loc[0] <= 90 or not -180 <= loc[1] <= 180):
            bad("default_location", f"{loc!r} is not [lat, lon] with lat in [-90, 90] and lon in [-180, 180]")
        self.default_location = (float(loc[0]), float(loc[1]))
        for name in ("queue_limit", "batch_concurrency", "max_body_bytes", "lm_max_batch", "lm_kv_budget_tokens",
                     "encoder_max_batch", "lm_prefix_block", "lora_slots"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                bad(name, f"{v!r} is not a positive integer")
        if self.slots is not None and (isinstance(self.slots, bool) or not isinstance(self.slots, int)
                                       or self.slots < 1):
            bad("slots", f"{self.slots!r} is not a positive integer")
        for name in ("queue_timeout_s", "request_timeout_s", "delay_scale", "last_mile_ms", "encoder_max_wait_ms",
                     "neuron_budget_per_day", "max_wait_s", "drain_timeout_s", "keep_alive_s", "body_timeout_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                bad(name, f"{v!r} is not a non-negative number")
            if name in _UPPER and v > _UPPER[name]:  # (1e300 s timeouts or delays hung requests and the drain)
                bad(name, f"{v!r} is over {_UPPER[name]:g}, more than any run can wait")
        for name in ("queue_timeout_s", "request_timeout_s", "body_timeout_s"):
            if getattr(self, name) <= 0:
                bad(name, "must be positive")
        # (the rule --tokens files and $EDGEPOP_TOKENS obey)
        problems = {token_problem(k, v) for k, v in self.tokens.items()} if isinstance(self.tokens, dict) else {SHORT}
        if SHORT in problems:
            bad("tokens", "must map token strings of 8+ characters to non-empty account ids (as --tokens files and "
                "$EDGEPOP_TOKENS do)")
        if problems - {None}:
            bad("tokens", "a token holds no spaces and an account starts and ends with no space (no bearer header "
                "could match them)")
        from dataplane.session import threads_problem  # (onnxruntime: loaded when a gateway is built anyway)

        if problem := threads_problem(self.threads):
            bad("threads", problem)
        v = self.lm_prefix_cache_mb
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            bad("lm_prefix_cache_mb", f"{v!r} is not a non-negative integer (0: off)")
        if self.provider not in ("auto", "cpu", "cuda"):
            bad("provider", f"{self.provider!r} is not one of auto, cpu, cuda")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            bad("seed", f"{self.seed!r} is not a non-negative integer")
        if self.db is not None and (not isinstance(self.db, str) or not self.db.strip()):
            bad("db", f"{self.db!r} is not a file path")
        if self.db is not None and "\0" in self.db:  # (the OS refuses the path later, with a traceback)
            bad("db", f"{self.db!r} holds a NUL byte, which no file path can")
        for name in ("delay", "no_auth", "rate_limit", "open_ops"):
            if not isinstance(getattr(self, name), bool):
                bad(name, "must be true or false")
        v = self.auth_failures_per_minute
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            bad("auth_failures_per_minute", f"{v!r} is not a non-negative integer (0: no brake)")
        if not isinstance(self.rate_limits, dict):
            bad("rate_limits", "must be a table of task or model id -> requests per minute")
        for key, rpm in self.rate_limits.items():
            if key not in WORKERS_AI_TASK_RPM and key not in self.models:
                bad("rate_limits", f"{key!r} is neither a task ({', '.join(sorted(WORKERS_AI_TASK_RPM))}) nor a "
                    "served model id")
            if isinstance(rpm, bool) or not isinstance(rpm, int | float) or not math.isfinite(rpm) or rpm < 0:
                bad("rate_limits", f"{key!r} = {rpm!r} is not a non-negative number of requests per minute")
        from topology.last_mile import MODES

        if self.last_mile not in MODES:
            bad("last_mile", f"{self.last_mile!r} is not one of {', '.join(MODES)}")
        if self.last_mile != "fixed" and self.last_mile_ms != GatewayConfig.last_mile_ms:  # (as a scenario's)
            bad("last_mile_ms", f"{self.last_mile_ms!r} applies with last_mile = \"fixed\" only, not with "
                f"{self.last_mile!r} (whose figures replace it)")
        v = self.gpu_inventory_scale
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 100:  # (NaN fails too)
            bad("gpu_inventory_scale", f"{v!r} is not a number in (0, 100]")
        v = self.anycast_misroute
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1:
            bad("anycast_misroute", f"{v!r} is not a share in [0, 1]")
        from topology.demand import DEMAND_WEIGHTS

        if self.demand_weight not in DEMAND_WEIGHTS:
            bad("demand_weight", f"{self.demand_weight!r} is not one of {', '.join(DEMAND_WEIGHTS)}")
        for name in ("placement_options", "router_options", "autoscaler_options"):
            if not isinstance(getattr(self, name), dict):
                bad(name, "must be a table of option = value")
        try:
            self.deployment_config().check(where)
        except UserError as exc:  # (DeploymentConfig calls it 'placement'; this file spells it 'placement_policy')
            text = str(exc).replace(f"{where}: field 'placement':", f"{where}: field 'placement_policy':", 1)
            for name in ("placement_options", "router_options", "autoscaler_options"):  # (named as the others are)
                text = text.replace(f"{where} {name}:", f"{where}: field {name!r}:", 1)
            raise UserError(text) from None

    def deployment_config(self) -> DeploymentConfig:
        """The deployment part of this config, as the simulator's ``[edge]`` table would give it."""
        options = dict(self.placement_options)
        if self.placement_policy == "per-pop" and self.placement:
            options.setdefault("pops", dict(self.placement))
        return DeploymentConfig(placement=self.placement_policy, placement_options=options, router=self.router,
                                router_options=dict(self.router_options), autoscaler=self.autoscaler,
                                autoscaler_options=dict(self.autoscaler_options), queue_limit=self.queue_limit,
                                queue_timeout_s=self.queue_timeout_s, pops=list(self.pops),
                                **(self.scenario_plan.deployment if self.scenario_plan else {}))

    def with_overrides(self, **kw) -> GatewayConfig:
        """A copy with the given fields replaced (``None`` values are ignored: flags that were not given)."""
        given = {k: v for k, v in kw.items() if v is not None}
        # Errors may then be the flags': said once, and only when a value really changed.
        changed = any(getattr(self, k) != v for k, v in given.items() if k != "source")
        if (changed and "source" not in given and self.source != "gateway config"
                and not self.source.endswith(OVERRIDDEN)):
            given["source"] = f"{self.source}{OVERRIDDEN}"
        return replace(self, **given)


# ``scenario`` and ``scenario_plan`` are what ``--scenario`` sets once it has loaded one; a file naming them would
# load nothing
_FIELDS = {f.name for f in fields(GatewayConfig)} - {"scenario", "scenario_plan", "source"}


def load_config(path: str | Path | None) -> GatewayConfig:
    """Read a gateway TOML file (``None``: the defaults)."""
    if path is None:
        return GatewayConfig()
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise UserError(f"gateway config {str(path)!r} not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid TOML: {exc}") from None
    for name in ("scenario", "scenario_plan"):
        if name in doc:
            raise UserError(f"{path}: field {name!r} is not read from a config file: give it as --scenario NAME|FILE")
    unknown = sorted(set(doc) - _FIELDS)
    if unknown:
        raise UserError(f"{path}: unknown field {unknown[0]!r} (known: {', '.join(sorted(_FIELDS))})")
    if "default_location" in doc and isinstance(doc["default_location"], list):
        doc["default_location"] = tuple(doc["default_location"])
    cfg = GatewayConfig.__new__(GatewayConfig)
    base = GatewayConfig()
    for f in fields(GatewayConfig):
        setattr(cfg, f.name, doc.get(f.name, getattr(base, f.name)))
    cfg.source = str(path)
    cfg.validate(str(path))
    # Adapter paths are relative to the TOML file, so a config directory can be moved as a whole.
    cfg.lora_adapters = {m: {n: str(path.parent / p) for n, p in t.items()} for m, t in cfg.lora_adapters.items()}
    return cfg


def parse_location(text: str, where: str) -> tuple[float, float]:
    """``"lat,lon"`` -> (lat, lon); a bad value raises one UserError naming ``where``."""
    parts = text.split(",")
    try:
        lat, lon = (float(p) for p in parts) if len(parts) == 2 else (math.nan, math.nan)
    except ValueError:
        lat = lon = math.nan
    if not (math.isfinite(lat) and math.isfinite(lon) and -90 <= lat <= 90 and -180 <= lon <= 180):
        raise UserError(f"{where}: {text!r} is not 'lat,lon' with lat in [-90, 90] and lon in [-180, 180]")
    return lat, lon
