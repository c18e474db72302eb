"""SyncWatch: finds every call in a loop that forces (or, on a CPU-only machine, would force)
a host-device sync, with the user's file:line, its kind, and counts per step.

    watch = SyncWatch(policy)              # parameters of these modules live on the device
    with watch:
        for step in range(n):
            loss = train_step(batch)
            watch.step()
            with watch.allow("log every 100 steps"):
                if step % 100 == 0:
                    print(loss.item())  # sync: intended, for the log
    print(watch.report().table())

It tracks which tensors would live on the device: CUDA tensors, every nn.Parameter, tensors the
user marks, tensors moved or created there (`.to(device)`, `.cuda()`, a factory's `device=`),
and everything computed from them. Tensors built on the host from host data (an optimizer's
step counter, `torch.tensor(xs)`) are not device tensors, and reading them is not a sync; moving
them to the device is a copy to the device (blocking, from pageable memory), and a move to where
a tensor already lives is free (docs/sync_points.md says how a CPU-only run tells the two
directions apart). Both
layers (a TorchFunctionMode and a TorchDispatchMode) are per thread: a watch sees the thread
that entered it. With a dispatch mode active torch.compile does not compile, so the watch sees
the eager program. Known blind spots are listed in docs/sync_points.md.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from collections.abc import Callable, Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from nostall.profiler import catalog
from nostall.profiler.frames import Source, called_from_torch, names_host, user_frame
from nostall.profiler.report import SyncEvent, SyncReport

_ACTIVE = threading.local()


def active_watch() -> SyncWatch | None:
    """The innermost SyncWatch entered on this thread, if any."""
    stack = getattr(_ACTIVE, "stack", [])
    return stack[-1] if stack else None


class _FunctionLayer(TorchFunctionMode):
    def __init__(self, watch: SyncWatch):
        super().__init__()
        self.watch = watch

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        watch = self.watch
        if func in catalog.MOVES:
            if called_from_torch():
                return self._follow(func, args, kwargs)
            return self._move(func, args, kwargs)
        if kwargs.get("device") is not None and (
            func in catalog.DATA_FACTORIES or func in catalog.FILL_FACTORIES
        ):
            return self._create(func, args, kwargs)
        kind = catalog.FUNCTION_KINDS.get(func)
        if kind is None or not watch._touches_device(args, kwargs):
            return func(*args, **kwargs)
        watch._record(kind)
        # The ATen ops underneath (_local_scalar_dense, say) are this same sync: not recorded.
        watch._quiet += 1
        try:
            out = func(*args, **kwargs)
            if kind == "copy to host":
                out = _stand_in(out, args)
        finally:
            watch._quiet -= 1
        if kind == "copy to host":
            # The copy is on the host: a later read of it (numpy, tolist) is not a second sync.
            watch._set_host(out)
        return out

    def _move(self, func, args, kwargs):
        """Tensor.to / Tensor.cuda: device -> host is a copy to the host, host -> device a copy
        to the device (both blocking unless non_blocking, from pinned memory for the second),
        and a move to where the tensor already lives is free."""
        watch = self.watch
        target = catalog.move_target(func, args, kwargs)
        if target is None or not isinstance(args[0], torch.Tensor):
            return func(*args, **kwargs)  # a dtype conversion: where it lives does not change
        source = args[0]
        to_host = names_host(target)
        on_device = watch._is_device(source)
        blocking = not catalog.non_blocking(func, args, kwargs)
        if on_device and to_host:
            kind = "copy to host" if blocking else None
        elif not on_device and not to_host:
            # Non-blocking only from pinned memory (on a CPU-only machine nothing can be
            # pinned, so non_blocking=True is taken at its word).
            pinned = source.is_pinned() or not torch.cuda.is_available()
            kind = "copy to device" if blocking or not pinned else None
        else:
            kind = None
        if kind is not None:
            watch._record(kind)
        watch._quiet += 1
        try:
            out = func(*args, **kwargs)
            if on_device == to_host:  # it crosses over: a new tensor on the other side
                out = _stand_in(out, args)
        finally:
            watch._quiet -= 1
        if to_host:
            watch._set_host(out)
        else:
            watch._tag(out)
        return out

    def _follow(self, func, args, kwargs):
        """A move made by torch's own code (Module.to moving parameters and buffers, a clip
        coefficient sent to the gradients' device): device-generic plumbing, never reported,
        but what it moves lives where it sends it."""
        out = func(*args, **kwargs)
        target = catalog.move_target(func, args, kwargs)
        if target is not None and not names_host(target):
            self.watch._tag(out)
        return out

    def _create(self, func, args, kwargs):
        """A factory with a device: on the device unless it names the host; from host data
        (torch.tensor, as_tensor) a copy to the device."""
        watch = self.watch
        try:
            target = torch.device(kwargs["device"])
        except (RuntimeError, TypeError):
            return func(*args, **kwargs)
        if names_host(target):
            return func(*args, **kwargs)
        watch._quiet += 1
        try:
            out = func(*args, **kwargs)
        finally:
            watch._quiet -= 1
        if func in catalog.DATA_FACTORIES and out.numel() > 0:  # nothing to copy: no copy
            watch._record("copy to device")
        watch._tag(out)
        return out


def _stand_in(out, args):
    """On a CPU-only machine a move to where a tensor is returns the tensor itself; on a GPU it
    returns a new tensor on the other side. A view stands in for that copy, so the tensor copied
    from keeps where it lives and the copy gets the other side."""
    if any(out is t for t in _tensors(args)):
        return out.view_as(out)
    return out


def _tensors(value) -> Iterator[torch.Tensor]:
    """The tensors in op arguments or outputs (tensors, lists/tuples of them, dicts)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


@functools.cache
def _written_args(func) -> tuple[int, ...]:
    """Positions of the arguments an op writes into."""
    return tuple(
        i
        for i, a in enumerate(func._schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    )


class _DispatchLayer(TorchDispatchMode):
    def __init__(self, watch: SyncWatch):
        super().__init__()
        self.watch = watch

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        watch = self.watch
        on_device = watch._touches_device(args, kwargs)
        if on_device and watch._quiet == 0:
            kind = catalog.classify_op(func, args, kwargs)
            if kind is None and func.overloadpacket in catalog.INDEXING:
                kind = self._host_indices(args, kwargs)
            if kind is not None:
                watch._record(kind)
        out = func(*args, **kwargs)
        if on_device:
            # Whatever is computed from device tensors lives on the device, and so does every
            # tensor an op writes into.
            watch._tag(out)
            for i in _written_args(func):
                if i < len(args):
                    watch._tag(args[i])
        return out

    def _host_indices(self, args, kwargs) -> str | None:
        """A device tensor indexed by integer indices that live on the host (`t[np_idx]`, a
        list of ints): they are copied to the device first, from pageable memory."""
        watch = self.watch
        source = args[0] if args else kwargs.get("self")
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if not isinstance(source, torch.Tensor) or not watch._is_device(source):
            return None
        for index in indices or ():
            if (
                isinstance(index, torch.Tensor)
                and index.dim() > 0
                and index.dtype not in (torch.bool, torch.uint8)
                and not watch._is_device(index)
            ):
                return "copy to device"
        return None


class SyncWatch:
    """Records host-device syncs in the code it watches. See the module docstring."""

    def __init__(
        self,
        *modules: torch.nn.Module,
        tensors: tuple[torch.Tensor, ...] = (),
        all_tensors: bool = False,
        cuda_cross_check: bool = True,
    ):
        self._device = WeakIdKeyDictionary()
        self._host = WeakIdKeyDictionary()  # copies made to the host (even with all_tensors)
        self.all_tensors = all_tensors
        self.cuda_cross_check = cuda_cross_check and torch.cuda.is_available()
        self.events: list[SyncEvent] = []
        self.cuda_warnings: list[tuple[str, int]] = []
        self.steps = 0
        self._quiet = 0
        self._allowed: list[str] = []
        self._layers: contextlib.ExitStack | None = None
        for module in modules:
            self.mark(*module.parameters(), *module.buffers())
        self.mark(*tensors)

    @staticmethod
    def prepare() -> None:
        """Pays now what the first watch would pay inside the code it watches: the first
        TorchDispatchMode torch enters imports torch._dynamo (2-3 s on a small CPU). Call it
        before a timed region that holds a watch."""
        import torch._dynamo  # noqa: F401

    # -- what counts as a device tensor ------------------------------------------------------
    def mark(self, *tensors: torch.Tensor) -> None:
        """Declares tensors (and what is later computed from them) as living on the device."""
        for t in tensors:
            self._device[t] = True

    def _is_device(self, t: torch.Tensor) -> bool:
        if t in self._host:
            return False
        return (
            self.all_tensors or t.is_cuda or isinstance(t, torch.nn.Parameter) or t in self._device
        )

    def _set_host(self, value) -> None:
        for t in _tensors(value):
            if not t.is_cuda:
                self._device.pop(t, None)
                self._host[t] = True

    def _touches_device(self, args, kwargs) -> bool:
        return any(self._is_device(t) for t in _tensors((args, kwargs)))

    def _tag(self, value) -> None:
        for t in _tensors(value):
            self._device[t] = True

    # -- recording ---------------------------------------------------------------------------
    def _record(self, kind: str) -> Source:
        source = user_frame()
        if source.in_distributions:
            kind = "distributions validation"
        allowed = bool(self._allowed)
        self.events.append(
            SyncEvent(
                kind=kind,
                file=source.file,
                line=source.line,
                function=source.function,
                step=self.steps,
                allowed=allowed,
                reason=self._allowed[-1] if allowed else None,
                caller=source.caller,
            )
        )
        return source

    def step(self) -> None:
        """Marks the end of one step of the loop, for per-step counts."""
        self.steps += 1

    @contextlib.contextmanager
    def allow(self, reason: str) -> Iterator[None]:
        """Syncs inside are intended: counted apart with `reason`, never reported as faults."""
        self._allowed.append(reason)
        try:
            yield
        finally:
            self._allowed.pop()

    # -- entering and leaving ----------------------------------------------------------------
    def __enter__(self) -> SyncWatch:
        stack = contextlib.ExitStack()
        stack.enter_context(_FunctionLayer(self))
        stack.enter_context(_DispatchLayer(self))
        if self.cuda_cross_check:
            stack.enter_context(self._cuda_debug_mode())
        _ACTIVE.__dict__.setdefault("stack", []).append(self)
        stack.callback(_ACTIVE.stack.pop)
        self._layers = stack
        return self

    def __exit__(self, *exc) -> None:
        assert self._layers is not None
        self._layers.close()
        self._layers = None

    def __call__(self, fn: Callable) -> Callable:
        """As a decorator: watch every call of `fn`."""

        @functools.wraps(fn)
        def watched(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)

        return watched

    @contextlib.contextmanager
    def _cuda_debug_mode(self) -> Iterator[None]:
        # CUDA's own detector, as a cross-check: it is process-wide and warns on the syncs it
        # sees (not explicit synchronize calls, events, or pageable non_blocking copies).
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                yield
            finally:
                torch.cuda.set_sync_debug_mode(previous)
        for w in caught:
            if "synchroniz" in str(w.message):
                self.cuda_warnings.append((w.filename, w.lineno))

    def report(self, only_user_code: bool = False) -> SyncReport:
        """The syncs so far, by line; with `only_user_code`, those in installed libraries at the
        user's line that called into them."""
        return SyncReport.from_events(self.events, self.steps, self.cuda_warnings, only_user_code)


# Module-level helpers: scripts annotate their loop once, and the annotations act on whatever
# watch is active (under `nostall profile`) and do nothing otherwise.
def mark_step() -> None:
    watch = active_watch()
    if watch is not None:
        watch.step()


def mark(*tensors: torch.Tensor) -> None:
    watch = active_watch()
    if watch is not None:
        watch.mark(*tensors)


@contextlib.contextmanager
def allow(reason: str) -> Iterator[None]:
    watch = active_watch()
    if watch is None:
        yield
        return
    with watch.allow(reason):
        yield


class SyncError(AssertionError):
    """Raised by assert_no_sync when the watched code synchronised host and device."""


@contextlib.contextmanager
def assert_no_sync(*modules: torch.nn.Module, **kwargs) -> Iterator[SyncWatch]:
    """Fails (SyncError, listing each site) if the code inside has an unintended sync."""
    with SyncWatch(*modules, **kwargs) as watch:
        yield watch
    report = watch.report()
    if report.unintended:
        raise SyncError("unintended host-device syncs:\n" + report.table())
