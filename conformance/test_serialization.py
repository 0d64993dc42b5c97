"""``torch_xla.utils.serialization``: data with device tensors saved as references plus one
file per tensor, loaded back as CPU tensors (layout and behaviour of real torch_xla 2.9 CPU)."""

from __future__ import annotations

import os

import torch


def test_save_and_load_round_trip(xla_target, tmp_path):
    import torch_xla
    import torch_xla.utils.serialization as xser

    dev = torch_xla.device()
    weight = torch.arange(6.0, device=dev).reshape(2, 3) * 2
    data = {"w": weight, "meta": ("step", 3), "pair": [weight, torch.ones(2, device=dev)]}
    path = str(tmp_path / "ckpt.pt")
    xser.save(data, path)
    # One file per distinct tensor, next to the data file.
    assert sorted(os.listdir(path + ".tensors")) == ["tensor_0.pt", "tensor_1.pt"]
    plain = torch.load(path, weights_only=False)
    assert isinstance(plain["w"], xser.TensorReference)
    loaded = xser.load(path)
    assert loaded["w"].device.type == "cpu"  # loaded as saved; moving it is the caller's
    assert loaded["w"].cpu().tolist() == [[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]]
    assert loaded["pair"][0] is loaded["w"]  # shared before, shared after
    assert loaded["meta"] == ["step", 3]  # tuples come back as lists
