"""Argument checks for the fake (meta) kernels, mirroring csrc/common/checks.h.

Under `torch.compile` the fake kernel runs instead of the C++ one, so it must reject the same
inputs with the same messages (RuntimeError, like the C++ checks). Metadata only: no sync.
"""

import math

import torch

FLOAT_DTYPES = (torch.float32, torch.float64)
INT64_MAX = 2**63 - 1


def checked_product(a: int, b: int, op: str, product: str) -> int:
    """a * b for a size, refused as the C++ checked_product refuses it (int64 would wrap)."""
    if not -INT64_MAX - 1 <= a * b <= INT64_MAX:
        _fail(f"{op}: {product} = {a} * {b} overflows int64")
    return a * b


def _fail(message: str) -> None:
    raise RuntimeError(message)


def check_time_major(t: torch.Tensor, name: str) -> None:
    if t.dim() != 2:
        _fail(f"{name} must be a time-major [T, N] tensor, got {t.dim()} dimensions")
    if t.dtype not in FLOAT_DTYPES:
        _fail(f"{name} must be float32 or float64, got {t.dtype}")
    if t.shape[0] < 1 or t.shape[1] < 1:
        _fail(f"{name} must have T >= 1 and N >= 1, got {list(t.shape)}")


def _check_shape_and_device(t: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str) -> None:
    if t.shape != ref.shape:
        _fail(f"{name} must have the shape of {ref_name} {list(ref.shape)}")
    if t.device != ref.device:
        _fail(f"{name} must be on the device of {ref_name}")


def check_like(t: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str) -> None:
    if t.dim() != 2:
        _fail(f"{name} must be a time-major [T, N] tensor, got {t.dim()} dimensions")
    _check_shape_and_device(t, name, ref, ref_name)
    if t.dtype != ref.dtype:
        _fail(f"{name} must have the dtype of {ref_name} ({ref.dtype}), got {t.dtype}")


def check_flags(t: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str) -> None:
    if t.dtype != torch.bool:
        _fail(f"{name} must be bool, got {t.dtype}")
    if t.dim() != 2:
        _fail(f"{name} must be a time-major [T, N] tensor, got {t.dim()} dimensions")
    _check_shape_and_device(t, name, ref, ref_name)


def check_unit_interval(x: float, name: str) -> None:
    if not 0.0 <= x <= 1.0:
        _fail(f"{name} must lie in [0, 1], got {x}")


def check_positive(x: float, name: str) -> None:
    if not (x > 0.0 and math.isfinite(x)):
        _fail(f"{name} must be a positive finite number, got {x}")
