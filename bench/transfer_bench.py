"""A large model to several executors: what the driver sends, and how long until every
executor has built it, the driver's file (``ship="driver"``) against the executors' files
written at ship time (``ship="auto"``: shares read from the driver's channel, exchanged
between executors through Spark's shuffle, :mod:`spark_keras.executor.transport.chunked`),
on ``local-cluster[4,1,1024]`` (four executor JVMs on this machine), each path in a fresh driver process
(:func:`bench.large_bench.launch`).

The driver's bytes are counted per TCP socket on the loopback (:mod:`bench.socket_bytes`):
the sockets of the driver's processes (its Python, its JVM) whose other end belongs to an
executor's process (its JVM, its Python workers), so Py4J between the driver's own
processes does not count. Each build of the model in a worker is read from the build log
(``SPARK_KERAS_BUILD_LOG``): its executor (the worker's daemon's parent) and when it ended.
On paper, from the measured figures: the time until 500 executors have the model at
10 Gb/s per host (:func:`on_paper`). ``python -m bench --only transfer``.
"""

from __future__ import annotations

from typing import Any

from bench import large_bench
from bench.report import table
from bench.targets import _target

GIB = 0.5  # a 512 MB model (8 Dense(4096) layers of 64 MiB)
EXECUTORS = 4
MASTER = f"local-cluster[{EXECUTORS},1,1024]"
LINK = 10e9 / 8  # bytes per second of a 10 Gb/s link
FLEET = 500  # executors, on paper
SHARE_MIB = 32  # chunked.SHARE_BYTES, in MiB
SENT_RATIO = 1.5  # target: the shuffle path's driver bytes for four executors, x the payload
JVM_MARGIN = 0.2  # target: the shuffle path's JVM peaks, GiB above the driver's file's
TITLE = ("## A large model to four executors: the driver's file vs shares through Spark's "
         "shuffle, on local-cluster[4,1,1024]")

DRIVER, CHUNKS = "ship='driver' (the driver's file)", "ship='auto' (shares through a shuffle at ship time)"
PLAN = [(DRIVER, "driver"), (CHUNKS, "auto")]


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Both paths side by side, each in a fresh driver process."""
    gib = 0.1 if quick else GIB
    rows = [row(large_bench.launch(gib, ship, master=MASTER, partitions=EXECUTORS,
                                   count_bytes=True), label) for label, ship in PLAN]
    for r in rows:
        r[f"{FLEET} executors at 10 Gb/s, s (on paper)"] = on_paper(r)
    return rows


def executors_built(result: dict[str, Any]) -> tuple[int, float | None]:
    """How many executor JVMs had a worker build the model, and the seconds from the
    ship's start until the last build ended (None: no build was logged)."""
    processes = {p["pid"]: p for p in result.get("processes", [])}

    def executor(pid: int) -> int | None:
        for _ in range(4):  # worker -> daemon -> executor JVM
            found = processes.get(pid)
            if found is None:
                return None
            if found["role"] == "executor JVM":
                return pid
            pid = found.get("ppid", 0)
        return None

    builds = result.get("builds", [])
    executors = {executor(b["pid"]) for b in builds} - {None}
    return len(executors), max((b["s"] for b in builds), default=None)


def row(result: dict[str, Any], label: str) -> dict[str, Any]:
    """One table row of a run."""
    payload = result.get("payload_bytes") or 1
    processes = result.get("processes", [])

    def peak(role: str, key: str) -> float:
        return max((p[key] / 2**20 for p in processes if p["role"] == role), default=0.0)

    built, last = executors_built(result)
    sent = result.get("driver_sent_bytes", 0)
    return {"path": label, "payload MB": payload / 1e6, "chunks": result.get("chunks", 0),
            "executors that built it": built, "driver sent MB": sent / 1e6,
            "driver sent x payload": sent / payload, "shares": result.get("shares", 0), "ship s": result.get("ship_s"),
            "all executors built s": last, "exact": result.get("exact", False),
            "driver Python private GiB": peak("driver Python", "anon"),
            "driver JVM RSS GiB": peak("driver JVM", "rss"),
            "executor JVM RSS GiB (max)": peak("executor JVM", "rss"),
            "error": result.get("error", "")}


def on_paper(r: dict[str, Any]) -> float | None:
    """Seconds until :data:`FLEET` executors have built the model at :data:`LINK`
    bytes/s per host, from this run's figures (``after``: the measured seconds from the
    end of shipping until all four executors had built it, every per-chunk cost of the
    loopback included, kept whole).

    The driver's file: the driver's link carries one copy per executor,
    ``ship s + FLEET x payload / link + after``. Shares through a shuffle: each byte
    leaves the driver once (a share per map task), then executors fetch the shares from
    each other: the measured copies cross the driver's link whatever the number of
    executors, and each executor's link carries one payload in and one out (its map
    output, full duplex), ``all built s + max(driver's copies, 1) x payload / link`` (the
    measured seconds, kept whole: an executor's work is a payload through its map tasks and
    one through its reduce task whatever the number of executors; the driver's scheduling
    of a map and a reduce task per executor, about a millisecond each, and the n blocks
    each reduce task fetches, not counted)."""
    if r.get("all executors built s") is None or r.get("ship s") is None:
        return None
    payload = r["payload MB"] * 1e6
    after = r["all executors built s"] - r["ship s"]
    if r["chunks"]:
        return r["all executors built s"] + max(r["driver sent x payload"], 1.0) * payload / LINK
    return r["ship s"] + FLEET * payload / LINK + after


def targets(rows: list[dict[str, Any]]) -> list[str]:
    """Each path built on every executor, exactly; the shuffle path's driver bytes <= 1.5x
    the payload, its seconds until all executors have built no more than the driver's
    file's, and its JVMs' peaks within 0.2 GiB of the driver's file's."""
    by = {r["path"]: r for r in rows}
    out = [_target(f"{r['path']}: all {EXECUTORS} executors built it, predictions exact (1: yes)",
                   float(ok), ok) for r in rows
           for ok in [r["executors that built it"] == EXECUTORS and bool(r["exact"])]]
    chunks, driver = by.get(CHUNKS), by.get(DRIVER)
    if chunks is not None:
        sent = chunks["driver sent x payload"]
        out.append(_target(f"shares: the driver's processes sent <= {SENT_RATIO:g}x "
                           f"the payload", sent, sent <= SENT_RATIO))
    if chunks is not None and driver is not None:
        mine, theirs = chunks["all executors built s"], driver["all executors built s"]
        ratio = None if mine is None or not theirs else mine / theirs
        out.append(_target("shares: seconds until all executors built it, x the "
                           "driver's file's (<= 1)", ratio, ratio is not None and ratio <= 1.0))
        for role in ("driver JVM RSS GiB", "executor JVM RSS GiB (max)"):
            more = chunks[role] - driver[role]
            out.append(_target(f"shares: {role} within {JVM_MARGIN:g} GiB of the driver's "
                               f"file's ({driver[role]:.2f})", more, more <= JVM_MARGIN))
        out.append(f"[info] the driver's file: the driver sent {driver['driver sent x payload']:.2f}x "
                   f"the payload")
    return out


def body(results: dict[str, Any]) -> list[str]:
    """The section's block in docs/benchmarks.md after its run line."""
    rows = results["transfer"]
    return [
        f"A model of {GIB:g} GiB of weights (`Input((4096,))`, tanh `Dense(4096)` layers, "
        f"`Dense(8)`) on {MASTER} (four executor JVMs of 1 GiB heaps, one core each, on this "
        f"2-core machine), each path in a fresh driver process: `BroadcastModel(spark, model, "
        f"ship=...)` (ship s), then the first `transform(df).collect()` of 32 rows in "
        f"{EXECUTORS} partitions, one per executor (the workers had started and imported Keras "
        f"before). Bytes the driver's processes (its Python and its JVM) sent to the "
        f"executors' processes, from each loopback socket's `bytes_acked` (`ss -tinp`, every "
        f"50 ms). Seconds from the ship's start until the last worker's build of the model "
        f"ended (the build log); executors counted from the builds' processes. Peak private "
        f"memory of the driver's Python and peak resident sets of the JVMs (/proc, every 50 "
        f"ms). On paper: {FLEET} executors at 10 Gb/s per host from the measured figures (the "
        f"driver's file: one copy per executor through the driver's link, the measured time "
        f"after shipping kept whole; shares: the measured copies through the driver's "
        f"link whatever the number of executors, one payload through each executor's, the "
        f"measured time until all built kept whole).", "",
        table(rows, floatfmt="{:,.2f}"), "", *_per_chunk(rows),
        "Targets:", "", *(f"- {line}" for line in targets(rows)), ""]


def _per_chunk(rows: list[dict[str, Any]]) -> list[str]:
    """The measured per-share cost, the line under the table: the shuffle path's ship
    seconds beyond the driver's file's (the same payload file written on the driver; the
    rest is the warm-up's job), per share."""
    by = {r["path"]: r for r in rows}
    chunks, driver = by.get(CHUNKS), by.get(DRIVER)
    if chunks is None or driver is None or not chunks["shares"] or None in (
            chunks["ship s"], driver["ship s"]):
        return []
    each = (chunks["ship s"] - driver["ship s"]) / chunks["shares"]
    return [f"Per share ({CHUNKS}): {each:.2f} s of the ship beyond the driver's file's (one "
            f"job: a map task per share of at most {SHARE_MIB} MiB read from the driver's "
            f"channel, a reduce task per executor writing its file, {EXECUTORS} executors at "
            f"once).", ""]


if __name__ == "__main__":
    found = run()
    print(table(found, floatfmt="{:,.2f}"))
    print("\n".join(targets(found)))
