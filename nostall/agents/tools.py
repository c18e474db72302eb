"""TRL's `tools=`: Python functions the model calls from its turns, as an episode environment.

Each tool's schema comes from its signature and docstring (transformers' get_json_schema, as
TRL's chat template rendering takes it) and is rendered into the prompt by the chat template.
A model turn that holds tool calls, read by the tokenizer's response template where it has one
(TRL's way) or in the `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` format of
Qwen's and Hermes' templates (TurnParser), has them run in order (an async tool
awaited on this thread's own loop); each result, or `{"error": ...}` for a tool that raises or
is not known, goes back to the model as a tool message, whose tokens the chat template renders
(appended as tokens: the conversation is never re-tokenized). A turn without a tool call ends
the episode: its conversation is what the reward functions score.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Callable

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def tool_schemas(tools: list[Callable]) -> list[dict]:
    """Each tool's JSON schema (ValueError naming a tool whose docstring transformers cannot
    read: it needs a description and each argument under Args)."""
    from transformers.utils import get_json_schema

    schemas = []
    for tool in tools:
        if not callable(tool):
            raise ValueError(f"tools: {tool!r} is not a function")
        try:
            schemas.append(get_json_schema(tool))
        except Exception as e:  # (transformers' DocstringParsingException and friends)
            name = getattr(tool, "__name__", repr(tool))
            raise ValueError(f"tools: {name}: {e}") from None
    return schemas


def parse_tool_calls(text: str) -> list[dict]:
    """The tool calls in a turn's text, in order: {"name", "arguments"} dicts, or {"error"} for
    a call that is not a JSON object with a name."""
    calls = []
    for body in _CALL.findall(text):
        try:
            call = json.loads(body)
        except json.JSONDecodeError as e:
            calls.append({"error": f"the tool call is not JSON ({e.msg})"})
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            calls.append({"error": "a tool call needs a name"})
            continue
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):  # (some templates put the arguments as a JSON string)
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = None
        if not isinstance(arguments, dict):
            calls.append({"error": f"tool {call['name']}: arguments must be an object"})
            continue
        calls.append({"name": call["name"], "arguments": arguments})
    return calls


class TurnParser:
    """A turn's text and tool calls, read as TRL reads them: by the tokenizer's own response
    template where it has one (transformers' parse_response: Llama 3's, GPT-OSS', GLM's and
    every format a model ships or a user sets, e.g. with TRL's add_response_schema), else in the
    `<tool_call>` JSON format of Qwen's and Hermes' templates. A turn the template cannot parse
    is plain text (TRL's fallback): no calls."""

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer
        self.template = getattr(tokenizer, "response_template", None) if tokenizer else None
        self.header = _assistant_header(tokenizer) if self.template is not None else None

    def __call__(self, text: str) -> tuple[str, list[dict]]:
        if self.template is None:
            return _CALL.sub("", text).strip(), parse_tool_calls(text)
        ending = self.tokenizer.eos_token or ""  # (the template's close: the turn's end)
        try:
            parsed = self.tokenizer.parse_response(text + ending, prefix=self.header)
        except (ValueError, TypeError):
            return text, []
        if not isinstance(parsed, dict):
            return text, []
        calls = []
        for tool_call in parsed.get("tool_calls") or []:
            function = tool_call.get("function", {}) if isinstance(tool_call, dict) else {}
            name, arguments = function.get("name"), function.get("arguments", {})
            if not isinstance(name, str):
                calls.append({"error": "a tool call needs a name"})
            elif not isinstance(arguments, dict):
                calls.append({"error": f"tool {name}: arguments must be an object"})
            else:
                calls.append({"name": name, "arguments": arguments})
        return (parsed.get("content") or "").strip(), calls


def _assistant_header(tokenizer) -> str:
    """What the chat template writes before an assistant turn's text (the parser's prefix)."""
    user = [{"role": "user", "content": "x"}]
    bare = tokenizer.apply_chat_template(user, tokenize=False)
    opened = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    return opened[len(bare) :] if opened.startswith(bare) else opened


def run_tool(tools: dict[str, Callable], call: dict) -> tuple[str, object, bool]:
    """(name, result, failed): the tool's return, or {"error": ...} where it raised, was not
    known or the call was malformed."""
    name = call.get("name", "unknown")
    if "error" in call:
        return name, {"error": call["error"]}, True
    tool = tools.get(name)
    if tool is None:
        return name, {"error": f"Tool {name} not found."}, True
    try:
        result = tool(**call["arguments"])
        if inspect.isawaitable(result):
            result = asyncio.run(_awaited(result))
        return name, result, False
    except Exception as e:  # (the user's tool: whatever it raises goes back to the model)
        return name, {"error": str(e)}, True


async def _awaited(awaitable):
    return await awaitable


class ToolSuffix:
    """The tokens the chat template puts after an assistant turn that called tools: the tool
    messages, then the next assistant turn's header (TRL's way: the template rendered with and
    without them, the difference taken after the turn's end-of-turn token)."""

    def __init__(self, tokenizer, eos_token_id: int):
        self.tokenizer, self.eos_token_id = tokenizer, eos_token_id

    def __call__(self, tool_messages: list[dict]) -> list[int]:
        call = {"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}
        head = [
            {"role": "user", "content": "dummy"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
        ]
        prefix = self._ids(head, False)
        ends = [i for i, t in enumerate(prefix) if t == self.eos_token_id]
        if ends:
            prefix = prefix[: ends[-1] + 1]
        full = self._ids(head + tool_messages, True)
        if full[: len(prefix)] != prefix:
            raise ValueError(
                "tools: the chat template does not render a tool message after a tool call "
                "as a continuation of the conversation (it is not prefix-preserving)"
            )
        return full[len(prefix) :]

    def _ids(self, messages, add_generation_prompt: bool) -> list[int]:
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
        )
        return list(ids)


class ToolCallEnv:
    """One episode's environment over `tools`: its step runs the turn's tool calls and answers
    with the tool messages' tokens, or ends the episode when the turn calls none. It keeps the
    conversation after the prompt (`messages`) for the reward functions."""

    def __init__(
        self,
        tools: dict[str, Callable],
        suffix: ToolSuffix,
        instance=None,
        parse: TurnParser | None = None,
    ):
        self.tools, self.suffix = tools, suffix
        self.instance = instance  # (TRL's environment_factory: the rollout's own, reset already)
        self.parse = parse or TurnParser()
        self.messages: list[dict] = []

    def reset(self, *, seed=None, options=None):
        self.messages = []
        return "", {}  # (the prompt is the row's, tools rendered in it)

    def last_turn(self, action: str) -> None:
        """A turn past the rounds allowed: kept in the conversation, its calls not run."""
        self._assistant(*self.parse(action))

    def _assistant(self, text: str, calls: list[dict]) -> None:
        if not calls:
            self.messages.append({"role": "assistant", "content": text})
            return
        tool_calls = [
            {"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls
            if "error" not in c
        ]
        self.messages.append({"role": "assistant", "content": text, "tool_calls": tool_calls})

    def step(self, action: str):
        text, calls = self.parse(action)
        self._assistant(text, calls)
        if not calls:
            return [], 0.0, True, False, {"tool_calls": 0, "tool_failures": 0}
        results, failures = [], 0
        for call in calls:
            name, result, failed = run_tool(self.tools, call)
            failures += failed
            content = result if isinstance(result, list) else str(result)
            results.append({"role": "tool", "name": name, "content": content})
        self.messages += results
        info = {"tool_calls": len(calls), "tool_failures": failures}
        return self.suffix(results), 0.0, False, False, info
