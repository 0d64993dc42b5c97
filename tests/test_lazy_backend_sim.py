"""torch_xla registers its kernels once per process, at import: real torch_xla 2.9 on CPU
counts ``RegisterXLAFunctions`` once right after import, and ``_init_xla_lazy_backend`` adds
nothing (not even after the counters were cleared)."""

from __future__ import annotations


def test_kernels_register_once_per_process(xlasim_sim):
    import torch_xla
    import torch_xla.debug.metrics as met

    assert met.counter_value("RegisterXLAFunctions") == 1
    torch_xla._XLAC._init_xla_lazy_backend()
    torch_xla._XLAC._init_xla_lazy_backend()
    assert met.counter_value("RegisterXLAFunctions") == 1
    met.clear_all()
    assert torch_xla._XLAC._init_xla_lazy_backend() is None
    assert met.counter_value("RegisterXLAFunctions") is None
