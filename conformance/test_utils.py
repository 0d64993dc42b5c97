"""torch_xla.utils.utils, the plain helpers that examples and client libraries import."""

from __future__ import annotations

import pytest
import torch


def test_getenv_as_and_print_fn(xla_target, monkeypatch, capsys):
    import torch_xla.utils.utils as xu

    monkeypatch.setenv("XLASIM_CONF_FLAG", "0")
    monkeypatch.setenv("XLASIM_CONF_RATE", "0.25")
    monkeypatch.delenv("XLASIM_CONF_UNSET", raising=False)
    assert xu.getenv_as("XLASIM_CONF_FLAG", bool) is False
    assert xu.getenv_as("XLASIM_CONF_RATE", float, 0.4) == 0.25
    assert xu.getenv_as("XLASIM_CONF_UNSET", int, 7) == 7
    monkeypatch.setenv("DEBUG", "1")
    xu.get_print_fn()("shown")
    xu.get_print_fn(debug=0)("hidden")
    assert capsys.readouterr().err == "shown\n"


def test_sample_generator_and_nesting(xla_target):
    import torch_xla.utils.utils as xu

    data = (torch.zeros(2), torch.ones(2))
    gen = xu.SampleGenerator(data, 3)
    assert len(gen) == 3
    assert [batch is data for batch in gen] == [True, True, True]
    assert len(list(gen)) == 3  # every iter() starts a fresh pass
    assert xu.shape([[1, 2, 3], [4, 5, 6]]) == [2, 3]
    assert xu.shape(5) == []
    with pytest.raises(AssertionError):
        xu.shape([[1, 2], [3]])
    assert xu.flatten_nested_tuple([1, (2, [3, 4]), 5]) == (1, 2, 3, 4, 5)
    assert xu.as_list(4) == [4] and xu.as_list((4,)) == (4,)
    base = (1, 2)
    assert xu.list_copy_append(base, 3) == [1, 2, 3] and base == (1, 2)


def test_fn_data_generator(xla_target):
    import torch_xla.utils.utils as xu

    made = []

    def make(*shape):
        made.append(shape)
        return torch.full(shape, float(len(made)))

    gen = xu.FnDataGenerator(lambda x: x.sum(), 4, make, dims=(2, 3), count=2)
    assert len(gen) == 2
    batches = [(data.shape, target.item()) for data, target in gen]
    assert batches == [(torch.Size([4, 2, 3]), 24.0), (torch.Size([4, 2, 3]), 48.0)]
    assert len(list(gen)) == 2  # every iter() starts a fresh pass
    assert made == [(4, 2, 3)] * 4
    flat = xu.FnDataGenerator(lambda x: x, 5, make)  # dims default to [1]
    assert flat.next()[0].shape == torch.Size([5, 1])
    with pytest.raises(StopIteration):
        flat.next()
    samples = xu.SampleGenerator("x", 1)
    assert next(samples) == "x"
    with pytest.raises(StopIteration):
        next(samples)
    assert list(samples) == ["x"]


def test_for_each_instance_rewrite(xla_target):
    import torch_xla.utils.utils as xu

    class Box:
        def __init__(self, items):
            self.items = items

    shared = torch.ones(1)
    value = {"a": (shared, 2), "b": [shared, Box([torch.zeros(1)])]}
    seen = []
    xu.for_each_instance(value, lambda x: isinstance(x, torch.Tensor), seen.append)
    assert len(seen) == 2  # the shared tensor once
    out = xu.for_each_instance_rewrite(
        value, lambda x: isinstance(x, torch.Tensor), lambda t: t + 1
    )
    assert isinstance(out["a"], list)  # tuples come back as lists
    assert out["a"][0] is out["b"][0]  # sharing survives the rewrite
    assert out["a"][0].tolist() == [2.0] and out["a"][1] == 2
    assert isinstance(out["b"][1], Box) and out["b"][1] is not value["b"][1]
    assert out["b"][1].items[0].tolist() == [1.0]
    assert value["b"][1].items[0].tolist() == [0.0]  # the input is left alone

    class Pair(xu.DataWrapper):
        def __init__(self, x, y):
            self.x, self.y = x, y

        def get_tensors(self):
            return [self.x, self.y]

        def from_tensors(self, tensors):
            return Pair(*tensors)

    moved = xu.for_each_instance_rewrite(
        [Pair(torch.zeros(1), torch.ones(1))],
        lambda x: isinstance(x, torch.Tensor),
        lambda t: t * 3,
    )
    assert moved[0].y.tolist() == [3.0]
    with pytest.raises(NotImplementedError):
        xu.DataWrapper().get_tensors()


def test_for_each_instance_and_rewrite_visit_in_one_order(xla_target):
    # Real torch_xla 2.9: both walk depth first, a dict's key before its value, each object
    # once, so what one collects lines up with what the other converts.
    import torch_xla.utils.utils as xu

    class Box:
        def __init__(self, label):
            self.label = label
            self.items = {"n": (7, 8), 0.5: ["p", {"q": 9}]}

    common = Box("c")
    data = [{"x": 1.5, 3: Box("a")}, (common, "z"), {4: common}]
    primitive = lambda x: isinstance(x, (int, str, float))  # noqa: E731
    collected, converted = [], []
    xu.for_each_instance(data, primitive, collected.append)
    xu.for_each_instance_rewrite(data, primitive, lambda x: converted.append(x) or x)
    assert collected == converted
    assert collected == ["x", 1.5, 3, "a", "n", 7, 8, 0.5, "p", "q", 9, "c", "z", 4]


def test_distribution_metadata(xla_target):
    # Client libraries (Lightning) read the installed version before importing torch_xla.
    import importlib.metadata

    import torch_xla.version

    assert importlib.metadata.version("torch_xla") == "2.9.0"
    assert importlib.metadata.distribution("torch-xla").metadata["Name"] == "torch-xla"
    assert torch_xla.version.__version__ == "2.9.0"
