"""Coverage-guided fuzzing of the payload reader: `make fuzz` (FUZZ_SECONDS, default 300).

Every input must load or raise PayloadError: any other exception, a hang or a crash is
a bug. Inputs are raw bytes seeded from a valid payload, plus structured mutations that
re-seal checksums so the deeper checks are reached.
"""

from __future__ import annotations

import os
import sys

import atheris

with atheris.instrument_imports():
    import spark_keras as sk

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fuzz import payload_mutations as mut  # noqa: E402


def seed() -> bytes:
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.BatchNormalization()])
    return sk.dumps(model)


SEED = seed()
FIELDS = ["offset", "nbytes", "shape", "dtype", "kind", "name"]


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    choice = fdp.ConsumeIntInRange(0, 2)
    if choice == 0:
        candidate = fdp.ConsumeBytes(fdp.remaining_bytes())
    elif choice == 1:
        field = FIELDS[fdp.ConsumeIntInRange(0, len(FIELDS) - 1)]
        value = mut.INTERESTING[fdp.ConsumeIntInRange(0, len(mut.INTERESTING) - 1)]
        candidate = mut.mutate_header(SEED, fdp.ConsumeIntInRange(0, 64), field, value)
    else:
        candidate = mut.mutate_body(SEED, fdp.ConsumeIntInRange(0, 1 << 20), fdp.ConsumeIntInRange(0, 255))
    try:
        sk.loads(candidate)
    except sk.PayloadError:
        pass


if __name__ == "__main__":
    seconds = int(os.environ.get("FUZZ_SECONDS", "300"))
    atheris.Setup([sys.argv[0], f"-max_total_time={seconds}", "-timeout=30", "-rss_limit_mb=4096"]
                  + sys.argv[1:], one_input)
    atheris.Fuzz()
