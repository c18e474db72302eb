"""A Gymnasium environment's state as tensors, numbers and strings: what a checkpoint holds of
it, so a checkpoint loads with `torch.load(weights_only=True)` and no pickle of an object runs
on resume.

An environment is its wrapper chain (TimeLimit, OrderEnforcing, ..., the environment itself).
Of each link the state is its attributes that are data: numbers, strings, NumPy arrays and
scalars, NumPy random generators (their bit generator's state), and lists, tuples, dicts and
deques of these. What makes the chain (spaces, the spec, the next link, methods, constructor
arguments) is rebuilt by making the environment anew, and restored into by `load_env_state`.
An attribute that is neither (a simulator handle, a Box2D world) makes the environment one a
checkpoint cannot hold: `EnvStateError` names it. An environment may instead give its own
`state_dict()` / `load_state_dict(state)` of data, used in place of its attributes.
"""

from __future__ import annotations

import collections
import inspect
import types

import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.registration import EnvSpec

# Attributes that make the chain rather than hold its state.
STRUCTURE = {"env", "spec", "_saved_kwargs", "metadata", "_metadata", "_cached_spec"}
_STRUCTURE_TYPES = (
    gym.Env,
    gym.spaces.Space,
    EnvSpec,
    types.ModuleType,
    type,
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
)
_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")
# NumPy dtypes a tensor can carry (the array travels as one).
_ARRAY_DTYPES = {
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
}


_ABSENT = object()


class EnvStateError(ValueError):
    """An environment whose state a checkpoint cannot hold as data, with what and where."""


def _encode(value, where: str):
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic):  # a NumPy scalar
        if value.dtype.name not in _ARRAY_DTYPES:
            raise EnvStateError(f"{where} is a NumPy {value.dtype} scalar")
        # sync: none, a NumPy scalar on the host
        return {"__numpy_scalar__": value.dtype.name, "value": value.item()}
    if isinstance(value, np.ndarray):
        if value.dtype.name not in _ARRAY_DTYPES:
            raise EnvStateError(f"{where} is a NumPy array of {value.dtype}")
        return {"__ndarray__": value.dtype.name, "data": torch.from_numpy(value.copy())}
    if isinstance(value, np.random.Generator):
        return {"__generator__": value.bit_generator.state}
    if isinstance(value, collections.deque):
        return {
            "__deque__": [_encode(v, f"{where}[{i}]") for i, v in enumerate(value)],
            "maxlen": value.maxlen,
        }
    if isinstance(value, list | tuple):
        return type(value)(_encode(v, f"{where}[{i}]") for i, v in enumerate(value))
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value) or any(k.startswith("__") for k in value):
            raise EnvStateError(f"{where} is a dict whose keys are not plain strings")
        return {k: _encode(v, f"{where}[{k!r}]") for k, v in value.items()}
    raise EnvStateError(f"{where} is a {type(value).__module__}.{type(value).__qualname__}")


def _decode(value):
    if isinstance(value, dict):
        if "__ndarray__" in value:
            dtype = _dtype(value["__ndarray__"])
            return value["data"].numpy().astype(dtype, copy=True)  # sync: none, a host tensor
        if "__numpy_scalar__" in value:
            return _dtype(value["__numpy_scalar__"]).type(value["value"])
        if "__generator__" in value:
            return _generator(value["__generator__"])
        if "__deque__" in value:
            return collections.deque((_decode(v) for v in value["__deque__"]), value["maxlen"])
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_decode(v) for v in value)
    return value


def _dtype(name: str) -> np.dtype:
    if name not in _ARRAY_DTYPES:
        raise EnvStateError(f"a checkpoint's environment state names the dtype {name!r}")
    return np.dtype(name)


def _generator(state: dict) -> np.random.Generator:
    name = state.get("bit_generator") if isinstance(state, dict) else None
    if name not in _BIT_GENERATORS:
        raise EnvStateError(f"a checkpoint's environment state names the generator {name!r}")
    generator = np.random.Generator(getattr(np.random, name)())
    generator.bit_generator.state = state
    return generator


def _chain(env: gym.Env) -> list:
    links = [env]
    while isinstance(links[-1], gym.Wrapper):
        links.append(links[-1].env)
    return links


def _own_state(link) -> bool:
    return callable(getattr(link, "state_dict", None)) and callable(
        getattr(link, "load_state_dict", None)
    )


def env_state(env: gym.Env, name: str) -> list[dict]:
    """Each link's state, as data; EnvStateError naming the first attribute that is not."""
    states = []
    for link in _chain(env):
        kind = type(link).__qualname__
        where = f"{name}: {kind}"
        if _own_state(link):
            states.append(
                {"class": kind, "own": _encode(link.state_dict(), where + ".state_dict()")}
            )
            continue
        attributes = {}
        for attr, value in vars(link).items():
            if attr in STRUCTURE or isinstance(value, _STRUCTURE_TYPES) or callable(value):
                continue
            attributes[attr] = _encode(value, f"{where}.{attr}")
        states.append({"class": kind, "attributes": attributes})
    return states


def load_env_state(env: gym.Env, states: list[dict], name: str) -> None:
    """Restores `env_state`'s data into a freshly made (and reset) environment of the same
    chain; EnvStateError for an attribute it does not hold as data, or a value of another kind
    than its own."""
    links = _chain(env)
    classes = [type(link).__qualname__ for link in links]
    saved = [s.get("class") for s in states] if isinstance(states, list) else None
    if saved != classes:
        raise EnvStateError(f"{name}: the checkpoint's environment is {saved}, this one {classes}")
    # Every value checked before any is set: a refused checkpoint leaves the environment as
    # it was.
    restored = [
        (link, _checked(link, state, name)) for link, state in zip(links, states, strict=True)
    ]
    for link, values in restored:
        if isinstance(values, dict):
            for attr, value in values.items():
                setattr(link, attr, value)
        else:
            link.load_state_dict(values[0])


def _checked(link, state: dict, name: str) -> dict | tuple:
    """A link's attributes to set ({name: value}), or (its own state,) for `load_state_dict`.
    Only the data attributes the environment has (made and reset: its own, or its class's
    default), each with a value of its kind: a checkpoint restores state, it does not add or
    replace behaviour."""
    if "own" in state:
        return (_decode(state["own"]),)
    values = {}
    for attr, value in state["attributes"].items():
        current = inspect.getattr_static(link, attr, _ABSENT)
        if attr in STRUCTURE or current is _ABSENT or attr.startswith("__"):
            raise EnvStateError(
                f"{name}: the checkpoint sets {attr!r} of {state['class']}, "
                f"which the environment does not hold as data"
            )
        decoded = _decode(value)
        if not _same_kind(current, decoded):
            raise EnvStateError(
                f"{name}: the checkpoint sets {state['class']}.{attr} to a "
                f"{type(decoded).__name__}, where the environment holds a "
                f"{type(current).__name__}"
            )
        values[attr] = decoded
    return values


def _same_kind(current, value) -> bool:
    """Whether a restored value may replace an attribute's: None on either side (set on reset,
    or cleared), numbers for numbers, else the same type (a NumPy scalar as its Python kind)."""
    if current is None or value is None:
        return True
    if callable(current) or isinstance(current, (*_STRUCTURE_TYPES, property, staticmethod)):
        return False
    number = (int, float, np.number, np.bool_)
    if isinstance(current, number) and isinstance(value, number):
        return not (isinstance(current, str) or isinstance(value, str))
    return isinstance(value, type(current)) or isinstance(current, type(value))
