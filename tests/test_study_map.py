"""The study kind is decided in one place (batchtune/recipe/study.py); nothing else compares strings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import batchtune
from batchtune.recipe.load import load_recipe
from batchtune.recipe.study import StudyKind, kind_of

PACKAGE = Path(batchtune.__file__).parent
# a comparison of a backend name or probe mode with the study strings, in any spelling
STRING_TEST = re.compile(r'(==|!=|\bin\b)\s*\(?\s*"(pretrain|branched)"')


def test_no_study_string_comparisons_outside_the_map() -> None:
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "study.py":
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if STRING_TEST.search(code):
                hits.append(f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}")
    assert hits == []


def test_the_regex_catches_what_it_must() -> None:
    lines = ('if cfg.backend.training == "pretrain":', 'x = mode != "branched"', 'if t in ("pretrain", "x")')
    for line in lines:
        assert STRING_TEST.search(line)


@pytest.mark.parametrize(
    ("training", "mode", "kind"),
    [
        ("torch", "grid", StudyKind.RL_GRID),
        ("nqm", "branched", StudyKind.RL_BRANCHED),
        ("pretrain", "grid", StudyKind.PRETRAIN_GRID),
        ("pretrain", "branched", StudyKind.PRETRAIN_BRANCHED),
    ],
)
def test_kind_of(training: str, mode: str, kind: StudyKind) -> None:
    got = kind_of(training, mode)
    assert got is kind
    assert got.pretrain == (training == "pretrain")
    assert got.branched == (mode == "branched")
    assert got.sample_unit == ("tokens" if got.pretrain else "samples")


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("tiny-grpo", StudyKind.RL_GRID),
        ("nqm", StudyKind.RL_GRID),
        ("tiny-pretrain", StudyKind.PRETRAIN_GRID),
        ("tiny-pretrain-branched", StudyKind.PRETRAIN_BRANCHED),
    ],
)
def test_shipped_recipes_name_their_kind(name: str, kind: StudyKind) -> None:
    assert load_recipe(name).study is kind


def test_every_kind_has_a_row_in_the_map() -> None:
    from batchtune.workflow.study import STUDIES

    assert set(STUDIES) == set(StudyKind)
    assert all(row.kind is kind for kind, row in STUDIES.items())
    assert not STUDIES[StudyKind.PRETRAIN_GRID].ranked  # its grid gives B_opt/B_min, not a pick
