"""Ray clusters of simulated TPU hosts: one machine's fake-TPU nodes and the pytest fixture
(``cluster``), and the nodes a big slice's hosts run on across machines (``node``, the
``xlasim ray-node`` command)."""
