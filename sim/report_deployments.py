"""The report's line on how each deployment was placed and routed, and its warning when the two sides are routed
by different rules (summary.json's ``deployments.<name>.routing`` and ``placement`` blocks)."""

from __future__ import annotations


def _options(options: dict) -> str:
    return ", ".join(f"{k} = {v:g}" if isinstance(v, int | float) and not isinstance(v, bool) else f"{k} = {v}"
                     for k, v in options.items())


def rule_text(routing: dict) -> str:
    """``nearest-balanced (window_ms = 10)``: a router with its options (summary.json's ``routing`` block)."""
    opts = _options(routing.get("options") or {})
    return routing["router"] + (f" ({opts})" if opts else "")


def deployment_lines(summary: dict) -> list[str]:
    """How each deployment was placed and routed, and a warning when the two sides are routed by different rules
    (a gain may then be the router's, not the deployment's)."""
    parts, rules = [], {}
    for name, block in summary["deployments"].items():
        r, p = block.get("routing"), block.get("placement")
        if not r or not p:
            continue
        rules[name] = rule = rule_text(r)
        wrapped = f" inside {r['wrapped_by']}" if r.get("wrapped_by") else ""
        parts.append(f"{name}: {p['policy']} placement ({p['replicas']:,} replicas on {p['gpus_placed']:,} GPUs), "
                     f"routed by {rule}{wrapped}, queue limit {r['queue_limit']:,} (timeout {r['queue_timeout_s']:g} s)")
    if not parts:
        return []
    out = ["Deployments: " + "; ".join(parts) + "."]
    if len(set(rules.values())) > 1:
        out.append("The deployments are routed by different rules: a gain may be the router's rather than the "
                   "deployment's (the same router on both sides compares the deployments alone).")
    return out
