"""BroadcastModel: a Keras model broadcast once, rebuilt once per Python worker process.

Its public methods are here; how it ships (:mod:`.broadcast_shipping`), its later versions
(:mod:`.broadcast_versions`) and what it releases when (:mod:`.broadcast_lifecycle`) are
their own modules'."""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from spark_keras.channel.client import Address
from spark_keras.errors import SparkKerasError
from spark_keras.executor import driver_payload, resources, task_model, task_version
from spark_keras.executor.transport.base import Transport
from spark_keras.handle import ModelHandle
from spark_keras.inference.options import DEFAULT_BATCH_SIZE, check_resize
from spark_keras.inference.preprocess import Preprocess
from spark_keras.spark import broadcast_lifecycle, broadcast_shipping, broadcast_versions


class BroadcastModel(ModelHandle):
    """A Keras model shipped to Spark executors once, as a payload broadcast.

    ``.value`` is the model: on the driver the original object; on an executor the
    model rebuilt from the payload through this process's :mod:`spark_keras.cache`, so
    each Python worker process builds it once however many tasks, stages and actions use
    it, including when the handle is captured in a UDF closure (closures are unpickled per
    task, the cache is not). The Keras object itself is never pickled.

    With Keras 3 on TensorFlow, an executor holds one copy of the weights whatever its
    number of Python workers: the first worker that needs the model writes the payload
    to a file in the executor's block manager directory (deleted when the executor
    stops; on Spark Connect the session artifact is that file), and every worker builds
    its model on weights that are views of that file, mapped copy-on-write (see
    :func:`spark_keras.load` with ``share_weights``). Such a model is a normal Keras model;
    writes to its variables stay private to the worker.

    Args:
        spark: a ``SparkSession`` or ``SparkContext``.
        model_or_path: a Keras model, a ``.keras`` file, or a payload file
            (``spark_keras.save``): a local path, or a URI that ``pyarrow.fs``
            resolves (``file://``, ``s3://``, ``gs://``, ``hdfs://``...). A URI is
            not shipped through the driver: each executor reads the file from
            storage once (converting a ``.keras`` file there) and refuses it unless
            its payload digest is the one the driver read (see
            :mod:`spark_keras.storage` for credentials).
        custom_objects: custom classes/functions the model needs. They, and the custom
            classes found in the model, are shipped with the payload (cloudpickle: classes
            defined in the driver's ``__main__`` travel by value); the payload format
            itself stays pickle-free.
        safe_mode: Keras ``safe_mode`` when rebuilding (and when loading a ``.keras`` file).
        share_weights: build on the executor's shared copy of the weights (default);
            ``False`` gives every worker its own copy, as does legacy tf-keras, which
            has no zero-copy path.
        preprocess: a Python function run in the workers on each batch before the model
            (decoding, tokenizing...): it receives a pandas DataFrame of the input
            columns (binary as ``bytes``, strings as ``str``, arrays as numpy arrays) and
            returns the model's inputs (an array, a list in input order, a dict keyed
            by input name, or a DataFrame), one row per row; the usual input checks and
            ``on_invalid`` apply to what it returns. Shipped by value with the handle.
        resize: for image columns (Spark's image data source) of another height and width
            than the model's input: an interpolation of ``keras.utils.load_img``
            (``"bilinear"``, ``"nearest"``, ``"bicubic"``, ``"hamming"``, ``"box"``,
            ``"lanczos"``) resizing each image as ``load_img(target_size=...,
            interpolation=...)`` does (PIL, the ``images`` extra); None (default): such
            rows are invalid. Channels are always converted to the input's (gray, RGB,
            RGBA) as ``load_img(color_mode=...)`` converts them.
        version: the first version's label (default "1"; see :meth:`update`).
        refresh: for a model given as a URI: check the file at most every ``refresh``
            seconds, at micro-batch and action boundaries, and :meth:`update` to it when
            it changed (see :meth:`update`).
        ship: how the payload reaches the executors: ``"auto"`` (default: a URI from
            storage; on Spark Connect a session artifact; else a broadcast, or, for a
            payload over 64 MiB, as ``"driver"``), ``"driver"``: each executor streams
            it from a file of the driver (:mod:`~spark_keras.executor.driver_payload`) when
            a worker there first needs it, never through a JVM heap nor whole in the
            driver's memory (executors that never use the model never fetch it;
            :class:`~spark_keras.KeyedModels` ships that way), or ``"broadcast"``
            (classic Spark: a broadcast whatever the size, in the JVMs' heaps).

    Example::

        bm = BroadcastModel(spark, model)
        scored = bm.transform(df, ["features"])                 # Arrow, zero-copy
        df.select(bm.predict_udf()("features"))                 # a vectorized UDF
        rdd.mapPartitions(bm.predict_partition)                 # plain RDDs
    """

    # set by broadcast_shipping (state shared with broadcast_versions, broadcast_lifecycle,
    # executor.task_model and executor.task_version, which take the handle)
    _transport: Transport  # how version 1's payload reaches the executors
    _versions: Address | None  # the handle's token for the driver's channel
    _version: str  # the current version's label (a worker's copy: its own version's)
    _finalizer: weakref.finalize | None  # releases the driver's copies once collected

    def __init__(self, spark: Any, model_or_path: Any, *,
                 custom_objects: Mapping[str, Any] | None = None, safe_mode: bool = True,
                 share_weights: bool = True,
                 preprocess: Callable[[Any], Any] | None = None,
                 resize: str | None = None, version: str | None = None,
                 refresh: float | None = None, ship: str = "auto") -> None:
        # every argument is checked before a file is written
        self.resize = check_resize(resize)
        label, watch_every = broadcast_shipping.check(spark, model_or_path, version, ship, refresh)
        self._preprocess = Preprocess.of(preprocess)
        self._custom_objects, self._safe_mode = custom_objects, safe_mode
        self._share_weights, self._released = share_weights, False
        self._stale: tuple[tuple[str, type[Transport]], ...] = ()  # in a worker: see release_stale
        self._lock = threading.Lock()  # update(), unpersist(), destroy() one at a time
        broadcast_shipping.ship(self, spark, model_or_path, label, ship, watch_every)
        # dropped on the driver: its copies and registry entries go
        self._finalizer = broadcast_lifecycle.on_collected(self)

    # --- the model (key, nbytes, value, predictor, signature: see ModelHandle) ---------

    def check_usable(self) -> None:
        """Raise if destroyed; drop what the driver had released (:meth:`release_stale`)."""
        broadcast_lifecycle.check_usable(self)

    def release_stale(self) -> list[str]:
        """In a worker: drop the models, and the executor's payload files, of the
        BroadcastModels the driver had destroyed or unpersisted when it shipped this
        handle. Every use of a handle's model does it first; call it to free a worker's
        memory without using a model.

        Returns:
            The keys dropped.
        """
        return task_version.drop_released(self._stale)

    # --- in a worker: the model on the task's device (see resources) --------------------

    @property
    def value(self) -> Any:
        """The Keras model: the original on the driver; in a worker, built once per
        process and device (the GPU Spark assigned the task, if any) and cached."""
        if self._model is not None:
            return self._model
        return task_model.placed(self)[0]

    @property
    def predictor(self) -> Any:
        """The model's compiled inference function, called on the task's device."""
        if self._model is not None:
            return super().predictor
        return task_model.predictor(self)

    def build_model(self, placement: resources.Placement | None = None) -> tuple:
        """The model built from the transport's payload, on ``placement``'s device.

        Args:
            placement: the task's device and thread pools (default: the CPU).

        Returns:
            ``(model, nbytes, memory, placement record)`` for the model cache.
        """
        return task_model.build(self, placement)

    # --- versions ---------------------------------------------------------------------

    @property
    def version(self) -> str:
        """The label of the current version ("1", the constructor's ``version=``, or what
        :meth:`update` returned); in a task, the version that task scores with."""
        return self.for_task()._version

    def update(self, model_or_path: Any, *, version: str | None = None,
               custom_objects: Mapping[str, Any] | None = None) -> str:
        """Ship a new version of the model through this handle; returns its label.

        Every plan made with this handle scores with the new version from its next
        micro-batch (a running Structured Streaming query: no restart) or action whose
        tasks start after ``update`` returns; a micro-batch or action already running
        keeps its version, and a micro-batch Spark runs again (a failure, a restart from
        the checkpoint in this driver process) gets the version it was first scored
        with. The workers ask the driver which version to use (see
        :mod:`spark_keras.channel.versions`) and read a new version's payload from it,
        or from storage for a URI; old versions are released once no micro-batch holds
        them.

        Args:
            model_or_path: as for the constructor. It must take the same inputs and give
                the same outputs (shapes, dtypes, names) as the current version: plans
                made with this handle fixed their schema.
            version: the new version's label, unique (default: its number, "2", "3"...,
                or the next number no version's label took).
            custom_objects: as for the constructor (default: the constructor's).

        Returns:
            The new version's label (what ``version_col`` then says).

        Raises:
            ArgumentError: the label is taken, or the model does not fit the current
                version's inputs and outputs.
        """
        return broadcast_versions.update(self, model_or_path, version, custom_objects)

    # what the Watch of a URI given with refresh= calls (channel.versions.Watch)
    def _read(self, model_or_path: Any, custom_objects: Mapping[str, Any] | None
              ) -> driver_payload.DriverPayload:
        return broadcast_versions.read(self, model_or_path, custom_objects)

    def _adopt(self, payload: driver_payload.DriverPayload) -> str:
        return broadcast_versions.adopt(self, payload)

    def for_task(self) -> "BroadcastModel":
        """This handle as the version the running Spark task scores with.

        Returns:
            In a task, the handle of the version the driver pinned the task's micro-batch
            or action to (asked once per process and micro-batch or action); elsewhere,
            this handle.
        """
        return task_version.for_task(self)

    # --- inference helpers -----------------------------------------------------------

    def predict_udf(self, *, return_type: Any = None, batch_size: int = DEFAULT_BATCH_SIZE,
                    on_invalid: str = "error", max_invalid: float | None = None,
                    buckets: Any = None, max_invalid_scope: str = "action") -> Any:
        """A vectorized, iterator-form UDF scoring this model: ``df.select(udf("features"))``.

        Columns: one array/Vector/scalar column per model input, several scalar columns stacked as
        the features of a single-input model, or a struct column (``udf(struct(*cols))``) whose
        fields are stacked the same way or matched by name to a multi-input model's named inputs
        (see :mod:`spark_keras.inference.columns`). Arrow-native (``arrow_udf``) on PySpark >= 4.1,
        a pandas UDF before. The row count never changes.

        Args:
            return_type: the result's Spark type (a ``DataType`` or a DDL string), instead
                of the one the model's outputs give.
            batch_size: rows per model call.
            on_invalid: ``"error"`` (default) fails the task on a null, NaN/inf or wrongly shaped
                row, naming the column and row, and on a row the model (or the preprocess
                function) raises on (:class:`~spark_keras.errors.ModelCallError`, found by
                retrying the batch in parts); ``"null"`` gives such rows a null prediction.
            max_invalid: (with ``"null"``) a count (>= 1) or a fraction (< 1) of invalid rows
                beyond which scoring fails with :class:`~spark_keras.errors.InvalidRowsError`,
                counted over every task of the action (micro-batch): a count as soon as the
                tasks' sum passes it, a fraction once every task of the stage has scored its
                rows (see :mod:`spark_keras.inference.limits`).
            max_invalid_scope: ``"action"`` (default: the tasks report their counts to the
                driver) or ``"task"`` (each task alone, no request to the driver).
            buckets: for a model that masks its variable-length inputs (``Masking``,
                ``Embedding(mask_zero=True)``, a keras-hub ``padding_mask``): pad a batch's rows
                into at most this many lengths (an int), or to these lengths (a sequence), one
                model call per bucket, each prediction staying its row's own (within 1e-5); an
                ``ArgumentError`` where padding would change them (:mod:`spark_keras.inference.buckets`).

        Returns:
            The UDF. Its column is a scalar for a single-unit output, (nested) arrays for
            vector outputs, a struct with one field per output for multi-output models.
        """
        from spark_keras.spark.udf import PredictUDF  # pyarrow loads with it, on first use, not with this module

        self.check_usable()
        return PredictUDF(self, return_type=return_type, batch_size=batch_size,
                          on_invalid=on_invalid, max_invalid=max_invalid, buckets=buckets,
                          max_invalid_scope=max_invalid_scope)

    def transform(self, df: Any, input_cols: str | Sequence[str], output_col: str = "prediction",
                  *, batch_size: int = DEFAULT_BATCH_SIZE, on_invalid: str = "error",
                  profile: Any = None, error_col: str | None = None,
                  observe: Any = None, max_invalid: float | None = None, buckets: Any = None,
                  id_col: str | None = None, version_col: str | None = None,
                  max_invalid_scope: str = "action") -> Any:
        """Score ``df``, with zero-copy Arrow-to-numpy conversion.

        On PySpark >= 4.1 only the input columns travel to Python and only the new columns come
        back (an ``arrow_udf``: columns Arrow cannot carry, such as intervals, stay in the JVM);
        with a ``profile``, or before PySpark 4.1, whole rows go through ``mapInArrow``. As with
        any column, the prediction is computed where an action needs it: ``count()`` alone
        scores nothing (and raises no input error); write or collect the output.

        Args:
            df: the DataFrame to score.
            input_cols: its column(s) holding the model's inputs, as for :meth:`predict_udf`.
            output_col: the prediction's column (a struct for multi-output models).
            batch_size: rows per model call.
            on_invalid: as in :meth:`predict_udf`.
            profile: a ``pyspark.resource.ResourceProfile`` for the scoring stage alone
                (PySpark >= 4.0; stage-level scheduling: more CPUs, or GPUs, per scoring
                task); TensorFlow's thread pools and the model's device follow each task's
                resources (see :mod:`spark_keras.executor.resources`).
            error_col: (with ``on_invalid="null"`` only) a string column added too, null for
                scored rows and, for each invalid row, what ``on_invalid="error"`` would have
                raised for it (the column, what is wrong, what the input expects), or for a row
                the model or the preprocess function raised on, ``"model: <Error>: <message>"``.
            observe: a ``pyspark.sql.Observation`` (or a name, for streaming queries, whose
                progress then reports ``observedMetrics[name]``) that, once an action has run,
                holds ``rows``, ``invalid_rows``, ``model_builds`` (this model's builds in the
                Python workers during the query's tasks: 0 where cached) and ``build_seconds``.
            max_invalid: as in :meth:`predict_udf`.
            max_invalid_scope: as in :meth:`predict_udf`.
            buckets: as in :meth:`predict_udf`.
            id_col: a column naming each row (a record id): errors and ``error_col``
                reasons say ``row id=17`` instead of ``row 10 of this batch``.
            version_col: a string column added too: the label of the model version
                that scored the row (see :meth:`update`).

        Returns:
            ``df`` with every column kept plus ``output_col`` (and ``error_col``, ``version_col``).

        Raises:
            ModelInputError: on the driver, for input columns the schema already shows the model
                cannot take (a count of columns its input cannot take, a string column for a
                numeric input...); rows are checked in the workers.
        """
        from spark_keras.spark.transform import transform

        self.check_usable()
        return transform(self, df, input_cols, output_col, batch_size=batch_size,
                         on_invalid=on_invalid, profile=profile, error_col=error_col,
                         observe=observe, max_invalid=max_invalid, id_col=id_col,
                         version_col=version_col, buckets=buckets,
                         max_invalid_scope=max_invalid_scope)

    def predict_partition(self, rows: Iterable[Any], *, batch_size: int = DEFAULT_BATCH_SIZE,
                          on_invalid: str = "error", max_invalid: float | None = None,
                          id_col: str | None = None, buckets: Any = None,
                          max_invalid_scope: str = "action") -> Iterator[Any]:
        """For ``rdd.mapPartitions(bm.predict_partition)``: one prediction per row, in order.

        Args:
            rows: the partition's rows. A row is a feature array/list/Vector, a tuple/Row
                with one value per model input, or a dict keyed by input name.
            batch_size: rows per model call.
            on_invalid: as in :meth:`predict_udf` (the partition is the task).
            max_invalid: as in :meth:`predict_udf`.
            max_invalid_scope: as in :meth:`predict_udf` (the action: every task of the
                job's stage that scores with this handle and limit).
            buckets: as in :meth:`predict_udf` (checked in the task).
            id_col: a field of each row (a ``Row`` or a dict) naming it in errors (``row
                id=17``); the row's other fields are the model's inputs.

        Yields:
            Predictions: floats for single-unit outputs, numpy arrays otherwise, dicts for
            multi-output models; ``None`` for invalid rows when ``on_invalid="null"``.

        Raises:
            SparkKerasError: on Spark Connect, which has no RDDs.
        """
        if not self._transport.rdds:
            raise SparkKerasError("predict_partition is for rdd.mapPartitions, and Spark Connect has "
                                  "no RDDs: use bm.transform(df, ...) or bm.predict_udf(), or your "
                                  "own df.mapInArrow function calling bm.predictor")
        from spark_keras.spark.map_partitions import predict_rows

        return predict_rows(self, rows, batch_size=batch_size, on_invalid=on_invalid,
                            max_invalid=max_invalid, id_col=id_col, buckets=buckets,
                            max_invalid_scope=max_invalid_scope)

    # --- lifecycle -----------------------------------------------------------------------

    def unpersist(self, blocking: bool = False) -> None:
        """Free the executors' copies: the broadcast blocks now; the cached models and
        payload files when each worker next uses a BroadcastModel.

        The handle stays usable: its payload is broadcast afresh under a new
        :attr:`key` (executors fetch it only if it is used again), and a worker that
        uses it again rebuilds the model once, then serves it from its cache. The old
        blocks are destroyed: an action still running, or a DataFrame made before, fails.

        Args:
            blocking: wait until the broadcast blocks are removed.
        """
        broadcast_lifecycle.unpersist(self, blocking)

    def destroy(self, blocking: bool = False) -> None:
        """Release the broadcast everywhere; this handle can no longer be used.

        A handle dropped on the driver (garbage-collected) releases what it holds there
        too: the driver's copies of its payloads go, and the plans made with it that
        still run get its current version (from the workers' copies, or its broadcast)
        until Spark stops; keep the handle while such plans may need the driver's copy.
        Once no handle remains and Spark stopped, the driver's version server closes.

        Args:
            blocking: wait until the broadcast blocks are removed.
        """
        broadcast_lifecycle.destroy(self, blocking)

    # --- pickling (what a closure or a broadcast structure carries) ----------------------

    def __getstate__(self) -> dict[str, Any]:
        return broadcast_shipping.carried(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def __repr__(self) -> str:
        where = "driver" if self._model is not None else f"worker pid {os.getpid()}"
        return f"BroadcastModel({self._key}, {self._nbytes / 2**20:.1f} MB, {where})"

