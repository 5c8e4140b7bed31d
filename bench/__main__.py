"""`python -m bench [--quick] [--only SECTION,...] [--write]`.

Sections: payload, scoring, memory, dask, coldstart, frontends, inputs, threads,
operations, isolation, keyed, large, transfer, commits, images.

Prints each section's table. With --write, also rewrites the sections it ran in
docs/benchmarks.md (tables, command, machine, date, targets met or not), keeping the
others, and docs/benchmarks.png when it ran the scoring section.

`PYTHONPATH=<dir> python -m bench` measures the spark_keras found in <dir> (say an older
checkout): its entries go ahead of the working directory, which `python -m` puts first.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path[:0] = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]

from bench import docs, targets  # noqa: E402
from bench.docs import TITLES  # noqa: E402
from bench.report import table  # noqa: E402

# a section's run: what it adds to the results, its heading, its tables and the lines under them
Shown = tuple[dict, str, list[str], list[str]]


def _payload(args: argparse.Namespace) -> Shown:
    from bench import payload_bench

    rows = payload_bench.run(repeats=1 if args.quick else args.repeats,
                             names=["MLP 90MB"] if args.quick else None)
    return ({"payload": rows}, "## Rebuild: pickle.loads(pickle.dumps(m)) vs spark_keras.loads(spark_keras.dumps(m)) "
            "vs spark_keras.load(file, share_weights=True)", [table(rows)], targets.payload_targets(rows))


def _scoring(args: argparse.Namespace) -> Shown:
    from bench import scoring_bench

    rows, facts = scoring_bench.run(quick=args.quick)
    shown = "\n".join(f"{k}: {v:.1f}" if isinstance(v, float) else f"{k}: {v}" for k, v in facts.items())
    return ({"scoring": rows, "facts": facts}, "## Scoring throughput on local[2]",
            [table(rows, floatfmt="{:,.2f}")], ["\n" + shown, *targets.scoring_targets(rows, facts)])


def _memory(args: argparse.Namespace) -> Shown:
    from bench import memory_bench

    rows = memory_bench.run(quick=args.quick)
    return ({"memory": rows}, "## Memory: N Python workers holding one model, a copy per worker vs one shared file",
            [table(rows, floatfmt="{:,.2f}")], targets.memory_targets(rows))


def _dask(args: argparse.Namespace) -> Shown:
    from bench import dask_bench

    rows = dask_bench.run(repeats=1 if args.quick else args.repeats)
    return {"dask": rows}, "## Dask: client.submit(f, model), Keras pickling vs payload vs ship()", [table(rows)], []


def _coldstart(args: argparse.Namespace) -> Shown:
    from bench import coldstart_bench

    rows = coldstart_bench.run(quick=args.quick)
    return ({"coldstart": rows}, "## Cold start of a fresh Python worker (spark.python.worker.reuse=false): "
            "pyspark.daemon vs spark_keras.executor.daemon, local[2]", [table(rows)], targets.coldstart_targets(rows))


def _frontends(args: argparse.Namespace) -> Shown:
    from bench import frontends_bench

    rows = frontends_bench.run(quick=args.quick)
    return ({"frontends": rows}, "## Front-ends: predict_partition, pool_predict, predict_dask against the raw "
            "model (MLP, batch 1024)", [table(rows, floatfmt="{:,.2f}")], [])


def _inputs(args: argparse.Namespace) -> Shown:
    from bench import inputs_bench

    rows, lengths = inputs_bench.run(quick=args.quick)
    return ({"inputs": rows, "inputs_lengths": lengths}, TITLES["inputs"],
            [table(rows, floatfmt="{:,.2f}"), table(lengths, floatfmt="{:,.2f}")],
            targets.inputs_targets(rows, lengths))


def _threads(args: argparse.Namespace) -> Shown:
    from bench import threads_bench

    rows = threads_bench.run(quick=args.quick)
    return {"threads": rows}, TITLES["threads"], [table(rows, floatfmt="{:,.2f}")], []


def _operations(args: argparse.Namespace) -> Shown:
    from bench import operations_bench

    rows = operations_bench.run(quick=args.quick)
    return {"operations": rows}, TITLES["operations"], [table(rows, floatfmt="{:,.3f}")], []


def _isolation(args: argparse.Namespace) -> Shown:
    from bench import isolation_bench

    rows = isolation_bench.run(quick=args.quick)
    return ({"isolation": rows}, TITLES["isolation"], [table(rows, floatfmt="{:,.3f}")],
            targets.isolation_targets(rows))


def _keyed(args: argparse.Namespace) -> Shown:
    from bench import keyed_bench

    rows, memory, curve = keyed_bench.run_all(quick=args.quick)
    return ({"keyed": rows, "keyed_memory": memory, "keyed_curve": curve}, TITLES["keyed"],
            [table(rows, floatfmt="{:,.3f}"), table(memory, floatfmt="{:,.2f}"),
             table(curve, floatfmt="{:,.3f}")],
            targets.keyed_targets(rows, curve))


def _large(args: argparse.Namespace) -> Shown:
    from bench import large_bench

    rows = large_bench.run(quick=args.quick)
    return ({"large": rows}, TITLES["large"], [table(rows, floatfmt="{:,.2f}")],
            targets.large_targets(rows))


def _transfer(args: argparse.Namespace) -> Shown:
    from bench import transfer_bench

    rows = transfer_bench.run(quick=args.quick)
    return ({"transfer": rows}, TITLES["transfer"], [table(rows, floatfmt="{:,.2f}")],
            transfer_bench.targets(rows))


def _commits(args: argparse.Namespace) -> Shown:
    from bench import commit_cost, commits_bench, resume_kill

    rows = commits_bench.run(quick=args.quick)
    if not args.quick:  # more task slots than a group's tasks (a minute more)
        rows += commits_bench.run(master=commits_bench.CLUSTER)
    costs = commit_cost.measure(quick=args.quick)
    killed = resume_kill.run(quick=args.quick)
    return ({"commits": rows, "commit_cost": costs, "resume_kill": killed}, TITLES["commits"],
            [table(rows, floatfmt="{:,.3f}"), table(costs, floatfmt="{:,.1f}"),
             table(killed, floatfmt="{:,.2f}")],
            targets.commits_targets(rows) + targets.resume_kill_targets(killed))


def _images(args: argparse.Namespace) -> Shown:
    from bench import images_bench

    rows = images_bench.run(quick=args.quick)
    return ({"images": rows}, TITLES["images"], [table(rows, floatfmt="{:,.3f}")],
            targets.images_targets(rows))


RUNNERS = {"payload": _payload, "scoring": _scoring, "memory": _memory, "dask": _dask, "coldstart": _coldstart,
           "frontends": _frontends, "inputs": _inputs, "threads": _threads, "operations": _operations,
           "isolation": _isolation, "keyed": _keyed, "large": _large, "transfer": _transfer,
           "commits": _commits,
           "images": _images}
SECTIONS = tuple(RUNNERS)


def machine() -> str:
    import pyspark

    from spark_keras import flavour

    keras = flavour.current()
    shown = getattr(keras, "display_name", "tf-keras" if _legacy() else "Keras")  # (older versions)
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{platform.machine()}, {os.cpu_count()} cores, {mem:.0f} GiB, Linux {platform.release()}, "
            f"Python {platform.python_version()}, PySpark {pyspark.__version__}, "
            f"{shown} {keras.version}")


def _legacy() -> bool:
    """Under tf-keras; ``Flavour.legacy`` where spark_keras has it (older versions do not)."""
    from spark_keras import flavour

    keras = flavour.current()
    return getattr(keras, "legacy", keras.name == "tf_keras")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md and .png")
    args = parser.parse_args(argv)
    sections = [s for s in args.only.split(",") if s]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    from spark_keras import flavour

    legacy = _legacy()
    if legacy and sections != ["payload"]:
        parser.error("under tf-keras (TF_USE_LEGACY_KERAS=1) only --only payload is available")
    started = time.perf_counter()
    given = sys.argv[1:] if argv is None else argv
    command = " ".join(["TF_USE_LEGACY_KERAS=1"] * legacy + ["python -m bench", *given])
    results: dict = {"machine": machine(), "command": command,
                     "date": datetime.date.today().isoformat(),
                     "flavour": flavour.current().name}
    print(f"machine: {results['machine']}")
    timings = results["section_seconds"] = {}
    section_started = time.perf_counter()

    def section_done(name: str) -> None:
        nonlocal section_started
        timings[name] = time.perf_counter() - section_started
        print(f"({name}: {timings[name]:.0f} s)")
        section_started = time.perf_counter()

    for name in SECTIONS:
        if name in sections:
            found, heading, tables, notes = RUNNERS[name](args)
            results.update(found)
            print(f"\n{heading}\n")
            print("\n\n".join(tables))
            for line in notes:
                print(line)
            section_done(name)
    results["seconds"] = time.perf_counter() - started
    print(f"\nbench finished in {results['seconds']:.0f}s")
    if args.write:
        docs.write_docs(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
