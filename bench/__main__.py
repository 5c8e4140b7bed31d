"""`python -m bench [--quick] [--only payload,scoring,memory,dask,coldstart,frontends,inputs,threads,operations] [--write]`.

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

from . import report  # noqa: E402

SECTIONS = ("payload", "scoring", "memory", "dask", "coldstart", "frontends", "inputs", "threads",
            "operations")


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
    results: dict = {"machine": machine(), "command": " ".join(["TF_USE_LEGACY_KERAS=1"] * legacy + ["python -m bench", *given]),
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

    if "payload" in sections:
        from . import payload_bench

        rows = payload_bench.run(repeats=1 if args.quick else args.repeats,
                                 names=["MLP 90MB"] if args.quick else None)
        results["payload"] = rows
        print("\n## Rebuild: pickle.loads(pickle.dumps(m)) vs spark_keras.loads(spark_keras.dumps(m)) "
              "vs spark_keras.load(file, share_weights=True)\n")
        print(report.table(rows))
        for line in report.payload_targets(rows):
            print(line)
        section_done("payload")
    if "scoring" in sections:
        from . import scoring_bench

        rows, facts = scoring_bench.run(quick=args.quick)
        results["scoring"], results["facts"] = rows, facts
        print("\n## Scoring throughput on local[2]\n")
        print(report.table(rows, floatfmt="{:,.2f}"))
        print("\n" + "\n".join(f"{k}: {v:.1f}" if isinstance(v, float) else f"{k}: {v}" for k, v in facts.items()))
        for line in report.scoring_targets(rows, facts):
            print(line)
        section_done("scoring")
    if "memory" in sections:
        from . import memory_bench

        rows = memory_bench.run(quick=args.quick)
        results["memory"] = rows
        print("\n## Memory: N Python workers holding one model, a copy per worker vs one shared file\n")
        print(report.table(rows, floatfmt="{:,.2f}"))
        for line in report.memory_targets(rows):
            print(line)
        section_done("memory")
    if "dask" in sections:
        from . import dask_bench

        rows = dask_bench.run(repeats=1 if args.quick else args.repeats)
        results["dask"] = rows
        print("\n## Dask: client.submit(f, model), Keras pickling vs payload vs ship()\n")
        print(report.table(rows))
        section_done("dask")
    if "coldstart" in sections:
        from . import coldstart_bench

        rows = coldstart_bench.run(quick=args.quick)
        results["coldstart"] = rows
        print("\n## Cold start of a fresh Python worker (spark.python.worker.reuse=false): "
              "pyspark.daemon vs spark_keras.spark.daemon, local[2]\n")
        print(report.table(rows))
        for line in report.coldstart_targets(rows):
            print(line)
        section_done("coldstart")
    if "frontends" in sections:
        from . import frontends_bench

        rows = frontends_bench.run(quick=args.quick)
        results["frontends"] = rows
        print("\n## Front-ends: predict_partition, pool_predict, predict_dask against the raw model "
              "(MLP, batch 1024)\n")
        print(report.table(rows, floatfmt="{:,.2f}"))
        section_done("frontends")
    if "inputs" in sections:
        from . import inputs_bench

        rows, lengths = inputs_bench.run(quick=args.quick)
        results["inputs"], results["inputs_lengths"] = rows, lengths
        print("\n## Text, image bytes and variable-length sequences on local[2]\n")
        print(report.table(rows, floatfmt="{:,.2f}"))
        print()
        print(report.table(lengths, floatfmt="{:,.2f}"))
        for line in report.inputs_targets(rows, lengths):
            print(line)
        section_done("inputs")
    if "threads" in sections:
        from . import threads_bench

        rows = results["threads"] = threads_bench.run(quick=args.quick)
        print(f"\n{report.TITLES['threads']}\n")
        print(report.table(rows, floatfmt="{:,.2f}"))
        section_done("threads")
    if "operations" in sections:
        from . import operations_bench

        rows = results["operations"] = operations_bench.run(quick=args.quick)
        print(f"\n{report.TITLES['operations']}\n")
        print(report.table(rows, floatfmt="{:,.3f}"))
        section_done("operations")
    results["seconds"] = time.perf_counter() - started
    print(f"\nbench finished in {results['seconds']:.0f}s")
    if args.write:
        report.write_docs(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
