"""Small pieces of torch_xla 2.9's Python surface that upstream's TPU CI tests use (facts from
its source; the RNG behaviour also measured on real torch_xla 2.9 with PJRT_DEVICE=CPU): the
module aliases its package exposes (``torch_xla.xm`` ...), ``xm.fork_rng``, and
``scan_layers``'s cache of the step function of pure layers."""

from __future__ import annotations

import torch

import xlasim


def test_package_module_aliases_and_fork_rng():
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla
        import torch_xla.core.xla_env_vars
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime
        import torch_xla.utils.utils

        assert torch_xla.xm is xm and torch_xla.xr is torch_xla.runtime
        assert torch_xla.xu is torch_xla.utils.utils
        assert torch_xla.xenv is torch_xla.core.xla_env_vars
        assert torch_xla.tpu.__name__ == "torch_xla._internal.tpu"
        assert torch_xla.xmp.__name__ == "torch_xla.distributed.xla_multiprocessing"

        dev = torch_xla.device()
        xm.set_rng_state(42)
        first = torch.randn(4, device=dev).cpu()
        xm.set_rng_state(42)
        with xm.fork_rng():
            torch.randn(4, device=dev)
        # the fork put the RNG back: the next draw is the one right after seeding
        assert torch.equal(torch.randn(4, device=dev).cpu(), first)
        xm.set_rng_state(42)
        with xm.fork_rng(enabled=False):
            torch.randn(4, device=dev)
        assert not torch.equal(torch.randn(4, device=dev).cpu(), first)


def test_scan_layers_caches_the_step_of_pure_layers_only():
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla
        import torch_xla.experimental.scan_layers as scan_layers_module
        from torch_xla.experimental.scan_layers import scan_layers

        dev = torch_xla.device()
        layers = [torch.nn.Linear(4, 4).to(dev) for _ in range(3)]
        x = torch.randn(2, 4, device=dev)
        scan_layers_module._ONE_LAYER_CACHE.clear()
        scan_layers(layers, x.clone())
        assert len(scan_layers_module._ONE_LAYER_CACHE) == 0
        out = scan_layers(layers, x.clone(), is_layer_pure=True)
        scan_layers(layers, x.clone(), is_layer_pure=True)
        # Keyed by (id(partition_fn), id(first layer)), the partition_fn defaulting to
        # functorch's default_partition (torch_xla 2.9's scan_layers signature).
        from torch._functorch.partitioners import default_partition

        assert list(scan_layers_module._ONE_LAYER_CACHE) == [(id(default_partition), id(layers[0]))]
        expected = x
        for layer in layers:
            expected = layer(expected)
        torch.testing.assert_close(out.cpu(), expected.cpu())


def test_runtime_device_attributes_are_the_devices_own():
    # upstream's pjrt/test_runtime_tpu.py: a device's attributes are coords, core_on_chip and
    # num_cores; the global list adds each device's name (real torch_xla 2.9 on CPU: {} and
    # [{'name': 'CPU:0'}])
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla
        import torch_xla.runtime as xr

        own = xr.runtime_device_attributes(str(torch_xla.device()))
        assert sorted(own) == ["coords", "core_on_chip", "num_cores"]
        everyone = xr.global_runtime_device_attributes()
        assert sorted(everyone[0]) == ["coords", "core_on_chip", "name", "num_cores"]
        assert xr.runtime_device_attributes("TPU:2")["coords"] == everyone[2]["coords"]


def test_scan_module_helpers_and_its_graph_cache():
    # torch_xla 2.9's scan module (its source): tree_flatten_none drops None leaves and puts
    # them back; the traced graphs of a pure fn are kept per fn and input structure
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla
        import torch_xla.experimental.scan as scan_module

        tree = {"a": 1, "b": None, "c": (2, None, 3)}
        flat, unflatten = scan_module.tree_flatten_none(tree)
        assert flat == [1, 2, 3]
        assert unflatten([10, 20, 30]) == {"a": 10, "b": None, "c": (20, None, 30)}
        scan_module._SCAN_COMPUTATION_CACHE.clear()  # upstream's tests clear it in setUp

        def step(c, x):
            return c + x, c * x

        dev = torch_xla.device()
        xs = torch.ones(3, 2, device=dev)
        scan_module.scan(step, torch.zeros(2, device=dev), xs, is_fn_pure=True)
        scan_module.scan(step, torch.zeros(2, device=dev), xs[:2], is_fn_pure=True)
        assert len(scan_module._SCAN_COMPUTATION_CACHE[step]) == 1  # keyed by one step's shape
        scan_module.scan(
            step, torch.zeros(3, device=dev), torch.ones(2, 3, device=dev), is_fn_pure=True
        )
        assert len(scan_module._SCAN_COMPUTATION_CACHE[step]) == 2
