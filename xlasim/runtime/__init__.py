"""The simulated runtime's state: device, tensors, lazy graphs, metrics, memory, hosts; and the
optional TPU-compiler layer (``libtpu_compiler``, ``aten_to_jax``), imported only when asked."""
