"""Keras models on Dask workers (needs the ``dask`` extra: dask and distributed).

Three ways in, from simplest to fastest:

* ``client.submit(train, spark_keras.make_picklable(model))``: every task receives the
  model as a payload (config + weights, plus custom classes: by reference when
  importable, by value when defined in ``__main__``) and gets its own independent copy,
  so it may train it and return ``get_weights()``. The scheduler unpickles every task it
  is sent, so it rebuilds the model too (it needs Keras installed).
* :func:`ship`: the payload goes to every worker once, in a worker plugin (workers that
  join later get it too); tasks receive a tiny handle whose ``.value`` is the model,
  rebuilt once per worker process through :mod:`spark_keras.cache`. For inference;
  :func:`predict_dask` scores a ``dask.array`` or ``dask.dataframe`` with it.
* ``dask worker --preload spark_keras.dask``: workers import Keras and the modules listed
  in ``SPARK_KERAS_PRELOAD`` (comma-separated; custom layers and models) at start.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from typing import Any, Mapping, Sequence, cast

import numpy as np

from spark_keras._deps import require

require("distributed", "spark_keras.dask")
from distributed.diagnostics.plugin import WorkerPlugin  # noqa: E402

from spark_keras import flavour
from spark_keras.cache import model_cache
from spark_keras.errors import ModelInputError, SparkKerasError
from spark_keras.handle import ModelHandle
from spark_keras.inference import columns as cols
from spark_keras.inference.engine import score
from spark_keras.inference.options import DEFAULT_BATCH_SIZE, check_batch_size, check_on_invalid
from spark_keras.inference.outputs import flat_columns, flat_dtype, flat_outputs
from spark_keras.inference.preprocess import Preprocess
from spark_keras.inference.signature import Signature, model_outputs
from spark_keras.payload import digest, host_file
from spark_keras.payload.shipment import Shipment
from spark_keras.preload import PRELOAD_ENV, preload
from spark_keras.private_folder import private_folder

logger = logging.getLogger("spark_keras")

__all__ = ["ship", "DaskModel", "predict_dask", "dask_setup", "PRELOAD_ENV"]

PAYLOAD_FOLDER = host_file.FOLDER_NAME  # beside the workers' scratch folders


def ship(client: Any, model: Any, *, custom_objects: Mapping[str, Any] | None = None,
         safe_mode: bool = True, preprocess: Any = None) -> "DaskModel":
    """Send ``model`` to every worker of ``client`` once, for tasks to use.

    The payload and the model's custom objects (those found in it plus
    ``custom_objects``; cloudpickled, so classes from ``__main__`` work) travel in a
    ``distributed`` worker plugin: registered with the scheduler, it reaches current
    workers now and workers started later when they join. The returned
    :class:`DaskModel` pickles as its key and size only; inside a task, ``handle.value`` is the
    model, built on first use in each worker process and cached
    (:func:`spark_keras.cache_info`). With Keras 3 on TensorFlow the workers of a host
    share one copy of the weights, mapped from a file the first of them writes; otherwise
    each worker keeps the payload, to rebuild the model after a cache eviction.
    Use it for inference; to train on a worker, submit a
    ``make_picklable`` model instead, which gives each task its own copy.

    Example::

        handle = ship(client, model)
        futures = client.map(lambda x: handle.value(x).numpy(), batches)
        scores = predict_dask(handle, ddf, columns=feature_names)
        handle.release()                      # or: with ship(client, model) as handle:

    Args:
        client: a ``distributed.Client``.
        model: a built Keras model.
        custom_objects: custom classes/functions its config refers to, beside those
            found in it.
        safe_mode: passed to ``loads`` in the workers (``False`` only for models you
            trust: it allows Lambda layers).
        preprocess: a function run in the workers on each partition (a pandas
            DataFrame of the chosen columns) before the model, as for
            :class:`~spark_keras.BroadcastModel`; :func:`predict_dask` applies it.

    Returns:
        The handle for tasks (:class:`DaskModel`).

    Raises:
        PayloadError: the model cannot be serialized. Rebuilding errors on a worker
            (for example an unknown class) are raised by the tasks using the handle.
    """
    shipment = Shipment.of(model, custom_objects=custom_objects, safe_mode=safe_mode)
    key = ModelHandle.new_key(model, "dask-")
    client.register_plugin(_ModelPlugin(key, shipment), name=key)
    logger.info("shipped %s to Dask workers: %.1f MB payload", key,
                len(shipment.payload) / 2**20)
    return DaskModel(key, len(shipment.payload), model=model, client=client,
                     preprocess=Preprocess.of(preprocess))


class DaskModel(ModelHandle):
    """A model shipped to Dask workers by :func:`ship`: ``.value`` is the model (the
    original on the driver, the cached rebuild in a worker process).

    Args:
        key: the cache key, the name of the worker plugin carrying the payload.
        nbytes: the size of the payload in bytes.
        model: the Keras model on the driver (None once unpickled in a worker).
        client: the ``distributed.Client`` that shipped it (None once unpickled).
        preprocess: the function run on each partition before the model.
    """

    def __init__(self, key: str, nbytes: int, *, model: Any = None, client: Any = None,
                 preprocess: Preprocess | None = None) -> None:
        super().__init__(key, nbytes, model=model, preprocess=preprocess)
        self._client = client  # None once unpickled, as the model

    def build_model(self) -> tuple:
        return self._plugin().build()

    def release(self) -> None:
        """Unregister the plugin: workers drop the payload and the cached model, and the
        hosts' payload files go; tasks using this handle afterwards fail. Driver-side only.

        Raises:
            SparkKerasError: called elsewhere than on the driver that shipped the model.
        """
        if self._client is None:
            raise SparkKerasError("release() is called on the driver that shipped the model")
        self._client.unregister_worker_plugin(self._key)

    def __enter__(self) -> "DaskModel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def _plugin(self) -> "_ModelPlugin":
        from distributed import get_worker

        try:
            worker = get_worker()
        except ValueError:
            raise SparkKerasError(f"{self!r}.value works on the driver and in tasks on the "
                                  f"workers of the client that shipped it") from None
        plugin = worker.plugins.get(self._key)
        if not isinstance(plugin, _ModelPlugin):
            raise SparkKerasError(f"model {self._key} is not on worker {worker.address}: it "
                                  f"was released, or shipped with another cluster's client")
        return plugin

    def __reduce__(self) -> tuple:
        return (_unpickle_handle, (self._key, self._nbytes, self._preprocess))

    def __dask_tokenize__(self) -> tuple:
        return ("spark_keras.DaskModel", self._key)

    def __repr__(self) -> str:
        where = "driver" if self._model is not None else f"worker pid {os.getpid()}"
        return f"DaskModel({self._key}, {self._nbytes / 2**20:.1f} MB, {where})"


def _unpickle_handle(key: str, nbytes: int, preprocess: Preprocess | None) -> DaskModel:
    return DaskModel(key, nbytes, preprocess=preprocess)


class _ModelPlugin(WorkerPlugin):
    """Carries a :class:`Shipment` to each worker; building waits for the first task,
    so a model that cannot be rebuilt fails that task instead of the worker.

    With Keras 3 on TensorFlow, the first worker of a host to build writes the payload
    to a file in :data:`PAYLOAD_FOLDER`, beside the workers' scratch folders, and every
    worker of the host builds on weights mapped from it (one copy per host); a worker
    then lets go of its own copy of the payload bytes, so it needs the file to build
    again (after a cache eviction). The file therefore stays while any worker of the
    host holds the plugin (see :func:`.host_file.join`): it goes with the last of them,
    when the plugin is released or the workers close.

    Other users of the host may write the scratch folder (it is often ``/tmp``'s): the
    payload folder is used only if it is this user's alone, in a folder no other user may
    write (:func:`.private_folder`; else the worker keeps its own copy, with a warning),
    and a file found written is mapped only once its SHA-256 is the one fixed on the
    client as the model was shipped (:func:`.digest.check_file`)."""

    def __init__(self, key: str, shipment: Shipment) -> None:
        self.name, self.shipment = key, shipment
        self.nbytes = len(shipment.payload)
        self.sha256 = hashlib.sha256(shipment.payload).hexdigest()
        self.folder: str | None = None
        self._users: int | None = None  # this worker's share of the host's file

    def setup(self, worker: Any) -> None:
        if not flavour.current().shares_weights:
            return
        scratch = os.path.dirname(os.path.abspath(worker.local_directory))
        folder = os.path.join(scratch, PAYLOAD_FOLDER)
        try:
            private_folder(folder, holder=True)
            self._users = host_file.join(folder, self.name)
        except OSError as exc:
            logger.warning("cannot share %s's payload file in %s (%s): worker %s keeps its "
                           "own copy of the weights", self.name, folder, exc, worker.address)
            return
        self.folder = folder

    def build(self) -> tuple:
        if self.folder is None:
            return self.shipment.build()
        verify = functools.partial(digest.check_file, sha256=self.sha256,
                                   what=f"model {self.name}", where="this host")
        built = self.shipment.build_shared(self.folder, self.name, self.nbytes, verify=verify)
        self.shipment = self.shipment.without_payload()
        return built

    def teardown(self, worker: Any) -> None:
        model_cache.drop(self.name)
        users, self._users = self._users, None
        if users is not None and self.folder is not None:
            try:
                host_file.leave(users, self.folder, self.name)
            except OSError as exc:
                logger.warning("cannot remove %s's payload file in %s: %s", self.name,
                               self.folder, exc)


# --- scoring dask collections ---------------------------------------------------------

def predict_dask(handle: DaskModel, collection: Any, *,
                 columns: Sequence[str] | Mapping[str, Sequence[str]] | None = None,
                 batch_size: int = DEFAULT_BATCH_SIZE, on_invalid: str = "error") -> Any:
    """Score a ``dask.array.Array`` or ``dask.dataframe.DataFrame`` with a shipped model,
    block by block / partition by partition, through each worker's cached model and the
    engine every front-end uses (the same input kinds, errors and ``on_invalid`` rule as
    Spark and ``pool_predict``). Lazy: returns a dask collection.

    Args:
        handle: from :func:`ship`.
        collection: a dask array (rows along axis 0, the rest reshaped to the model's
            single input; chunks along other axes are merged), or a dask DataFrame
            (scalar columns, or columns holding arrays).
        columns: DataFrame only. The columns to use (default: every column): stacked as
            the features of a single-input model, or one per input (in order, or named
            as the inputs); or a dict mapping each input name to its columns.
        batch_size: rows per compiled model call.
        on_invalid: ``"error"`` (default) fails the task on a null, NaN/inf or wrongly
            shaped row, naming the column and row; ``"null"`` gives such rows NaN outputs
            (the outputs are then floats).

    Returns:
        For an array: a dask array per output (rows, *output shape), one for a
        single-output model, else a dict keyed by output name. For a DataFrame: a dask
        DataFrame with the input's index and one column per output value: the output's
        name (``prediction`` for a single output) or ``<name>_<i>`` for vector outputs.

    Raises:
        ModelInputError: the collection or columns do not match the model's inputs.
    """
    check_on_invalid(on_invalid)
    options = {"handle": handle, "batch_size": check_batch_size(batch_size),
               "on_invalid": on_invalid}
    signature = handle.signature
    if hasattr(collection, "map_blocks") and hasattr(collection, "chunks"):
        if columns is not None:
            raise ModelInputError("columns= applies to dask DataFrames, not arrays")
        return _predict_array(collection, signature, options)
    if hasattr(collection, "map_partitions") and hasattr(collection, "columns"):
        return _predict_frame(collection, signature, columns, options)
    raise ModelInputError(f"predict_dask scores a dask Array or DataFrame, not "
                          f"{type(collection).__name__} (use .to_frame() on a Series)")


def _predict_array(x: Any, signature: Signature, options: dict) -> Any:
    if len(signature.inputs) != 1:
        raise ModelInputError(f"the model has inputs {[s.name for s in signature.inputs]}: "
                              f"score a dask DataFrame with columns={{input: [...]}}")
    spec = signature.inputs[0]
    x = x[:, None] if x.ndim == 1 else x
    if int(np.prod(x.shape[1:])) != spec.size:
        raise ModelInputError(f"rows of shape {tuple(x.shape[1:])} do not fit the model's "
                              f"input {spec.name!r}: {spec.describe()}")
    x = x.rechunk({axis: -1 for axis in range(1, x.ndim)})
    width = len(flat_columns(signature))  # every value of every output (none ragged)
    dtype = flat_dtype(signature, options["on_invalid"] == "null")
    flat = x.map_blocks(_score_block, **options, dtype=dtype,
                        chunks=(x.chunks[0], (width,)), drop_axis=list(range(2, x.ndim)))
    outputs, start = [], 0
    for out in signature.outputs:
        size = cast(int, out.size)  # known: flat_columns refused unknown dimensions
        part = flat[:, start:start + size]
        start += size
        if out.shape != (out.size,):
            part = part.reshape((part.shape[0], *out.shape))
        out_dtype = np.dtype(out.dtype) if options["on_invalid"] == "error" else dtype
        outputs.append(part.astype(out_dtype) if out_dtype != dtype else part)
    return model_outputs(outputs, signature)


def _predict_frame(frame: Any, signature: Signature,
                   columns: Sequence[str] | Mapping[str, Sequence[str]] | None,
                   options: dict) -> Any:
    import pandas as pd

    if options["handle"].preprocess is None:
        # the same column checks as in the tasks, on the (empty) meta frame: fail here, now
        cols.assign(cols.from_frame(frame._meta, columns, signature), signature)
    names = flat_columns(signature)
    dtype = flat_dtype(signature, options["on_invalid"] == "null")
    meta = pd.DataFrame(np.zeros((0, len(names)), dtype), columns=names,
                        index=pd.Index([], dtype=frame.index.dtype))
    return frame.map_partitions(_score_partition, columns=columns, names=names, **options,
                                meta=meta)


# --- in the workers ---------------------------------------------------------------------

def _score_block(block: np.ndarray, *, handle: DaskModel, batch_size: int,
                 on_invalid: str) -> np.ndarray:
    signature = handle.signature
    scored = score(handle, cols.from_numpy(block, signature), batch_size=batch_size,
                   on_invalid=on_invalid)
    return flat_outputs(scored, on_invalid == "null")


def _score_partition(frame: Any, *, handle: DaskModel, columns: Any, batch_size: int,
                     on_invalid: str, names: list[str]) -> Any:
    import pandas as pd

    signature = handle.signature
    data = cols.from_frame(frame, columns, None) if handle.preprocess is not None \
        else cols.from_frame(frame, columns, signature)
    scored = score(handle, data, batch_size=batch_size, on_invalid=on_invalid, where="partition")
    return pd.DataFrame(flat_outputs(scored, on_invalid == "null"), index=frame.index,
                        columns=names)


# --- dask worker --preload spark_keras.dask -------------------------------------------

def dask_setup(worker: Any = None) -> list[str]:
    """Preload hook: ``dask worker --preload spark_keras.dask`` (or
    ``LocalCluster(preload=["spark_keras.dask"])``) runs it when a worker starts.

    Imports Keras (so the first task does not pay for it) and every module named in the
    ``SPARK_KERAS_PRELOAD`` environment variable (comma-separated, e.g.
    ``SPARK_KERAS_PRELOAD=my_layers,my_pkg.models``): the modules defining your custom
    layers and models, registered with ``@keras.saving.register_keras_serializable``, so
    tasks only receive configs and weights.

    Args:
        worker: the ``distributed`` worker starting (named in the log).

    Returns:
        The names of the modules imported.

    Raises:
        SparkKerasError: a listed module cannot be imported (the worker does not start).
    """
    names = preload()
    logger.info("spark_keras preload on %s: keras%s", getattr(worker, "address", "worker"),
                "".join(f", {n}" for n in names))
    return names
