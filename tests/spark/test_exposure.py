"""The warning that the driver's channel token crosses the network in clear: a cluster
master without Spark's authentication and network encryption, a remote Spark Connect
server without TLS (:mod:`spark_keras.spark.exposure`)."""

from __future__ import annotations

import logging

import pytest

import spark_keras as sk
from spark_keras.spark import exposure
from tests import models
from tests.conftest import make_spark

SECURED = {"spark.authenticate": "true", "spark.authenticate.secret": "a-secret-for-this-test",
           "spark.network.crypto.enabled": "true"}


@pytest.mark.parametrize("master, conf, off", [
    ("local", {}, []),
    ("local[2]", {}, []),
    ("local[*]", {}, []),
    ("local[4,3]", {}, []),
    ("local-cluster[2,1,1024]", {}, list(exposure.SETTINGS)),
    ("spark://host:7077", {"spark.authenticate": "true"}, ["spark.network.crypto.enabled"]),
    ("yarn", {"spark.network.crypto.enabled": "TRUE"}, ["spark.authenticate"]),
    ("k8s://https://api:6443", {"spark.authenticate": "false",
                                "spark.network.crypto.enabled": "true"}, ["spark.authenticate"]),
    ("local-cluster[1,1,1024]", SECURED, []),
    ("yarn", SECURED, []),
])
def test_the_settings_off_for_a_master(master, conf, off):
    assert exposure.settings_off(master, conf.get) == off


@pytest.mark.parametrize("url, off", [
    ("sc://spark.example.com", True),
    ("sc://10.1.2.3:15002/;user_id=me", True),
    ("sc://spark.example.com:443/;use_ssl=true", False),
    ("sc://spark.example.com/;token=abc", False),  # PySpark uses TLS with a token
    ("sc://localhost", False),  # a server on this host: nothing on the network
    ("sc://127.0.0.1:15002", False),
    ("sc://[::1]:15002", False),
])
def test_a_connect_string_without_tls_to_another_host(url, off, monkeypatch):
    pytest.importorskip("grpc")
    # a local Connect server started earlier in this process leaves its token in the
    # environment, where every builder takes it (and then uses TLS)
    monkeypatch.delenv("SPARK_CONNECT_AUTHENTICATE_TOKEN", raising=False)
    from pyspark.sql.connect.client.core import DefaultChannelBuilder

    assert exposure.tls_off(DefaultChannelBuilder(url)) is off


def _exposure_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "spark_keras" and r.levelno == logging.WARNING
            and "in clear" in r.getMessage()]


def test_the_channel_on_a_cluster_warns_once_without_sparks_encryption_never_with_it(
        build_log, caplog, monkeypatch):
    """Handles started on a local-cluster master without spark.authenticate and
    spark.network.crypto.enabled: one warning naming both (not one per handle); with
    both on, none."""
    for conf, expected in (({}, 1), (SECURED, 0)):
        monkeypatch.setattr(exposure, "_warned", set())  # this process's earlier warnings
        spark = make_spark("local-cluster[1,1,1024]", build_log, **conf)
        try:
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="spark_keras"):
                handles = [sk.BroadcastModel(spark, models.mlp(4, 8, 1)) for _ in range(2)]
            found = _exposure_warnings(caplog)
            assert len(found) == expected, found
            for message in found:
                assert "Spark master 'local-cluster[1,1,1024]'" in message, message
                assert "spark.authenticate=true and spark.network.crypto.enabled=true" in message
            for handle in handles:
                handle.destroy()
        finally:
            spark.stop()
