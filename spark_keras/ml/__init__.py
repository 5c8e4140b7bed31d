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
(an ``arrow_udf`` over the input columns; ``mapInArrow`` before PySpark 4.1): the stage
creates its :class:`BroadcastModel` on first use, from the session of the DataFrame it
transforms, and reuses it for every later call of the stage and of its copies, so each
Python worker builds the model once.

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

The stage lives here, under the name its saved metadata gives
(``spark_keras.ml.KerasTransformer``); its Params are in :mod:`spark_keras.ml.params`,
its model in :mod:`spark_keras.ml.source`, saving and loading in
:mod:`spark_keras.ml.persistence`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from spark_keras._deps import require

require("pyspark", "spark_keras.ml (KerasTransformer)")
from pyspark import keyword_only  # noqa: E402
from pyspark.ml.base import Transformer
from pyspark.ml.util import MLReadable, MLWritable, MLWriter

from spark_keras.errors import ArgumentError, SparkKerasError
from spark_keras.inference.buckets import checked
from spark_keras.inference.options import (
    DEFAULT_BATCH_SIZE,
    ML_PARAMS,
    check_buckets,
    check_error_col,
    check_max_invalid,
)
from spark_keras.ml.params import KerasTransformerParams, to_batch_size, to_on_invalid
from spark_keras.ml.persistence import KerasTransformerReader, KerasTransformerWriter
from spark_keras.ml.source import ModelSource

if TYPE_CHECKING:
    from spark_keras.spark.broadcast import BroadcastModel

__all__ = ["KerasTransformer"]


class KerasTransformer(Transformer, KerasTransformerParams, MLReadable["KerasTransformer"],
                       MLWritable):
    """Scores a Keras model on a DataFrame column (or columns) in a ``pyspark.ml`` pipeline.

    The model is shipped on the first ``transform`` (a ``BroadcastModel`` created from
    the DataFrame's session) and shared by :meth:`copy`'s copies; a DataFrame of another
    session (a new SparkContext, another Connect session) ships it again. The Params
    (``inputCol`` to ``buckets``) are saved with the stage; the other arguments are not.

    Args:
        model: a Keras model, a ``.keras`` file or payload file (a local path or a URI
            that ``pyarrow.fs`` opens), payload bytes (``spark_keras.dumps``), or a
            :class:`~spark_keras.BroadcastModel` (used as is, whatever session transforms).
        inputCol: one array, ML ``Vector`` or scalar column. Exactly one of ``inputCol``
            and ``inputCols`` is set.
        inputCols: several scalar columns stacked as features, or one column per model
            input.
        outputCol: the prediction's column (default ``"prediction"``): a scalar column
            for a single-unit output, an array for a vector output, a struct with one
            field per output for a multi-output model.
        batchSize: rows per model call (default 1024).
        onInvalid: ``"error"`` or ``"null"``, see :meth:`BroadcastModel.predict_udf`.
        errorCol: unset by default; with ``onInvalid="null"``, a string column saying why
            each invalid row got a null prediction, see :meth:`BroadcastModel.transform`.
        maxInvalid: with ``onInvalid="null"``, the invalid rows a task may meet before
            it fails, see :meth:`BroadcastModel.predict_udf`.
        idCol: unset by default; a column naming each row in errors and ``errorCol``
            reasons (``row id=17``), see :meth:`BroadcastModel.transform`.
        versionCol: unset by default; a string column with the label of the model
            version that scored each row, see :meth:`BroadcastModel.update`.
        buckets: unset by default; for a model that masks its variable-length inputs,
            pad each batch's rows into at most this many lengths (an int) or to these
            lengths (a list), see :meth:`BroadcastModel.predict_udf`.
        custom_objects: as for ``BroadcastModel``. Not saved: a loaded stage needs its
            custom classes registered where it is loaded.
        safe_mode: as for ``BroadcastModel``. Not saved: a loaded stage rebuilds with
            ``safe_mode=True``.
        share_weights: as for ``BroadcastModel``. Not saved.
        preprocess: as for ``BroadcastModel``. Not saved: a loaded stage has no
            preprocess function.
    """

    _input_kwargs: dict[str, Any]

    @keyword_only
    def __init__(self, *, model: Any = None, inputCol: str | None = None,
                 inputCols: list[str] | None = None, outputCol: str = "prediction",
                 batchSize: int = DEFAULT_BATCH_SIZE, onInvalid: str = "error",
                 errorCol: str | None = None, maxInvalid: float | None = None,
                 idCol: str | None = None, versionCol: str | None = None,
                 buckets: int | list[int] | None = None,
                 custom_objects: Mapping[str, Any] | None = None, safe_mode: bool = True,
                 share_weights: bool = True, preprocess: Any = None) -> None:
        super().__init__()
        kwargs = dict(self._input_kwargs)
        options = {k: kwargs.pop(k) for k in ("custom_objects", "safe_mode", "share_weights",
                                              "preprocess") if k in kwargs}
        model = kwargs.pop("model", None)
        self._source: ModelSource | None = \
            ModelSource.of(model, **options) if model is not None else None
        self.setParams(**kwargs)

    @keyword_only
    def setParams(self, *, inputCol: str | None = None, inputCols: list[str] | None = None,
                  outputCol: str | None = None, batchSize: int | None = None,
                  onInvalid: str | None = None, errorCol: str | None = None,
                  maxInvalid: float | None = None, idCol: str | None = None,
                  versionCol: str | None = None,
                  buckets: int | list[int] | None = None) -> "KerasTransformer":
        """setParams(self, \\*, inputCol=None, inputCols=None, outputCol=None, batchSize=None,
        onInvalid=None, errorCol=None, maxInvalid=None, idCol=None, versionCol=None,
        buckets=None): sets the params given (``None`` leaves a param as it is)."""
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

    def setMaxInvalid(self, value: float) -> "KerasTransformer":
        """Sets the value of :py:attr:`maxInvalid`."""
        return self._set(maxInvalid=value)

    def setIdCol(self, value: str) -> "KerasTransformer":
        """Sets the value of :py:attr:`idCol`."""
        return self._set(idCol=value)

    def setVersionCol(self, value: str) -> "KerasTransformer":
        """Sets the value of :py:attr:`versionCol`."""
        return self._set(versionCol=value)

    def setBuckets(self, value: int | list[int]) -> "KerasTransformer":
        """Sets the value of :py:attr:`buckets`."""
        return self._set(buckets=value)

    # --- the model ---------------------------------------------------------------------

    @property
    def model(self) -> Any:
        """The Keras model, on the driver (loaded from the stage's payload if need be)."""
        return self._require_source().model()

    def broadcastModel(self, spark: Any = None) -> "BroadcastModel":
        """The :class:`~spark_keras.BroadcastModel` shipping this stage's model.

        Args:
            spark: the session whose executors get it (default: the active session).

        Returns:
            The handle, created on first use for each session.

        Raises:
            SparkKerasError: the stage has no model.
        """
        if spark is None:
            from pyspark.sql import SparkSession

            spark = SparkSession.active()
        return self._require_source().handle_for(spark, self.uid)

    def _require_source(self) -> "ModelSource":
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
        if single is not None:
            return single
        if not multi:
            raise ArgumentError(f"{self.uid}: inputCols is empty")
        return list(multi)

    def _transform(self, dataset: Any) -> Any:
        columns = self._input_columns()
        output = self.getOutputCol()
        if not output:
            raise ArgumentError(f"{self.uid}: outputCol must be a non-empty column name")
        # values set by hand into the param map skip the converters: check them again
        batch_size = to_batch_size(self.getBatchSize())
        on_invalid = to_on_invalid(self.getOnInvalid())
        error_col = check_error_col(self.getErrorCol(), on_invalid, ML_PARAMS)
        max_invalid = check_max_invalid(self.getMaxInvalid(), on_invalid, ML_PARAMS)
        buckets = check_buckets(self.getBuckets(), ML_PARAMS)  # before the model ships
        handle = self._require_source().handle_for(dataset.sparkSession, self.uid)
        checked(handle, buckets, ML_PARAMS)  # the model takes padded rows, or this says why
        return handle.transform(dataset, columns, output, batch_size=batch_size,
                                on_invalid=on_invalid, error_col=error_col,
                                max_invalid=max_invalid, id_col=self.getIdCol(),
                                version_col=self.getVersionCol(), buckets=buckets)

    # --- persistence -----------------------------------------------------------------------

    def write(self) -> MLWriter:
        """A writer for this stage (``stage.write().overwrite().save(path)``).

        Returns:
            An MLWriter saving the params (JSON metadata) and the model's payload.
        """
        return KerasTransformerWriter(self)

    @classmethod
    def read(cls) -> "KerasTransformerReader":
        """A reader for saved stages (``KerasTransformer.read().load(path)``).

        Returns:
            An MLReader for a stage saved by :meth:`write`.
        """
        return KerasTransformerReader(cls)
