"""A pending graph as torch_xla's HLO text (``hlo_text``), and as a real TPU executable: replayed
into JAX (``aten_to_jax``) and compiled by libtpu for the slice's topology (``libtpu``, the
optional ``tpu-compiler`` extra, imported only when a simulation asks for it)."""
