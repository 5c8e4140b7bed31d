"""A case through the engine (no Spark: ``score`` and a front-end's conversion of its
outputs, as ``tests/inference/test_engine.py`` drives it), and :func:`check`: every difference from
the oracle (:mod:`.oracle`), as one ``AssertionError`` listing them.

What is checked: the row count; under ``on_invalid="null"`` exactly which rows are null
(in the engine's mask and in the front-end's output), each reason's stage (and, for the
input checks, the row it names), every scored row against the model on that row alone
within 1e-5 (exactly where each call held one row); under ``"error"`` the error's class,
and the column and row it names; ``max_invalid``'s verdict; a refusal of ``buckets``
only for a model whose padded steps could change a prediction, and always for a masked
model whose maximum over the steps drops the mask (the docs say the driver refuses
such a model: a check of its structure, whatever the rows); and the rows fed to the
model: a batch the model does not raise on is called once, and the search for the rows
it raises on feeds it at most :data:`WORK` times the rows it scores."""

from __future__ import annotations

import functools
import re
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from spark_keras.errors import (
    ArgumentError,
    InvalidRowsError,
    ModelCallError,
    ModelInputError,
    PreprocessError,
    SparkKerasError,
)
from spark_keras.inference.buckets import checked
from spark_keras.inference.columns import from_arrow
from spark_keras.inference.engine import Scored, score
from spark_keras.inference.limits import InvalidBudget
from spark_keras.inference.outputs import to_arrow, to_numpy, to_rows
from spark_keras.inference.predictor import Predictor
from spark_keras.inference.preprocess import Preprocess
from tests.differential.cases import PREPROCESS, Case
from tests.differential.oracle import STAGES, Outcome, expected
from tests.differential.recipes import Recipe, build

WORK = 10  # the most rows the model may be fed per row it scores, when a call raised
TOLERANCE = 1e-5
ID_COL = "id"


class Difference(AssertionError):
    """The engine differs from the oracle; a subclass per kind of difference (named by
    the first one found), so that Hypothesis shrinks and reports each kind on its own."""


# the kinds of difference, as each problem's text starts
DIFFERENCES: dict[str, type[Difference]] = {
    kind: type(f"{kind.title().replace('-', '')}Difference", (Difference,), {"__module__": __name__})
    for kind in ("refusal", "raised", "error", "rows", "reason", "values", "front-end", "budget",
                 "work")}


class Counted:
    """A predictor's compiled call, counting the calls and the rows fed."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.calls = self.rows = 0

    def __call__(self, arrays: Any) -> Any:
        self.calls += 1
        self.rows += len(arrays[0]) if len(arrays) else 0
        return self.call(arrays)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.call, name)


@functools.lru_cache(maxsize=None)
def predictor(recipe: Recipe) -> Predictor:
    """One predictor per model (a compiled call traces once), its call counted."""
    made = Predictor(build(recipe))
    made._call = Counted(made._call)
    return made


@dataclass
class Observed:
    """What the engine did with a case."""

    refused: ArgumentError | None = None  # buckets refused (checked on the driver)
    error: BaseException | None = None  # what scoring raised
    budget_error: InvalidRowsError | None = None
    invalid: np.ndarray | None = None  # (n,) bool
    reasons: Any = None
    rows: list[dict[str, Any] | None] = field(default_factory=list)  # per row, from the front-end
    front_nulls: list[bool] = field(default_factory=list)
    fed: int = 0
    calls: int = 0


def run(case: Case) -> Observed:
    """``case`` through the engine as a front-end drives it."""
    opts = case.options
    pred = predictor(case.recipe)
    fn = PREPROCESS[case.preprocess] if case.preprocess else None
    handle = types.SimpleNamespace(predictor=pred, preprocess=Preprocess.of(fn), resize=None)
    seen = Observed()
    if opts.buckets is not None:
        try:
            checked(handle, opts.buckets)
        except ArgumentError as exc:
            seen.refused = exc
            return seen
    counted: Counted = pred._call  # type: ignore[assignment]
    counted.calls = counted.rows = 0
    columns = from_arrow([name for name, _ in case.columns()], case.arrays())
    ids = None if opts.ids is None else (ID_COL, pa.array(list(opts.ids)))
    try:
        scored = score(handle, columns, batch_size=opts.batch_size, on_invalid=opts.on_invalid,
                       where=opts.where, first_row=opts.first_row, reasons=opts.reasons,
                       ids=ids, buckets=opts.buckets)
    except Exception as exc:  # judged against the oracle
        seen.error = exc
        seen.fed, seen.calls = counted.rows, counted.calls
        return seen
    seen.fed, seen.calls = counted.rows, counted.calls
    seen.invalid = np.zeros(scored.rows, bool) if scored.invalid is None else scored.invalid
    seen.reasons = scored.reasons
    try:
        seen.rows, seen.front_nulls = front_end(scored, opts.frontend)
    except Exception as exc:  # converting the outputs raised: judged too
        seen.error = exc
    budget = InvalidBudget(opts.max_invalid)
    try:
        budget.add(scored)
        budget.finish()
    except InvalidRowsError as exc:
        seen.budget_error = exc
    return seen


def front_end(scored: Scored, frontend: str) -> tuple[list[dict[str, Any] | None], list[bool]]:
    """Each row's outputs (output name -> value) as the front-end gives them, and whether
    the front-end's row is null."""
    names = list(scored.signature.output_names or ("prediction",))
    if frontend == "arrow":
        column = to_arrow(scored)
        nulls = column.is_null().to_pylist()
        cells = column.to_pylist()
        rows = [None if c is None else (c if scored.signature.output_names else {names[0]: c})
                for c in cells]
        return rows, nulls
    if frontend == "rows":
        cells = list(to_rows(scored))
        rows = [None if c is None else (c if scored.signature.output_names else {names[0]: c})
                for c in cells]
        return rows, [c is None for c in cells]
    return numpy_rows(to_numpy(scored), names)


def numpy_rows(out: Any, names: list[str]) -> tuple[list[dict[str, Any] | None], list[bool]]:
    """A numpy front-end's outputs (one array, or a dict of them: ``to_numpy``, what
    ``pool_predict`` returns) as each row's outputs (output name -> value, None for a null
    row) and whether each row is null (every output None or all NaN)."""
    arrays = out if isinstance(out, dict) else {names[0]: out}
    n = len(next(iter(arrays.values())))
    nulls = [all(_null(arrays[k][i]) for k in names) for i in range(n)]
    rows = [None if nulls[i] else {k: arrays[k][i] for k in names} for i in range(n)]
    return rows, nulls


def _null(value: Any) -> bool:
    """A null row of a numpy front-end's output: None (objects) or all NaN (numbers)."""
    if value is None:
        return True
    array = np.asarray(value)
    return array.dtype.kind == "f" and array.size > 0 and bool(np.isnan(array).all())


# --- the checks -------------------------------------------------------------------------------

def row_name(case: Case, i: int) -> str:
    """How the engine must name row ``i`` (``RowNames.at``, as its docstring says)."""
    opts = case.options
    if opts.ids is not None:
        value = opts.ids[i]
        if value is None:
            return f"row {opts.first_row + i} of this {opts.where} ({ID_COL} is null)"
        return f"row {ID_COL}={value!r}"
    return f"row {opts.first_row + i} of this {opts.where}"


def names(text: str, name: str) -> bool:
    """Whether ``text`` names the row named ``name`` (not a row whose name extends it)."""
    return re.search(re.escape(name) + r"(?![0-9])", text) is not None


def check(case: Case, targeted: bool = False) -> None:
    """Raise an ``AssertionError`` listing every difference between the engine and the
    oracle on ``case``. ``targeted`` (in a Hypothesis test): steer the search towards
    cases that feed the model many rows per row scored (where unbounded work shows)."""
    want = expected(case)
    seen = run(case)
    if targeted:
        from hypothesis import target

        target(seen.fed / max(1, sum(o.stage in (None, "model", "output") for o in want)),
               label="rows fed per row scored")
    problems = differences(case, want, seen)
    if problems:
        kind = DIFFERENCES[problems[0].split(":", 1)[0]]
        raise kind(f"{len(problems)} difference(s) from the oracle:\n  - "
                   + "\n  - ".join(problems) + f"\n{describe(case, want, seen)}")


def differences(case: Case, want: list[Outcome], seen: Observed) -> list[str]:
    """What the engine did that the oracle says it must not have."""
    opts, recipe = case.options, case.recipe
    if seen.refused is not None:
        if recipe.pads_exactly and not (recipe.probe_may_raise and "probe" in str(seen.refused)):
            return [f"refusal: buckets={opts.buckets!r} refused for a model whose every sequence input "
                    f"is masked up to every output: {seen.refused}"]
        return []
    if opts.buckets is not None and recipe.drops_mask:
        # whatever the rows: a padded step may move the maximum, by chance or not
        return [f"refusal: buckets={opts.buckets!r} accepted for a model whose maximum over the "
                f"steps (GlobalMaxPooling1D) drops the mask of its masked input"]
    if opts.on_invalid == "error":
        problems = _error_policy(case, want, seen)
    else:
        problems = _null_policy(case, want, seen)
    return problems + _work(case, want, seen)


def _error_policy(case: Case, want: list[Outcome], seen: Observed) -> list[str]:
    failing = [i for i, o in enumerate(want) if o.stage]
    error = seen.error
    if not failing:
        if error is None:
            return _scored_rows(case, want, seen, set())
        if not case.n and isinstance(error, PreprocessError):
            return []  # a function raising on an empty batch: said clearly
        if case.composition:
            wrong = [i for i in range(case.n) if names(str(error), row_name(case, i))]
            return [f"error: under 'error' the engine blamed {row_name(case, wrong[0])}, which passes "
                    f"alone: {_text(error)}"] if wrong else []
        return [f"raised: under 'error' the engine raised though every row passes alone: {_text(error)}"]
    stage = min((str(want[i].stage) for i in failing), key=STAGES.index)
    at = [i for i in failing if want[i].stage == stage]
    if case.composition and isinstance(error, PreprocessError) \
            and not any(names(str(error), row_name(case, i)) for i in range(case.n)):
        return []  # the function raised on the batch, on no row alone: said of the batch's rows
    if error is None:
        return [f"error: under 'error' the engine raised nothing; {row_name(case, at[0])} fails at "
                f"stage {stage!r}"]
    text = str(error)
    if stage == "input":
        order = [name for name, _ in case.recipe.inputs]
        column = next(c for c in order if any(c in want[i].columns for i in at))
        row = min(i for i in at if column in want[i].columns)
        problems = []
        if type(error) is not ModelInputError:
            problems.append(f"error: under 'error' an invalid input raised {_text(error)}, not a "
                            f"ModelInputError")
        if f"column {column!r}" not in text:
            problems.append(f"error: the input error does not name column {column!r}: {_text(error)}")
        if not names(text, row_name(case, row)) and "each row holds" not in text:
            problems.append(f"error: the input error does not name {row_name(case, row)}: {_text(error)}")
        return problems
    kind = {"preprocess": PreprocessError, "model": ModelCallError, "output": SparkKerasError}[stage]
    if not isinstance(error, kind):
        return [f"error: under 'error' stage {stage!r} raised {_text(error)}, not a {kind.__name__}"]
    blamed = [i for i in range(case.n) if names(text, row_name(case, i))]
    first_only = stage == "preprocess" or not (case.recipe.variable or case.composition)
    if stage == "output" and not blamed:
        return []
    if not blamed:
        # a call failing by composition as well: the engine's search for the first row
        # may stop at it (the call's own error, as its docstring says)
        return [] if case.composition else [f"error: the {stage} error names no row: {_text(error)}"]
    if blamed[0] not in at or (first_only and blamed[0] != at[0]):
        return [f"error: the {stage} error names {row_name(case, blamed[0])}; the first row failing "
                f"there alone is {row_name(case, at[0])}: {_text(error)}"]
    return []


def _null_policy(case: Case, want: list[Outcome], seen: Observed) -> list[str]:
    if seen.error is not None:
        return [f"raised: under 'null' the engine raised {_text(seen.error)}"]
    assert seen.invalid is not None
    problems = []
    if len(seen.invalid) != case.n:
        return [f"rows: {len(seen.invalid)} rows scored of {case.n}"]
    failing = {i for i, o in enumerate(want) if o.stage}
    invalid = set(np.flatnonzero(seen.invalid).tolist())
    reasons = seen.reasons
    stopped = {i for i in invalid - failing
               if case.composition and (reasons is None or "SearchStopped" in str(reasons[i]))}
    for i in sorted(failing - invalid):
        problems.append(f"rows: {row_name(case, i)} is scored; alone it fails at stage "
                        f"{want[i].stage!r} {want[i].why}".rstrip())
    for i in sorted(invalid - failing - stopped):
        why = f" ({reasons[i]})" if reasons is not None else ""
        problems.append(f"rows: {row_name(case, i)} is null{why}; alone it is scored")
    if case.options.reasons:
        problems += _reasons(case, want, invalid & failing, reasons)
    problems += _scored_rows(case, want, seen, invalid)
    problems += _budget(case, seen, len(invalid))
    return problems


def _reasons(case: Case, want: list[Outcome], rows: set[int], reasons: Any) -> list[str]:
    problems = []
    for i in sorted(rows):
        reason = None if reasons is None else reasons[i]
        o = want[i]
        if not isinstance(reason, str):
            problems.append(f"reason: {row_name(case, i)}: no reason (stage {o.stage!r})")
            continue
        if o.stage == "input":
            first = o.columns[0]
            ok = reason.startswith(f"column {first!r}: ") and (
                names(reason, row_name(case, i)) or "each row holds" in reason)
        elif o.stage == "output":
            ok = reason.startswith(("model: ", "output")) and "UTF-8" in reason
        else:
            ok = reason.startswith(f"{o.stage}: ") and "SearchStopped" not in reason
        if not ok:
            problems.append(f"reason: {row_name(case, i)}: reason {reason!r} for stage {o.stage!r} "
                            f"{o.columns or ''}".rstrip())
    return problems


def _scored_rows(case: Case, want: list[Outcome], seen: Observed, invalid: set[int]) -> list[str]:
    problems = []
    if len(seen.rows) != case.n:
        return [f"front-end: the {case.options.frontend} front-end gave {len(seen.rows)} rows of {case.n}"]
    for i, null in enumerate(seen.front_nulls):
        if null != (i in invalid):
            problems.append(f"front-end: {row_name(case, i)}: the {case.options.frontend} front-end's row is "
                            f"{'null' if null else 'not null'}, the engine's mask says otherwise")
    exact = case.options.batch_size == 1 and case.options.buckets is None \
        and case.preprocess != "padded"
    for i, o in enumerate(want):
        got = seen.rows[i]
        if o.stage or i in invalid or got is None:
            continue
        assert o.values is not None
        for name, value in o.values.items():
            if not _same(got.get(name), value, exact):
                problems.append(f"values: {row_name(case, i)}: output {name!r} is {_shown(got.get(name))}, "
                                f"alone {_shown(value)}{' (exact)' if exact else ''}")
    return problems


def _same(got: Any, want: Any, exact: bool) -> bool:
    if isinstance(want, str):
        return got == want
    want = np.asarray(want)
    try:
        array = np.asarray(got, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    if array.size == want.size == 1:
        array = array.reshape(want.shape)
    if array.shape != want.shape:
        return False
    if exact:
        return bool(np.array_equal(array.astype(want.dtype), want, equal_nan=True))
    return bool(np.allclose(array, want, atol=TOLERANCE, rtol=TOLERANCE, equal_nan=True))


def compare(case: Case, got: dict[int, tuple[Any, str | None]], frontend: str,
            engine: Any = None) -> list[str]:
    """Every row's difference from the engine's answer on the case (``engine``: :func:`run`'s,
    if already made), as another front-end gave it: ``got`` maps each row's number to its
    outputs (output name -> value; None for a null row) and its reason where the front-end
    gives one (an error column), else None. The same rows, each null exactly where the
    engine's is, a reason of the engine's stage, every other row's outputs within
    :data:`TOLERANCE` (the front-end's batches are not the engine's)."""
    seen = engine or run(case)
    assert seen.error is None and seen.invalid is not None, seen.error
    problems = []
    if sorted(got) != list(range(case.n)):
        return [f"{frontend}: rows {sorted(got)} of {case.n}"]
    for i in range(case.n):
        outputs, error = got[i]
        if bool(seen.invalid[i]) != (outputs is None):
            problems.append(f"{frontend}: row {i} is {'null' if outputs is None else 'scored'}; "
                            f"the engine's is {'null' if seen.invalid[i] else 'scored'} ({error})")
            continue
        if outputs is None:
            want = str(seen.reasons[i]).split(":", 1)[0]
            if error is not None and error.split(":", 1)[0] != want:
                problems.append(f"{frontend}: row {i}'s reason {error!r}; the engine's stage {want!r}")
            continue
        for name, value in (seen.rows[i] or {}).items():
            if not _same(outputs.get(name), value, False):
                problems.append(f"{frontend}: row {i}'s {name!r} is {outputs.get(name)!r}, the "
                                f"engine's {value!r}")
    return problems


def _budget(case: Case, seen: Observed, invalid: int) -> list[str]:
    limit = case.options.max_invalid
    if limit is None:
        return []
    over = invalid > limit if limit >= 1 else bool(case.n) and invalid > limit * case.n
    if over != (seen.budget_error is not None):
        return [f"budget: max_invalid={limit!r} with {invalid} invalid of {case.n}: "
                f"{'raised' if seen.budget_error else 'did not raise'}"]
    return []


def _work(case: Case, want: list[Outcome], seen: Observed) -> list[str]:
    """The rows fed to the model against the rows it had to score."""
    if case.options.on_invalid == "error" or seen.error is not None:
        return []
    reached = sum(o.stage in (None, "model", "output") for o in want)
    raised = any(o.stage == "model" for o in want) or case.composition
    if not raised and seen.fed != reached:
        return [f"work: the model was fed {seen.fed} rows in {seen.calls} calls for {reached} rows it "
                f"does not raise on (a clean batch is called once)"]
    if seen.fed > WORK * max(reached, 1):
        return [f"work: the model was fed {seen.fed} rows in {seen.calls} calls to score {reached} rows "
                f"(more than {WORK} times)"]
    return []


def _text(error: BaseException) -> str:
    first = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {first[:300]}"


def _shown(value: Any) -> str:
    text = np.array2string(np.asarray(value), precision=7, threshold=20) \
        if not isinstance(value, (str, type(None))) else repr(value)
    return text.replace("\n", " ")


def describe(case: Case, want: list[Outcome], seen: Observed) -> str:
    """The case and both sides, for the failure message."""
    lines = [f"case: {case!r}",
             f"oracle: {[o.stage or 'ok' for o in want]}",
             f"engine invalid: {None if seen.invalid is None else np.flatnonzero(seen.invalid).tolist()}"
             f", fed {seen.fed} rows in {seen.calls} calls"]
    if seen.error is not None:
        lines.append(f"engine raised: {_text(seen.error)}")
    return "\n".join(lines)
