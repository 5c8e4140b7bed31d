"""A Keras model as a ``pyspark.ml`` pipeline stage: :class:`KerasTransformer`.

::

    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import StandardScaler, VectorAssembler
    from spark_keras.ml import KerasTransformer

    pipeline = Pipeline(stages=[
        VectorAssembler(inputCols=["a", "b", "c"], outputCol="raw"),
        StandardScaler(inputCol="raw", outputCol="features", withMean=True),
        KerasTransformer(model=model, inputCol="features", outputCol="score"),
    ])
    fitted = pipeline.fit(df)
    fitted.write().overwrite().save("/models/churn")   # or a URI: hdfs://, s3a://...
    PipelineModel.load("/models/churn").transform(df)

Scoring is :meth:`BroadcastModel.transform <spark_keras.spark.broadcast.BroadcastModel.transform>`
(an ``arrow_udf`` over the input columns; ``mapInArrow`` before PySpark 4.1): the stage creates its :class:`BroadcastModel` on first use, from the
session of the DataFrame it transforms, and reuses it for every later call of the stage
and of its copies, so each Python worker builds the model once.

Saving writes Spark's usual stage metadata (the Params, as JSON, through
``DefaultParamsWriter``) plus the model's payload as ``payload.skp`` in the stage's
folder; nothing is pickled. The payload goes where Spark puts the metadata: a plain path
is qualified by Hadoop on classic Spark (so it lands on HDFS if that is the default
filesystem), other URIs are written with ``pyarrow.fs`` (``s3a://`` as ``s3://``). On
Spark Connect the client writes the payload: plain paths must be on a filesystem the
client and the server share. Loading reads the payload back from there into the driver's
memory, refused unless its size and digest are the ones in the stage's metadata: a loaded
stage holds its model, so it keeps scoring with it whatever is saved over its folder later,
and it can be saved back over the folder it came from (alone or in a ``PipelineModel``).
Saving prepares the payload before anything is removed: a model that cannot be serialized
leaves an existing stage as it was.
The payload holds the model's config and weights, not code: custom layers must be
importable and registered (``@keras.saving.register_keras_serializable``) in the process
that loads the stage.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
from typing import TYPE_CHECKING, Any, Mapping

from ._deps import require

require("pyspark", "spark_keras.ml (KerasTransformer)")
from pyspark import keyword_only  # noqa: E402
from pyspark.ml.base import Transformer
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasInputCol, HasInputCols, HasOutputCol
from pyspark.ml.util import (
    DefaultParamsReader,
    DefaultParamsWriter,
    MLReadable,
    MLReader,
    MLWritable,
    MLWriter,
)

from . import __version__, storage
from .errors import ArgumentError, ArgumentTypeError, PayloadError, SparkKerasError, StorageError
from .inference.engine import ON_INVALID
from .inference.predictor import DEFAULT_BATCH_SIZE
from .payload.stored import open_model
from .spark.transport import is_connect

if TYPE_CHECKING:
    from .spark.broadcast import BroadcastModel

__all__ = ["KerasTransformer"]

logger = logging.getLogger("spark_keras")

PAYLOAD_FILE = "payload.skp"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+):")


# --- params ------------------------------------------------------------------------------

def _to_batch_size(value: Any) -> int:
    size = TypeConverters.toInt(value)  # TypeError for non-integers, as Spark's int params
    if size <= 0:
        raise ArgumentError(f"batchSize must be a positive integer, got {size}")
    return size


def _to_on_invalid(value: Any) -> str:
    text = TypeConverters.toString(value)
    if text not in ON_INVALID:
        raise ArgumentError(f"onInvalid must be one of {', '.join(map(repr, ON_INVALID))}, "
                         f"got {text!r}")
    return text


class _KerasTransformerParams(HasInputCol, HasInputCols, HasOutputCol):
    """Params of :class:`KerasTransformer`."""

    batchSize: "Param[int]" = Param(
        Params._dummy(), "batchSize",
        "rows per model call on a worker (> 0); each Arrow batch is scored in calls of "
        "at most this many rows",
        typeConverter=_to_batch_size)
    onInvalid: "Param[str]" = Param(
        Params._dummy(), "onInvalid",
        "how to handle a row the model cannot take (a null, NaN/inf or wrongly shaped "
        "value): 'error' fails the task naming the column and row, 'null' gives the row a "
        "null prediction",
        typeConverter=_to_on_invalid)
    errorCol: "Param[str]" = Param(
        Params._dummy(), "errorCol",
        "a string column added with, for each invalid row, why the model cannot take it "
        "(null for scored rows); needs onInvalid='null'",
        typeConverter=TypeConverters.toString)

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(outputCol="prediction", batchSize=DEFAULT_BATCH_SIZE, onInvalid="error")

    def getBatchSize(self) -> int:
        """Gets the value of batchSize or its default value."""
        return self.getOrDefault(self.batchSize)

    def getOnInvalid(self) -> str:
        """Gets the value of onInvalid or its default value."""
        return self.getOrDefault(self.onInvalid)

    def getErrorCol(self) -> str | None:
        """Gets the value of errorCol (None: not set, no error column)."""
        return self.getOrDefault(self.errorCol) if self.isDefined(self.errorCol) else None


# --- the stage -----------------------------------------------------------------------------

class KerasTransformer(Transformer, _KerasTransformerParams, MLReadable["KerasTransformer"],
                       MLWritable):
    """Scores a Keras model on a DataFrame column (or columns) in a ``pyspark.ml`` pipeline.

    Params: ``inputCol`` (one array, ML ``Vector`` or scalar column) or ``inputCols``
    (several scalar columns stacked as features, or one column per model input):
    exactly one of them; ``outputCol`` (default ``"prediction"``: a scalar column for a
    single-unit output, an array for a vector output, a struct with one field per output
    for a multi-output model); ``batchSize`` (default 1024); ``onInvalid`` (``"error"``
    or ``"null"``, see :meth:`BroadcastModel.predict_udf`); ``errorCol`` (unset by
    default; with ``onInvalid="null"``, a string column saying why each invalid row got
    a null prediction, see :meth:`BroadcastModel.transform`).

    Args:
        model: a Keras model, a ``.keras`` file or payload file (a local path or a URI
            that ``pyarrow.fs`` opens), payload bytes (``spark_keras.dumps``), or a
            :class:`~spark_keras.BroadcastModel` (used as is, whatever session transforms).
        custom_objects, safe_mode, share_weights, preprocess: as for ``BroadcastModel``.
            Not saved: a loaded stage rebuilds with ``safe_mode=True``, needs its custom
            classes registered where it is loaded, and has no preprocess function.

    The model is shipped on the first ``transform`` (a ``BroadcastModel`` created from
    the DataFrame's session) and shared by :meth:`copy`'s copies; a DataFrame of another
    session (a new SparkContext, another Connect session) ships it again.
    """

    _input_kwargs: dict[str, Any]

    @keyword_only
    def __init__(self, *, model: Any = None, inputCol: str | None = None,
                 inputCols: list[str] | None = None, outputCol: str = "prediction",
                 batchSize: int = DEFAULT_BATCH_SIZE, onInvalid: str = "error",
                 errorCol: str | None = None,
                 custom_objects: Mapping[str, Any] | None = None, safe_mode: bool = True,
                 share_weights: bool = True, preprocess: Any = None) -> None:
        super().__init__()
        kwargs = dict(self._input_kwargs)
        options = {k: kwargs.pop(k) for k in ("custom_objects", "safe_mode", "share_weights",
                                              "preprocess") if k in kwargs}
        model = kwargs.pop("model", None)
        self._source: _ModelSource | None = \
            _ModelSource.of(model, **options) if model is not None else None
        self.setParams(**kwargs)

    @keyword_only
    def setParams(self, *, inputCol: str | None = None, inputCols: list[str] | None = None,
                  outputCol: str | None = None, batchSize: int | None = None,
                  onInvalid: str | None = None,
                  errorCol: str | None = None) -> "KerasTransformer":
        """setParams(self, \\*, inputCol=None, inputCols=None, outputCol=None, batchSize=None,
        onInvalid=None, errorCol=None): sets the params given (``None`` leaves a param as
        it is)."""
        return self._set(**{k: v for k, v in self._input_kwargs.items() if v is not None})

    def setInputCol(self, value: str) -> "KerasTransformer":
        """Sets the value of :py:attr:`inputCol`."""
        return self._set(inputCol=value)

    def setInputCols(self, value: list[str]) -> "KerasTransformer":
        """Sets the value of :py:attr:`inputCols`."""
        return self._set(inputCols=value)

    def setOutputCol(self, value: str) -> "KerasTransformer":
        """Sets the value of :py:attr:`outputCol`."""
        return self._set(outputCol=value)

    def setBatchSize(self, value: int) -> "KerasTransformer":
        """Sets the value of :py:attr:`batchSize`."""
        return self._set(batchSize=value)

    def setOnInvalid(self, value: str) -> "KerasTransformer":
        """Sets the value of :py:attr:`onInvalid`."""
        return self._set(onInvalid=value)

    def setErrorCol(self, value: str) -> "KerasTransformer":
        """Sets the value of :py:attr:`errorCol`."""
        return self._set(errorCol=value)

    # --- the model ---------------------------------------------------------------------

    @property
    def model(self) -> Any:
        """The Keras model, on the driver (loaded from the stage's payload if need be)."""
        return self._require_source().model()

    def broadcastModel(self, spark: Any = None) -> "BroadcastModel":
        """The :class:`~spark_keras.BroadcastModel` shipping this stage's model to
        ``spark``'s executors (default: the active session); created on first use."""
        if spark is None:
            from pyspark.sql import SparkSession

            spark = SparkSession.active()
        return self._require_source().handle_for(spark, self.uid)

    def _require_source(self) -> "_ModelSource":
        if self._source is None:
            raise SparkKerasError(
                f"{self.uid} has no model: give one with KerasTransformer(model=...) (a Keras "
                f"model, a .keras or payload file, payload bytes or a BroadcastModel)")
        return self._source

    # --- transforming ----------------------------------------------------------------------

    def _input_columns(self) -> str | list[str]:
        """``inputCol`` or ``inputCols``, whichever is set; raises unless exactly one is."""
        single = self.getOrDefault(self.inputCol) if self.isDefined(self.inputCol) else None
        multi = self.getOrDefault(self.inputCols) if self.isDefined(self.inputCols) else None
        if single is not None and multi is not None:
            raise ArgumentError(
                f"{self.uid} has both inputCol ({single!r}) and inputCols ({multi!r}) set: "
                f"set exactly one (inputCol for one column, inputCols for several)")
        if single is None and multi is None:
            raise ArgumentError(
                f"{self.uid} requires exactly one of inputCol, inputCols to be set, but "
                f"neither is: inputCol for one array, ML Vector or scalar column, inputCols "
                f"for several scalar columns or one column per model input")
        if multi is not None and not multi:
            raise ArgumentError(f"{self.uid}: inputCols is empty")
        return single if single is not None else list(multi)

    def _transform(self, dataset: Any) -> Any:
        columns = self._input_columns()
        output = self.getOutputCol()
        if not output:
            raise ArgumentError(f"{self.uid}: outputCol must be a non-empty column name")
        # values set by hand into the param map skip the converters: check them again
        batch_size = _to_batch_size(self.getBatchSize())
        on_invalid = _to_on_invalid(self.getOnInvalid())
        error_col = self.getErrorCol()
        if error_col is not None and on_invalid != "null":
            raise ArgumentError(f"{self.uid}: errorCol={error_col!r} needs onInvalid='null' "
                                f"(with onInvalid={on_invalid!r} an invalid row fails the task)")
        handle = self._require_source().handle_for(dataset.sparkSession, self.uid)
        return handle.transform(dataset, columns, output, batch_size=batch_size,
                                on_invalid=on_invalid, error_col=error_col)

    # --- persistence -----------------------------------------------------------------------

    def write(self) -> MLWriter:
        """An MLWriter saving the params (JSON metadata) and the model's payload."""
        return _KerasTransformerWriter(self)

    @classmethod
    def read(cls) -> "_KerasTransformerReader":
        """An MLReader for a stage saved by :meth:`write`."""
        return _KerasTransformerReader(cls)


class _ModelSource:
    """A stage's model, shared by the stage's copies: what it was built from, and the
    BroadcastModel that ships it (created on first use, for one session at a time)."""

    def __init__(self, *, model: Any = None, location: str | None = None,
                 payload: bytes | None = None, handle: "BroadcastModel | None" = None,
                 custom_objects: Mapping[str, Any] | None = None, safe_mode: bool = True,
                 share_weights: bool = True, preprocess: Any = None,
                 saved_at: str | None = None) -> None:
        self._model = model
        self._location = location
        self._payload = payload
        self._given = handle
        self._options = {"custom_objects": custom_objects, "safe_mode": safe_mode,
                         "share_weights": share_weights, "preprocess": preprocess}
        self._saved_at = saved_at  # the stage folder this source was loaded from
        self._handle: "BroadcastModel | None" = None
        self._owner: tuple | None = None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, model: Any, *, custom_objects: Mapping[str, Any] | None = None,
           safe_mode: bool = True, share_weights: bool = True,
           preprocess: Any = None) -> "_ModelSource":
        from .payload import codec
        from .spark.broadcast import BroadcastModel

        options = {"custom_objects": custom_objects, "safe_mode": safe_mode,
                   "share_weights": share_weights, "preprocess": preprocess}
        if isinstance(model, BroadcastModel):
            return cls(handle=model, **options)
        if isinstance(model, (str, os.PathLike)):
            location = os.fspath(model)
            if not storage.is_uri(location) and not os.path.isfile(location):
                raise StorageError(f"model file {location!r} does not exist")
            return cls(location=location, **options)
        if isinstance(model, (bytes, bytearray, memoryview)):
            if not codec.is_payload(model):
                raise PayloadError("model bytes are not a spark_keras payload (spark_keras.dumps)")
            return cls(payload=bytes(model), **options)
        if not (hasattr(model, "get_config") and callable(model)):
            raise ArgumentTypeError(
                f"model must be a Keras model, a .keras or payload file path or URI, payload "
                f"bytes or a BroadcastModel; got {type(model).__name__}")
        return cls(model=model, **options)

    def __deepcopy__(self, memo: dict) -> "_ModelSource":
        return self  # the model is shared, never copied

    # --- shipping -------------------------------------------------------------------------

    def handle_for(self, spark: Any, uid: str) -> "BroadcastModel":
        """The BroadcastModel for ``spark``'s executors: the one given, else the one made
        for this session (or SparkContext) earlier, else a new one."""
        if self._given is not None:
            return self._given
        owner = _owner(spark)
        with self._lock:
            if self._handle is None or self._owner != owner:
                if self._handle is not None:
                    logger.info("%s: a DataFrame of another Spark session; shipping the "
                                "model again", uid)
                self._handle, self._owner = self._ship(spark), owner
                logger.info("%s: model shipped as %s", uid, self._handle.key)
            return self._handle

    def _ship(self, spark: Any) -> "BroadcastModel":
        try:
            return self._new_handle(spark)
        except PayloadError as exc:
            if self._saved_at is None:
                raise
            raise PayloadError(
                f"the model of the KerasTransformer saved at {self._saved_at!r} cannot be "
                f"rebuilt here. A loaded stage rebuilds with safe_mode=True, and its "
                f"custom classes must be registered (@keras.saving."
                f"register_keras_serializable) in a module imported before it transforms "
                f"data. {exc}") from exc

    def _new_handle(self, spark: Any) -> "BroadcastModel":
        from .spark.broadcast import BroadcastModel

        if self._model is not None:
            return BroadcastModel(spark, self._model, **self._options)
        if self._location is not None:
            return BroadcastModel(spark, self._location, **self._options)
        # payload bytes: through a file, so that the BroadcastModel ships these very bytes
        with tempfile.TemporaryDirectory(prefix="spark_keras_") as tmp:
            path = os.path.join(tmp, PAYLOAD_FILE)
            with open(path, "wb") as f:
                f.write(self._payload)
            return BroadcastModel(spark, path, **self._options)

    # --- the model and its payload on the driver -------------------------------------------

    def model(self) -> Any:
        from .payload import codec

        if self._model is not None:
            return self._model
        handle = self._given if self._given is not None else self._handle
        if handle is not None:
            return handle.value
        loads_options = {"custom_objects": self._options["custom_objects"],
                         "safe_mode": self._options["safe_mode"]}
        if self._payload is not None:
            return codec.loads(self._payload, **loads_options)
        return open_model(self._location, **loads_options)[0]

    def payload(self) -> bytes:
        """The model's payload, for saving: the bytes or payload file given as is; a
        model (or a BroadcastModel's) and a ``.keras`` file serialized here."""
        from .payload import codec

        if self._payload is not None:
            return self._payload
        if self._location is not None:
            data = storage.read(self._location)
            if codec.is_payload(data):
                return data
            return open_model(self._location,  # a .keras file, converted
                              custom_objects=self._options["custom_objects"],
                              safe_mode=self._options["safe_mode"])[1]
        if self._model is not None:
            return codec.dumps(self._model, custom_objects=self._options["custom_objects"])
        recipe = getattr(self._given, "_recipe", None)
        objects = recipe.custom_objects() if recipe is not None else None
        return codec.dumps(self._given.value, custom_objects=objects)


def _metadata_context(spark: Any) -> Any:
    """What Spark's metadata writer and reader take: the SparkContext on classic Spark
    (PySpark 3.5 takes nothing else), the session on Connect."""
    return spark if is_connect(spark) else spark.sparkContext


def _owner(spark: Any) -> tuple:
    """What a BroadcastModel belongs to: a Connect session, or a SparkContext (which
    every classic session of the application shares)."""
    if is_connect(spark):
        return ("connect", spark.session_id)
    return ("classic", getattr(spark, "sparkContext", spark))


# --- where the payload is stored ------------------------------------------------------------

def _payload_location(spark: Any, path: str, name: str) -> str:
    """Where the file ``name`` of a stage saved at ``path`` lives, as Spark resolves ``path``:
    a local path, or a URI for ``pyarrow.fs``.

    On classic Spark a plain path is qualified by Hadoop, as Spark qualifies it for the
    metadata (on a cluster whose default filesystem is HDFS, ``/models/m`` is
    ``hdfs://.../models/m``). On Spark Connect a plain path is local to this client."""
    location = path
    # a plain path, file:/x, file:///x, hdfs:/x (not s3a://, which needs Hadoop's S3 jars)
    if ("://" not in path or _scheme(path) == "file") and not is_connect(spark):
        location = _hadoop_qualified(spark, path) or path
    scheme = _scheme(location)
    if scheme is None:
        return os.path.join(os.path.abspath(location), name)
    if scheme == "file":
        return os.path.join(_file_uri_path(location), name)
    if scheme in ("s3a", "s3n"):  # Hadoop's names for S3; pyarrow knows it as s3
        location = "s3" + location[len(scheme):]
    if "://" not in location:
        raise StorageError(f"cannot store a model at {path!r}: give a local path or a URI "
                           f"such as s3://bucket/folder")
    base, sep, query = location.partition("?")
    return f"{base.rstrip('/')}/{name}{sep}{query}"


def _file_uri_path(uri: str) -> str:
    """The local path of a ``file:`` URI as Hadoop's ``Path`` reads it (where Spark puts
    a stage's metadata): everything after the scheme and the authority, taken literally:
    ``%20`` names a folder ``%20``, ``?`` and ``#`` are part of the name."""
    rest = uri[len("file:"):]
    if rest.startswith("//"):
        slash = rest.find("/", 2)
        rest = rest[slash:] if slash >= 0 else "/"
    if rest.startswith("/"):
        rest = "/" + rest.lstrip("/")  # Hadoop folds repeated slashes, even leading ones
    return os.path.abspath(rest)


def _scheme(path: str) -> str | None:
    match = _SCHEME.match(path)
    return match.group(1).lower() if match else None


def _hadoop_qualified(spark: Any, path: str) -> str | None:
    """``path`` qualified by the JVM's Hadoop configuration (``file:/...``,
    ``hdfs://nn:8020/...``); None if there is no JVM to ask."""
    try:
        sc = getattr(spark, "sparkContext", spark)
        hadoop_path = sc._jvm.org.apache.hadoop.fs.Path(path)
        fs = hadoop_path.getFileSystem(sc._jsc.hadoopConfiguration())
        uri = fs.makeQualified(hadoop_path).toUri()
    except Exception as exc:  # no JVM (a stopped context), or Hadoop refuses the path
        logger.debug("cannot qualify %s with Hadoop: %s", path, exc)
        return None
    if (uri.getScheme() or "file") == "file":
        return uri.getPath()
    return uri.toString()


# --- writer and reader ------------------------------------------------------------------------

class _KerasTransformerWriter(MLWriter):
    """Saves the stage's params as Spark's JSON metadata and its payload as a file."""

    def __init__(self, instance: KerasTransformer) -> None:
        super().__init__()
        self.instance = instance
        self._prepared: tuple[bytes, dict[str, Any], str] | None = None

    def _handleOverwrite(self, path: str) -> None:
        if is_connect(self.sparkSession):  # no JVM here: the Connect ML helper does it
            try:
                from pyspark.ml.connect.readwrite import RemoteMLWriter
            except ImportError as exc:  # PySpark < 4.0
                raise SparkKerasError(
                    f"this PySpark cannot overwrite {path!r} over Spark Connect (it has no "
                    f"Connect ML helper): remove the folder first, or save elsewhere") from exc
            RemoteMLWriter.handleOverwrite(path, True)
        else:
            super()._handleOverwrite(path)

    def save(self, path: str) -> None:
        """Save the stage at ``path``. Everything that can fail before the files are
        written (serializing the model, reading the payload file it was made from,
        resolving where the payload goes) is done before an existing folder is removed."""
        self._prepared = self._prepare(path)
        try:
            super().save(path)
        finally:
            self._prepared = None

    def _prepare(self, path: str) -> tuple[bytes, dict[str, Any], str]:
        """The payload, its metadata record, and where it goes for a stage at ``path``."""
        from .payload import format as fmt

        payload = self.instance._require_source().payload()
        header = fmt.unpack(payload, verify=False).header
        record = {"file": PAYLOAD_FILE, "nbytes": len(payload),
                  "body_sha256": header["body_sha256"], "keras": header.get("keras"),
                  "model_class": header.get("model_class")}
        location = _payload_location(self.sparkSession, path, PAYLOAD_FILE)
        storage.size(location)  # an unreachable or unusable URI fails here
        return payload, record, location

    def saveImpl(self, path: str) -> None:
        stage = self.instance
        payload, record, location = self._prepared or self._prepare(path)
        extra = {"sparkKeras": {"version": __version__, "payload": record}}
        # metadata first: Spark refuses to write it over an existing stage
        params = {p.name: v for p, v in stage._paramMap.items() if v is not None}
        DefaultParamsWriter.saveMetadata(stage, path, _metadata_context(self.sparkSession),
                                         extraMetadata=extra, paramMap=params)
        if not storage.is_uri(location) and is_connect(self.sparkSession) \
                and not os.path.isdir(os.path.join(os.path.dirname(location), "metadata")):
            raise StorageError(
                f"the Spark Connect server wrote the stage's metadata at {path!r} on a "
                f"filesystem this client does not see, and the client writes the model's "
                f"payload: save to a URI both reach (s3://..., hdfs://...) or a shared mount")
        storage.write(location, payload)
        logger.info("saved %s: %.1f MB payload at %s", stage.uid, len(payload) / 2**20, location)


class _KerasTransformerReader(MLReader[KerasTransformer]):
    """Loads a stage saved by :class:`_KerasTransformerWriter`."""

    def __init__(self, cls: type[KerasTransformer]) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> KerasTransformer:
        spark = self.sparkSession
        metadata = DefaultParamsReader.loadMetadata(path, _metadata_context(spark))
        expected = f"{self.cls.__module__}.{self.cls.__name__}"
        if metadata.get("class") != expected:
            raise SparkKerasError(f"{path!r} holds a {metadata.get('class')}, not a {expected}")
        record = (metadata.get("sparkKeras") or {}).get("payload")
        if not isinstance(record, dict) or not isinstance(record.get("file"), str):
            raise PayloadError(f"the metadata of {path!r} names no model payload: it was not "
                               f"saved by KerasTransformer")
        stage = self.cls()
        stage._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(stage, metadata)
        location = _payload_location(spark, path, os.path.basename(record["file"]))
        size = storage.size(location)
        if size is None:
            hint = ""
            if is_connect(spark) and not storage.is_uri(location):
                hint = (" (on Spark Connect this client reads the payload: a plain path must be "
                        "on a filesystem the client and the server share, or use a URI)")
            raise StorageError(f"the model payload of the KerasTransformer saved at {path!r} is "
                               f"missing: {location}{hint}")
        # the stage holds its payload from now on: whatever is saved over the folder later,
        # it scores (and saves) the model it was loaded with
        payload = _checked_payload(storage.read(location), location, record)
        stage._source = _ModelSource(payload=payload, saved_at=path)
        return stage


def _checked_payload(payload: bytes, location: str, record: Mapping[str, Any]) -> bytes:
    """``payload``, read from ``location``, unless it is not the one the stage's metadata
    ``record`` describes (its size and body digest) or its body does not match its digest."""
    from .payload import format as fmt

    damaged = "the saved stage is damaged, or its payload was replaced"
    if len(payload) != record.get("nbytes"):
        raise PayloadError(f"the model payload {location} has {len(payload)} bytes, the "
                           f"stage's metadata says {record.get('nbytes')}: {damaged}")
    try:
        digest = fmt.unpack(payload).header["body_sha256"]  # verifies the body too
    except PayloadError as exc:
        raise PayloadError(f"the model payload {location} is not sound ({exc}): {damaged}") \
            from exc
    expected = record.get("body_sha256")
    if digest != expected:
        raise PayloadError(f"the model payload {location} has body digest {digest[:12]}..., "
                           f"the stage's metadata says {str(expected)[:12]}...: {damaged}")
    return payload
