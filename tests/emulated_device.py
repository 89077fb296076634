"""A stand-in accelerator for tests on a machine without one: tensors "on the device" are
host tensors that torch's function hooks keep apart from host ones as CUDA does, so code
that is meant to run where the parameters live can be checked for where its tensors go.

Under `EmulatedDevice()`, a tensor moved `.to(DEVICE)` or made with `device=DEVICE`
reports `DEVICE` and stays on it through every operation; an operation that mixes it with
a host tensor (other than a 0-dim one, which CUDA takes as a scalar) raises as CUDA does,
`.numpy()` on it raises as CUDA's does, and `.to("cpu")` / `.cpu()` / `.copy_()` are the
crossings. It checks placement only: the arithmetic is the host's, so numbers are those a
host run gives (a CUDA run may round differently). A test of code that truly needs CUDA
kernels needs a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

DEVICE = torch.device("cuda", 0)
HOST = torch.device("cpu")


class OnDevice(torch.Tensor):
    """A host tensor standing for one on DEVICE (made only by EmulatedDevice)."""


def on_host(tensor: torch.Tensor) -> torch.Tensor:
    """The plain host tensor an emulated device tensor holds (for comparing numbers)."""
    return tensor.as_subclass(torch.Tensor)


def _device_of(value: Any) -> torch.device | None:
    if isinstance(value, torch.device):
        return value
    if isinstance(value, str):
        return torch.device(value)
    return None


def _target(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device | None:
    """Where `.to(...)` sends a tensor, if it names a device."""
    named = _device_of(kwargs.get("device"))
    if named is not None:
        return named
    for arg in args[1:]:
        found = _device_of(arg)
        if found is not None:
            return found
        if isinstance(arg, torch.Tensor):
            return DEVICE if isinstance(arg, OnDevice) else HOST
    return None


_CROSSINGS: set[Callable[..., Any]] = {torch.Tensor.copy_, torch.Tensor.__setitem__}
"""Operations that may take a host tensor into a device one (or back), as CUDA allows."""
_SHAPED_LIKE: set[Callable[..., Any]] = {torch.Tensor.view_as, torch.Tensor.reshape_as,
                                         torch.Tensor.expand_as}
"""Operations that read only the shape of their second tensor: the result is where the
first one is."""


class EmulatedDevice(TorchFunctionMode):
    def __torch_function__(self, func: Callable[..., Any], types: Any,
                           args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
                           ) -> Any:
        kwargs = dict(kwargs or {})
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        on_device = [t for t in tensors if isinstance(t, OnDevice)]
        if func == torch.Tensor.device.__get__:  # type: ignore[attr-defined]
            return DEVICE if on_device else HOST
        if getattr(func, "__name__", "") in ("__get__", "__set__"):  # p.grad = g, p.data
            if func.__name__ == "__set__" and _mixed(args[0], args[1:]):
                raise RuntimeError("assigned grad has data located on a different device")
            return func(*args, **kwargs)
        if func in _SHAPED_LIKE:
            result = func(*tree_map(_unwrap, args), **kwargs)
            return _wrap(result) if isinstance(args[0], OnDevice) else result
        if func is torch.Tensor.numpy and on_device:
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use "
                            "Tensor.cpu() to copy the tensor to host memory first.")
        plain_args, plain_kwargs = tree_map(_unwrap, (args, kwargs))
        if func in (torch.Tensor.to, torch.Tensor.cpu):
            target = HOST if func is torch.Tensor.cpu else _target(args, kwargs)
            if target is not None:
                plain_args = (plain_args[0], *(HOST if _device_of(a) == DEVICE else a
                                               for a in plain_args[1:]))
                if _device_of(plain_kwargs.get("device")) == DEVICE:
                    plain_kwargs["device"] = HOST
                result = func(*plain_args, **plain_kwargs)
                return _wrap(result) if target == DEVICE else result
        if _device_of(kwargs.get("device")) == DEVICE:  # made on the device
            plain_kwargs["device"] = HOST
            return _wrap(func(*plain_args, **plain_kwargs))
        if on_device and func not in _CROSSINGS:
            host = [t for t in tensors if not isinstance(t, OnDevice) and t.dim() > 0]
            if host:
                raise RuntimeError("Expected all tensors to be on the same device, but found "
                                   "at least two devices, cuda:0 and cpu!")
        result = func(*plain_args, **plain_kwargs)
        if func in _CROSSINGS:
            return args[0] if func is torch.Tensor.copy_ else result
        return tree_map(_wrap, result) if on_device else result


def _unwrap(value: Any) -> Any:
    return on_host(value) if isinstance(value, OnDevice) else value


def _mixed(tensor: Any, others: Any) -> bool:
    """Whether a device tensor meets a host one (other than a 0-dim one), or the reverse."""
    values = [v for v in tree_flatten(others)[0] if isinstance(v, torch.Tensor) and v.dim()]
    return isinstance(tensor, torch.Tensor) and any(
        isinstance(v, OnDevice) != isinstance(tensor, OnDevice) for v in values)


def _wrap(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and not isinstance(value, OnDevice):
        return value.as_subclass(OnDevice)
    return value
