"""One training loop for TPU (TorchTPU or torch_xla), GPU and CPU, with no torch_xla call in it.

::

    trainer = SeamlessTPUTrainer(model, mixed_precision="bf16")
    model, optimizer, loader = trainer.prepare(model, optimizer, loader)
    for x, y in loader:
        optimizer.zero_grad()
        with trainer.autocast():
            loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()             # on XLA: reduce (if needed), step, one sync
        print(trainer.reduce_mean(loss))

The device is picked TPU -> GPU -> CPU (:func:`detect_device`).  Where TorchTPU is loaded
(``import torch_tpu``; Ray Train's TPU workers load it) its eager ``tpu`` device is the TPU:
the loop runs there as on a GPU (``DistributedDataParallel`` over its ``tpu_dist`` group when
``torch.distributed`` has several ranks, batches moved to the device, a plain optimizer step
with nothing to synchronize).  Otherwise, on XLA:

* the model moves to the XLA device; under SPMD its parameters are explicitly replicated
  over the mesh, so the first step's graph already has the input shardings every later
  step has (left unsharded, torch_xla 2.9 compiles step 2 again because its parameters come
  back ``{replicated}``; checked on PJRT CPU);
* ``optimizer.step()`` all-reduces gradients only where torch_xla needs it (multi-process
  without SPMD; under SPMD the compiler inserts the reductions), steps, and calls
  ``torch_xla.sync()`` exactly once, so the whole step is one compiled graph and the loss
  is materialized by it (reading it afterwards costs no extra graph);
* the data loader becomes a ``MpDeviceLoader``; under SPMD with input sharding along the
  mesh's first (data) axis, taken from the backend's mesh inside a Ray Train worker
  (``tpu_backend.get_xla_mesh()``), else the global mesh or a 1-D mesh over all devices.
  With several SPMD hosts every host iterates the same global batch and torch_xla
  transfers only the shards its devices hold (``trainer.num_data_loaders`` is 1).

Elsewhere the model is wrapped in ``DistributedDataParallel`` and the loader given a
``DistributedSampler`` when ``torch.distributed`` is initialized with several ranks (Ray
Train's CPU/GPU workers), and batches are moved to the device.

The parts: :mod:`~tpu_backend.seamless.device` (which device, moving data there),
:mod:`~tpu_backend.seamless.trainer`, :mod:`~tpu_backend.seamless.optimizer` and
:mod:`~tpu_backend.seamless.loader`.  ``import tpu_backend.seamless`` never imports
torch_xla; it is imported only once an XLA device has been detected.
"""

from tpu_backend.seamless.device import DeviceInfo, detect_device, to_device, xla_configured
from tpu_backend.seamless.optimizer import SeamlessOptimizer
from tpu_backend.seamless.trainer import SeamlessTPUTrainer

__all__ = [
    "DeviceInfo",
    "SeamlessOptimizer",
    "SeamlessTPUTrainer",
    "detect_device",
    "to_device",
    "xla_configured",
]
