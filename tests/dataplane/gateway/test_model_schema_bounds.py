"""``GET /ai/models/schema`` beyond the body fields: the ``max_tokens`` bound of a gateway whose engines have a KV
budget smaller than the context window, the SDK's strict (typed) reading of every served model's schema, the
``rejectIfBusy`` pattern read by both regex dialects (Python's and ECMA-262's, the one JSON Schema names), and the
stream body's reference to its events."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import cloudflare
import httpx
import jsonschema
import pytest
from kit.gateway import ALICE, GEN, MODELS, TOKENS, _serve, headers, run_url

from dataplane.gateway import schemas

BUDGET = 300  # KV tokens per engine: tighter than the stand-in's window of 512
# characters around a flag word: the ones where Python's \s, ECMA-262's \s and str.strip() part ways, and a few
# they all take
EDGES = ["\u001c", "\u001f", "\u0085", "\ufeff", "\u00a0", "\u2028", "\u3000", "\u200b", " \t\n", ""]


def _schema(url: str, model: str) -> dict:
    r = httpx.get(f"{url}/client/v4/accounts/alice/ai/models/schema", params={"model": model}, headers=headers())
    assert r.status_code == 200, r.text
    return r.json()["result"]


@pytest.fixture(scope="module")
def budget_gateway(tmp_path_factory, gateway_topo):
    """One PoP serving GEN with engines whose KV budget (300 tokens) is below the served window (512)."""
    from dataplane.gateway import GatewayConfig

    cfg = GatewayConfig(pops=["FRA"], models=[GEN], tokens=TOKENS, delay=False, lm_kv_budget_tokens=BUDGET,
                        db=str(tmp_path_factory.mktemp("gw-kv") / "b.sqlite"))
    server, app = _serve(cfg, gateway_topo)
    yield server.url
    server.stop()


def test_max_tokens_bound_is_the_kv_budget_when_it_is_tighter(budget_gateway):
    """The schema's max_tokens maximum is what the engine serves with a one-token prompt: budget - 1 here, not
    window - 1; one more is refused by both (413 from the engine's KV budget check)."""
    url = budget_gateway
    inp = jsonschema.Draft202012Validator(_schema(url, GEN)["input"])
    bound = _schema(url, GEN)["input"]["properties"]["max_tokens"]["anyOf"][0]
    assert bound["maximum"] == BUDGET - 1 and f"KV budget of {BUDGET}" in bound["description"]
    served = {"prompt": "x", "max_tokens": BUDGET - 1}
    assert inp.is_valid(served)
    r = httpx.post(run_url(url, GEN), json=served, headers=headers(), timeout=120)
    assert r.status_code == 200, r.text
    over = {"prompt": "x", "max_tokens": BUDGET}
    assert not inp.is_valid(over)
    r = httpx.post(run_url(url, GEN), json=over, headers=headers(), timeout=60)
    assert (r.status_code, r.json()["errors"][0]["code"]) == (413, 3006), r.text
    assert f"KV budget of {BUDGET}" in r.json()["errors"][0]["message"]


def test_strict_sdk_reads_every_served_models_schema(gateway):
    """The SDK's typed response (type, description and a boolean additionalProperties on input and output) is
    met for every served model: strict response validation raises otherwise."""
    url, _ = gateway
    c = cloudflare.Cloudflare(api_token=ALICE, base_url=f"{url}/client/v4", max_retries=0, timeout=30,
                              _strict_response_validation=True)
    for model in MODELS:
        got = c.ai.models.schema.get(account_id="alice", model=model)
        for side in (got.input, got.output):
            assert side.type and side.description and isinstance(side.additional_properties, bool), model
            jsonschema.Draft202012Validator.check_schema(side.to_dict())


def test_generation_input_takes_unknown_fields_only_as_null(gateway):
    """The top-level additionalProperties: true does not open the body: fields not listed are still null only."""
    url, _ = gateway
    inp = jsonschema.Draft202012Validator(_schema(url, GEN)["input"])
    assert inp.is_valid({"prompt": "x", "not_a_field": None})
    assert not inp.is_valid({"prompt": "x", "not_a_field": 1}) and not inp.is_valid({"prompt": "x", "max_token": 5})


def test_whitespace_class_is_what_str_strip_removes():
    every = "".join(map(chr, range(sys.maxunicode + 1)))
    assert set(schemas.WHITESPACE) == {c for c in every if c.isspace()} == {c for c in every if not c.strip()}


def _ecma_matches(pattern: str, strings: list[str]) -> dict[str, list[bool]]:
    """Whether ECMA-262's RegExp (node), without and with the u flag, finds ``pattern`` in each string."""
    script = ("const d = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
              "const r = f => d.strings.map(s => new RegExp(d.pattern, f).test(s));"
              "process.stdout.write(JSON.stringify({plain: r(''), unicode: r('u')}));")
    done = subprocess.run(["node", "-e", script], input=json.dumps({"pattern": pattern, "strings": strings}),
                          capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def _flag_pattern(url: str, model: str) -> str:
    return _schema(url, model)["input"]["properties"]["options"]["anyOf"][0]["properties"]["rejectIfBusy"][
        "anyOf"][1]["pattern"]


def test_reject_if_busy_pattern_means_the_same_in_both_dialects(gateway):
    """The pattern names its characters (no \\s, whose set differs between the dialects), and Python's re and
    ECMA-262 both take exactly the spellings the gateway takes, edge characters included."""
    url, _ = gateway
    pattern = _flag_pattern(url, GEN)
    strings = [f"{c}{w}{c}" for c in EDGES for w in ("false", "NO", "0", "")] + ["maybe", "\ufefffalse", "fa lse"]
    gateway_takes = [s.strip().lower() in ("true", "1", "yes", "false", "0", "no", "") for s in strings]
    python = jsonschema.Draft202012Validator({"type": "string", "pattern": pattern})
    assert [python.is_valid(s) for s in strings] == gateway_takes
    # Dialect-neutral by construction: the only escapes are \\uXXXX (read alike by both dialects), no class
    # shorthand such as \\s, whose sets differ; where node is installed, ECMA-262 itself is asked too.
    assert re.fullmatch(r"(?:[^\\]|\\u[0-9a-fA-F]{4})*", pattern), pattern
    if shutil.which("node") is not None:
        ecma = _ecma_matches(pattern, strings)
        assert ecma["plain"] == gateway_takes and ecma["unicode"] == gateway_takes


@pytest.mark.parametrize("edge", ["\u001c", "\u0085", "\ufeff"])
def test_reject_if_busy_edge_characters_on_the_schema_and_the_route(gateway, edge):
    """U+001C and U+0085 around a word are stripped by the gateway (200), U+FEFF is not (400); the schema
    agrees in both directions."""
    url, _ = gateway
    inp = jsonschema.Draft202012Validator(_schema(url, GEN)["input"])
    body = {"prompt": "x", "max_tokens": 1, "options": {"rejectIfBusy": f"{edge}false{edge}"}}
    r = httpx.post(run_url(url, GEN), json=body, headers=headers(), timeout=60)
    assert r.status_code == (400 if edge == "\ufeff" else 200), r.text
    assert inp.is_valid(body) == (r.status_code == 200)


def test_what_a_schema_cannot_say_names_the_served_limits():
    """The list of limits the route checks beyond the schema names the figures the code uses (a changed limit
    fails here until the list follows)."""
    from dataplane.gateway.config import GatewayConfig
    from dataplane.tasks import MAX_IMAGE_PIXELS

    said = " ".join(schemas.__doc__.split())
    assert f"{MAX_IMAGE_PIXELS:,} pixels" in said and f"{sys.get_int_max_str_digits():,} digits" in said
    assert GatewayConfig.max_body_bytes == 10 * 1024 * 1024 and "``max_body_bytes`` (10 MiB" in said
    assert "KV budget" in said
