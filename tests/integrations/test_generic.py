"""Generic per-step CSV / JSONL logs: mapping, units, validation, and storing them like probe runs."""

from __future__ import annotations

import json

import pytest

from batchtune.errors import InputError
from batchtune.integrations.common import RunInfo
from batchtune.integrations.logs_generic import read_table
from batchtune.integrations.readers import import_runs, read_log
from batchtune.records.store import ResultsStore

CSV = """run,prompts,group_size,lr,seed,step,reward,grad_norm,note
a,4,8,0.001,0,1,0.10,1.5,warm
a,4,8,0.001,0,2,0.20,1.2,
b,8,8,0.0014,1,1,0.15,1.0,x
b,8,8,0.0014,1,2,0.30,0.9,y
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_csv_two_runs_samples_from_steps(tmp_path):
    runs = read_log(write(tmp_path, "log.csv", CSV), "csv")
    a, b = runs
    assert (a.run_id, a.candidate, a.prompts, a.group_size, a.seed, a.lr) == ("a", "P4xG8", 4, 8, 0, 0.001)
    assert [s.samples for s in a.steps] == [32, 64]  # samples = step * P * G, in responses
    assert [s.metrics for s in a.steps] == [
        {"reward": 0.10},
        {"reward": 0.20},
    ]  # the text column is not a metric
    assert [s.grad_norm for s in a.steps] == [1.5, 1.2]
    assert [s.samples for s in b.steps] == [64, 128]
    assert b.seed == 1 and b.lr == pytest.approx(0.0014)


def test_jsonl_mapping_and_run_info(tmp_path):
    lines = [{"global_step": i, "seen": 16 * i, "val": {"acc": 0.1 * i}, "gnorm": 2.0 / i} for i in (1, 2, 3)]
    path = write(tmp_path, "log.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
    info = RunInfo(prompts=2, group_size=8, lr=3e-4, seed=5, run_id="mine")
    mapping = {"step": "global_step", "samples": "seen", "grad_norm": "gnorm", "eval_reward": "val/acc"}
    (run,) = read_log(path, "jsonl", info, mapping)
    assert run.run_id == "mine" and run.seed == 5 and run.lr == 3e-4
    assert [s.samples for s in run.steps] == [16, 32, 48]
    assert [s.metrics["eval_reward"] for s in run.steps] == pytest.approx([0.1, 0.2, 0.3])
    assert [s.grad_norm for s in run.steps] == pytest.approx([2.0, 1.0, 2 / 3])


@pytest.mark.parametrize(
    ("text", "info", "match"),
    [
        ("", RunInfo(), r"log\.csv is empty"),
        (
            "run,prompts,group_size,lr,reward\na,4,8,1e-3,0.1\n",
            RunInfo(),
            r"log\.csv:1: missing column 'step'",
        ),
        ("step,reward\n1,0.1\n", RunInfo(), r"log\.csv:1: missing column 'prompts'"),
        (
            "step,prompts,group_size,lr,reward\n1,4,8,1e-3,0.1\n2,4,8,abc,0.2\n",
            RunInfo(),
            r":3: column 'lr': 'abc'",
        ),
        (
            "step,prompts,group_size,lr,reward\n1,4,8,1e-3,0.1\n2,4,8,1e-3,zz\n",
            RunInfo(),
            r":3: column 'reward'",
        ),
        ("step,prompts,group_size,lr\n1,4,8,1e-3\n2,8,8,1e-3\n", RunInfo(), r":3: column 'prompts' changes"),
        ("step,prompts,group_size,lr\n1,4,8,1e-3\n1,4,8,1e-3\n", RunInfo(), r"step 1 appears twice"),
        ("step,prompts,group_size,lr\n1.5,4,8,1e-3\n", RunInfo(), r":2: column 'step': '1.5' is not a whole"),
        ("step,reward\n1,0.1\n", RunInfo(prompts=4, group_size=8), r"no learning rate|missing column 'lr'"),
    ],
)
def test_malformed_csv_is_one_clear_error(tmp_path, text, info, match):
    with pytest.raises(InputError, match=match):
        read_log(write(tmp_path, "log.csv", text), "csv", info)


def test_malformed_jsonl_names_the_line(tmp_path):
    path = write(
        tmp_path, "log.jsonl", '{"step": 1, "prompts": 4, "group_size": 8, "lr": 0.1}\n{"step": 2,\n'
    )
    with pytest.raises(InputError, match=r"log\.jsonl:2: not valid JSON"):
        read_log(path, "jsonl")
    path = write(tmp_path, "arr.jsonl", "[1, 2]\n")
    with pytest.raises(InputError, match=r"arr\.jsonl:1: expected a JSON object"):
        read_log(path, "jsonl")


def test_mapped_metric_column_must_exist(tmp_path):
    with pytest.raises(InputError, match="no column 'val/acc' for metric eval_reward"):
        read_log(write(tmp_path, "log.csv", CSV), "csv", None, {"eval_reward": "val/acc"})


def test_partial_ignores_the_line_being_written(tmp_path):
    text = '{"step": 1, "prompts": 2, "group_size": 4, "lr": 0.1, "reward": 0.5}\n{"step": 2, "prom'
    path = write(tmp_path, "live.jsonl", text)
    (run,) = read_table(path, partial=True)
    assert [s.step for s in run.steps] == [1]
    with pytest.raises(InputError):
        read_table(path)


def test_import_stores_runs_like_probe_runs(tmp_path):
    store = ResultsStore(tmp_path / "results")
    result = import_runs(store, read_log(write(tmp_path, "log.csv", CSV), "csv"))
    assert result.added == ("a", "b") and result.skipped == ()
    records = {r.run_id: r for r in store.runs()}
    a = records["a"]
    assert (a.status, a.lr_rule, a.candidate, a.steps, a.samples) == ("completed", "given", "P4xG8", 2, 64)
    assert a.batch_responses == 32 and a.reference_batch == 32 and a.source.endswith("log.csv")
    assert [s.samples for s in store.steps("a")] == [32, 64]
    again = import_runs(store, read_log(tmp_path / "log.csv", "csv"))
    assert again.added == () and again.skipped == ("a", "b")  # never overwritten


def test_bad_batch_writes_nothing(tmp_path):
    store = ResultsStore(tmp_path / "results")
    (run,) = read_log(write(tmp_path, "x.csv", "step,prompts,group_size,lr\n1,4,8,1e-3\n"), "csv")
    with pytest.raises(InputError, match="both named 'x'"):
        import_runs(store, [run, run])
    assert store.runs() == [] and not (tmp_path / "results" / "runs").exists()


def test_step_s_is_the_whole_step_and_other_s_its_remainder(tmp_path):
    text = "step,prompts,group_size,lr,step_s,gen_s\n1,4,8,1e-3,3.0,1.0\n2,4,8,1e-3,2.5,\n"
    (run,) = read_log(write(tmp_path, "t.csv", text), "csv")
    assert [(s.gen_s, s.train_s, s.other_s) for s in run.steps] == [(1.0, 0.0, 2.0), (0.0, 0.0, 2.5)]
    assert all(s.timed for s in run.steps) and all("step_s" not in s.metrics for s in run.steps)
    (alone,) = read_log(write(tmp_path, "u.csv", "step,prompts,group_size,lr,step_s\n1,4,8,1e-3,4\n"), "csv")
    assert alone.steps[0].other_s == 4.0
