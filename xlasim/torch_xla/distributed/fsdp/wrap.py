"""Auto-wrap policies of ``torch_xla.distributed.fsdp.wrap``: which submodules of a model
an FSDP wrapper wraps on its own, and the walk that wraps them.

A policy is called twice per module: with ``recurse=True`` to ask whether to look into the
module's children, and with ``recurse=False`` to ask whether to wrap the module itself
(``unwrapped_params`` counts the parameters its wrapped children did not take).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from torch import nn

__all__ = [
    "always_wrap_policy",
    "lambda_auto_wrap_policy",
    "recursive_wrap",
    "size_based_auto_wrap_policy",
    "transformer_auto_wrap_policy",
]


def always_wrap_policy(*args: Any, **kwargs: Any) -> bool:
    """Wrap every submodule as its own unit."""
    return True


def lambda_auto_wrap_policy(
    module: nn.Module, recurse: bool, unwrapped_params: int, lambda_fn: Callable[..., Any]
) -> bool:
    """Look into every module; wrap the ones ``lambda_fn`` says yes to."""
    return True if recurse else bool(lambda_fn(module))


def transformer_auto_wrap_policy(
    module: nn.Module,
    recurse: bool,
    unwrapped_params: int,
    transformer_layer_cls: Collection[type[nn.Module]],
) -> bool:
    """Look into every module; wrap the instances of ``transformer_layer_cls``."""
    return True if recurse else isinstance(module, tuple(transformer_layer_cls))


def size_based_auto_wrap_policy(
    module: nn.Module,
    recurse: bool,
    unwrapped_params: int,
    min_num_params: int = int(1e8),
    force_leaf_modules: Collection[type[nn.Module]] | None = None,
    exclude_wrap_modules: Collection[type[nn.Module]] | None = None,
) -> bool:
    """Look into and wrap modules holding at least ``min_num_params`` unwrapped parameters;
    never look into ``force_leaf_modules`` nor wrap ``exclude_wrap_modules`` (defaults: the
    function's ``FORCE_LEAF_MODULES`` and ``EXCLUDE_WRAP_MODULES`` attributes)."""
    if unwrapped_params < min_num_params:
        return False
    # The defaults are public attributes of the policy (programs read and replace them), so
    # they are looked up at each call.
    defaults: Any = size_based_auto_wrap_policy
    if recurse:
        leaves = defaults.FORCE_LEAF_MODULES if force_leaf_modules is None else force_leaf_modules
        return not isinstance(module, tuple(leaves))
    excluded = (
        defaults.EXCLUDE_WRAP_MODULES if exclude_wrap_modules is None else exclude_wrap_modules
    )
    return not isinstance(module, tuple(excluded))


size_based_auto_wrap_policy.FORCE_LEAF_MODULES = {nn.MultiheadAttention}  # type: ignore[attr-defined]
size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES = {nn.ModuleList, nn.ModuleDict}  # type: ignore[attr-defined]


def _wrap_one(module: nn.Module, wrapper_cls: Callable[..., Any], **kwargs: Any) -> Any:
    # A module may carry its own settings for its wrapper; they win over the shared ones.
    overrides = getattr(module, "_wrap_overrides", None)
    return (
        wrapper_cls(module, **{**kwargs, **overrides})
        if overrides
        else wrapper_cls(module, **kwargs)
    )


def recursive_wrap(
    module: nn.Module,
    auto_wrap_policy: Callable[..., bool],
    wrapper_cls: Callable[..., Any],
    ignored_modules: Collection[nn.Module],
    ignored_params: Collection[nn.Parameter],
    only_wrap_children: bool = False,
    **kwargs: Any,
) -> tuple[nn.Module, int]:
    """Wrap, depth first, the submodules of ``module`` that ``auto_wrap_policy`` picks with
    ``wrapper_cls(submodule, **kwargs)``, and ``module`` itself unless ``only_wrap_children``.

    Returns the (possibly wrapped) module and how many parameters ended up wrapped.
    """
    assert auto_wrap_policy is not None, "Must specify auto_wrap_policy."
    assert wrapper_cls is not None, "Must specify wrapper_cls"
    if isinstance(wrapper_cls, type):
        for sub in module.modules():
            if sub not in ignored_modules:
                assert not isinstance(sub, wrapper_cls)
    # Membership as torch_xla tests it: a set of parameters (by identity); a list would
    # compare tensors by value and fail.
    total = sum(p.numel() for p in module.parameters() if p not in ignored_params)
    if not auto_wrap_policy(module=module, recurse=True, unwrapped_params=total):
        return module, 0
    wrapped = 0
    for name, child in list(module.named_children()):
        if child in ignored_modules:
            continue
        new_child, count = recursive_wrap(
            child, auto_wrap_policy, wrapper_cls, ignored_modules, ignored_params, **kwargs
        )
        setattr(module, name, new_child)
        wrapped += count
    if not only_wrap_children and auto_wrap_policy(
        module=module, recurse=False, unwrapped_params=total - wrapped
    ):
        return _wrap_one(module, wrapper_cls, **kwargs), total
    return module, wrapped


def _wrap_children(
    module: nn.Module,
    auto_wrap_policy: Callable[..., bool],
    wrapper_cls: Callable[..., Any],
    refused: type,
    refused_name: str,
    **kwargs: Any,
) -> None:
    """What both FSDP wrappers do with an ``auto_wrap_policy``: refuse a module that already
    holds one of them (named as torch_xla's message names it), then wrap the submodules the
    policy picks with ``wrapper_cls(submodule, **kwargs)``, leaving ``module`` itself."""
    for name, sub in module.named_modules():
        if isinstance(sub, refused):
            raise ValueError(
                f"Expected {name} to NOT be {refused_name} if using an `auto_wrap_policy`"
            )
    recursive_wrap(
        module=module,
        auto_wrap_policy=auto_wrap_policy,
        wrapper_cls=wrapper_cls,
        ignored_modules=[],
        ignored_params=[],
        only_wrap_children=True,
        **kwargs,
    )
