"""TRL's dict of environment factories: each row's `environment` column picks its factory (the
column not passed to reset), its prompt renders its own environment's tools, its rollouts act on
instances of that environment, each class with get_reward scores its own rollouts alone;
instances are constructed once and reset for each batch (TRL's pool), more made only where a
batch needs more at once. A TRL script with a dict runs under nostall and under TRL."""

import re

import pytest

from nostall.agents.factory import EnvironmentFactory
from nostall.lm.prompts import ToolPrompt, render
from tests.agents import tool_model
from tests.agents.scripts import LIBS, run_script
from tests.agents.test_tools import COUNTER_ROWS, Counter, CounterEngine


class Doubler:
    """A second environment: its value doubled by its tool; paid once it is twice the start."""

    made = 0

    def __init__(self):
        Doubler.made += 1
        self.start = self.value = 0

    def reset(self, start=0, **kwargs):
        assert "environment" not in kwargs  # (the routing column is not reset's)
        self.start = self.value = int(start)
        return f" (the doubler is at {self.value})"

    def double(self) -> int:
        """Doubles the value."""
        self.value *= 2
        return self.value

    def get_reward(self) -> float:
        return float(self.value == 2 * self.start)


FACTORIES = {"counter": Counter, "doubler": Doubler}
MIXED_ROWS = [
    {**row, "environment": "counter" if i % 2 == 0 else "doubler"}
    for i, row in enumerate(COUNTER_ROWS)
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tool_model.save(tmp_path_factory.mktemp("tool_model"))


def test_each_row_gets_its_environments_instances_and_tools():
    factory = EnvironmentFactory(FACTORIES, [])
    prompts, instances = factory.start(MIXED_ROWS[:4], 2)
    assert [type(e).__name__ for e in instances] == ["Counter"] * 2 + ["Doubler"] * 2 + [
        "Counter"
    ] * 2 + ["Doubler"] * 2
    assert all(isinstance(p, ToolPrompt) for p in prompts)
    tools = [[schema["function"]["name"] for schema in p.tools] for p in prompts]
    assert tools == [["increment"], ["double"], ["increment"], ["double"]]
    assert prompts[1].messages[-1]["content"].endswith("(the doubler is at 1)")
    assert factory.shared_schemas is None


def test_a_prompt_is_rendered_with_its_own_environments_tools(model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    factory = EnvironmentFactory(FACTORIES, [])
    counter, doubler = (factory.sized_prompt(row) for row in MIXED_ROWS[:2])
    assert "increment" in render(tokenizer, counter) and "double" not in render(tokenizer, counter)
    assert "double" in render(tokenizer, doubler) and "increment" not in render(tokenizer, doubler)


def test_instances_are_made_once_and_reset_each_batch():
    Doubler.made = 0
    factory = EnvironmentFactory(FACTORIES, [])
    assert Doubler.made == 1  # (the probe, the pool's first)
    _, first = factory.start(MIXED_ROWS[:4], 2)
    _, second = factory.start(MIXED_ROWS[:4], 2)
    assert [id(e) for e in first] == [id(e) for e in second]  # (the same instances, reset)
    assert Doubler.made == 4  # (two rows of two rollouts at once: four instances)
    factory.start(MIXED_ROWS[1:2], 2)  # (fewer at once: none made)
    assert Doubler.made == 4


def test_each_class_scores_its_own_rollouts():
    factory = EnvironmentFactory(FACTORIES, [])
    _, instances = factory.start(MIXED_ROWS[:2], 1)
    counter_reward, doubler_reward = factory.reward_functions()
    assert (counter_reward.__name__, doubler_reward.__name__) == ("Counter", "Doubler")
    instances[1].double()
    assert counter_reward(environments=instances) == [0.0, None]
    assert doubler_reward(environments=instances) == [None, 1.0]


@pytest.mark.parametrize(
    ("factories", "rows", "message"),
    [
        (FACTORIES, [{**COUNTER_ROWS[0], "environment": "abacus"}], "environment='abacus'.*"),
        (FACTORIES, [COUNTER_ROWS[0]], "environment=None, which is not among"),
        ({}, None, "an empty dict names no environment"),
        ({"counter": 3}, None, r"environment_factory\['counter'\]: 3 is not callable"),
    ],
)
def test_dict_mistakes_are_refused_by_name(factories, rows, message):
    with pytest.raises(ValueError, match=message):
        EnvironmentFactory(factories, []).start(rows, 1)


class MixedEngine(CounterEngine):
    """Calls the row's own tool: increment the counter to 10, or double the doubler once."""

    def answer(self, text):
        if re.search(r"the\s*doubler\s*is\s*at", text):
            return '<tool_call>{"name": "double", "arguments": {}}</tool_call>'
        return super().answer(text)


def _mixed_trainer(model_dir, tmp_path, max_steps: int, eval_dataset=None):
    """A trainer over MIXED_ROWS and FACTORIES, one round of tool calls an episode."""
    from nostall import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=max_steps,
        logging_steps=1,
        max_completion_length=200,
        num_generations=2,
        per_device_train_batch_size=4,
        use_cpu=True,
        save_strategy="no",
        max_tool_calling_iterations=1,
    )
    return GRPOTrainer(
        model=str(model_dir),
        args=args,
        train_dataset=MIXED_ROWS,
        eval_dataset=eval_dataset,
        environment_factory=FACTORIES,
    )


def test_rollouts_of_mixed_environments_act_and_are_paid_through_the_trainer(model_dir, tmp_path):
    from transformers import AutoTokenizer

    trainer = _mixed_trainer(model_dir, tmp_path, max_steps=2)
    trainer.setup.generator.episodes.runner.engine = MixedEngine(
        AutoTokenizer.from_pretrained(model_dir)
    )
    result = trainer.train()
    assert result.rewards == [1.0, 1.0]  # (every rollout paid by its own class)
    logged = [e for e in trainer.state.log_history if "loss" in e]
    assert all(e["rewards/Counter/mean"] == e["rewards/Doubler/mean"] == 1.0 for e in logged)
    assert all(e["tools/failure_frequency"] == 0.0 for e in logged)


DICT_SCRIPT = """
from datasets import Dataset
from {lib} import GRPOConfig, GRPOTrainer
from tests.agents.test_factory_dict import FACTORIES, MIXED_ROWS

args = GRPOConfig(output_dir=OUT, max_steps=2, logging_steps=1, max_completion_length=8,
                  num_generations=4, per_device_train_batch_size=4, use_cpu=True)
trainer = GRPOTrainer(model=MODEL, args=args, train_dataset=Dataset.from_list(MIXED_ROWS),
                      environment_factory=FACTORIES)
trainer.train()
"""


@pytest.mark.parametrize("lib", LIBS)
def test_a_trl_script_with_a_dict_of_factories_runs_with_trls_semantics(lib, model_dir, tmp_path):
    state, logs = run_script(DICT_SCRIPT, lib, model_dir, tmp_path / "out")
    assert state.global_step == 2
    keys = {"tools/call_frequency", "rewards/Counter/mean", "rewards/Doubler/mean"}
    assert logs and all(keys <= set(e) for e in logs)


class Game:
    """An environment that owns its data: reset gives the prompt (no train_dataset)."""

    def reset(self, **kwargs):
        self.guesses = 0
        return "guess a number"

    def guess(self, x: int) -> str:
        """Guesses.

        Args:
            x: The guess.
        """
        self.guesses += 1
        return "higher"

    def get_reward(self) -> float:
        return float(self.guesses)


NO_DATA_SCRIPT = """
from {lib} import GRPOConfig, GRPOTrainer
from tests.agents.test_factory_dict import Game

args = GRPOConfig(output_dir=OUT, max_steps=2, logging_steps=1, max_completion_length=8,
                  num_generations=4, per_device_train_batch_size=4, use_cpu=True)
trainer = GRPOTrainer(model=MODEL, args=args, environment_factory=Game)
trainer.train()
"""


@pytest.mark.parametrize("lib", LIBS)
def test_an_environment_that_owns_its_data_trains_without_a_dataset(lib, model_dir, tmp_path):
    state, logs = run_script(NO_DATA_SCRIPT, lib, model_dir, tmp_path / "out")
    assert state.global_step == 2
    assert len(logs) == 2 and all("rewards/Game/mean" in e for e in logs)


@pytest.mark.parametrize(
    ("factory", "extra", "message"),
    [
        (FACTORIES, {"max_steps": 2}, "a dict of factories needs a train_dataset"),
        (Game, {}, "without a train_dataset .* set max_steps"),
    ],
)
def test_no_dataset_mistakes_are_refused_by_name(factory, extra, message, model_dir, tmp_path):
    from nostall import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, **extra)
    with pytest.raises(ValueError, match=message):
        GRPOTrainer(model=str(model_dir), args=args, environment_factory=factory)


def test_a_run_with_environments_is_evaluated_in_episodes_too(model_dir, tmp_path, monkeypatch):
    """evaluate() of an environment_factory run runs episodes as training does (tools rendered
    and called, the environments' get_reward scoring): with turns scripted to call each row's
    tool, every evaluated rollout is paid. (Single completions, as before, would score 0.)"""
    from transformers import AutoTokenizer

    from nostall.algos.grpo import evaluation

    trainer = _mixed_trainer(model_dir, tmp_path, max_steps=1, eval_dataset=MIXED_ROWS[:4])
    scripted = MixedEngine(AutoTokenizer.from_pretrained(model_dir))
    real = evaluation.make_engine

    def make_engine(*args, **kwargs):  # (the evaluation's own engine, its turns scripted:
        engine = real(*args, **kwargs)  # a turn a call, the rounds' path)
        engine.generate_turn = scripted.generate_turn
        engine.__class__ = type("Scripted", (type(engine),), {"continuous": False})
        return engine

    monkeypatch.setattr(evaluation, "make_engine", make_engine)
    metrics = trainer.evaluate()
    assert metrics["eval_reward"] == 1.0
    assert metrics["eval_rewards/Counter/mean"] == metrics["eval_rewards/Doubler/mean"] == 1.0
    assert any("increment" in call for call in scripted.calls)  # (the tools rendered in)


def test_a_text_environment_run_refuses_an_eval_dataset(tmp_path):
    from nostall import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        task="guess", max_steps=1, num_generations=2, output_dir=str(tmp_path), use_cpu=True
    )
    trainer = GRPOTrainer(args=args, eval_dataset=[{"prompt": "guess 1-8:", "answer": "3"}])
    with pytest.raises(ValueError, match="text-environment run"):
        trainer.evaluate()
