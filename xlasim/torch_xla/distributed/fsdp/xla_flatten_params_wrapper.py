"""``XlaFlattenParamsWrapper``: the module that ``XlaFullyShardedDataParallel`` puts between
itself and the wrapped module (``fsdp._fsdp_wrapped_module._fpw_module`` is the user's module).

torch_xla can also flatten the wrapped parameters into one vector here
(``flatten_parameters=True``); the simulator does not, so the wrapper holds no parameter of
its own and only shapes the names: ``state_dict()`` keys leave out ``_fpw_module.`` and
``load_state_dict`` puts it back, as torch_xla's wrapper does.
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["XlaFlattenParamsWrapper"]

_INNER = "_fpw_module."


def _drop_inner_prefix(module: nn.Module, state_dict: Any, prefix: str, *_: Any) -> None:
    # Keys the wrapped module wrote, "<prefix>_fpw_module.<rest>", become "<prefix><rest>".
    for key in [k for k in state_dict if k.startswith(prefix + _INNER)]:
        state_dict[prefix + key[len(prefix) + len(_INNER) :]] = state_dict.pop(key)


def _restore_inner_prefix(module: nn.Module, state_dict: Any, prefix: str, *_: Any) -> None:
    for key in [k for k in state_dict if k.startswith(prefix)]:
        state_dict[prefix + _INNER + key[len(prefix) :]] = state_dict.pop(key)


class XlaFlattenParamsWrapper(nn.Module):
    """Holds ``module`` as ``_fpw_module`` and forwards calls, attributes and indexing to it."""

    def __init__(
        self,
        module: nn.Module,
        param_list: Any = None,
        flat_param_names: list[str] | None = None,
        auto_unflatten_state_dict: bool | None = True,
    ) -> None:
        groups = [list(g) for g in param_list] if param_list is not None else None
        if groups is None or any(groups):
            raise NotImplementedError(
                "xlasim does not simulate XlaFlattenParamsWrapper flattening parameters "
                "(param_list with parameters; XlaFullyShardedDataParallel's "
                "flatten_parameters=True); pass param_list=[[]]"
            )
        super().__init__()
        self._fpw_module = module
        self.flat_param_names: list[str] = []
        self.is_flattened = True
        self._auto_unflatten_state_dict = auto_unflatten_state_dict
        self.register_state_dict_post_hook(_drop_inner_prefix)
        self.register_load_state_dict_pre_hook(_restore_inner_prefix)

    @property
    def module(self) -> nn.Module:
        return self._fpw_module

    @property
    def flat_params(self) -> list[nn.Parameter]:
        return []

    def metadata(self, flat_param_idx: int) -> Any:
        raise IndexError(f"flat_param_idx {flat_param_idx}: this wrapper flattens no parameters")

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_fpw_module"], name)

    def __getitem__(self, key: Any) -> Any:
        return self._modules["_fpw_module"].__getitem__(key)  # type: ignore[index,operator]

    def forward(self, *inputs: Any, **kwinputs: Any) -> Any:
        return self._fpw_module(*inputs, **kwinputs)
