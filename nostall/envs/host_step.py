"""The NumPy API's step without the dispatcher: one ctypes call into the engine
(csrc/envs/host_step.cpp) with the addresses of buffers made and checked once.

The op `nostall::env_step_into` costs 10-13 us a call through the dispatcher; this path about
1 us. It is only for host buffers the VectorEnv owns, whose dtype, shape and contiguity were
fixed when they were made; any other call goes through the op."""

from __future__ import annotations

import ctypes
import functools

import torch


class _HostStep(ctypes.Structure):
    # Mirrors HostStep in csrc/envs/host_step.cpp, field for field.
    _fields_ = [
        ("actions", ctypes.c_void_p),
        ("obs", ctypes.c_void_p),
        ("reward", ctypes.c_void_p),
        ("terminated", ctypes.c_void_p),
        ("truncated", ctypes.c_void_p),
        ("final_obs", ctypes.c_void_p),
    ]


@functools.cache
def _entry():
    import nostall._C as native  # loaded already: CDLL only takes another reference

    function = ctypes.CDLL(native.__file__).nostall_env_step_host
    function.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64]
    function.restype = ctypes.c_int64
    return function


class HostStepper:
    """Steps `handle` into fixed CPU tensors: `actions` and the five outputs of EnvStep's
    layout. The tensors must outlive the stepper (it holds them)."""

    def __init__(self, handle: int, actions: torch.Tensor, out: tuple[torch.Tensor, ...]):
        tensors = (actions, *out)
        if any(t.device.type != "cpu" or not t.is_contiguous() for t in tensors):
            raise ValueError("HostStepper needs contiguous CPU tensors")
        self._tensors = tensors  # keeps the addresses below valid
        final_obs = out[4]
        self._args = _HostStep(
            *(t.data_ptr() for t in tensors[:5]),
            final_obs.data_ptr() if final_obs.numel() else None,
        )
        self._args_ref = ctypes.byref(self._args)
        self._error = ctypes.create_string_buffer(1024)
        self._handle = handle
        self._function = _entry()

    def __call__(self) -> int:
        """Steps once; returns how many environments finished. The engine's errors (an action
        out of range, NaN, a closed handle) are raised as RuntimeError with its message."""
        done = self._function(self._handle, self._args_ref, self._error, 1024)
        if done < 0:
            raise RuntimeError(self._error.value.decode(errors="replace"))
        return done
