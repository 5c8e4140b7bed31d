"""What the driver's channel answers each request, and who may ask it.

Each request carries a token made for one scope (:mod:`.credentials`): a handle's,
``model:<handle>``, asks about that handle alone, so a token for one model neither reads
another's payloads nor pins its versions (403); a budget's, ``budget:<key>``, reports to
that budget alone. Three routes:

* ``GET /resolve?name=<handle>&scope=<scope>``: the version that scope scores with,
  and the versions released (JSON: a version's payload SHA-256, and that of its custom
  objects when Spark ships them, :mod:`spark_keras.executor.shipped_objects`; never a
  pickle); a scope not of the forms :func:`.scopes.scope_of` makes is refused (400)
  before it reaches the schedule;
* ``GET /payload?name=<handle>&index=<n>``: a version's payload bytes (the driver keeps
  a copy of each version it shipped itself or read from storage while that version is
  current or pinned by a scope, and until ``destroy`` or until the handle is
  garbage-collected; 410 once that copy was deleted);
* ``GET /invalid?name=<budget>&scope=<scope>&...``: a task's count of invalid rows against
  a ``max_invalid`` counted over its action (:mod:`.budget_ledger`); a handle's token may
  report for its own ``predict_partition`` budgets (``p.<handle>.<limit>``).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
from typing import Any, Protocol

from spark_keras.channel import budget_ledger
from spark_keras.channel.credentials import budget_scope, handle_of, model_scope
from spark_keras.channel.protocol import Answer, Later, Refused
from spark_keras.channel.versions import CHECK_WAIT

# the scopes scopes.scope_of makes: stream:<query id>:<batch id>, sql:<execution id>,
# stage:<stage id> or stage:<context>:<stage id>
_NUMBER = r"(?:0|[1-9][0-9]{0,17})"  # as Spark writes ids: no leading zero (07 is not 7)
_SCOPE = re.compile(rf"stream:[A-Za-z0-9._-]{{1,128}}:{_NUMBER}|sql:{_NUMBER}"
                    rf"|stage:(?:[A-Za-z0-9._-]{{1,128}}:)?{_NUMBER}")
_INDEX = re.compile(r"[0-9]{1,9}")


class Versions(Protocol):
    """What the answers read: the driver's schedules and payload copies
    (:class:`.version_server.Server`)."""

    def checking(self, name: str, scope: str | None) -> concurrent.futures.Future | None: ...

    def resolve(self, name: str, scope: str | None) -> dict[str, Any]: ...

    def payload_path(self, name: str, index: int) -> str: ...


def answer(owner: Versions, path: str, query: dict[str, str], token_scope: str) -> Answer | Later:
    """The answer to a request that showed a token made for ``token_scope`` (run in
    the channel's pool)."""
    name = query.get("name", "")
    if not name or len(name) > 256:
        raise Refused(400, "a request names a model (name=)")
    if not _allowed(path, name, token_scope):
        raise Refused(403, f"this token is not {name[:100]!r}'s (it is {token_scope[:100]!r}'s)")
    scope = query.get("scope") or None
    if scope is not None and not _SCOPE.fullmatch(scope):
        raise Refused(400, f"malformed scope {scope[:100]!r} (stream:<query id>:<batch>, "
                           f"sql:<execution id> or stage:<stage id>)")
    if path == "/invalid":  # a task's invalid rows (name: the budget's key)
        return Answer(json.dumps(budget_ledger.answer(query, scope, handle_of(token_scope))).encode())
    if path == "/resolve":
        checking = owner.checking(name, scope)  # a watched file's check, off the pool
        if checking is not None:
            return Later(checking, CHECK_WAIT, lambda: _resolved(owner, name, scope))
        return _resolved(owner, name, scope)
    if path == "/payload":
        index = query.get("index", "")
        if not _INDEX.fullmatch(index):
            raise Refused(400, f"index must be a version number, not {index[:20]!r}")
        try:
            copy = owner.payload_path(name, int(index))
        except KeyError:
            raise Refused(404, f"no version {index} of model {name!r} here") from None
        try:
            f = open(copy, "rb")
        except FileNotFoundError:
            raise Refused(410, f"{copy} was deleted") from None
        return Answer(kind="application/octet-stream", file=f, size=os.fstat(f.fileno()).st_size)
    raise Refused(404, f"no such path {path[:100]!r}")


def _allowed(path: str, name: str, scope: str) -> bool:
    """Whether a token made for ``scope`` may ask ``path`` about ``name``: a handle's
    token its own versions and payloads, and its ``predict_partition`` budgets' reports
    (``p.<handle>.<limit>``); a budget's its reports."""
    if path == "/invalid":
        handle = handle_of(scope)
        return scope == budget_scope(name) or (handle is not None and name.startswith(f"p.{handle}."))
    return scope == model_scope(name)


def _resolved(owner: Versions, name: str, scope: str | None) -> Answer:
    try:
        resolved = owner.resolve(name, scope)
    except KeyError:
        raise Refused(404, f"no model {name!r} here") from None
    return Answer(json.dumps(resolved).encode())
