"""TRL's tools=: schemas rendered into the prompt, tool calls parsed from a turn and run (sync and
async; a failing or unknown tool answered with {"error": ...} and counted), results appended as
the chat template's tokens, the conversation scored by the reward functions; and a TRL script
with tools= run under nostall and under TRL with the same steps and logged keys."""

import re

import pytest
import torch

from nostall.agents.episodes import Episode, EpisodeRunner, EpisodeSettings
from nostall.agents.tools import (
    ToolCallEnv,
    ToolSuffix,
    parse_tool_calls,
    run_tool,
    tool_schemas,
)
from nostall.lm.generation import Completions
from tests.agents import tool_model
from tests.agents.scripts import LIBS, run_script


def add(a: int, b: int) -> int:
    """Adds two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


async def slow_double(x: int) -> int:
    """Doubles a number, asynchronously.

    Args:
        x: The number.
    """
    return 2 * x


def broken(x: int) -> int:
    """Always fails.

    Args:
        x: Anything.
    """
    raise RuntimeError("the sandbox is down")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tool_model.save(tmp_path_factory.mktemp("tool_model"))


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def test_tool_calls_are_parsed_in_order_and_bad_ones_named():
    text = (
        'ok <tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
        '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 1}"}</tool_call>'
        "<tool_call>{not json}</tool_call><tool_call>[1]</tool_call>"
        '<tool_call>{"name": "add", "arguments": 3}</tool_call>'
    )
    calls = parse_tool_calls(text)
    assert calls[:2] == [
        {"name": "add", "arguments": {"a": 2, "b": 3}},
        {"name": "add", "arguments": {"a": 1, "b": 1}},
    ]
    assert "not JSON" in calls[2]["error"] and "needs a name" in calls[3]["error"]
    assert "must be an object" in calls[4]["error"]
    assert parse_tool_calls("no call here") == []


def test_tools_run_sync_and_async_and_failures_go_back_to_the_model():
    tools = {"add": add, "slow_double": slow_double, "broken": broken}
    assert run_tool(tools, {"name": "add", "arguments": {"a": 2, "b": 3}}) == ("add", 5, False)
    assert run_tool(tools, {"name": "slow_double", "arguments": {"x": 4}}) == (
        "slow_double",
        8,
        False,
    )
    _name, result, failed = run_tool(tools, {"name": "broken", "arguments": {"x": 1}})
    assert failed and result == {"error": "the sandbox is down"}
    assert run_tool(tools, {"name": "nope", "arguments": {}})[1] == {
        "error": "Tool nope not found."
    }
    _, result, failed = run_tool(tools, {"name": "add", "arguments": {"c": 1}})
    assert failed and "unexpected keyword" in result["error"]


def test_a_tool_without_a_readable_docstring_is_refused_by_name():
    def undocumented(x):
        return x

    with pytest.raises(ValueError, match="tools: undocumented"):
        tool_schemas([undocumented])
    with pytest.raises(ValueError, match="not a function"):
        tool_schemas([3])
    assert tool_schemas([add])[0]["function"]["name"] == "add"


class ScriptedEngine:
    """Answers each context with a tool call until the context holds a tool's result, then with
    that result: the turns a model that calls tools would write, through the runner's path."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.allowed = torch.ones(len(tokenizer), dtype=torch.bool)
        self.eos = tokenizer.eos_token_id

    def answer(self, text: str) -> str:
        return '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'

    def generate_turn(self, contexts, max_new_tokens, noise):
        rows = []
        for context in contexts:
            text = self.tokenizer.decode(context)
            # (Qwen2.5's template puts a result in a user turn, the Hermes-style one in a tool turn)
            # (the character tokenizer drops newlines: none is looked for)
            results = re.findall(r"<tool_response>\s*(.*?)\s*</tool_response>", text, re.DOTALL)
            results += re.findall(r"<\|im_start\|>tool\s*(.*?)<\|im_end\|>", text, re.DOTALL)
            answer = results[-1] if results else self.answer(text)
            rows.append([*self.tokenizer.encode(answer, add_special_tokens=False), self.eos])
        width = min(max(len(r) for r in rows), max_new_tokens)
        out = Completions.empty(len(rows), 1, width)
        for i, row in enumerate(rows):
            row = row[:width]
            out.completion_ids[i, : len(row)] = torch.tensor(row)
            out.completion_mask[i, : len(row)] = True
            out.log_probs[i, : len(row)] = -0.5
        return out


def test_an_episode_calls_a_tool_reads_its_result_and_answers(tokenizer):
    eos = tokenizer.eos_token_id
    runner = EpisodeRunner(
        ScriptedEngine(tokenizer),
        EpisodeSettings(max_turns=3, budget=400, timeout_s=5.0, eos_token_id=eos),
        tokenize=lambda text: tokenizer.encode(text, add_special_tokens=False),
        detokenize=lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
    )
    suffix = ToolSuffix(tokenizer, eos)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "2+3="}],
        tools=[add],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    episodes = [Episode(ToolCallEnv({"add": add}, suffix), list(prompt), None) for _ in range(2)]
    runner.run(episodes, noise_seed=0)
    for e in episodes:
        assert e.done and e.failure is None and e.turns == 2 and e.calls == 1
        assert e.env.messages[0]["tool_calls"][0]["function"] == {
            "name": "add",
            "arguments": {"a": 2, "b": 3},
        }
        assert e.env.messages[1] == {"role": "tool", "name": "add", "content": "5"}
        assert e.env.messages[2] == {"role": "assistant", "content": "5"}
        # The tool's turn is the template's tokens, out of the loss; the model's turns in it.
        text = tokenizer.decode(e.tokens)
        tool_part = [t for t, s in zip(e.tokens, e.sampled, strict=True) if not s]
        rendered = tokenizer.decode(tool_part)
        assert rendered in text and "5" in rendered and rendered.endswith("assistant")
        assert text.endswith("5" + tokenizer.eos_token)


class AlwaysCalls(ScriptedEngine):
    """Never shown a tool's result (only each context's first token): calls again each turn."""

    def generate_turn(self, contexts, max_new_tokens, noise):
        return super().generate_turn([c[:1] for c in contexts], max_new_tokens, noise)


def test_the_last_round_allowed_is_kept_but_its_calls_are_not_run(tokenizer):
    """TRL's max_tool_calling_iterations: with one round allowed, a model that always calls
    runs one call; its second turn's call is in the conversation, unrun."""
    eos = tokenizer.eos_token_id
    settings = EpisodeSettings(2, 400, 5.0, eos, act_on_last_turn=False)
    runner = EpisodeRunner(
        AlwaysCalls(tokenizer),
        settings,
        tokenize=lambda text: tokenizer.encode(text, add_special_tokens=False),
        detokenize=lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
    )
    counted = []

    def counting_add(a: int, b: int) -> int:
        counted.append((a, b))
        return a + b

    env = ToolCallEnv({"add": counting_add}, ToolSuffix(tokenizer, eos))
    episode = Episode(env, tokenizer.encode("x", add_special_tokens=False), None)
    runner.run([episode], noise_seed=0)
    assert counted == [(2, 3)] and episode.turns == 2 and episode.truncated
    assert [m["role"] for m in env.messages] == ["assistant", "tool", "assistant"]
    assert env.messages[2]["tool_calls"][0]["function"]["name"] == "add"


SCRIPT = """
from datasets import Dataset
from {lib} import GRPOConfig, GRPOTrainer

def add(a: int, b: int) -> int:
    '''Adds two numbers.

    Args:
        a: The first number.
        b: The second number.
    '''
    return a + b

rows = [{{"prompt": [{{"role": "user", "content": f"{{i}}+{{i + 1}}="}}]}} for i in range(8)]

def reward_len(completions, **kwargs):
    return [-abs(4 - len(c[-1]["content"])) for c in completions]

args = GRPOConfig(output_dir=OUT, max_steps=2, logging_steps=1, max_completion_length=8,
                  num_generations=4, per_device_train_batch_size=4, use_cpu=True,
                  max_tool_calling_iterations=2)
trainer = GRPOTrainer(model=MODEL, reward_funcs=reward_len, args=args,
                      train_dataset=Dataset.from_list(rows), tools=[add])
trainer.train()
"""


@pytest.mark.parametrize("lib", LIBS)
def test_a_trl_script_with_tools_runs_with_trls_semantics(lib, model_dir, tmp_path):
    state, logs = run_script(SCRIPT, lib, model_dir, tmp_path / "out")
    assert state.global_step == 2
    assert sorted(p.name for p in (tmp_path / "out").glob("checkpoint-*")) == ["checkpoint-2"]
    assert logs and all({"tools/call_frequency", "tools/failure_frequency"} <= set(e) for e in logs)


class Counter:
    """TRL's environment_factory shape: reset(**row), a tool method, get_reward."""

    def __init__(self):
        self.count = 0

    def reset(self, start=0, **kwargs):
        self.count = int(start)
        return f" (the counter is at {self.count})"

    def increment(self, by: int) -> int:
        """Adds to the counter.

        Args:
            by: How much to add.
        """
        self.count += by
        return self.count

    def get_reward(self) -> float:
        return float(self.count == 10)


COUNTER_ROWS = [
    {"prompt": [{"role": "user", "content": "Make the counter 10."}], "start": i} for i in range(8)
]

ENV_SCRIPT = """
from datasets import Dataset
from {lib} import GRPOConfig, GRPOTrainer
from tests.agents.test_tools import COUNTER_ROWS, Counter

args = GRPOConfig(output_dir=OUT, max_steps=2, logging_steps=1, max_completion_length=8,
                  num_generations=4, per_device_train_batch_size=4, use_cpu=True)
trainer = GRPOTrainer(model=MODEL, args=args, train_dataset=Dataset.from_list(COUNTER_ROWS),
                      environment_factory=Counter)
trainer.train()
"""


@pytest.mark.parametrize("lib", LIBS)
def test_a_trl_script_with_environment_factory_runs_with_trls_semantics(lib, model_dir, tmp_path):
    state, logs = run_script(ENV_SCRIPT, lib, model_dir, tmp_path / "out")
    assert state.global_step == 2
    keys = {"tools/call_frequency", "tools/failure_frequency", "rewards/Counter/mean"}
    assert logs and all(keys <= set(e) for e in logs)


class CounterEngine(ScriptedEngine):
    """Reads the counter from the prompt and calls increment to make it 10, then answers."""

    def generate_turn(self, contexts, max_new_tokens, noise):
        self.calls = [self.tokenizer.decode(c) for c in contexts]
        return super().generate_turn(contexts, max_new_tokens, noise)

    def answer(self, text):
        # (the test tokenizer keeps no whitespace)
        start = int(re.findall(r"the\s*counter\s*is\s*at\s*(\d+)", text)[-1])
        return (
            f'<tool_call>{{"name": "increment", "arguments": {{"by": {10 - start}}}}}</tool_call>'
        )


def test_each_rollout_acts_on_its_own_environment_and_is_scored_by_it(model_dir, tmp_path):
    """Through the trainer's own generation side, with turns scripted to call the environment's
    tool: every rollout's instance reaches 10, get_reward pays 1, and the reward functions get
    the instances."""
    from nostall import GRPOConfig, GRPOTrainer

    seen = []

    def sees_environments(completions, environments, **kwargs):
        seen.append([type(e).__name__ for e in environments])
        return [0.0] * len(completions)

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        logging_steps=1,
        max_completion_length=200,
        num_generations=2,
        per_device_train_batch_size=4,
        use_cpu=True,
        save_strategy="no",
        report_to="none",
        max_tool_calling_iterations=1,
    )
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=sees_environments,
        args=args,
        train_dataset=COUNTER_ROWS,
        environment_factory=Counter,
    )
    from transformers import AutoTokenizer

    runner = trainer.setup.generator.episodes.runner
    runner.engine = CounterEngine(AutoTokenizer.from_pretrained(model_dir))
    result = trainer.train()
    assert result.rewards == [1.0, 1.0]  # (every rollout's Counter at 10)
    assert seen and all(names == ["Counter"] * 4 for names in seen)


def test_environment_factory_mistakes_are_refused_by_name(model_dir, tmp_path):
    from nostall import GRPOConfig, GRPOTrainer
    from nostall.agents.factory import EnvironmentFactory

    class NoReset:
        pass

    class Talks(Counter):
        def reset(self, **kwargs):
            return 3

    class Moody(Counter):
        made = 0

        def reset(self, **kwargs):
            Moody.made += 1
            return f" mood {Moody.made}"

    with pytest.raises(ValueError, match="must define a callable reset"):
        EnvironmentFactory(NoReset, [])
    with pytest.raises(ValueError, match="returns None or a string"):
        EnvironmentFactory(Talks, []).sized_prompt(COUNTER_ROWS[0])
    with pytest.raises(ValueError, match="different observations"):
        EnvironmentFactory(Moody, []).start(COUNTER_ROWS[:1], 2)
    with pytest.raises(ValueError, match="No reward source"):

        class Rewardless(Counter):
            get_reward = None

        GRPOTrainer(
            model=str(model_dir),
            args=GRPOConfig(output_dir=str(tmp_path), max_steps=1, use_cpu=True),
            train_dataset=COUNTER_ROWS,
            environment_factory=Rewardless,
        )
    with pytest.raises(ValueError, match="tools need conversational prompts"):
        GRPOTrainer(
            model=str(model_dir),
            reward_funcs=lambda completions, **k: [0.0] * len(completions),
            args=GRPOConfig(output_dir=str(tmp_path), max_steps=1, use_cpu=True),
            train_dataset=[{"prompt": "x"}],
            tools=[add],
        )


def _json_call_template(tokenizer) -> dict:
    """A response template for Llama 3's tool-call format (a bare JSON object with "name" and
    "parameters"), anchored at this tokenizer's assistant header and closed by its <eos>."""
    from nostall.agents.tools import _assistant_header

    end = re.escape(tokenizer.eos_token)
    return {
        "defaults": {"role": "assistant"},
        "start_anchor": _assistant_header(tokenizer),
        "fields": {
            "tool_calls": {
                "open_pattern": r'\{"name":\s*"(?P<name>[^"]+)",\s*"parameters":\s*',
                "close_pattern": r"\}" + end + r"\s*",
                "repeats": True,
                "content": "json",
                "transform": {
                    "type": "function",
                    "function": {"name": "{name}", "arguments": "{content}"},
                },
            },
            "content": {"close_pattern": end + r"\s*", "content": "text"},
        },
    }


def test_a_tokenizers_response_template_reads_the_calls_as_trls_does(tokenizer):
    """With a response template on the tokenizer (a model's own, or TRL's add_response_schema),
    its format is parsed (transformers' parse_response), here Llama 3's bare JSON, which the
    <tool_call> reading does not see; without one, the <tool_call> format; text the template
    cannot parse is a turn without calls (TRL's fallback)."""
    import copy

    from nostall.agents.tools import TurnParser

    llama_style = '{"name": "add", "parameters": {"a": 2, "b": 3}}'
    assert TurnParser(tokenizer)(llama_style) == (llama_style, [])  # (no template: no call)
    templated = copy.copy(tokenizer)
    templated.response_template = _json_call_template(tokenizer)
    parse = TurnParser(templated)
    assert parse(llama_style)[1] == [{"name": "add", "arguments": {"a": 2, "b": 3}}]
    env = ToolCallEnv({"add": add}, ToolSuffix(templated, templated.eos_token_id), None, parse)
    env.reset()
    suffix, _, terminated, _, info = env.step(llama_style)
    assert suffix and not terminated and info == {"tool_calls": 1, "tool_failures": 0}
    assert env.messages[-1] == {"role": "tool", "name": "add", "content": "5"}
    assert parse("just an answer")[1] == []
