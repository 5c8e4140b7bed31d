"""`python -m bench [--quick] [--only payload,...]`: print tables; with --write, update docs."""

from __future__ import annotations

import argparse
import os
import platform
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from . import payload_bench, report  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="payload", help="comma-separated sections")
    args = parser.parse_args(argv)
    sections = set(args.only.split(","))
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}")
    if "payload" in sections:
        rows = payload_bench.run(repeats=args.repeats)
        print("\n## Rebuild: pickle.loads(pickle.dumps(m)) vs spark_keras.loads(spark_keras.dumps(m))\n")
        print(report.table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
