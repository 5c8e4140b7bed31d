"""KeyedModels: many Keras models in one job, each row scored by the model of its key.

Each key's model is a :class:`~spark_keras.BroadcastModel` of its own, shipped by the
driver (``ship="driver"``) or read from storage (a URI): its payload reaches an executor,
and lands in its file, when a worker there first needs that key, and each worker keeps the
models it uses in its LRU cache: a KeyedModels task makes room there for every key's
model (up to 64; not where ``SPARK_KERAS_CACHE_MAX_ENTRIES`` or ``configure_cache`` chose
a limit), still bounded by ``SPARK_KERAS_CACHE_MAX_BYTES``, so rows in any key order build
each model once per worker, not once per batch. In a batch, the rows are grouped by key (a stable sort of the keys'
codes, zero-copy slices), each key's rows go to its model in one call, and the results
are put back in row order; a batch of one key (rows clustered by key) is scored as is.
Batches in mixed key order are put together first until each key has about two model
calls' rows (:mod:`spark_keras.inference.keyed_batches`).
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any, Callable, Hashable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa

from spark_keras.cache import model_cache
from spark_keras.channel import versions
from spark_keras.errors import ArgumentError, ArgumentTypeError, ModelInputError, SparkKerasError
from spark_keras.inference import buckets as bucketing
from spark_keras.inference.engine import Scored
from spark_keras.inference.keyed_batches import gathered
from spark_keras.inference.limits import InvalidBudget
from spark_keras.inference.options import DEFAULT_BATCH_SIZE, Buckets, check_batch_size, check_on_invalid
from spark_keras.inference.outputs import to_arrow
from spark_keras.inference.rows import RowNames
from spark_keras.inference.specs import Signature, empty_outputs
from spark_keras.spark import job_budget, scoring
from spark_keras.spark.broadcast import BroadcastModel
from spark_keras.spark.transform import transform as transform_df
from spark_keras.spark.udf import arrow_udf_of, column_name

logger = logging.getLogger("spark_keras")


class KeyedModels:
    """Models by key, shipped to Spark executors: ``transform`` scores each row with the
    model of its key column's value.

    Args:
        spark: a ``SparkSession`` (classic or Spark Connect) or ``SparkContext``.
        models: ``{key: model_or_path}``: Keras models, ``.keras`` or payload files,
            local or URIs (each executor reads only the keys it meets), as for
            :class:`~spark_keras.BroadcastModel`. Keys are strings or integers, as the
            key column holds them. The models must take the same inputs and give the same
            outputs (shapes, dtypes, output names).

    ``custom_objects``, ``safe_mode``, ``share_weights`` and ``preprocess`` are
    ``BroadcastModel``'s, for every model.

    Example::

        km = KeyedModels(spark, {"fr": fr_model, "de": "s3://models/de.skp"})
        km.transform(df, "features", key="country").write.parquet("scored/")
    """

    def __init__(self, spark: Any, models: Mapping[Hashable, Any], *,
                 custom_objects: Mapping[str, Any] | None = None, safe_mode: bool = True,
                 share_weights: bool = True,
                 preprocess: Callable[[Any], Any] | None = None) -> None:
        if not isinstance(models, Mapping) or not models:
            raise ArgumentTypeError("KeyedModels takes a non-empty mapping {key: model_or_path}")
        kinds = {bool if isinstance(k, bool) else int if isinstance(k, int) else type(k)
                 for k in models}
        if not (kinds == {str} or kinds == {int}):
            raise ArgumentTypeError(f"KeyedModels' keys must be all strings or all integers "
                                    f"(as the key column holds them), not {sorted(map(str, kinds))}")
        self._handles: dict[Hashable, BroadcastModel] = {}
        try:
            for key, model in models.items():
                self._handles[key] = BroadcastModel(
                    spark, model, custom_objects=custom_objects, safe_mode=safe_mode,
                    share_weights=share_weights, preprocess=preprocess, ship="driver")
                self._check_fits(key, self._handles[key])
        except BaseException:
            self.destroy()
            raise
        first = next(iter(self._handles.values()))
        self._signature: Signature = first.signature
        self._preprocess = first.preprocess

    def _check_fits(self, key: Hashable, handle: BroadcastModel) -> None:
        """One KeyedModels scores one column layout: every model takes the first's inputs
        and gives its outputs."""
        first_key, first = next(iter(self._handles.items()))
        problems = versions.fit_problems(first.signature, handle.signature,
                                         theirs=f"key {first_key!r}'s")
        if problems:
            raise ArgumentError(f"the model of key {key!r} does not fit the model of key "
                                f"{first_key!r} (every key's model must take the same inputs "
                                f"and give the same outputs): {'; '.join(problems)}")

    # --- what scoring needs of a handle ------------------------------------------------

    @property
    def signature(self) -> Signature:
        """The models' inputs and outputs (one for all)."""
        return self._signature

    @property
    def preprocess(self) -> Any:
        """The preprocess function every model's batches go through (or None)."""
        return self._preprocess

    resize = None

    # --- the models --------------------------------------------------------------------

    def keys(self) -> list[Hashable]:
        """The keys that have a model."""
        return list(self._handles)

    def __getitem__(self, key: Hashable) -> BroadcastModel:
        """The :class:`~spark_keras.BroadcastModel` of ``key``."""
        try:
            return self._handles[key]
        except KeyError:
            raise ArgumentError(f"no model for key {key!r}; the keys are "
                                f"{_some(self.keys())}") from None

    def update(self, key: Hashable, model_or_path: Any, *, version: str | None = None) -> str:
        """Ship a new version of ``key``'s model; the other keys' models stay as they are.
        Running plans take it as :meth:`BroadcastModel.update` describes.

        Args:
            key: a key that has a model (a running plan cannot learn of a new key: make a
                new KeyedModels for it).
            model_or_path: the new model, fitting the others' inputs and outputs.
            version: its label (default: its number for this key, "2", "3"...).

        Returns:
            The new version's label.
        """
        return self[key].update(model_or_path, version=version)

    def destroy(self) -> None:
        """Release every model's broadcast; this KeyedModels can no longer be used."""
        for handle in self._handles.values():
            handle.destroy()

    # --- scoring ---------------------------------------------------------------------

    def transform(self, df: Any, input_cols: str | Sequence[str], key: str,
                  output_col: str = "prediction", *, batch_size: int = DEFAULT_BATCH_SIZE,
                  on_invalid: str = "error", error_col: str | None = None,
                  version_col: str | None = None, max_invalid: float | None = None,
                  id_col: str | None = None, buckets: Any = None,
                  max_invalid_scope: str = "action") -> Any:
        """Score ``df``, each row with the model of its ``key`` column's value.

        A row whose key has no model (or is null) is invalid: under ``on_invalid="null"``
        a null prediction (and, with ``error_col``, ``"key: no model for key 'x'"``),
        else the task fails with a :class:`~spark_keras.ModelInputError` naming the key.
        A key the column's type cannot hold (``3_000_000_000`` in an ``int`` column) is
        never met: the driver warns, or refuses a column that holds none of the keys.
        Cluster rows by key (``df.repartition(n, key).sortWithinPartitions(key)``) so
        that a worker meets each key's rows together: one model call per key and batch,
        and one build per key and worker even with a small cache.

        The other arguments are :meth:`BroadcastModel.transform`'s (``version_col``: the
        version of the row's key's model; ``buckets``: every key's model must mask its
        padding).

        Args:
            key: the column holding each row's key.

        Returns:
            ``df`` with every column kept plus ``output_col`` (and ``error_col``,
            ``version_col``).
        """
        if not isinstance(key, str) or not key:
            raise ArgumentTypeError(f"key must be the key column's name, not {key!r}")
        self._check_key_type(df.schema, key)
        for handle in self._handles.values():  # each model on the driver
            buckets = bucketing.checked(handle, buckets)
        return transform_df(self, df, input_cols, output_col,  # type: ignore[arg-type]
                            batch_size=batch_size, on_invalid=on_invalid, error_col=error_col,
                            max_invalid=max_invalid, id_col=id_col, version_col=version_col,
                            key_col=key, scorer=keyed_columns, buckets=buckets,
                            max_invalid_scope=max_invalid_scope)

    def predict_udf(self, *, batch_size: int = DEFAULT_BATCH_SIZE,
                    on_invalid: str = "error") -> Callable[..., Any]:
        """A UDF scoring each row with its key's model: ``udf("key", "features")`` (the
        key column first, then the input columns as for :meth:`BroadcastModel.predict_udf`).
        Needs PySpark >= 4.1 (an ``arrow_udf``); use :meth:`transform` before.

        Returns:
            The UDF.
        """
        from pyspark.sql.types import StructField

        from spark_keras.spark.types import prediction_type

        check_on_invalid(on_invalid)
        batch_size = check_batch_size(batch_size)

        def udf(key: Any, *columns: Any) -> Any:
            if not columns:
                raise ModelInputError("the KeyedModels UDF takes the key column, then at "
                                      "least one input column")
            names = [column_name(c) for c in columns]
            batches = functools.partial(keyed_columns, self, names, batch_size=batch_size,
                                        on_invalid=on_invalid, reasons=False, figures=False)
            made = arrow_udf_of(batches, len(names) + 1,
                                [StructField("prediction", prediction_type(self.signature))])
            if made is None:
                raise SparkKerasError("KeyedModels.predict_udf needs PySpark >= 4.1 (an "
                                      "arrow_udf); use KeyedModels.transform")
            return made(key, *columns)

        return udf

    def _check_key_type(self, schema: Any, key: str) -> None:
        """Refuse, on the driver, a key column whose values can never be the keys."""
        from pyspark.sql import types as T

        field = next((f for f in schema.fields if f.name == key), None)
        if field is None:
            return  # scoring names the missing column
        numeric = isinstance(field.dataType, T.IntegralType)
        textual = isinstance(field.dataType, T.StringType)
        keys_are_text = isinstance(self.keys()[0], str)
        if (keys_are_text and not textual) or (not keys_are_text and not numeric):
            raise ModelInputError(
                f"key column {key!r} has type {field.dataType.simpleString()}, and the keys "
                f"are {'strings' if keys_are_text else 'integers'} ({_some(self.keys())})")
        if numeric:  # keys out of its range are never met
            from pyspark.sql.pandas.types import to_arrow_type

            key_type = to_arrow_type(field.dataType)
            cannot = sorted(k for k in self.keys() if isinstance(k, int) and not _holds(key_type, k))
            if len(cannot) == len(self._handles):
                raise ModelInputError(
                    f"key column {key!r} has type {field.dataType.simpleString()}, which holds "
                    f"none of the keys {_some(cannot)}")
            if cannot:
                logger.warning("key column %r of type %s cannot hold the keys %s: their models "
                               "are never used", key, field.dataType.simpleString(), _some(cannot))

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __repr__(self) -> str:
        return f"KeyedModels({len(self._handles)} models: {_some(self.keys())})"


def keyed_columns(models: KeyedModels, names: list[str], batches: Iterator[Sequence[pa.Array]],
                  *, batch_size: int, on_invalid: str, reasons: bool, figures: bool = False,
                  max_invalid: job_budget.MaxInvalid = None, id_col: str | None = None,
                  version: bool = False, buckets: Buckets = None) -> Iterator[list[pa.Array]]:
    """In a task: per batch of ``[key, *inputs(, id)]`` columns, what
    :func:`~.scoring.scored_columns` gives, each key's rows scored by its model. Errors
    and reasons number a row by its place in the batch; the batch is held against
    ``max_invalid`` as a whole, in row order, once its keys are scored."""
    keys = models.keys()
    # every batch may hold every key: each model built once per worker, not per batch
    model_cache.make_room(len(keys), f"KeyedModels of {len(keys)} keys")
    known: dict[pa.DataType, tuple[pa.Array, np.ndarray]] = {}  # by key column type
    budget = job_budget.budget_of(max_invalid)
    # each key's rows are counted with the batch, after its last key, not on their own
    per_key = InvalidBudget(math.inf) if budget.active else budget
    for batch in gathered(batches, batch_size):  # mixed keys: batches put together
        arrays = list(batch.arrays)
        key_array = arrays.pop(0)
        if key_array.type not in known:
            known[key_array.type] = _known(keys, key_array.type)
        codes = _codes(key_array, *known[key_array.type])
        n = len(codes)
        order = np.argsort(codes, kind="stable")
        grouped = codes[order]
        starts = [0, *(np.flatnonzero(np.diff(grouped)) + 1).tolist()]
        if len(starts) == 1:  # one key: the batch as it is
            order_array = None
            taken = arrays
        else:
            order_array = pa.array(order)
            taken = [a.take(order_array) for a in arrays]
        parts, counted = [], []
        for start, stop in zip(starts, [*starts[1:], n]):
            rows = [a.slice(start, stop - start) for a in taken]
            ids = None if id_col is None else (id_col, rows.pop())
            # the rows' places in their batch (None: all of it, in order)
            positions = batch.local(None if order_array is None else order[start:stop])
            code = int(grouped[start]) if n else 0  # (an empty batch: the first model's empty outputs)
            if code < 0:
                scored, out = _unknown(models, key_array.take(pa.array(order[start:stop])),
                                       on_invalid, reasons, version,
                                       RowNames.of("batch", 0, ids, positions))
            else:
                task = models[keys[code]].for_task()
                scored, out = scoring.batch_columns(
                    task, names, rows, batch_size=batch_size, on_invalid=on_invalid,
                    reasons=reasons, version=version, ids=ids, budget=per_key, buckets=buckets,
                    positions=positions)
            parts.append(out)
            counted.append(scored)
        if budget.active:
            budget.add(_in_row_order(models.signature, counted, order, n))
        out = [pa.concat_arrays([p[j] for p in parts]) for j in range(len(parts[0]))] \
            if len(parts) > 1 else parts[0]
        if order_array is not None:  # back in row order
            inverse = np.empty(n, dtype=np.int64)
            inverse[order] = np.arange(n)
            out = [o.take(pa.array(inverse)) for o in out]
        yield from batch.split(out)
    budget.finish()


def _in_row_order(signature: Signature, scored: list[Scored], order: np.ndarray, n: int) -> Scored:
    """The invalid rows (and reasons, and their classes) of a batch's keys' ``scored`` rows
    (in ``order``), as one batch's: what the task's budget counts."""
    invalid = np.zeros(n, dtype=bool)
    why = np.full(n, None, dtype=object)
    classes = np.full(n, None, dtype=object)
    start = 0
    for part in scored:
        at = order[start:start + part.rows]
        start += part.rows
        if part.invalid is not None:
            invalid[at] = part.invalid
        if part.reasons is not None:
            why[at] = part.reasons
        if part.classes is not None:
            classes[at] = part.classes
    return Scored(signature, [], invalid, why, classes)


def _holds(key_type: pa.DataType, key: Hashable) -> bool:
    """Whether a column of ``key_type`` can hold ``key`` (an integer in its range, or a
    string in a string column)."""
    if pa.types.is_integer(key_type):
        info = np.iinfo(key_type.to_pandas_dtype())
        return isinstance(key, int) and info.min <= key <= info.max
    return isinstance(key, str) and (pa.types.is_string(key_type)
                                     or pa.types.is_large_string(key_type))


def _known(keys: list[Hashable], key_type: pa.DataType) -> tuple[pa.Array, np.ndarray]:
    """The keys a column of ``key_type`` can hold, as an array of that type, and their
    indices in ``keys`` (the others can never be met in it)."""
    held = [i for i, k in enumerate(keys) if _holds(key_type, k)]
    return pa.array([keys[i] for i in held], key_type), np.array(held, dtype=np.int64)


def _codes(key_array: pa.Array, values: pa.Array, indices: np.ndarray) -> np.ndarray:
    """Each row's index in the keys (-1: no model for it, or a null key), from the keys
    its column can hold (``values``) and their ``indices``."""
    import pyarrow.compute as pc

    if not len(values):
        return np.full(len(key_array), -1, dtype=np.int64)
    found = pc.index_in(key_array, value_set=values).fill_null(-1)
    return np.append(indices, -1)[found.to_numpy(zero_copy_only=False)]  # -1: the last


def _unknown(models: KeyedModels, keys: pa.Array, on_invalid: str, reasons: bool,
             version: bool, names: RowNames) -> tuple[Scored, list[pa.Array]]:
    """The rows whose key has no model (``names`` says which rows of the batch they are):
    refused, or null with their reason (in ``Scored.reasons`` for the task's budget, and
    in a column if ``reasons``)."""
    values = keys.to_pylist()
    if on_invalid == "error" and values[0] is None:
        raise ModelInputError(f"the key is null ({names.at(0)}): a row needs a key to be "
                              f"scored (on_invalid='null' makes such rows null)")
    if on_invalid == "error":
        raise ModelInputError(f"no model for key {values[0]!r} ({names.at(0)}): KeyedModels "
                              f"has keys {_some(models.keys())}")
    n = len(values)
    why = np.array([f"key: no model for key {v!r}" if v is not None else "key: the key is null"
                    for v in values], dtype=object)
    classes = np.array(["key: unknown" if v is not None else "key: null" for v in values],
                       dtype=object)
    scored = Scored(models.signature, empty_outputs(models.signature), np.ones(n, dtype=bool),
                    why, classes)
    out = [to_arrow(scored)]
    if reasons:
        out.append(pa.array(why, pa.string()))
    if version:
        out.append(pa.nulls(n, pa.string()))
    return scored, out


def _some(keys: Sequence[Hashable], most: int = 10) -> str:
    shown = ", ".join(repr(k) for k in keys[:most])
    return f"[{shown}{', ...' if len(keys) > most else ''}] ({len(keys)})"
