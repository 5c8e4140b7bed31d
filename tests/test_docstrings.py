"""The public API's docstrings keep one style (Google's, as Keras's: ``Args:``,
``Returns:``, ``Raises:``): each public function and method says what its parameters
are when it takes any, and what it returns when it returns something."""

from __future__ import annotations

import inspect
import re

import pytest

import spark_keras as sk
import spark_keras.dask as sk_dask
import spark_keras.handle as sk_handle
import spark_keras.ml as sk_ml
import spark_keras.multiprocessing as sk_mp


def _public_api() -> dict[str, object]:
    """Every public function and class of the API, by qualified name."""
    api: dict[str, object] = {}
    for name in ("dumps", "loads", "save", "load", "is_payload", "make_picklable",
                 "cache_info", "configure_cache", "BroadcastModel"):
        api[f"spark_keras.{name}"] = getattr(sk, name)
    for name in sk_dask.__all__:
        obj = getattr(sk_dask, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            api[f"spark_keras.dask.{name}"] = obj
    api["spark_keras.multiprocessing.pool_predict"] = sk_mp.pool_predict
    api["spark_keras.ml.KerasTransformer"] = sk_ml.KerasTransformer
    api["spark_keras.handle.ModelHandle"] = sk_handle.ModelHandle
    return api


# KerasTransformer's Param setters and getters (setInputCol, getBatchSize...) keep their
# one-line docstrings, as PySpark's own do
_PARAM_ACCESSOR = re.compile(r"^(set|get)[A-Z]")


def _members(cls: type) -> dict[str, object]:
    """The public methods and properties ``cls`` defines or inherits from this package
    (not those of PySpark's or Python's own classes)."""
    found: dict[str, object] = {}
    for klass in reversed(cls.__mro__):
        if not klass.__module__.startswith("spark_keras"):
            continue
        for name, member in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if inspect.isfunction(member) or isinstance(member, property):
                found[name] = member
    return found


def _cases() -> list[tuple[str, object, bool]]:
    """(qualified name, function or class, whether Args/Returns are required)."""
    cases = []
    for qualname, obj in _public_api().items():
        cases.append((qualname, obj, True))
        if inspect.isclass(obj):
            for name, member in _members(obj).items():
                accessor = obj is sk_ml.KerasTransformer and bool(_PARAM_ACCESSOR.match(name))
                cases.append((f"{qualname}.{name}", member, not accessor))
    return cases


def _sections(doc: str) -> set[str]:
    return set(re.findall(r"^\s*(Args|Returns|Yields|Raises|Example|Examples):\s*$", doc, re.M))


def _params(fn: object) -> list[str]:
    """The parameters a caller passes (no self or cls)."""
    params = list(inspect.signature(fn).parameters.values())  # type: ignore[arg-type]
    return [p.name for p in params if p.name not in ("self", "cls")]


@pytest.mark.parametrize("qualname, obj, full", _cases(), ids=[c[0] for c in _cases()])
def test_public_docstrings_follow_the_google_style(qualname, obj, full):
    if isinstance(obj, property):
        assert obj.fget is not None and inspect.getdoc(obj.fget), f"{qualname} has no docstring"
        return
    doc = inspect.getdoc(obj)
    assert doc, f"{qualname} has no docstring"
    if not full:
        return
    sections = _sections(doc)
    if inspect.isclass(obj):  # the constructor's parameters are documented on the class
        init = obj.__init__
        if init is object.__init__:
            return
        own = inspect.getdoc(init) if init.__doc__ else ""
        if _params(init) and not {"Args"} & (sections | _sections(own or "")):
            pytest.fail(f"{qualname} takes {_params(init)} but its docstring has no Args: section")
        return
    params = _params(obj)
    if params:
        assert "Args" in sections, f"{qualname} takes {params} but has no Args: section"
        missing = [p for p in params if not re.search(rf"^\s*\**{p}\b.*:", doc, re.M)]
        assert not missing, f"{qualname}'s Args: section does not describe {missing}"
    returns = inspect.signature(obj).return_annotation  # a string (postponed annotations)
    assert returns is not inspect.Signature.empty, f"{qualname} has no return annotation"
    if returns not in ("None", None, "NoReturn"):
        assert {"Returns", "Yields"} & sections, \
            f"{qualname} returns {returns} but has no Returns: section"


def test_the_walk_finds_the_api():
    names = {c[0] for c in _cases()}
    for expected in ("spark_keras.dumps", "spark_keras.BroadcastModel.transform",
                     "spark_keras.BroadcastModel.predict_udf", "spark_keras.dask.ship",
                     "spark_keras.dask.predict_dask", "spark_keras.multiprocessing.pool_predict",
                     "spark_keras.ml.KerasTransformer", "spark_keras.handle.ModelHandle.build_model"):
        assert expected in names
