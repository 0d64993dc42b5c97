"""Simulated ``torch_xla.experimental.pallas_kernels``: the JAX kernels torch_xla ships."""
