"""Workers AI catalog routes: model search, task list and author list, over the served models, and one model's
input and output JSON Schemas (:mod:`dataplane.gateway.schemas`).

Filters the ``cloudflare`` SDK sends (``client.ai.models.list``: ``search``, ``task``, ``author``, ``source``) are
applied, never ignored: an ignored filter would answer every model as a match. ``hide_experimental`` and
``include_deprecated`` change nothing here (no served model is either).
"""

from __future__ import annotations

import uuid

from fastapi import Request

from dataplane.gateway import schemas, standins
from dataplane.gateway.errors import bad_input
from dataplane.gateway.http_util import ok

SOURCE = 1  # the only model source here: Workers AI's own catalog (``source`` of each model-search entry)


def task_title(task: str) -> str:
    """A task's display name: ``text-generation`` -> ``Text Generation``."""
    return task.replace("-", " ").title()


def author_of(model: str) -> str:
    """``@cf/meta/llama-3`` -> ``meta``; a two-part id (``@edgepop/gpt2-tiny``) -> its namespace."""
    parts = model.lstrip("@").split("/")
    return parts[1] if len(parts) > 2 else parts[0]


def _uid(kind: str, name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{kind}:{name}" if kind else name))


def search_models(gw, q, page: int, per_page: int) -> tuple[list[dict], dict]:
    """Served models in the Workers AI model-search shape, filtered by the query ``q`` (substring of name or
    description, task id or name, author, source): (this page, ``result_info``). Properties say what really serves
    each model: ``stand_in`` (the data-plane model), ``is_stand_in``, the served ``context_window`` (the catalog's
    or the stand-in's, whichever is smaller) and, for embeddings, the ``dimensions`` returned."""
    search, task, author, source = q.get("search"), q.get("task"), q.get("author"), q.get("source")
    try:
        wrong_source = source is not None and float(source) != SOURCE
    except ValueError:
        raise bad_input("source must be a number") from None
    out = []
    b = gw.backend
    placement = b.placement()
    for spec in [] if wrong_source else b.catalog:
        if search and search.lower() not in spec.id.lower() and search.lower() not in spec.description.lower():
            continue
        if task and task.lower() not in (spec.task, task_title(spec.task).lower()):
            continue
        if author and author.lower() != author_of(spec.id).lower():
            continue
        pops = sorted(set(placement["pop"][placement["model"] == spec.id]))
        served = b.stand_in[spec.id]
        window = gw.context_window(spec.id) if spec.task == "text-generation" else spec.context_window
        props = [
            {"property_id": "context_window", "value": str(window)},
            {"property_id": "max_batch_prefill", "value": str(spec.max_batch)},
            {"property_id": "stand_in", "value": served},
            {"property_id": "is_stand_in", "value": str(standins.is_stand_in(spec.id, spec.stand_in, served)).lower()},
            {"property_id": "pops", "value": ",".join(pops)},
        ]
        if spec.task == "text-embeddings":
            props.append({"property_id": "dimensions", "value": str(spec.hidden)})
        out.append({
            "id": _uid("", spec.id), "source": SOURCE, "name": spec.id,
            "description": spec.description, "task": {"name": task_title(spec.task), "id": spec.task},
            "tags": [], "properties": props})
    start = (page - 1) * per_page
    items = out[start:start + per_page]
    info = {"page": page, "per_page": per_page, "count": len(items), "total_count": len(out),
            "total_pages": -(-len(out) // per_page)}
    return items, info


def register(app, gw, authenticate, prefix: str) -> None:
    """Add ``GET {prefix}/models/search``, ``/models/schema``, ``/tasks/search`` and ``/authors/search`` to
    ``app``."""
    @app.get(prefix + "/models/search")
    async def models_search(request: Request, account_id: str):
        authenticate(request, account_id)
        q = request.query_params
        try:
            page, per_page = int(q.get("page", 1)), int(q.get("per_page", 50))
        except ValueError:
            raise bad_input("page and per_page must be integers") from None
        if page < 1 or not 1 <= per_page <= 1000:
            raise bad_input("page must be >= 1 and per_page in [1, 1000]")
        items, info = search_models(gw, q, page, per_page)
        return ok(items, result_info=info)

    @app.get(prefix + "/models/schema")
    async def model_schema(request: Request, account_id: str):
        authenticate(request, account_id)
        model = request.query_params.get("model")
        if not model:
            raise bad_input("missing required query parameter 'model' (a model id, e.g. ?model=@cf/meta/...)")
        return ok(schemas.model_schema(gw, model))  # (an unknown model: 400/5007, as on /ai/run)

    # One entry per task / author of a served model; ``name`` is what the models list's filter takes.
    @app.get(prefix + "/tasks/search")
    async def tasks_search(request: Request, account_id: str):
        authenticate(request, account_id)
        tasks = sorted({spec.task for spec in gw.backend.catalog})
        return ok([{"id": t, "name": task_title(t), "description": f"{task_title(t)} models served here"}
                   for t in tasks])

    @app.get(prefix + "/authors/search")
    async def authors_search(request: Request, account_id: str):
        authenticate(request, account_id)
        authors = sorted({author_of(spec.id) for spec in gw.backend.catalog})
        return ok([{"id": _uid("author", a), "name": a, "description": f"models by {a}"} for a in authors])
