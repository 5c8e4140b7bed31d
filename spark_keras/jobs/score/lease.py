"""One job at a time per output: the lease a score run holds on each folder it writes
(its output and its quarantine, :class:`Leases`) while it runs (a ``--resume`` run from
its first look at the output; a plain one from its start until its folders are renamed
into place).

The lease is a hidden folder beside the output (``.<name>.spark-keras-lease``: names
starting with ``.`` are invisible to Spark's and pyarrow's readers, and it survives the
output's removal by a fresh run). It holds one ``holder-<token>.json`` per job that
claims the output (host, pid, when) and the holder's ``beat-<token>-<n>`` files, a new
one every :data:`BEAT_SECONDS`. Only the path layer's create, list and delete are used,
so it works wherever the job writes (local files, HDFS, object stores):

* **Taking it.** A job that finds another holder refuses (exit 2) while that job is alive:
  on this host (its name, boot and pid namespace: a container sharing the host's name
  has pids of its own) while its process runs; on another, while its beats go on (watched for up
  to :data:`STALE_SECONDS`). A holder found dead (a SIGKILLed driver, a preempted node)
  is removed, so a rerun resumes without help (a holder file that is not a holder's at
  once: each is written whole). Then the job writes its holder file, waits
  :data:`SETTLE_SECONDS` and lists again: of jobs that claimed the output at the same
  moment, the one whose token sorts first keeps it, the others withdraw and refuse.
* **Whose it is.** The job makes the lease folder writable by nobody else (no ACL a
  shared folder's default ACL would give it: :func:`~spark_keras.jobs.score.trust.make_folder`).
  A lease folder another user made (in a shared folder such as ``/tmp``, with a holder
  naming a process that never ends), one others can write, one in a folder another user
  can swap it from, or a holder file another user owns, is refused naming its owner or
  mode and the fix (:func:`~spark_keras.jobs.score.trust.trusted`), not taken for a live
  job's.
* **Holding it.** Before each commit and the ``_SUCCESS`` file the job checks that its
  holder file is still there and the first: a job judged dead by another (beats stalled
  past :data:`STALE_SECONDS`), or one whose claim another's preceded, stops instead of
  publishing over the other's output. Before each rename of a commit it checks again
  (:meth:`Lease.held`): its own last beat must have landed less than half
  :data:`STALE_SECONDS` ago (no other host can have judged it gone), and the holder
  files are listed again once the last look is :data:`CHECK_SECONDS` old, so a driver
  paused inside a commit past a takeover renames nothing more.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any, Iterable

from spark_keras.jobs.score.errors import JobError
from spark_keras.jobs.score.files import Paths, join, write_whole
from spark_keras.jobs.score.trust import foreign_owner, make_folder, trusted

__all__ = ["Lease", "Leases", "lease_folder", "BEAT_SECONDS", "STALE_SECONDS"]

logger = logging.getLogger("spark_keras.jobs.score")

BEAT_SECONDS = 5.0  # a holder's new beat file, this often
STALE_SECONDS = 30.0  # a holder on another host whose beats stalled this long is gone
SETTLE_SECONDS = 1.0  # between writing a holder file and looking for rivals again
CHECK_SECONDS = 1.0  # a commit's renames list the lease again once its last check is older
_SUFFIX = ".spark-keras-lease"


def lease_folder(place: str) -> str:
    """The lease folder of the output at ``place`` (:meth:`Paths.place`: one spelling
    per place, so every job on an output finds the same lease): a hidden sibling."""
    parent, _, name = place.rpartition("/")
    if not name or parent.endswith((":", ":/")):
        raise JobError(f"output {place!r} is the root of its filesystem or bucket: give "
                       f"a folder inside it")
    return join(parent or "/", f".{name}{_SUFFIX}")


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (Linux's ``/proc``: a pid reused by another
    process has another); None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None


def _pid_space() -> str | None:
    """This process's boot and pid namespace (Linux's ``/proc``): two jobs of one host
    name see each other's pids only if both agree. Containers that share the host's
    network share its host name, not its pids (``docker --net=host``, Kubernetes'
    ``hostNetwork``): there, another job's pid names another process or none."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f"{f.read().strip()} {os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def _running(pid: int, start: str | None) -> bool:
    """Whether process ``pid`` of this host runs (the same process, if ``start`` is known)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it runs
        pass
    return start is None or _process_start(pid) in (None, start)


class Lease:
    """This job's claim on ``output`` (see the module docstring): :meth:`take`,
    :meth:`check` before each change readers may see, :meth:`release` at the end."""

    def __init__(self, paths: Paths, output: str) -> None:
        self._paths = paths
        self._output = output
        self.folder = lease_folder(paths.place(output))
        self._token = ""  # made as the holder file is written (take)
        self._holder = ""
        self._stop = threading.Event()
        self._landed = self._checked = float("-inf")  # monotonic: last beat written, checked
        self._thread: threading.Thread | None = None

    def _holders(self) -> dict[str, str]:
        """token -> holder file path, of every job that claims the output now."""
        trusted(self._paths, self.folder, f"the lease folder of output {self._output!r},")
        if not self._paths.exists(self.folder):
            return {}
        found = {e.name[len("holder-"):-len(".json")]: join(self.folder, e.name)
                 for e in self._paths.children(self.folder)
                 if e.name.startswith("holder-") and e.name.endswith(".json")}
        for path in found.values():
            owner = foreign_owner(self._paths, path)
            if owner is not None:
                raise JobError(f"the lease of output {self._output!r} holds {path!r}, a holder "
                               f"file of user {owner}, not of the user who runs this job: "
                               f"another user may have put it there to hold this job back; "
                               f"it is not taken for a live job's: have {owner} (or root) "
                               f"remove it")
        return found

    def _beats(self, token: str) -> list[str]:
        prefix = f"beat-{token}-"
        if not self._paths.exists(self.folder):
            return []
        return [e.name for e in self._paths.children(self.folder) if e.name.startswith(prefix)]

    def _describe(self, info: dict) -> str:
        return (f"pid {info.get('pid')} on host {info.get('host')!r}, started "
                f"{info.get('started')}")

    def _alive(self, token: str, path: str) -> tuple[bool, dict]:
        """Whether the job of the holder file ``path`` runs, and what the file says."""
        try:
            info = json.loads(self._paths.read_bytes(path))
        except Exception:  # removed since, or not a holder's (each is written whole)
            info = None
        if not isinstance(info, dict) or not isinstance(info.get("host"), str) \
                or not isinstance(info.get("pid"), int):
            return False, {"host": "?", "pid": "?", "started": f"a damaged {path!r}"}
        here = _pid_space()
        if info["host"] == socket.gethostname() and info.get("pid_space", here) == here:
            return _running(info["pid"], info.get("pid_start")), info
        seen = self._beats(token)  # another host's: alive while its beats change
        deadline = time.monotonic() + STALE_SECONDS
        while time.monotonic() < deadline:
            time.sleep(min(1.0, BEAT_SECONDS / 2))
            if not self._paths.exists(path):
                return False, info  # it released the output meanwhile
            if self._beats(token) != seen:
                return True, info
        return False, info

    def _remove(self, token: str) -> None:
        if not token:
            return
        for name in [f"holder-{token}.json"] + self._beats(token):
            self._paths.delete(join(self.folder, name))

    def take(self) -> None:
        """Claim the output, or raise :class:`JobError` naming the job that holds it."""
        while others := self._holders():  # again after a wait: another may have come
            token, path = min(others.items())
            alive, info = self._alive(token, path)
            if alive:
                raise JobError(f"output {self._output!r} is being written by another score "
                               f"job ({self._describe(info)}): one job at a time per output "
                               f"(its lease: {self.folder!r})")
            logger.info("output %s: the job that held it (%s) is gone; taking it over",
                        self._output, self._describe(info))
            self._remove(token)
            if token in self._holders():
                raise JobError(f"cannot remove {path!r}, the lease of a score job that is "
                               f"gone; remove it to go on")
        info = {"host": socket.gethostname(), "pid": os.getpid(),
                "pid_start": _process_start(os.getpid()), "pid_space": _pid_space(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        # the token orders claims by when they were written: made now, not before the
        # wait above, so a claimant that stalled comes after one that did not
        self._token = f"{time.time_ns():020d}{uuid.uuid4().hex[:8]}"
        self._holder = join(self.folder, f"holder-{self._token}.json")
        try:
            make_folder(self._paths, self.folder)  # writable by nobody else (a default ACL)
            trusted(self._paths, self.folder, f"the lease folder of output {self._output!r},")
            write_whole(self._paths, self._holder, json.dumps(info))
            self._beat(0)
            time.sleep(SETTLE_SECONDS)
            if min(self._holders(), default=self._token) != self._token:
                raise JobError(f"output {self._output!r} was claimed at the same moment by "
                               f"another score job: one job at a time per output")
        except BaseException:  # that one (the first claim keeps it), an error, a Ctrl-C:
            self.release()  # a holder left would name this live process to every rerun
            raise
        self._thread = threading.Thread(target=self._beating, name="spark-keras-lease",
                                        daemon=True)
        self._thread.start()

    def _beat(self, n: int) -> None:
        self._paths.create(join(self.folder, f"beat-{self._token}-{n:012d}"), b"")
        self._landed = time.monotonic()
        if n:
            self._paths.delete(join(self.folder, f"beat-{self._token}-{n - 1:012d}"))

    def _beating(self) -> None:
        n = 0
        while not self._stop.wait(BEAT_SECONDS):
            n += 1
            try:
                self._beat(n)
            except Exception as exc:  # a beat missed: the next one may land
                logger.debug("lease beat %d of %s not written: %s", n, self._output, exc)

    def check(self) -> None:
        """Raise :class:`JobError` unless this job still holds the output."""
        self._checked = time.monotonic()
        holders = self._holders()
        if self._token not in holders or min(holders) != self._token:
            raise JobError(f"output {self._output!r}: another score job holds it now (this "
                           f"job's lease was taken over, or claimed after it); this job "
                           f"stops before publishing anything more")

    def held(self) -> None:
        """:meth:`check`, cheaply, right before a rename of a commit: raise
        :class:`JobError` if this job's last beat landed more than half
        :data:`STALE_SECONDS` ago (a job of another host may judge it gone from
        :data:`STALE_SECONDS` after it: a driver paused, or whose beats fail), and
        :meth:`check` again if the last check is more than :data:`CHECK_SECONDS` old (a
        paused driver's is)."""
        now = time.monotonic()
        if now - self._landed > STALE_SECONDS / 2:
            raise JobError(f"output {self._output!r}: this job's lease beats stalled for "
                           f"{now - self._landed:.0f} s (a paused driver, a filesystem that "
                           f"failed them): another job may take the output over; this job "
                           f"stops before publishing anything more")
        if now - self._checked > CHECK_SECONDS:
            self.check()

    def release(self) -> None:
        """Give the output up (at the job's end, success or failure)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(BEAT_SECONDS + 5)
        try:
            self._remove(self._token)
            if self._paths.exists(self.folder) and not self._paths.children(self.folder):
                self._paths.delete(self.folder)
        except Exception as exc:  # the next job finds it dead and removes it
            logger.warning("cannot remove the lease of output %s: %s", self._output, exc)

    def __enter__(self) -> "Lease":
        self.take()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


class Leases:
    """This job's leases on each folder it writes (``None`` entries left out; one lease
    per place): all taken, in the order of their folders, or none (the refusal names
    the folder another job holds); :meth:`check` checks every one."""

    def __init__(self, paths: Paths, outputs: Iterable[str | None]) -> None:
        leases: dict[str, Lease] = {}
        for output in outputs:
            if output is not None:
                lease = Lease(paths, output)
                leases.setdefault(lease.folder, lease)
        self._paths = paths
        self._leases = [leases[folder] for folder in sorted(leases)]

    def take(self) -> None:
        """Claim every folder, or raise :class:`JobError` holding none."""
        taken: list[Lease] = []
        try:
            for lease in self._leases:
                lease.take()
                taken.append(lease)
        except BaseException:
            for lease in reversed(taken):
                lease.release()
            raise

    def add(self, output: str | None) -> None:
        """Claim one more folder (once its place is known: a table made by the run),
        unless it is one this job holds already."""
        if output is None:
            return
        lease = Lease(self._paths, output)
        if all(held.folder != lease.folder for held in self._leases):
            lease.take()
            self._leases.append(lease)

    def check(self) -> None:
        """Raise :class:`JobError` unless this job still holds every folder."""
        for lease in self._leases:
            lease.check()

    def held(self) -> None:
        """:meth:`Lease.held` of every folder: before each rename of a commit."""
        for lease in self._leases:
            lease.held()

    def release(self) -> None:
        for lease in reversed(self._leases):
            lease.release()

    def __enter__(self) -> "Leases":
        self.take()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
