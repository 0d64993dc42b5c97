"""Sharding logic: meshes, partition specs, OpSharding rules, propagation, device layout.

Pure functions and values over shapes and device ids.  Nothing here reads or writes the
simulated runtime; the slice comes in as a ``tpu_backend.topology.SliceSpec`` (or anything
with its fields) and tensors only as shapes and values.

* ``op_sharding``: the ``xla::OpSharding`` proto, its spec strings, shard shapes and indices;
* ``tensor_sharding``: an OpSharding bound to a global shape (a tensor's annotation);
* ``mesh``: torch_xla's mesh and partition-spec arithmetic;
* ``device_mesh``: ``HybridMesh``'s layout of a logical mesh on the slice's torus;
* ``device_layout``: each device's attributes (chip coordinates, core);
* ``propagation``: the output shardings of an SPMD graph that can be derived exactly.
"""
