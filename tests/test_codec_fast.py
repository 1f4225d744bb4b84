"""The codec's fast paths for plain field values answer exactly as its general decoder and encoder:
the same records, the same values and types, the same errors, on typed and on arbitrary input."""

from __future__ import annotations

import dataclasses
import json
import math
import typing

from hypothesis import example, given, settings
from hypothesis import strategies as st

from batchtune import codec
from batchtune.errors import InputError
from batchtune.records.types import ModelInfo, RunRecord, StepRecord, ThroughputPoint

RECORDS = [StepRecord, RunRecord, ThroughputPoint, ModelInfo]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**60), 2**60),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["nan", "inf", "-inf", "Infinity", "x", ""]),
)
VALUES = st.one_of(SCALARS, st.dictionaries(st.sampled_from(["loss", "reward", "1"]), SCALARS, max_size=3))


def _reference(cls: type, data: dict, where: str) -> object:
    """from_dict as it was before the fast paths: every field through codec._decode."""
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    no_default = dataclasses.MISSING
    needed = [f for f in fields if f.default is no_default and f.default_factory is no_default]
    missing = [f.name for f in needed if f.name not in data]
    if missing:
        raise InputError(f"{where}: record lacks {', '.join(missing)}")
    given = [f.name for f in fields if f.name in data]
    kwargs = {name: codec._decode(data[name], hints[name], f"{where}: {name}") for name in given}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{where}: {exc}") from None


def _outcome(fn, *args) -> tuple[str, object]:
    try:
        return "ok", fn(*args)
    except InputError as exc:
        return "error", str(exc)


def _typed(obj: object) -> object:
    """Values with their types, NaN comparable, to tell 1 from 1.0 and NaN from None."""
    if dataclasses.is_dataclass(obj):
        return {f.name: _typed(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: _typed(v) for k, v in obj.items()}
    if isinstance(obj, float) and math.isnan(obj):
        return ("float", "nan")
    return (type(obj).__name__, obj)


@st.composite
def _rows(draw) -> tuple[type, dict]:
    cls = draw(st.sampled_from(RECORDS))
    valid = json.loads(codec.dumps(draw(st.builds(cls))))  # a stored record of that type...
    names = [f.name for f in dataclasses.fields(cls)]
    for name in draw(st.lists(st.sampled_from(names), max_size=3)):  # ...with a few fields changed
        if draw(st.booleans()):
            valid[name] = draw(VALUES)
        else:
            valid.pop(name, None)
    return cls, valid


_STEP = json.loads(codec.dumps(StepRecord("r", 1, 8, 8, 0.1, 1, 8, 0, {"loss": 1.5})))


@settings(max_examples=80, deadline=None, derandomize=True)
@given(_rows())
@example((StepRecord, {**_STEP, "lr": 1, "gen_s": None, "grad_norm": 2, "metrics": {"loss": 1, "kl": None}}))
@example((StepRecord, {**_STEP, "step": 2.0, "seed": True, "run_id": 3}))
def test_decoding_matches_the_general_decoder(row):
    cls, data = row
    new, old = _outcome(codec.from_dict, cls, data, "w"), _outcome(_reference, cls, data, "w")
    assert new[0] == old[0]
    assert (_typed(new[1]) if new[0] == "ok" else new[1]) == (_typed(old[1]) if old[0] == "ok" else old[1])


def test_a_stored_step_decodes_to_the_same_values_and_types():
    row = {"run_id": "r", "step": 3, "samples": 24, "tokens": 96, "lr": 1, "prompts": 1, "group_size": 8,
           "seed": 0, "metrics": {"loss": 2, "reward": 0.5, "kl": None, "x": "inf"}, "grad_norm": 3,
           "critic_grad_norm": None, "gen_s": 0.1}  # fmt: skip
    step = codec.from_dict(StepRecord, row, "w")
    assert _typed(step) == _typed(_reference(StepRecord, row, "w"))
    assert type(step.lr) is float and type(step.grad_norm) is float and step.critic_grad_norm is None
    assert type(step.metrics["loss"]) is float and math.isnan(step.metrics["kl"])


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.sampled_from(RECORDS).flatmap(st.builds))
def test_encoding_matches_the_general_encoder(record):
    reference = {f.name: codec.to_jsonable(getattr(record, f.name)) for f in dataclasses.fields(record)}
    assert _typed(codec.to_jsonable(record)) == _typed(reference)
