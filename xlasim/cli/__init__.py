"""The ``xlasim`` command: ``run``, ``describe``, ``demo`` and ``ray-node`` (``commands``), the
launcher that starts one process per simulated host (``launcher``), the slice drawing
(``describe``) and the demo's training job (``demo``)."""
