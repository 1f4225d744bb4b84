"""The trainers judge every off-policy / async config batchtune emits (marker ``trainers``;
.ci/trainers.sh). Cases: tests/integrations/async_cases.py.

- verl 0.9.1: Hydra composes each text with the config its entry point starts from (V1:
  ``trainer/config/ppo_trainer``; fully_async: ``experimental/fully_async_policy/config/
  fully_async_ppo_trainer``; one-step-off: ``experimental/one_step_off_policy/config/
  one_step_off_ppo_trainer``, from the source root as its ``file://verl/trainer/config`` searchpath
  needs). Then verl's own start-up assertions run on the composed config: the top-level ``assert``
  and assignment statements of the constructors that check it (``PPOTrainer.__init__`` and ``.step``,
  ``PPOTrainerSeparateAsync.__init__``, ``FullyAsyncRollouter.__init__`` and ``._validate_config``,
  ``OneStepOffRayTrainer.__init__``), extracted from the installed files with ``ast``: their classes
  import Ray and the GPU stack, their assertions only read the config.
- OpenRLHF 0.11.2: train_ppo_ray's own parser and post-parse assertions (test_packages_openrlhf.run_cli).
- TRL 1.16: ``GRPOConfig`` / ``trl.experimental.async_grpo.AsyncGRPOConfig`` build from the values,
  the printed call and the YAML file.
Each judge also refuses a wrong key or a broken constraint.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.integrations.async_cases import async_emitted
from tests.integrations.packages_cases import Emitted, command_words

pytestmark = pytest.mark.trainers


def _verl_root() -> Path:
    spec = importlib.util.find_spec("verl")
    if spec is None or spec.origin is None or importlib.util.find_spec("hydra") is None:
        pytest.skip("verl and hydra-core are not installed (.ci/trainers.sh installs them)")
    return Path(spec.origin).parent


def _entry(e: Emitted) -> str:
    return command_words(e.text)[2] if e.text.startswith("python3") else _file_module(e.text)


def _file_module(text: str) -> str:
    line = next(ln for ln in text.splitlines() if ln.startswith("# use: python3 -m "))
    return line.split()[4]


def _overrides(e: Emitted) -> list[str]:
    words = command_words(e.text)
    return words[3:] if words[:2] == ["python3", "-m"] else words


def compose_for(e: Emitted):
    """verl's config for ``e`` as its entry point composes it."""
    from hydra import compose, initialize_config_dir

    root, module = _verl_root(), _entry(e)
    where = {
        "verl.trainer.main_ppo": (root / "trainer" / "config", "ppo_trainer"),
        "verl.experimental.fully_async_policy.fully_async_main": (
            root / "experimental" / "fully_async_policy" / "config",
            "fully_async_ppo_trainer",
        ),
        "verl.experimental.one_step_off_policy.main_ppo": (
            root / "experimental" / "one_step_off_policy" / "config",
            "one_step_off_ppo_trainer",
        ),
    }
    config_dir, name = where[module]
    overrides = _overrides(e)
    if module.endswith("fully_async_main"):
        # its searchpath is pkg://verl.trainer.config, which imports verl (tensordict, ray: not
        # installed for the config checks); the same folder named as a file path composes the same
        overrides = [f"hydra.searchpath=[file://{root / 'trainer' / 'config'}]", *overrides]
    old = Path.cwd()
    os.chdir(root.parent)  # one-step-off's searchpath is file://verl/trainer/config: verl's source root
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            return compose(name, overrides=overrides)
    finally:
        os.chdir(old)


ROLLOUTER = "experimental/fully_async_policy/fully_async_rollouter.py"
# (file under verl/, class, method) whose top-level asserts judge the config at start-up
VERL_CHECKS = {
    "verl.trainer.main_ppo": [("trainer/ppo/v1/trainer_base.py", "PPOTrainer", "__init__"),
                              ("trainer/ppo/v1/trainer_base.py", "PPOTrainer", "step")],
    "separate_async": [("trainer/ppo/v1/trainer_separate_async.py", "PPOTrainerSeparateAsync", "__init__")],
    "verl.experimental.fully_async_policy.fully_async_main": [
        (ROLLOUTER, "FullyAsyncRollouter", "__init__"),
        (ROLLOUTER, "FullyAsyncRollouter", "_validate_config"),
    ],
    "verl.experimental.one_step_off_policy.main_ppo": [
        ("experimental/one_step_off_policy/ray_trainer.py", "OneStepOffRayTrainer", "__init__"),
    ],
}  # fmt: skip


def _method(path: Path, cls: str, method: str) -> ast.FunctionDef:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == method:
                    return item  # type: ignore[return-value]
    raise AssertionError(f"{path}: no {cls}.{method}")


def verl_asserts(cfg, module: str) -> list[str]:
    """Run verl's start-up assertions on ``cfg``; the sources of those that ran (AssertionError
    propagates: verl refuses the config). An assignment that needs what only a running verl has
    (workers, datasets) is skipped, and so is an assertion that reads it."""
    checks = list(VERL_CHECKS[module])
    if module == "verl.trainer.main_ppo" and cfg.trainer.v1.trainer_mode == "separate_async":
        checks += VERL_CHECKS["separate_async"]
    self, ran = SimpleNamespace(), []
    one_step_off = module == "verl.experimental.one_step_off_policy.main_ppo"
    for rel, cls, name in checks:
        fn = _method(_verl_root() / rel, cls, name)
        scope = {a.arg: None for a in fn.args.args} | {"self": self, "config": cfg}
        for stmt in fn.body:
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                try:
                    exec(compile(ast.Module([stmt], []), rel, "exec"), scope)
                except Exception:
                    continue
            elif isinstance(stmt, ast.Assert):
                try:
                    ok = eval(compile(ast.Expression(stmt.test), rel, "eval"), scope)
                except (NameError, AttributeError, TypeError):
                    continue
                assert ok, f"verl refuses it: {ast.unparse(stmt)}"
                ran.append(ast.unparse(stmt.test))
        if one_step_off:  # the rollout manager's own: assert ...rollout.mode == "async"
            assert cfg.actor_rollout_ref.rollout.mode == "async"
    return ran


@pytest.fixture(scope="module")
def verl_cases() -> list[Emitted]:
    _verl_root()
    return async_emitted("verl")


def test_verl_composes_and_passes_its_own_checks(verl_cases):
    from omegaconf import OmegaConf

    entries = {_entry(e) for e in verl_cases}
    assert len(entries) == 3 and len(verl_cases) >= 20
    for e in verl_cases:
        cfg = compose_for(e)  # a key the entry point's config lacks raises
        for word in _overrides(e):
            key, value = word.split("=", 1)
            got = OmegaConf.select(cfg, key)
            assert str(got) == value or float(got) == float(value), (e.label, key, got, value)
        ran = verl_asserts(cfg, _entry(e))
        assert ran, e.label
        if (
            "trainer.v1.trainer_mode" in (e.values or {})
            and e.values["trainer.v1.trainer_mode"] == "separate_async"
        ):
            assert any("parameter_sync_step" in r for r in ran), (e.label, ran)
        if "fully_async" in _entry(e):
            assert any("train_batch_size == 0" in r for r in ran), (e.label, ran)


def test_check_reads_async_keys_as_verl_resolves_them(verl_cases, tmp_path):
    """check's k, u, mode and batch from the emitted lines equal those from verl's composed config,
    written with its interpolations and resolved (its defaults included)."""
    from omegaconf import OmegaConf

    from batchtune.integrations.trainer_configs import read_trainer_config

    for i, e in enumerate(verl_cases):
        cfg = compose_for(e)
        lines = tmp_path / f"{i}.sh"
        lines.write_text(e.text)
        want = read_trainer_config(lines, "verl")
        for resolve in (False, True):
            path = tmp_path / f"{i}-{resolve}.yaml"
            path.write_text(OmegaConf.to_yaml(cfg, resolve=resolve))
            got = read_trainer_config(path, "verl")
            reading = (got.prompts, got.staleness, got.updates_per_batch, got.mode, got.engines)
            assert reading == (
                want.prompts,
                want.staleness,
                want.updates_per_batch,
                want.mode,
                want.engines,
            ), (
                e.label,
                resolve,
            )


def test_verl_refuses_a_wrong_async_key_or_constraint(verl_cases):
    from hydra.errors import HydraException

    split = next(e for e in verl_cases if e.label == "split-k2-sync2-cap1-partial-nodes-v1")
    typo = Emitted("typo", split.text.replace("num_warmup_batches", "num_warmup_batch"), None, {})
    with pytest.raises(HydraException):
        compose_for(typo)
    fa = next(e for e in verl_cases if e.label == "split-k1-fully_async")
    with pytest.raises(HydraException):
        compose_for(Emitted("t", fa.text.replace("staleness_threshold", "staleness_treshold"), None, {}))
    # a parameter_sync_step that does not split train_batch_size into ppo_mini_batch_size: verl asserts
    broken = split.text.replace("parameter_sync_step=2", "parameter_sync_step=3")
    with pytest.raises(AssertionError, match="parameter_sync_step"):
        verl_asserts(compose_for(Emitted("b", broken, None, {})), "verl.trainer.main_ppo")
    with pytest.raises(AssertionError, match="train_batch_size == 0"):
        wrong = fa.text.replace("data.train_batch_size=0", "data.train_batch_size=64")
        verl_asserts(compose_for(Emitted("b", wrong, None, {})), _entry(fa))


def test_openrlhf_parses_every_async_flag():
    from tests.integrations.test_packages_openrlhf import CLI, USER_FLAGS, _get, flags_of, run_cli

    cases = async_emitted("openrlhf")
    assert len(cases) >= 10
    for e in cases:
        args = run_cli(CLI, flags_of(e) + USER_FLAGS)  # unknown flag, bad value or failed assert: exit
        for flag, value in (e.values or {}).items():
            got = _get(args, flag)
            assert got == pytest.approx(value) if isinstance(value, float) else got == value, (e.label, flag)
    with pytest.raises(SystemExit):  # a wrong flag
        run_cli(CLI, ["--train.async_enabled", *USER_FLAGS])
    with pytest.raises(AssertionError, match="requires --train.async_enable"):  # partial needs async
        run_cli(CLI, ["--train.partial_rollout_enable", *USER_FLAGS])


@pytest.mark.slow  # builds ~12 TrainingArguments (about 20 s)
def test_trl_builds_every_async_config(tmp_path):
    trl = pytest.importorskip("trl")
    yaml = pytest.importorskip("yaml")
    from trl.experimental.async_grpo import AsyncGRPOConfig

    from tests.integrations.test_packages_trl import FIXED, _call_kwargs

    cases = async_emitted("trl")
    assert sum("AsyncGRPOConfig(" in e.text for e in cases) >= 4
    out = str(tmp_path / "o")
    for e in cases:
        cls = AsyncGRPOConfig if "AsyncGRPOConfig(" in e.text else trl.GRPOConfig
        if e.text.startswith("# batchtune: TRL"):
            values = yaml.safe_load(e.text)
        else:
            (values,) = _call_kwargs(e.text, cls.__name__)
        assert values == e.values, e.label
        cfg = cls(output_dir=out, **FIXED, **values)  # an unknown key is a TypeError
        for k, v in values.items():
            assert getattr(cfg, k) == v, (e.label, k)
    with pytest.raises(TypeError):
        AsyncGRPOConfig(output_dir=out, **FIXED, max_stalenes=2)
