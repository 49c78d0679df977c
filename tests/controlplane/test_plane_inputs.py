"""The control plane refuses requests that are not requests, and deployments are built from checked configs."""

import re

import numpy as np
import pytest
from kit.controlplane import TINY, make_fleet, placement

from controlplane.catalog import default_catalog
from controlplane.deployment import DeploymentConfig, build_deployment
from controlplane.plane import ControlPlane
from controlplane.routing import START
from controlplane.state import Request
from edgepop.errors import UserError

L8 = "@cf/meta/llama-3.1-8b-instruct"


def two_ingresses(catalog):
    return ControlPlane(catalog, make_fleet([1]), placement([(TINY, 0)]), np.zeros((2, 1)))


@pytest.mark.parametrize(("fields", "message"), [
    ({"prompt_tokens": -30000}, "prompt_tokens must be a finite non-negative number, got -30000"),
    ({"prompt_tokens": float("nan")}, "prompt_tokens must be a finite non-negative number, got nan"),
    ({"prompt_tokens": float("inf")}, "prompt_tokens must be a finite non-negative number, got inf"),
    ({"prompt_tokens": "10"}, "prompt_tokens must be a finite non-negative number, got '10'"),
    ({"output_tokens": -5}, "output_tokens must be a non-negative number, got -5"),
    ({"output_tokens": float("nan")}, "output_tokens must be a non-negative number, got nan"),
    ({"ingress": -1}, r"ingress must be an integer row of the RTT matrix \(0 to 1\), got -1"),
    ({"ingress": 2}, r"ingress must be an integer row of the RTT matrix \(0 to 1\), got 2"),
    ({"ingress": "AMS"}, r"ingress must be an integer row of the RTT matrix \(0 to 1\), got 'AMS'"),
    ({"ingress": 0.5}, r"ingress must be an integer row of the RTT matrix \(0 to 1\), got 0.5")])
def test_a_request_with_a_bad_field_is_refused_and_holds_nothing(catalog, fields, message):
    cp = two_ingresses(catalog)
    req = Request(7, TINY, **{"ingress": 1, "prompt_tokens": 10, "output_tokens": 5, **fields})
    with pytest.raises(UserError, match=f"^request 7: {message}$"):
        cp.submit(req, 0.0)
    r = cp.state.replicas[0]
    assert (r.active, r.kv_used, len(r.queue), cp.counts["submitted"]) == (0, 0, 0, 0)
    assert cp.submit(Request(8, TINY, 1, 10, 5), 0.0).action == START



@pytest.mark.parametrize("ingress", [1.0, True, np.float64(1.0)])
def test_a_non_integer_ingress_is_refused_even_once_its_row_is_cached(catalog, ingress):
    # 1.0 and True compare and hash like row 1: a cached candidate list would serve them without a word
    cp = two_ingresses(catalog)
    first = Request(0, TINY, 1, 10, 5)
    assert cp.submit(first, 0.0).action == START  # row 1's candidate list is cached now
    cp.finish(first, 0.0)
    message = r"^request 7: ingress must be an integer row of the RTT matrix \(0 to 1\), got "
    with pytest.raises(UserError, match=message + re.escape(repr(ingress)) + "$"):
        cp.submit(Request(7, TINY, ingress, 10, 5), 1.0)
    assert cp.counts["submitted"] == 1
    assert cp.submit(Request(8, TINY, np.int64(1), 10, 5), 1.0).action == START  # a numpy integer is a row


def test_an_int_subclass_ingress_is_a_row(catalog):
    """An ``IntEnum`` of PoP rows was refused by the integer check, and the error then named a field that was
    fine (the message's own check took it for an integer)."""
    import enum

    class Pop(enum.IntEnum):
        FRA = 1

    cp = two_ingresses(catalog)
    assert cp.submit(Request(7, TINY, Pop.FRA, 10, 5), 0.0).action == START


def test_a_negative_request_cannot_overcommit_the_kv_pool(catalog):
    cp = two_ingresses(catalog)
    r = cp.state.replicas[0]
    with pytest.raises(UserError):
        cp.submit(Request(0, TINY, 0, -r.kv_capacity), 0.0)
    window = catalog[TINY].context_window
    started = sum(cp.submit(Request(k, TINY, 0, window), 0.0).action == START for k in range(1, r.slots + 1))
    assert started == min(r.slots, r.kv_capacity // window)
    assert 0 < r.kv_used <= r.kv_capacity


def test_the_same_request_cannot_run_twice_nor_finish_twice(catalog):
    cp = two_ingresses(catalog)
    r = cp.state.replicas[0]
    req = Request(1, TINY, 0, 10, 5)
    assert cp.submit(req, 0.0).action == START
    with pytest.raises(UserError, match="^request 1 was submitted again while it is running"):
        cp.submit(req, 0.5)
    assert (r.active, r.kv_used) == (1, 15)
    cp.finish(req, 1.0)
    with pytest.raises(UserError, match="^request 1 is not running"):
        cp.finish(req, 2.0)
    assert (r.active, r.kv_used) == (0, 0)
    rejected = Request(2, "@cf/no/such", 0, 10)
    assert cp.submit(rejected, 3.0).code == 5007
    with pytest.raises(UserError, match="^request 2 is not running"):
        cp.finish(rejected, 3.0)
    # finished, it may be submitted again (a retry)
    assert cp.submit(req, 4.0).action == START


def test_a_queued_request_cannot_be_submitted_again(catalog):
    cp = two_ingresses(catalog)
    r = cp.state.replicas[0]
    for k in range(r.slots):
        cp.submit(Request(k, TINY, 0, 5), 0.0)
    queued = Request(100, TINY, 0, 5)
    assert cp.submit(queued, 0.0).action == "queue"
    with pytest.raises(UserError, match="^request 100 was submitted again while it is queued"):
        cp.submit(queued, 0.1)
    assert len(r.queue) == 1


# ---------------------------------------------------------------- DeploymentConfig.check and build_deployment
@pytest.mark.parametrize(("fields", "message"), [
    ({"init_s": -100}, "init_s must be a finite non-negative number of seconds, got -100"),
    ({"init_s": float("nan")}, "init_s must be a finite non-negative number of seconds, got nan"),
    ({"init_s": "5"}, "init_s must be a finite non-negative number of seconds, got '5'"),
    ({"queue_limit": True}, "queue_limit must be an integer >= 1, got True")])
def test_check_covers_the_admission_fields(fields, message):
    with pytest.raises(UserError, match=f"^cfg: {message}$"):
        DeploymentConfig(**fields).check("cfg")
    DeploymentConfig(init_s=0).check("cfg")  # no setup time is a valid cold start: loading only


@pytest.mark.parametrize(("fields", "message"), [
    ({"queue_limit": 0}, "queue_limit must be an integer >= 1, got 0"),
    ({"queue_timeout_s": 0}, "queue_timeout_s must be a positive number, got 0"),
    ({"load_gbs": 0}, "load_gbs must be a positive number, got 0"),
    ({"init_s": -100}, "init_s must be a finite non-negative number of seconds, got -100"),
    ({"init_s": float("nan")}, "init_s must be a finite non-negative number of seconds, got nan"),
    ({"router": "p2c", "router_options": {"k": 1}}, "k must be at least 2")])
def test_build_deployment_checks_its_config(topo, fields, message):
    cfg = DeploymentConfig(pops=["AMS"], **fields)
    with pytest.raises(UserError, match=f"deployment 'edge'.*{message}|{message}"):
        build_deployment("edge", cfg, topo, default_catalog(), demand_rps=5, mix={L8: 1.0})


def test_build_deployment_mix(topo):
    cfg = DeploymentConfig(pops=["AMS"])
    with pytest.raises(UserError, match="^the model mix is empty$"):
        build_deployment("edge", cfg, topo, default_catalog(), demand_rps=5, mix={})
    dep = build_deployment("edge", cfg, topo, default_catalog(), demand_rps=5, mix={L8: 1.0})
    assert set(dep.plane.state.by_model) == {L8}
