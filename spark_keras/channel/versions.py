"""Which version of a BroadcastModel each Spark task scores with (kept on the driver).

A Spark plan carries a handle as it was pickled when the plan was made, and a streaming
query keeps its plan for its whole life, so a new version cannot travel in the plan:
each task asks the driver (:mod:`.version_server`) which version its *scope*
(:mod:`.scopes`) uses, and the driver's :class:`Schedule` of that handle answers. The
first task of a scope to ask pins the scope to the version current then; every later
task of it gets the same one:

* a micro-batch of a streaming query, ``stream:<query id>:<batch id>``: a micro-batch
  that Spark runs again (a failed task, or the query restarted from its checkpoint in
  this driver process) gets the version it was first scored with, so the file sink's
  exactly-once output holds;
* a batch action (one SQL execution, every stage of it), ``sql:<execution id>``;
* an RDD job, ``stage:<stage id>`` (a retried stage keeps its id).

Only a scope that Spark runs now, or is about to, is pinned (:mod:`.running`: the
driver's own Spark says so; any holder of the handle's token can name any scope): one it
does not run, a future SQL execution or stage, an unseen micro-batch, is answered the
current version and pins nothing. Spark runs the micro-batches of a query one after
another, so a micro-batch is done once a later one of its query runs and asks: its pin
goes then (a query holds one pin, its latest micro-batch's), and a straggling task of an
earlier micro-batch gets the current version. Past :data:`MAX_PINS` per handle, the pins
of scopes Spark no longer runs go, least recently asked first, never a running one's.

A version is *released* once it is not current and no micro-batch that could still run
holds it: the workers that learn of it drop its model and the executors' file of its
payload. Batch actions do not hold a version: one in flight when its version is released
rebuilds it (from the driver's copy) where a worker dropped it. A version that is neither
current nor pinned by any scope is *unused*: no task can be given it any more, and the
driver deletes its copy (:meth:`Schedule.when_unused`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import os
import threading
import time
import weakref
from typing import Any, Callable

from spark_keras import storage
from spark_keras.errors import ArgumentError, ArgumentTypeError
from spark_keras.inference.specs import Signature
from spark_keras.payload.stored import StoredModel

logger = logging.getLogger("spark_keras")

# pins kept per handle; past it, those of scopes Spark no longer runs go (least recently
# asked first; where the driver cannot tell, on Spark Connect, the least recently asked)
# and, when every pin is a running scope's, a new scope gets the current version unpinned
MAX_PINS = 10_000
# seconds the first request of a new scope waits for a running check of its handle's
# watched file (off the channel's pool) before it is answered the current version
CHECK_WAIT = 5.0


@dataclasses.dataclass(frozen=True)
class Version:
    """One version of a handle's model: its ``label`` (what ``version_col`` says), the
    cache ``key`` workers build it under, its payload's size, and how it reaches the
    workers (``source``: a dict the worker's transport is made from; None for the
    handle's own first version, which travels with the handle)."""

    index: int
    label: str
    key: str
    nbytes: int
    source: dict[str, Any] | None = None


class Schedule:
    """A handle's versions on the driver: the current one, and the scopes pinned."""

    def __init__(self, first: Version) -> None:
        self._lock = threading.Lock()
        self.versions: dict[int, Version] = {first.index: first}
        self.current = first.index
        # scope -> version index, least recently asked first
        self._pins: collections.OrderedDict[str, int] = collections.OrderedDict()
        # per streaming query with a pin: its latest micro-batch that asked, and its scope
        self._latest_batch: dict[str, tuple[int, str]] = {}
        self._holders: collections.Counter[int] = collections.Counter()  # index -> its pins
        self._on_unused: Callable[[list[int]], None] | None = None

    def when_unused(self, call: Callable[[list[int]], None]) -> None:
        """Have ``call(indices)`` run (outside the schedule's lock) when versions become
        unused: neither current nor pinned by any scope, so that no task is given them
        any more (a version stops being current for good)."""
        self._on_unused = call

    def add(self, version: Version) -> None:
        """Make ``version`` current: scopes that ask from now on get it."""
        with self._lock:
            previous = self.current
            self.versions[version.index] = version
            self.current = version.index
            unused = self._unused([previous])
        self._report(unused)

    def labels(self) -> list[str]:
        with self._lock:
            return [v.label for v in self.versions.values()]

    def next_index(self) -> int:
        """The number the next version gets (its default label, if not taken)."""
        with self._lock:
            return max(self.versions) + 1

    def rename(self, key_of: Callable[[Version], str]) -> None:
        """Give every version the cache key ``key_of(version)`` (after ``unpersist()``:
        workers build them afresh under those, and drop them under those when released)."""
        with self._lock:
            self.versions = {i: dataclasses.replace(v, key=key_of(v)) for i, v in self.versions.items()}

    def current_only(self) -> "Schedule":
        """A schedule of the current version alone: what a collected handle's plans still
        ask for (no pin, nothing released)."""
        with self._lock:
            return Schedule(self.versions[self.current])

    def is_pinned(self, scope: str) -> bool:
        with self._lock:
            return scope in self._pins

    def pin(self, scope: str | None, running: Callable[[str], bool | None] | None = None
            ) -> Version:
        """The version ``scope`` scores with (the current one for a new scope, or none),
        pinned unless ``running(scope)`` (:func:`.running.running`; None: cannot tell)
        says Spark does not run it. A micro-batch's pin replaces its query's earlier one
        (done: they run one after another); one older than its query's latest (the query
        restarted in this driver from an older checkpoint) is pinned as any scope is,
        replacing none."""
        with self._lock:
            if scope is None:
                return self.versions[self.current]
            index = self._pins.get(scope)
            if index is not None:
                self._pins.move_to_end(scope)  # least recently asked goes first
                return self.versions[index]
            version = self.versions[self.current]
            if running is not None and running(scope) is False:
                return version  # to come, long done, or never run: no pin
            unpinned, room = self._room(running)
            if not room:
                logger.warning("model versions: %d scopes pinned, all running: %s is answered "
                               "the current version, unpinned", len(self._pins), scope)
            elif (stream := _stream_batch(scope)) is not None:
                query, batch = stream
                latest = self._latest_batch.get(query)
                if latest is None or batch > latest[0]:
                    if latest is not None and latest[1] in self._pins:
                        unpinned.append(self._pins.pop(latest[1]))
                    self._latest_batch[query] = (batch, scope)
            if room:
                self._pins[scope] = self.current
                self._holders[self.current] += 1
            for held in unpinned:
                self._holders[held] -= 1
            unused = self._unused(unpinned)
        self._report(unused)
        return version

    def _room(self, running: Callable[[str], bool | None] | None) -> tuple[list[int], bool]:
        """Room for a new pin (under the lock): past :data:`MAX_PINS`, the least recently
        asked scope ``running`` does not say runs is unpinned, never one it does. The
        versions unpinned, and False when every pin left is a running scope's."""
        unpinned: list[int] = []
        while len(self._pins) >= MAX_PINS:
            gone = next((s for s in self._pins if running is None or not running(s)), None)
            if gone is None:
                return unpinned, False
            unpinned.append(self._unpin(gone))
        return unpinned, True

    def _unpin(self, scope: str) -> int:
        """Drop ``scope``'s pin (under the lock); the version it held."""
        stream = _stream_batch(scope)
        if stream is not None and self._latest_batch.get(stream[0], (0, ""))[1] == scope:
            del self._latest_batch[stream[0]]
        return self._pins.pop(scope)

    def _unused(self, candidates: list[int]) -> list[int]:
        """Of ``candidates``, the versions unused now (under the lock)."""
        unused = []
        for index in dict.fromkeys(candidates):
            if self._holders[index] <= 0:
                self._holders.pop(index, None)
                if index != self.current and index in self.versions:
                    unused.append(index)
        return unused

    def _report(self, unused: list[int]) -> None:
        if unused and self._on_unused is not None:
            self._on_unused(unused)

    def released(self) -> list[Version]:
        """The versions no task needs any more: not current, and held by no micro-batch
        that could still run (a query's latest)."""
        with self._lock:
            held = {self.current}
            held.update(i for scope, i in self._pins.items() if scope.startswith("stream:"))
            return [v for i, v in self.versions.items() if i not in held]


def _stream_batch(scope: str) -> tuple[str, int] | None:
    """``(query id, batch id)`` of a micro-batch's scope, else None."""
    if not scope.startswith("stream:"):
        return None
    _, query, batch = scope.split(":")
    return query, int(batch)


def check_label(version: Any, taken: list[str], number: int = 1) -> str:
    """``version`` as a new label, refused if ``taken``; None: the first number from
    ``number`` on that is not taken."""
    if version is None:
        while str(number) in taken:
            number += 1
        return str(number)
    if not isinstance(version, str) or not version:
        raise ArgumentTypeError(f"version must be a non-empty string, not {version!r}")
    if version in taken:
        raise ArgumentError(f"version {version!r} was shipped already (versions: {taken})")
    return version


def check_refresh(refresh: Any, model_or_path: Any) -> float | None:
    """``refresh=`` as seconds (None: no watch), refused unless the model is a URI."""
    if refresh is None:
        return None
    if isinstance(refresh, bool) or not isinstance(refresh, (int, float)) or refresh < 0:
        raise ArgumentTypeError(f"refresh must be a number of seconds >= 0, not {refresh!r}")
    if not isinstance(model_or_path, (str, os.PathLike)) or not storage.is_uri(os.fspath(model_or_path)):
        raise ArgumentError("refresh= watches a model file given as a URI (file://, s3://...); "
                            "this model was not")
    return float(refresh)


def fit_problems(current: Signature, new: Signature,
                 theirs: str = "the current version's") -> list[str]:
    """How ``new``'s inputs and outputs differ from ``current``'s (none: it fits)."""
    def described(specs: Any) -> list[tuple]:
        return [(tuple(s.shape), str(s.dtype)) for s in specs]

    problems = []
    if described(current.inputs) != described(new.inputs) or \
            current.input_structure != new.input_structure:
        problems.append(f"inputs {described(new.inputs)}, {theirs} {described(current.inputs)}")
    if described(current.outputs) != described(new.outputs) or \
            current.output_names != new.output_names:
        problems.append(f"outputs {described(new.outputs)}, {theirs} "
                        f"{described(current.outputs)}")
    return problems


def check_fits(current: Signature, new: Signature) -> None:
    """Refuse a version whose inputs or outputs differ from the current one's: plans
    made with the handle fixed their columns' types."""
    problems = fit_problems(current, new)
    if problems:
        raise ArgumentError(f"the new version does not fit the plans made with this "
                            f"BroadcastModel: {'; '.join(problems)}; ship it in a new "
                            f"BroadcastModel instead")


class Watch:
    """A model file at a URI checked at most every ``refresh`` seconds (at the
    boundaries of micro-batches and actions, see :mod:`.version_server`): when its size
    or time changed, it is read, and shipped as a new version (``handle._adopt``) if its
    payload digest is not the one last shipped. Only what was shipped is recorded: a
    read or a shipment that fails is tried again at the next check."""

    def __init__(self, handle: Any, stored: StoredModel | None, refresh: float) -> None:
        if stored is None:
            raise ArgumentError("refresh= watches a model file given as a URI "
                                "(file://, s3://...); this model was not")
        self._handle = weakref.ref(handle)
        self._uri, self._refresh, self._digest = stored.uri, refresh, stored.digest
        self._stamp = storage.stamp(stored.uri)
        self._checked = time.monotonic()
        self._lock = threading.Lock()

    def check(self) -> None:
        with self._lock:
            handle = self._handle()
            if handle is None or time.monotonic() - self._checked < self._refresh:
                return
            self._checked = time.monotonic()
            stamp = storage.stamp(self._uri)  # taken before the read: a change during it shows next time
            if stamp is None or stamp == self._stamp:
                return
            payload = handle._read(self._uri, handle._custom_objects)
            if payload.stored is None or payload.stored.digest == self._digest:
                payload.discard()
                self._stamp = stamp  # touched, not changed
                return
            label = handle._adopt(payload)
            self._stamp, self._digest = stamp, payload.stored.digest
            logger.info("model file %s changed: version %s", self._uri, label)


class Check:
    """``check()`` (a :class:`Watch`'s: it may read storage and ship a version) run in a
    thread of its own, one at a time, so that the driver's channel never runs it in the
    pool answering every model's requests; its failures are logged, never raised."""

    def __init__(self, name: str, check: Callable[[], None]) -> None:
        self._name, self._check = name, check
        self._lock = threading.Lock()
        self._running: concurrent.futures.Future | None = None

    def start(self) -> concurrent.futures.Future | None:
        """The check running now, started if none runs (done once it ends); None when
        no thread can start (the interpreter is exiting)."""
        with self._lock:
            if self._running is None or self._running.done():
                future: concurrent.futures.Future = concurrent.futures.Future()
                future.set_running_or_notify_cancel()  # running: a waiter cannot cancel it
                try:
                    threading.Thread(target=self._run, args=(future,), daemon=True,
                                     name=f"spark_keras check {self._name}").start()
                except RuntimeError:
                    return None
                self._running = future
            return self._running

    def _run(self, future: concurrent.futures.Future) -> None:
        try:
            self._check()
        except Exception as exc:  # a storage hiccup must not fail the tasks asking
            logger.warning("cannot check the model file of %s for a new version: %s",
                           self._name, exc)
        finally:
            future.set_result(None)
