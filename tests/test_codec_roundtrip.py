"""The one JSON codec, property-tested: every record type round-trips (NaN as null, inf as "inf"), string
fields stay strings ("nan", "inf"), and arbitrary JSON never crashes the typed decoder (InputError only).

derandomize: CI draws the same examples every run, so a landing never hinges on what a random search
happens to find; cases a search once found are pinned with @example. To explore further locally, drop
derandomize (or run with --hypothesis-seed=N)."""

from __future__ import annotations

import json
import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from batchtune import codec
from batchtune.errors import InputError
from batchtune.records.files import to_json
from batchtune.records.types import ModelInfo, RunRecord, StepRecord, ThroughputPoint

FLOATS = st.floats(allow_nan=True, allow_infinity=True)
TEXT = st.one_of(st.sampled_from(["nan", "inf", "-inf", "Infinity", "null", "1e3", ""]), st.text(max_size=12))
INTS = st.integers(-(2**53), 2**53)
RECORDS = [StepRecord, RunRecord, ThroughputPoint, ModelInfo]


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _record(cls: type) -> st.SearchStrategy:
    return st.builds(
        cls,
        **{
            name: (
                FLOATS if tp in ("float", "float | None") else INTS if tp == "int"
                else st.dictionaries(TEXT, FLOATS, max_size=4) if tp.startswith("dict") else TEXT
            )
            for name, tp in cls.__annotations__.items()
            if tp in ("float", "float | None", "int", "str", "dict[str, float]")
        },
    )  # fmt: skip


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.sampled_from(RECORDS).flatmap(_record))
# found by hypothesis: NaN in an optional float field
@example(StepRecord("nan", 0, 0, 0, 0.0, 0, 0, 0, {}, grad_norm=0.0, critic_grad_norm=math.nan))
def test_every_record_round_trips(record):
    line = to_json(record)
    json.loads(line, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))  # standard JSON only
    back = codec.from_dict(type(record), codec.loads(line), "test")
    for f in record.__dataclass_fields__:
        a, b = getattr(record, f), getattr(back, f)
        if record.__annotations__.get(f) == "float | None" and isinstance(a, float) and math.isnan(a):
            assert b is None, (f, b)  # the codec's convention: null in an optional field is None
        else:
            assert _same(a, b), (f, a, b)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.sampled_from(["nan", "inf", "-inf", "Infinity", "1", "null"]))
def test_string_run_ids_stay_strings(rid):
    rec = RunRecord(rid, rid, 1, 2, 0, 1e-3, "sqrt", 1e-3, 2, "completed")
    back = codec.from_dict(RunRecord, codec.loads(to_json(rec)))
    assert back.run_id == rid and back.candidate == rid


JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), INTS, st.floats(allow_nan=False, allow_infinity=False), TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.sampled_from(RECORDS), JSON)
def test_arbitrary_json_is_decoded_or_refused_never_crashes(cls, data):
    try:
        codec.from_dict(cls, data, "f.json")
    except InputError as exc:
        assert str(exc).startswith("f.json")


@settings(max_examples=40, deadline=None, derandomize=True)
@given(JSON)
def test_to_jsonable_is_idempotent_and_standard(data):
    once = codec.to_jsonable(data)
    assert codec.to_jsonable(once) == once
    json.dumps(once, allow_nan=False)
