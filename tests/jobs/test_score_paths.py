"""The score job's path layer on classic Spark (Hadoop's FileSystem through the driver's
JVM): what each call costs in Py4J round trips, which a --resume run pays a few dozen
times per commit."""

from __future__ import annotations

import contextlib

from spark_keras.jobs.score.files import HadoopPaths


@contextlib.contextmanager
def _round_trips(spark):
    """Counts the Py4J commands the driver sends to its JVM in the block (the gateway
    client's own ``send_command``, wrapped on the instance and put back)."""
    client = spark.sparkContext._gateway._gateway_client
    sent = []
    real = client.send_command

    def counted(command, *args, **kwargs):
        sent.append(command.split("\n", 2)[:2])
        return real(*(command, *args), **kwargs)

    client.send_command = counted
    try:
        yield sent
    finally:
        del client.send_command


def test_a_path_call_takes_a_few_round_trips(spark, tmp_path):
    """Each call finds Hadoop's Path class once per JVM, not by a round trip per dotted
    name (each failed lookup of "org", "org.apache", ... searched the JVM's class path:
    80% of the call's time, a few dozen calls per commit)."""
    paths = HadoopPaths(spark)
    target = str(tmp_path / "f")
    paths.exists(target)  # the first call may find the class
    with _round_trips(spark) as sent:
        for _ in range(5):
            assert paths.exists(target) is False
    # per call: Path(target), hadoopConfiguration(), getFileSystem(), exists()
    assert len(sent) <= 5 * 4, sent[:12]
    paths.create(target, b"x")
    assert paths.exists(target) and paths.read_bytes(target) == b"x"
