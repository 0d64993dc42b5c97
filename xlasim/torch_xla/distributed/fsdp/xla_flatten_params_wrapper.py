"""``XlaFlattenParamsWrapper``: the module that ``XlaFullyShardedDataParallel`` puts between
itself and the wrapped module (``fsdp._fsdp_wrapped_module._fpw_module`` is the user's module).

With groups of parameters to flatten (FSDP's ``flatten_parameters=True``: trainable and frozen
ones apart), each group becomes one 1-D parameter ``flat_param_<i>`` of the wrapper, the
group's parameters concatenated in module order; the modules keep plain tensors that are
views into it, refreshed at each forward (FSDP swaps in the gathered full vector). With no
group (``param_list=[[]]``, FSDP's default) the wrapper only shapes names: ``state_dict()``
keys leave out ``_fpw_module.`` and ``load_state_dict`` puts it back, as in torch_xla.
"""

from __future__ import annotations

from typing import Any

import torch
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
        super().__init__()
        self._fpw_module = module
        if param_list is None:
            param_list = list(module.parameters())
        if param_list and isinstance(param_list[0], nn.Parameter):
            param_list = [param_list]
        if auto_unflatten_state_dict and any(param_list):
            raise NotImplementedError(
                "xlasim does not simulate XlaFlattenParamsWrapper's auto_unflatten_state_dict="
                "True (state_dict() with the original parameters of flattened groups); pass "
                "auto_unflatten_state_dict=False, as XlaFullyShardedDataParallel does"
            )
        groups = [g for g in (self._group_of(set(ps)) for ps in param_list) if g[0]]
        names = flat_param_names or [str(i) for i in range(len(groups))]
        if len(names) != len(groups):
            raise ValueError("Names and number of param lists must be equal")
        if len(names) != len(set(names)):
            raise ValueError("Each flat param must be given a unique name")
        self.flat_param_names = [f"flat_param_{n}" for n in names]
        # Per flat vector: numels, shapes, (module name, module, attribute) of each parameter
        # in it, and the places it is shared into. Kept here because FSDP replaces the
        # registered vectors with shards and, at each forward, with gathered tensors.
        self._layouts: list[tuple[list[int], list[torch.Size], list, list]] = []
        for name, (params, infos, shared) in zip(self.flat_param_names, groups, strict=True):
            flat = nn.Parameter(
                torch.cat([p.detach().reshape(-1) for p in params]),
                requires_grad=params[0].requires_grad,
            )
            self._layouts.append(
                ([p.numel() for p in params], [p.size() for p in params], infos, shared)
            )
            self.register_parameter(name, flat)
            for _, m, n in infos:
                delattr(m, n)
            for _, _, m, n, _, _ in shared:
                delattr(m, n)
        self.is_flattened = True
        self._auto_unflatten_state_dict = auto_unflatten_state_dict
        self._unflatten_params_as_views()
        self.register_state_dict_post_hook(_drop_inner_prefix)
        self.register_load_state_dict_pre_hook(_restore_inner_prefix)

    def _group_of(self, wanted: set[nn.Parameter]) -> tuple[list[nn.Parameter], list, list]:
        """The wanted parameters in module order, where each lives, and the later places a
        parameter seen before is shared into."""
        params: list[nn.Parameter] = []
        infos: list[tuple[str, nn.Module, str]] = []
        shared: list[tuple[str, str, nn.Module, str, nn.Module, str]] = []
        first: dict[nn.Parameter, tuple[str, nn.Module, str]] = {}
        for module_name, m in self.named_modules():
            for n, p in m.named_parameters(recurse=False):
                if p not in wanted:
                    continue
                if p in first:
                    shared.append((module_name, *first[p][:1], m, n, *first[p][1:]))
                    continue
                first[p] = (module_name, m, n)
                infos.append((module_name, m, n))
                params.append(p)
        if len({p.dtype for p in params}) > 1:
            raise AssertionError("expects all parameters to have same dtype")
        if len({p.requires_grad for p in params}) > 1:
            raise AssertionError("expects all parameters to have same requires_grad")
        return params, infos, shared

    def _unflatten_params_as_views(self) -> None:
        """Point every flattened module attribute at its slice of the current flat vectors."""
        for flat, (numels, shapes, infos, shared) in zip(
            self.flat_params, self._layouts, strict=True
        ):
            views = {}
            offset = 0
            for (_, m, n), numel, shape in zip(infos, numels, shapes, strict=True):
                views[(id(m), n)] = flat[offset : offset + numel].view(shape)
                object.__setattr__(m, n, views[(id(m), n)])
                offset += numel
            for _, _, m, n, first_m, first_n in shared:
                object.__setattr__(m, n, views[(id(first_m), first_n)])

    @property
    def module(self) -> nn.Module:
        return self._fpw_module

    @property
    def flat_params(self) -> list[Any]:
        return [getattr(self, n) for n in self.flat_param_names]

    def metadata(self, flat_param_idx: int) -> tuple[list[str], list[torch.Size], list[int]]:
        """(names, shapes, numels) of the parameters in ``flat_param_<flat_param_idx>``."""
        numels, shapes, infos, _ = self._layouts[flat_param_idx]
        return [f"{m}.{n}" if m else n for m, _, n in infos], list(shapes), list(numels)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_fpw_module"], name)

    def __getitem__(self, key: Any) -> Any:
        return self._modules["_fpw_module"].__getitem__(key)  # type: ignore[index,operator]

    def forward(self, *inputs: Any, **kwinputs: Any) -> Any:
        self._unflatten_params_as_views()
        return self._fpw_module(*inputs, **kwinputs)
