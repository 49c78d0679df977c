"""The report's lines on how each deployment was placed and routed (with a warning when the two sides are routed by
different rules, and a caveat when a placement lets memory alone decide what shares a GPU: summary.json's
``deployments.<name>.routing`` and ``placement`` blocks), and on the load offered
against each side's capacity (its ``capacity`` block): every figure holds at that load; and whether the two sides
hold the same budget (GPUs and dollars per hour)."""

from __future__ import annotations


def _options(options: dict) -> str:
    """``window_ms = 10, k = 3`` (an option left unset, None, is not named)."""
    return ", ".join(f"{k} = {v:g}" if isinstance(v, int | float) and not isinstance(v, bool) else f"{k} = {v}"
                     for k, v in options.items() if v is not None)


def rule_text(routing: dict) -> str:
    """``nearest-balanced (window_ms = 10)``: a router with its options (summary.json's ``routing`` block)."""
    opts = _options(routing.get("options") or {})
    return routing["router"] + (f" ({opts})" if opts else "")


def deployment_lines(summary: dict) -> list[str]:
    """How each deployment was placed and routed, and a warning when the two sides are routed by different rules
    (a gain may then be the router's, not the deployment's)."""
    parts, rules, policies = [], {}, []
    for name, block in summary["deployments"].items():
        r, p = block.get("routing"), block.get("placement")
        if not r or not p:
            continue
        rules[name] = rule = rule_text(r)
        policies.append(p["policy"])
        wrapped = f" inside {r['wrapped_by']}" if r.get("wrapped_by") else ""
        parts.append(f"{name}: {p['policy']} placement ({p['replicas']:,} replicas on {p['gpus_placed']:,} GPUs), "
                     f"routed by {rule}{wrapped}, queue limit {r['queue_limit']:,} (timeout {r['queue_timeout_s']:g} s)")
    if not parts:
        return []
    out = ["Deployments: " + "; ".join(parts) + "."]
    if shared := memory_only_policies(policies):
        out.append(memory_only_text(shared))
    if len(set(rules.values())) > 1:
        out.append("The deployments are routed by different rules: a gain may be the router's rather than the "
                   "deployment's (the same router on both sides compares the deployments alone).")
    return out


def memory_only_policies(names) -> list[str]:
    """Of these placement policy names (each once, in order), those under which memory alone decides what shares a
    GPU (the policy's ``memory_only``); a name the registry does not know is not one."""
    from controlplane.placement import PLACEMENTS

    out = []
    for name in dict.fromkeys(names):
        if name in PLACEMENTS and getattr(PLACEMENTS.get(name), "memory_only", False):
            out.append(name)
    return out


def memory_only_text(names: list[str]) -> str:
    """The caveat of a memory-only placement: its latencies are a bound, not a plan's."""
    its = "its" if len(names) == 1 else "their"
    return (f"{' and '.join(names)} placed by memory alone: language models that share a GPU each compute as if "
            f"they had it alone, so {its} latencies are an optimistic bound, not those of a fleet that could serve "
            "this plan (docs/placement.md).")


def load_line(summary: dict) -> list[str]:
    """The mean rate offered against each deployment's capacity at the SLO (its upper bound: routing may use less)."""
    span, cap = summary.get("simulated_span_s") or 0.0, summary.get("capacity") or {}
    shares = {name: c["capacity_rps"] for name, c in cap.items() if c.get("capacity_rps")}
    if span <= 0 or not shares:
        return []
    offered = summary["requests"] / span
    parts = "; ".join(f"{offered / rps:.0%} of {name}'s capacity at the SLO ({rps:,.0f} req/s)"
                      for name, rps in shares.items())
    return [f"Load: {offered:,.1f} requests/s offered on average (the arrivals over their span): {parts}. Every "
            "figure above holds at this load; a fleet sized to it (edgepop frontier's least budget) runs hotter."]


def budget_line(summary: dict) -> list[str]:
    """A line when the edge and central hold different budgets: a gain may then be the budget's."""
    cap = summary.get("capacity") or {}
    if "edge" not in cap or "central" not in cap:
        return []
    e, c = cap["edge"], cap["central"]

    def same(key):
        return abs(e[key] - c[key]) <= 0.01 * max(abs(e[key]), abs(c[key]), 1e-9)

    held = (f"edge {e['gpus']:,} GPUs at ${e['usd_per_hour']:,.1f}/hour, "
            f"central {c['gpus']:,} at ${c['usd_per_hour']:,.1f}/hour")
    if same("gpus") and same("usd_per_hour"):
        return []
    if same("usd_per_hour"):
        return [f"Budgets: equal dollars, unequal GPUs ({held}): the two sides buy different GPU types."]
    if same("gpus"):
        return [f"Budgets: equal GPUs, unequal dollars ({held}): the two sides hold different GPU types."]
    return [f"Budgets differ ({held}): a gain may be the budget's rather than the deployment's."]


def demand_line(block: dict | None) -> str | None:
    """``Demand: ...`` from a ``demand_weight`` block (``summary.json``'s, ``frontier.json``'s: present only when
    the demand cities are not weighted by population, the default); None without one."""
    if not block or block.get("mode") != "internet_users":
        return None
    return ("Demand: each city weighted by the people online there (its population x its country's share of "
            f"individuals using the Internet, {block['source']}), not by population.")


def network_line(net: dict, hint: str = "", misroute: bool = False) -> str:
    """``Network: last mile ...; per-request RTT jitter ...`` from a ``network`` block (``summary.json``'s,
    ``frontier.json``'s); ``hint`` follows the last mile, ``misroute`` adds imperfect anycast's share when there is
    one."""
    share = net.get("anycast_misroute") or 0.0
    anycast = f"; {share:.0%} of user cities one PoP off" if misroute and share else ""
    return f"Network: last mile {net['last_mile']}{hint}; per-request RTT jitter {net.get('jitter', 'off')}{anycast}."
