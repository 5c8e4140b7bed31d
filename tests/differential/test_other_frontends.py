"""A sample of the generated cases through the front-ends outside Spark (issue 44, item
3): ``predict_dask`` (a dask DataFrame of one to three partitions, on the two-process
``LocalCluster`` of ``tests/test_dask.py``) and ``pool_predict`` (spawned processes; an
Arrow table, a pandas DataFrame or numpy arrays), each compared with the engine's answer
for the same case (:func:`.harness.run`, itself checked against the oracle by
:mod:`.test_generated`), as :mod:`.test_spark_sample` does for Spark's front-ends
(:func:`.harness.compare`): the same rows in the same order, null (NaN, or None for text)
exactly where the engine's are, every other row's outputs within 1e-5. Neither front-end
gives reasons. Under ``on_invalid="error"`` the error must be one the engine raises on the
rows as the front-end splits them (pool chunks, dask partitions; numbered as the
front-end numbers them): the same class, naming the same row (and column, for an input).

Options are those each front-end takes (``batch_size``, ``on_invalid``, ``preprocess``);
the others (``buckets``, ``ids``, ``max_invalid``, ``reasons``) are dropped from the case.
Cases are left out (:func:`unsupported`, saying why) where the front-end cannot give the
engine's answer by design."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

pytest.importorskip("distributed")

from tests.differential.cases import PREPROCESS, Case, Options  # noqa: E402
from tests.differential.harness import compare, numpy_rows, run  # noqa: E402
from tests.differential.profiles import profile  # noqa: E402
from tests.differential.recipes import Recipe, build  # noqa: E402
from tests.differential.strategies import cases  # noqa: E402
from tests.test_dask import client  # noqa: E402,F401  (the LocalCluster fixture: two worker processes)

pytestmark = pytest.mark.timeout(900)

MAX_ROWS = 16
FAMILIES = ("dense", "seq", "tokens", "text", "pair")
DASK_FAMILIES = FAMILIES[:-1]  # (a pair's output per step: see unsupported)
DASK_FAST, DASK_SLOW = 2, 10  # cases per family (~1 s each, once the cluster runs)
POOL_FAST, POOL_SLOW = 1, 3  # cases (make test), per family (slow): each pool_predict
# starts its own spawned processes (10-15 s here, loaded)
WHERE = {"dask": "partition", "pool": "input"}  # how each front-end numbers rows in errors


def unsupported(case: Case, frontend: str) -> str | None:
    """Why ``frontend`` cannot give the engine's answer on ``case`` (None: it can)."""
    if case.composition:
        return ("a call failing on a batch's composition, no row alone: the front-end's "
                "batches (pool chunks, dask partitions) are not the engine's")
    if frontend == "dask" and (case.recipe.head == "steps" or case.recipe.family == "pair"):
        return ("an output per step (rows of their own length): predict_dask gives flat "
                "columns, refusing outputs of unknown dimensions")
    return None


def frontend_cases(frontend: str, families: tuple[str, ...] = FAMILIES) -> st.SearchStrategy[Case]:
    """Generated cases of at most :data:`MAX_ROWS` rows that ``frontend`` takes, with the
    options it takes: batch size, ``on_invalid``; rows named as it names them."""
    def own_options(case: Case) -> Case:
        o = case.options
        return dataclasses.replace(case, options=Options(
            batch_size=o.batch_size, on_invalid=o.on_invalid, where=WHERE[frontend],
            frontend="numpy"))
    return cases(max_rows=MAX_ROWS, families=families) \
        .filter(lambda c: unsupported(c, frontend) is None).map(own_options)


def output_names(recipe: Recipe) -> list[str]:
    """The model's outputs as the front-ends name them (``prediction`` for one output)."""
    from spark_keras.inference.signature import signature_of

    return list(signature_of(build(recipe)).output_names or ("prediction",))


# --- the data, as each front-end's user holds it ------------------------------------------

def column_names(case: Case) -> list[str]:
    return [name for name, _ in case.columns()]


def pandas_frame(case: Case) -> Any:
    """The case's raw columns as a pandas DataFrame of Python cells (lists, text, bytes,
    None: object columns), the values of the engine's Arrow columns."""
    import pandas as pd

    return pd.DataFrame({name: pd.Series(array.to_pylist(), dtype=object)
                         for name, array in zip(column_names(case), case.arrays())})


def numpy_arrays(case: Case) -> list[np.ndarray]:
    """One array per model input: a float array where every row is a list of one width
    (NaN and infinities as they are), else an object array of the cells."""
    out = []
    for (_, kind), array in zip(case.columns(), case.arrays()):
        cells = array.to_pylist()
        widths = {len(c) if isinstance(c, list) else -1 for c in cells}
        if kind in ("vector", "features") and len(widths) == 1 and widths != {-1} \
                and all(v is not None for c in cells for v in c):
            out.append(np.asarray(cells, dtype="float32").reshape(len(cells), -1))
            continue
        column = np.empty(len(cells), dtype=object)
        for i, c in enumerate(cells):  # (one by one: equal lists would become a 2-D array)
            column[i] = c
        out.append(column)
    return out


# --- errors under on_invalid="error" -----------------------------------------------------

def blamed(error: BaseException) -> tuple[str, str | None, str | None]:
    """An error's class, the row it names and, for an input's error, the column."""
    text = str(error)
    row = re.search(r"row \d+ of this \w+", text)
    column = re.search(r"column '[^']*'", text) if type(error).__name__ == "ModelInputError" \
        else None
    return type(error).__name__, row and row.group(0), column and column.group(0)


def part(case: Case, start: int, stop: int, **options: Any) -> Case:
    """Rows ``start:stop`` of ``case``, with ``options`` changed."""
    return Case(case.recipe, case.rows[start:stop], case.preprocess,
                dataclasses.replace(case.options, **options))


def error_problems(case: Case, error: BaseException | None, units: list[Case],
                   frontend: str) -> list[str]:
    """Under ``"error"``: the front-end's ``error`` (None: it raised nothing) against the
    engine's on each of ``units``, the rows as the front-end scores them apart."""
    raised = [seen.error for seen in map(run, units) if seen.error is not None]
    if error is None:
        return [f"{frontend}: raised nothing; the engine raised {blamed(raised[0])}"] if raised else []
    if not any(blamed(error) == blamed(e) for e in raised):
        return [f"{frontend}: raised {blamed(error)}: {str(error)[:300]}; the engine raised "
                f"{[blamed(e) for e in raised] or 'nothing'}"]
    return []


def check(case: Case, error: BaseException | None, got: dict[int, tuple[Any, None]],
          units: list[Case], frontend: str) -> None:
    """The front-end's answer (``got``, or the ``error`` it raised) against the engine's."""
    if case.options.on_invalid == "error":
        problems = error_problems(case, error, units, frontend)
        if error is None and not problems:
            problems = compare(case, got, frontend)
    elif error is not None:
        problems = [f"{frontend}: raised under 'null': {type(error).__name__}: {str(error)[:300]}"]
    else:
        problems = compare(case, got, frontend)
    assert not problems, "\n  - ".join([f"case: {case!r}", *problems])


# --- Dask ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shipped(client):  # noqa: F811  (the fixture imported above)
    """One DaskModel per (recipe, preprocess) for the module, released at its end."""
    from spark_keras.dask import ship

    made: dict[tuple[Recipe, str | None], Any] = {}

    def get(recipe: Recipe, preprocess: str | None) -> Any:
        if (recipe, preprocess) not in made:
            made[recipe, preprocess] = ship(client, build(recipe),
                                            preprocess=PREPROCESS[preprocess] if preprocess else None)
        return made[recipe, preprocess]

    yield get
    for handle in made.values():
        handle.release()


def dask_scored(handle: Any, case: Case, partitions: int
                ) -> tuple[BaseException | None, dict[int, tuple[Any, None]], list[Case]]:
    """``predict_dask`` on the case's rows in ``partitions`` partitions: the error it
    raised, or each row's outputs by its index (in the order computed); and the rows of
    each partition as a case, numbered within it."""
    import dask
    import dask.dataframe as dd

    from spark_keras.dask import predict_dask

    opts = case.options
    with dask.config.set({"dataframe.convert-string": False}):  # (as the docs say)
        frame = dd.from_pandas(pandas_frame(case), npartitions=partitions)
        bounds = [0, case.n] if None in frame.divisions else \
            [*frame.divisions[:-1], case.n]  # the index is the row's number
        units = [part(case, a, b, first_row=0) for a, b in zip(bounds, bounds[1:])]
        try:
            out = predict_dask(handle, frame, columns=column_names(case),
                               batch_size=opts.batch_size, on_invalid=opts.on_invalid).compute()
        except Exception as exc:  # judged against the engine's
            return exc, {}, units
    specs = handle.signature.outputs
    arrays, start = {}, 0
    for spec in specs:  # the flat columns (name, or name_<i>) back to each output's shape
        size = int(spec.size)
        block = out.iloc[:, start:start + size].to_numpy()
        start += size
        if spec.dtype != "string":  # (beside a text output every column holds objects)
            block = block.astype("float64")
        arrays[spec.name] = block.reshape(len(out), *spec.shape)
    rows, _ = numpy_rows(arrays if len(specs) > 1 else arrays[specs[0].name],
                         [s.name for s in specs])
    index = [int(i) for i in out.index]
    if index != sorted(index):
        raise AssertionError(f"dask: rows in the order {index}")
    return None, {i: (r, None) for i, r in zip(index, rows)}, units


def _dask_sample(shipped: Any, family: str, examples: int, slow: bool) -> None:
    def one(case: Case, partitions: int) -> None:
        error, got, units = dask_scored(shipped(case.recipe, case.preprocess), case, partitions)
        check(case, error, got, units, f"dask ({partitions} partitions)")

    settings = profile("slow" if slow else "ci")
    settings = type(settings)(settings, max_examples=examples)
    settings(given(frontend_cases("dask", (family,)), st.sampled_from((2, 1, 3)))(one))()


@pytest.mark.parametrize("family", DASK_FAMILIES)
def test_dask_agrees_with_the_engine(client, shipped, family):  # noqa: F811
    _dask_sample(shipped, family, DASK_FAST, slow=False)


@pytest.mark.slow
@pytest.mark.heavy  # ~3 min with the pool sample below: make test-heavy (CI's time)
@pytest.mark.parametrize("family", DASK_FAMILIES)
def test_more_cases_through_dask_agree_with_the_engine(client, shipped, family):  # noqa: F811
    _dask_sample(shipped, family, DASK_SLOW, slow=True)


# --- pool_predict --------------------------------------------------------------------------

def pooled(case: Case, data: str, processes: int
           ) -> tuple[BaseException | None, dict[int, tuple[Any, None]], list[Case]]:
    """``pool_predict`` on the case's rows held as ``data`` (``"arrow"``, ``"pandas"``,
    ``"numpy"``): the error it raised, or each row's outputs; and the rows as the pool
    scores them apart: its chunks (``batch_size`` rows, or fewer to give each process
    one), and first, without a preprocess function, every row (the inputs are read and
    checked in the parent)."""
    from spark_keras.multiprocessing import pool_predict

    opts = case.options
    if data == "numpy":
        given_data, columns = numpy_arrays(case), None
    else:
        given_data = pandas_frame(case) if data == "pandas" else \
            pa.table(dict(zip(column_names(case), case.arrays())))
        columns = column_names(case)
    rows = max(1, min(opts.batch_size, -(-case.n // processes)))
    units = [] if case.preprocess else [part(case, 0, case.n)]
    units += [part(case, a, a + rows, first_row=a) for a in range(0, case.n, rows)]
    try:
        out = pool_predict(build(case.recipe), given_data, columns=columns, processes=processes,
                           batch_size=opts.batch_size, on_invalid=opts.on_invalid,
                           preprocess=PREPROCESS[case.preprocess] if case.preprocess else None)
    except Exception as exc:  # judged against the engine's
        return exc, {}, units
    got, _ = numpy_rows(out, output_names(case.recipe))
    return None, {i: (r, None) for i, r in enumerate(got)}, units


def _pool_sample(families: tuple[str, ...], examples: int, processes: tuple[int, ...],
                 slow: bool) -> None:
    def one(case: Case, data: str, processes: int) -> None:
        if case.preprocess is not None and data == "numpy":  # (a function reads a frame's columns)
            data = "pandas"
        if not slow:  # make test's case: a pool started (a row to score)
            null = dataclasses.replace(case, options=dataclasses.replace(case.options, on_invalid="null"))
            assume(case.n > 0 and not run(null).invalid.all())
        error, got, units = pooled(case, data, processes)
        check(case, error, got, units, f"pool_predict ({data}, {processes} processes)")

    settings = profile("slow" if slow else "ci")
    settings = type(settings)(settings, max_examples=examples)
    settings(given(frontend_cases("pool", families), st.sampled_from(("arrow", "pandas", "numpy")),
                   st.sampled_from(processes))(one))()


def test_pool_predict_agrees_with_the_engine():
    _pool_sample(FAMILIES, POOL_FAST, (1,), slow=False)


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.parametrize("family", FAMILIES)
def test_more_cases_through_pool_predict_agree_with_the_engine(family):
    _pool_sample((family,), POOL_SLOW, (1, 2), slow=True)


# --- regressions found by the samples ------------------------------------------------------

def _frame(name: str, cells: list[Any]) -> Any:
    import pandas as pd

    return pd.DataFrame({name: pd.Series(cells, dtype=object)})


def test_pool_predict_reads_a_column_of_no_value_as_rows_of_the_inputs_kind():
    """A pandas column holding only None, empty arrays or no row has no type to read (an
    Arrow null type): it was taken for arrays of doubles (or of nulls), and the text or
    token model refused the whole column, under ``"null"`` too, where each row must be
    null, and under ``"error"`` without naming a row (found by the Dask sample, on
    partitions; no pool starts here: no row is valid)."""
    from spark_keras.errors import ModelInputError
    from spark_keras.multiprocessing import pool_predict

    text, tokens = build(Recipe("text")), build(Recipe("tokens"))
    for model, frame in ((text, _frame("w", [None, None])), (tokens, _frame("t", [[], None]))):
        out = pool_predict(model, frame, on_invalid="null", processes=1)
        assert out.shape == (2, 1) and np.isnan(out).all()
        with pytest.raises(ModelInputError, match=r"column '.': .*row 0 of this input"):
            pool_predict(model, frame, processes=1)
    assert pool_predict(text, _frame("w", []), on_invalid="null", processes=1).shape == (0, 1)


def test_dask_scores_partitions_whose_text_is_all_missing_or_empty(client, shipped):  # noqa: F811
    """A partition whose text cells are all None gives null rows, not a failed task; a
    filter leaving empty partitions gives no rows, not an error (found by the sample)."""
    import dask
    import dask.dataframe as dd

    from spark_keras.dask import predict_dask

    recipe = Recipe("text")
    handle = shipped(recipe, None)
    with dask.config.set({"dataframe.convert-string": False}):
        frame = dd.from_pandas(_frame("w", ["cat", "dog", None, None]), npartitions=2)
        assert frame.npartitions == 2
        out = predict_dask(handle, frame, columns=["w"], on_invalid="null").compute()
        none = predict_dask(handle, frame[frame.w == "yak"], columns=["w"]).compute()
    engine = run(Case(recipe, [["cat"], ["dog"]], options=Options(frontend="numpy")))
    assert list(out.index) == [0, 1, 2, 3] and out["prediction"][2:].isna().all()
    np.testing.assert_allclose(out["prediction"][:2], [r["prediction"][0] for r in engine.rows],
                               rtol=1e-5, atol=1e-5)
    assert len(none) == 0
