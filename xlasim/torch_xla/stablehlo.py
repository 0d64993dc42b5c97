"""``torch_xla.stablehlo``: a ``torch.export`` program as a callable "StableHLO" program.

torch_xla traces the exported graph on the XLA device and keeps the traced StableHLO module;
calling the result runs that module.  The simulator keeps the exported program's decomposed
core-ATen graph instead and runs it on the simulated device (every op computes there, as any
other device op does), so results, output devices and dtypes are torch_xla's.

The StableHLO text and bytecode of a program come from jax's lowering of the same graph
(``xlasim.runtime.compiler.stablehlo``), which needs the ``tpu-compiler`` extra; without it,
asking for them raises ``NotImplementedError`` naming the extra.  They are made when first
asked for, so exporting and running never need the extra.

The program's inputs are in torch_xla's order, the one its trace finishes them in (a walk of
the graph from the outputs); with ``inline_all_constant=False`` the scalar operands other than
0 and 1 are inputs too, kept in the bundle's ``additional_constants``.  Difference from
torch_xla, in bookkeeping: every state the graph reads (parameters, buffers, lifted constant
tensors) is in the bundle's ``state_dict`` (torch_xla makes some of them trace constants).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as metrics
from torch._decomp import core_aten_decompositions, get_decompositions
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.utils import _pytree as pytree

from xlasim.runtime.settings import tpu_compiler_layer

# The simulator's own file next to torch_xla's in a saved program: the decomposed exported
# program, which is what the simulator runs (torch_xla runs the ``.bytecode`` file).
_PROGRAM_SUFFIX = ".xlasim.pt2"


@dataclass
class StableHLOExportOptions:
    include_human_readable_text: bool = True
    override_tracing_arguments: tuple[Any, ...] | None = None
    override_tracing_kwargs: Mapping[str, Any] | None = None
    save_weights: bool = True
    # Every scalar constant inlined in the module (False: only 0 and 1; the rest are inputs).
    inline_all_constant: bool = True
    export_weights: bool = True
    # Namespaces of ops exported as stablehlo.custom_call.
    custom_ops_allowed_in_graph: set[str] = field(default_factory=set)
    # Node metadata written as the module's locations.
    export_node_metadata: bool = False


class VariableType(enum.Enum):
    INPUT_ARG = "input_arg"
    PARAMETER = "parameter"
    CONSTANT = "constant"


@dataclass
class VariableSignature:
    shape: list[int]
    dtype: str
    dynamic_dims: list[int] = dataclasses.field(default_factory=list)


@dataclass
class InputLocation:
    type_: VariableType
    position: int = -1
    name: str = ""

    @classmethod
    def parameter(cls, name: str) -> InputLocation:
        return cls(type_=VariableType.PARAMETER, name=name)

    @classmethod
    def input_arg(cls, position: int) -> InputLocation:
        return cls(type_=VariableType.INPUT_ARG, position=position)

    @classmethod
    def constant(cls, position: int) -> InputLocation:
        return cls(type_=VariableType.CONSTANT, position=position)


@dataclass
class StableHLOFunctionMeta:
    name: str
    stablehlo_version: str
    # One per input of the program, in its order; ``input_locations`` says where each comes
    # from (a caller's argument, a state of the model, or a constant of the bundle).
    input_signature: list[VariableSignature]
    output_signature: list[VariableSignature]
    input_locations: list[InputLocation]
    unused_inputs: list[tuple[InputLocation, VariableSignature]]
    input_pytree_spec: str | None = None
    output_pytree_spec: str | None = None


class StableHLOJSONSerializer(json.JSONEncoder):
    def default(self, o: Any) -> Any:
        if dataclasses.is_dataclass(o) and not isinstance(o, type):
            return dataclasses.asdict(o)
        if isinstance(o, VariableType):
            return o.value
        return super().default(o)


_META_CLASSES: tuple[type, ...] = ()  # filled below, once StableHLOFunc exists


def stablehlo_obj_hook(dct: dict[str, Any]) -> Any:
    """``json.load``'s object hook for a saved ``.meta`` file: a dict whose keys are exactly a
    meta dataclass's fields becomes that dataclass (other dicts come back as ``None``)."""
    for cls in _META_CLASSES:
        if {f.name for f in dataclasses.fields(cls)} == dct.keys():
            return cls(**{k: _as_variable_type(v) for k, v in dct.items()})
    return None


def _as_variable_type(value: Any) -> Any:
    try:
        return VariableType(value)
    except (ValueError, TypeError):
        return value


@dataclass
class StableHLOFunc:
    meta: StableHLOFunctionMeta
    bytecode: bytes | None
    text: str | None


_META_CLASSES = (StableHLOFunctionMeta, StableHLOFunc, VariableSignature, InputLocation)


@dataclass
class StableHLOModelBundle:
    # The model's states as numpy arrays, by name.
    state_dict: dict[str, Any]
    additional_constants: list[np.ndarray]
    stablehlo_funcs: list[StableHLOFunc]


@dataclass
class _Program:
    """What the simulator runs for one function: the decomposed exported program, and the
    Python values export fixed for its non-tensor placeholders (placeholder position -> value);
    ``module`` is its graph cut down to the outputs the caller gets, and ``order`` the positions
    of the placeholders that are the program's inputs, in the program's order. Without
    ``inline_all_constant`` the scalar operands other than 0 and 1 are inputs too: ``lifted``
    holds their values by the position of the placeholder each became."""

    exported: ExportedProgram
    fixed: dict[int, Any]
    lower_text: bool
    inline_all_constant: bool = True
    # Namespaces of the ops written as custom calls (custom_ops_allowed_in_graph).
    custom_namespaces: frozenset[str] = frozenset()
    module: torch.fx.GraphModule = field(init=False)
    lifted: dict[int, np.ndarray] = field(init=False)
    order: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.module = _returned_only(self.exported)
        self.lifted = {} if self.inline_all_constant else _lift_scalars(self.module)
        self.order = _program_order(self.module, self.fixed)


# Scalars torch_xla keeps in the module when it makes the others inputs.
_SPECIAL_SCALARS = (0, 1)


def _lift_scalars(module: torch.fx.GraphModule) -> dict[int, np.ndarray]:
    """Each Python number an op takes as a tensor operand, other than 0 and 1, becomes a new
    placeholder of a 0-d tensor of the op's result type (``sub(x, 5)`` on float32 ``x``: a
    float32 input); returns their values by placeholder position."""
    graph = module.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    lifted: dict[int, np.ndarray] = {}
    for node in list(graph.nodes):
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None:
            continue
        tensors = [a.meta["val"] for a in node.all_input_nodes if "val" in a.meta]
        args = list(node.args)
        for i, (arg, spec) in enumerate(zip(args, schema.arguments, strict=False)):
            number = isinstance(arg, (int, float)) and not isinstance(arg, bool)
            if not number or not isinstance(spec.type, torch.TensorType):
                continue
            if arg in _SPECIAL_SCALARS:
                continue
            dtype = torch.result_type(tensors[0], arg) if tensors else torch.get_default_dtype()
            value = torch.tensor(arg, dtype=dtype)
            with graph.inserting_after(placeholders[-1]):
                placeholder = graph.placeholder(f"_scalar_{len(lifted)}")
            placeholder.meta["val"] = value
            placeholders.append(placeholder)
            lifted[len(placeholders) - 1] = value.numpy()
            args[i] = placeholder
        node.args = tuple(args)
    module.recompile()
    return lifted


def _ir_operands(node: torch.fx.Node) -> list[torch.fx.Node]:
    """``node``'s operands in the order of torch_xla's IR node for its op: ``addmm`` takes its
    two matrices first, then the bias (measured: a Linear layer's program takes the bias first,
    then the weight, then the input)."""
    if node.target is torch.ops.aten.addmm.default:
        bias, mat1, mat2 = node.args[:3]
        return [a for a in (mat1, mat2, bias) if isinstance(a, torch.fx.Node)]
    return node.all_input_nodes


def _program_order(module: torch.fx.GraphModule, fixed: dict[int, Any]) -> list[int]:
    """The placeholder positions of the program's inputs in torch_xla's order: its trace walks
    the graph depth first from each output in turn, an op's last operand first, and numbers
    the inputs as the walk finishes them (``sub(x, y)`` takes ``y`` as its first input)."""
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    position = {node: i for i, node in enumerate(placeholders)}
    output = next(n for n in module.graph.nodes if n.op == "output")
    order: list[int] = []
    seen: set[torch.fx.Node] = set()
    for root in output.all_input_nodes:
        stack: list[tuple[torch.fx.Node, bool]] = [(root, False)]
        while stack:
            node, finished = stack.pop()
            if finished:
                if node in position and position[node] not in fixed:
                    order.append(position[node])
                continue
            if node in seen:
                continue
            seen.add(node)
            stack.append((node, True))
            stack.extend((operand, False) for operand in _ir_operands(node))
    return order


def _returned_only(exported: ExportedProgram) -> torch.fx.GraphModule:
    """The exported graph returning only the model's outputs: an exported program returns the
    mutated buffers' new values first, which torch_xla's program drops (the buffers themselves
    are not updated), and what only they need is not computed."""
    graph = copy.deepcopy(exported.graph)
    output = next(n for n in graph.nodes if n.op == "output")
    mutated = len(exported.graph_signature.buffers_to_mutate)
    output.args = (tuple(output.args[0])[mutated:],)
    graph.eliminate_dead_code()
    return torch.fx.GraphModule(exported.graph_module, graph)


# -- running -------------------------------------------------------------------------------------
class XLAExportInterpreter(torch.fx.Interpreter):
    """Runs an exported graph's nodes on ``device``: ops that create tensors get the device, and
    a Python float given where the op takes a tensor becomes a tensor of the default dtype (as
    torch_xla does; the dispatcher would otherwise wrap it as a double)."""

    def __init__(
        self,
        module: torch.fx.GraphModule,
        device: torch.device,
        custom_ops_allowed_in_graph: set[str] | None = None,
        gm_serializer: Any = None,
    ) -> None:
        super().__init__(module)
        self._device = device
        self.custom_ops_allowed_in_graph = custom_ops_allowed_in_graph or set()
        self.gm_serializer = gm_serializer
        self.tensor_id_to_dynamic_dims: dict[int, list[int]] = {}
        # Set while checking the program can be captured: a custom call's results are then
        # empty tensors of its shapes (that trace is dropped, never read).
        self.stand_in_custom_calls = False

    def run_node(self, n: torch.fx.Node) -> Any:
        target = n.target
        namespace = getattr(target, "namespace", None)
        if n.op == "call_function" and namespace in self.custom_ops_allowed_in_graph:
            if not self.stand_in_custom_calls:
                raise NotImplementedError(
                    f"xlasim: running the custom call {target} (an op of "
                    "custom_ops_allowed_in_graph, a stablehlo.custom_call in the program) is "
                    "not simulated: its kernel is the backend's"
                )
            value = n.meta["val"]
            values = [value] if isinstance(value, torch.Tensor) else list(value)
            empty = [torch.empty(v.shape, dtype=v.dtype, device=self._device) for v in values]
            return empty[0] if isinstance(value, torch.Tensor) else tuple(empty)
        return super().run_node(n)

    def call_function(self, target: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        kwargs = dict(kwargs)
        if "device" in kwargs:
            kwargs["device"] = self._device
        schema = getattr(target, "_schema", None)
        if schema is not None:
            args = tuple(
                torch.tensor(a)
                if isinstance(a, float) and isinstance(spec.type, torch.TensorType)
                else a
                for a, spec in zip(args, schema.arguments, strict=False)
            )
        return super().call_function(target, args, kwargs)


def _on_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    if isinstance(value, torch.Tensor) and value.device != device:
        return value.to(device)
    return value


def _trace(program: _Program, call_args: list[Any], stand_ins: bool = False) -> list[Any]:
    """The program's outputs, pending on the device."""
    device = torch_xla.device()
    placeholders = sum(1 for n in program.module.graph.nodes if n.op == "placeholder")
    values = [program.fixed.get(i) for i in range(placeholders)]
    for position, arg in zip(program.order, call_args, strict=True):
        values[position] = _on_device(arg, device)
    with torch.no_grad():
        interpreter = XLAExportInterpreter(program.module, device, set(program.custom_namespaces))
        interpreter.stand_in_custom_calls = stand_ins
        outputs = interpreter.run(*values, enable_io_processing=False)
    return list(outputs)


def _run(program: _Program, call_args: list[Any]) -> list[Any]:
    outputs = _trace(program, call_args)
    # One program, run to its results (torch_xla executes the module when called).
    xm.unlazy([t for t in outputs if isinstance(t, torch.Tensor)])
    return outputs


def _extract_call_parameters(
    args: Any, meta: StableHLOFunctionMeta, bundle: StableHLOModelBundle
) -> list[Any]:
    if meta.input_pytree_spec is not None:
        args, _ = pytree.tree_flatten(args)
    found = []
    for location in meta.input_locations:
        if location.type_ == VariableType.PARAMETER:
            found.append(bundle.state_dict[location.name])
        elif location.type_ == VariableType.CONSTANT:
            found.append(bundle.additional_constants[location.position])
        else:
            found.append(args[location.position])
    return found


# -- the module ------------------------------------------------------------------------------
class StableHLOGraphModule:
    def __init__(self, bundle: StableHLOModelBundle) -> None:
        self._bundle = bundle
        self._name_to_stablehlo = {func.meta.name: func for func in bundle.stablehlo_funcs}
        self._default_method = bundle.stablehlo_funcs[0].meta.name
        # Filled by exported_program_to_stablehlo and load (the programs the simulator runs).
        self._programs: dict[str, _Program] = {}

    def evaluate(self, method_name: str, args: Any) -> Any:
        func = self._name_to_stablehlo[method_name]
        program = self._programs.get(method_name)
        if program is None:
            raise NotImplementedError(
                f"xlasim: running StableHLO bytecode is not simulated; the function "
                f"{method_name!r} has no exported program next to it (a directory saved by "
                "torch_xla's save_as_stablehlo, not by the simulated one)"
            )
        call_args = _extract_call_parameters(args, func.meta, self._bundle)
        outputs = _run(program, call_args)
        if func.meta.output_pytree_spec is not None:
            spec = pytree.treespec_loads(func.meta.output_pytree_spec)
            return pytree.tree_unflatten(outputs, spec)
        return outputs

    def _lowered(self, method_name: str) -> StableHLOFunc:
        func = self._name_to_stablehlo[method_name]
        program = self._programs.get(method_name)
        if func.bytecode is None and program is not None:
            func.bytecode, text = _lower(program)
            if program.lower_text:
                func.text = text
        return func

    def get_stablehlo_bytecode(self, method_name: str | None = None) -> bytes | None:
        return self._lowered(method_name or self._default_method).bytecode

    def get_stablehlo_text(self, method_name: str | None = None) -> str | None:
        name = method_name or self._default_method
        program = self._programs.get(name)
        if program is not None and not program.lower_text:  # include_human_readable_text=False
            return None
        return self._lowered(name).text

    def save(
        self, directory_path: str | os.PathLike, options: StableHLOExportOptions | None = None
    ) -> None:
        for name in self._name_to_stablehlo:
            self._lowered(name)
        _save_program_bundle(self._bundle, directory_path, options)
        functions = os.path.join(directory_path, "functions")
        for name, program in self._programs.items():
            torch.export.save(program.exported, os.path.join(functions, name + _PROGRAM_SUFFIX))
            fixed = os.path.join(functions, name + _PROGRAM_SUFFIX + ".fixed")
            with open(fixed, "w") as f:
                json.dump(
                    {
                        "fixed": {str(k): v for k, v in program.fixed.items()},
                        "inline_all_constant": program.inline_all_constant,
                        "custom_ops_allowed_in_graph": sorted(program.custom_namespaces),
                    },
                    f,
                )

    @classmethod
    def load(cls, directory_path: str | os.PathLike) -> StableHLOGraphModule:
        module = cls(_load_program_bundle(directory_path))
        functions = os.path.join(directory_path, "functions")
        for func in module._bundle.stablehlo_funcs:
            path = os.path.join(functions, func.meta.name + _PROGRAM_SUFFIX)
            if os.path.exists(path):
                with open(path + ".fixed") as f:
                    saved = json.load(f)
                if "fixed" not in saved:  # saved before the export options were kept
                    saved = {"fixed": saved}
                fixed = {int(k): v for k, v in saved["fixed"].items()}
                module._programs[func.meta.name] = _Program(
                    torch.export.load(path),
                    fixed,
                    func.text is not None,
                    saved.get("inline_all_constant", True),
                    frozenset(saved.get("custom_ops_allowed_in_graph", ())),
                )
        return module

    def __call__(self, *args: Any) -> Any:
        return self.evaluate(self._default_method, args)


def _lower(program: _Program) -> tuple[bytes, str]:
    # The compiler layer imports jax: only a program that asks for its StableHLO loads it.
    lowering = tpu_compiler_layer(
        "xlasim.runtime.compiler.stablehlo",
        "xlasim: StableHLO text and bytecode come from jax's lowering of the exported graph",
    )
    placeholders = [n for n in program.module.graph.nodes if n.op == "placeholder"]
    examples = [placeholders[i].meta["val"] for i in program.order]
    inputs = [(_symbolic_shape(example), example.dtype) for example in examples]
    lowered = lowering.lower_graph(
        program.module, program.fixed, program.order, inputs, program.custom_namespaces
    )
    return lowered.bytecode, lowered.text


# -- export --------------------------------------------------------------------------------------
# torch_xla decomposes exported programs with torch.export's defaults plus these.
_extra_decompositions = get_decompositions([torch.ops.aten.grid_sampler_2d])


def _run_decompositions(exported_model: ExportedProgram) -> ExportedProgram:
    table = (
        torch.export.default_decompositions()
        if hasattr(torch.export, "default_decompositions")
        else core_aten_decompositions()
    )
    table.update(_extra_decompositions)
    table[torch.ops.aten._safe_softmax.default] = torch.softmax
    return exported_model.run_decompositions(table)


def _symbolic_shape(example: torch.Tensor) -> list[int | str]:
    """An input's shape with each dynamic dimension as the expression of export's symbols."""
    return [d if isinstance(d, int) else str(d.node.expr) for d in example.shape]


def _signature(value: Any, output: bool = False) -> VariableSignature:
    """torch_xla's signature of an input or output: a dynamic dimension has the example's size
    and, for an input only, is listed in ``dynamic_dims`` (torch_xla reads outputs off its
    trace of the example)."""
    if isinstance(value, torch.Tensor):
        dims = [i for i, d in enumerate(value.shape) if not isinstance(d, int)]
        shape = [d if isinstance(d, int) else _example_size(d) for d in value.shape]
        dtype = str(value.dtype).removeprefix("torch.")
        return VariableSignature(shape, dtype, [] if output else dims)
    return VariableSignature([], type(value).__name__)


def _example_size(size: torch.SymInt) -> int:
    hint = size.node.hint
    return int(hint) if hint is not None else -1


def _inputs_read(outputs: list[Any]) -> set[torch.fx.Node]:
    """The placeholders the given output nodes depend on."""
    seen: set[torch.fx.Node] = set()
    stack = [o for o in outputs if isinstance(o, torch.fx.Node)]
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(node.all_input_nodes)
    return {n for n in seen if n.op == "placeholder"}


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy()


def _exported_program_to_stablehlo_bundle(
    exported_model: ExportedProgram, options: StableHLOExportOptions | None
) -> tuple[StableHLOModelBundle, _Program]:
    exported_model = _run_decompositions(exported_model)
    if options is None:
        options = StableHLOExportOptions()
    if options.export_node_metadata:
        raise NotImplementedError(
            "xlasim: StableHLOExportOptions.export_node_metadata is not simulated"
        )
    args, kwargs = exported_model.example_inputs
    assert len(kwargs) == 0, "Export to stablehlo doesnt support kwargs yet."

    states = {**exported_model.state_dict, **exported_model.constants}
    placeholders = [n for n in exported_model.graph.nodes if n.op == "placeholder"]
    outputs = next(n for n in exported_model.graph.nodes if n.op == "output").args[0]
    mutated = len(exported_model.graph_signature.buffers_to_mutate)
    kept = list(outputs)[mutated:]
    read = _inputs_read(kept)
    user_position = 0
    fixed: dict[int, Any] = {}
    state_dict: dict[str, Any] = {}
    inputs: dict[int, tuple[InputLocation, VariableSignature]] = {}
    unused_inputs: list[tuple[InputLocation, VariableSignature]] = []
    for position, (node, spec) in enumerate(
        zip(placeholders, exported_model.graph_signature.input_specs, strict=True)
    ):
        example = node.meta.get("val")
        if spec.kind == InputKind.USER_INPUT:
            location = InputLocation.input_arg(user_position)
            user_position += 1
            if not isinstance(example, torch.Tensor) or node not in read:
                # Export bakes non-tensor arguments into the program, and an input no output
                # depends on is no input of the program: either is an unused input.
                fixed[position] = None if isinstance(example, torch.Tensor) else example
                unused_inputs.append((location, _signature(example)))
                continue
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            location = InputLocation.parameter(spec.target)
            state_dict[spec.target] = states[spec.target]
            if node not in read:  # e.g. a buffer only updated: its new value is not returned
                fixed[position] = None
                continue
        else:
            raise NotImplementedError(
                f"xlasim: exporting a program with a {spec.kind.name} input is not simulated"
            )
        inputs[position] = (location, _signature(example))

    program = _Program(
        exported_model,
        fixed,
        options.include_human_readable_text,
        options.inline_all_constant,
        frozenset(options.custom_ops_allowed_in_graph),
    )
    constants = [program.lifted[i] for i in program.order if i in program.lifted]
    for index, position in enumerate(i for i in program.order if i in program.lifted):
        value = program.lifted[position]
        inputs[position] = (InputLocation.constant(index), _signature(torch.from_numpy(value)))
    input_locations = [inputs[i][0] for i in program.order]
    input_signature = [inputs[i][1] for i in program.order]
    output_signature = [_signature(o.meta.get("val"), output=True) for o in kept]
    meta = StableHLOFunctionMeta(
        name="forward",
        stablehlo_version="0.0.0",
        input_signature=input_signature,
        output_signature=output_signature,
        input_locations=input_locations,
        unused_inputs=unused_inputs,
        input_pytree_spec=pytree.treespec_dumps(exported_model.call_spec.in_spec),
        output_pytree_spec=pytree.treespec_dumps(exported_model.call_spec.out_spec),
    )
    exported_state = {k: _numpy(v) for k, v in state_dict.items()} if options.export_weights else {}
    bundle = StableHLOModelBundle(
        state_dict=exported_state,
        additional_constants=constants,
        stablehlo_funcs=[StableHLOFunc(meta, None, None)],
    )
    return bundle, program


def _check_capturable(
    program: _Program, meta: StableHLOFunctionMeta, constants: list[np.ndarray]
) -> None:
    """torch_xla traces the program on its example inputs when it exports it, and refuses a
    program with an op it would run on the CPU; the trace is dropped, never run."""
    exported = program.exported
    args, _ = exported.example_inputs
    user = pytree.tree_leaves(args)
    states = {**exported.state_dict, **exported.constants}
    sources = {
        VariableType.INPUT_ARG: lambda loc: user[loc.position],
        VariableType.PARAMETER: lambda loc: states[loc.name],
        VariableType.CONSTANT: lambda loc: constants[loc.position],
    }
    call_args = [sources[loc.type_](loc) for loc in meta.input_locations]
    torch_xla.sync()
    xm.wait_device_ops()
    metrics.clear_counters()
    outputs = _trace(program, call_args, stand_ins=True)
    del outputs
    fallback_ops = metrics.executed_fallback_ops()
    if fallback_ops:
        raise RuntimeError(
            "This model contains ops not capturable by Pytorch/XLA: {}".format(
                "\n".join(fallback_ops)
            )
        )


def exported_program_to_stablehlo(
    exported_model: ExportedProgram, options: StableHLOExportOptions | None = None
) -> StableHLOGraphModule:
    """A callable with ``exported_model``'s calling convention that runs its program on the
    (simulated) XLA device."""
    bundle, program = _exported_program_to_stablehlo_bundle(exported_model, options)
    _check_capturable(program, bundle.stablehlo_funcs[0].meta, bundle.additional_constants)
    module = StableHLOGraphModule(bundle)
    module._programs[module._default_method] = program
    return module


# -- saving and loading ----------------------------------------------------------------------
def _save_program_bundle(
    bundle: StableHLOModelBundle,
    stablehlo_dir: str | os.PathLike,
    options: StableHLOExportOptions | None = None,
) -> None:
    """torch_xla's layout: ``data/<state name>`` (numpy), ``functions/<name>.meta`` (JSON),
    ``.bytecode`` and ``.mlir``, and ``constants/<index>`` (numpy)."""
    if options is None:
        options = StableHLOExportOptions()
    if options.save_weights:
        os.makedirs(os.path.join(stablehlo_dir, "data"), exist_ok=True)
        for name, value in bundle.state_dict.items():
            with open(os.path.join(stablehlo_dir, "data", name), "wb") as f:
                np.save(f, value)
    functions = os.path.join(stablehlo_dir, "functions")
    os.makedirs(functions, exist_ok=True)
    for func in bundle.stablehlo_funcs:
        with open(os.path.join(functions, func.meta.name + ".meta"), "w") as f:
            json.dump(func.meta, f, cls=StableHLOJSONSerializer)
        if func.bytecode is not None:
            with open(os.path.join(functions, func.meta.name + ".bytecode"), "wb") as f:
                f.write(func.bytecode)
        if func.text is not None:
            with open(os.path.join(functions, func.meta.name + ".mlir"), "w") as f:
                f.write(func.text)
    constants = os.path.join(stablehlo_dir, "constants")
    os.makedirs(constants, exist_ok=True)
    for index, value in enumerate(bundle.additional_constants):
        with open(os.path.join(constants, str(index)), "wb") as f:
            np.save(f, value)


def _files(path: str | os.PathLike) -> Iterator[tuple[str, IO[bytes]]]:
    for name in os.listdir(path):
        with open(os.path.join(path, name), "rb") as f:
            yield name, f


def _load_program_bundle(stablehlo_dir: str | os.PathLike) -> StableHLOModelBundle:
    state_dict = {}
    if os.path.exists(os.path.join(stablehlo_dir, "data")):
        for name, f in _files(os.path.join(stablehlo_dir, "data")):
            state_dict[name] = np.load(f, allow_pickle=True)
    constants = sorted(
        (int(name), np.load(f, allow_pickle=True))
        for name, f in _files(os.path.join(stablehlo_dir, "constants"))
    )
    metas = []
    bytecodes: dict[str, bytes] = {}
    texts: dict[str, str] = {}
    for name, f in _files(os.path.join(stablehlo_dir, "functions")):
        stem, suffix = os.path.splitext(name)
        if suffix == ".meta":
            metas.append(json.load(f, object_hook=stablehlo_obj_hook))
        elif suffix == ".bytecode":
            bytecodes[stem] = f.read()
        elif suffix == ".mlir":
            texts[stem] = f.read().decode()
    return StableHLOModelBundle(
        state_dict=state_dict,
        additional_constants=[value for _, value in constants],
        stablehlo_funcs=[
            StableHLOFunc(meta, bytecodes.get(meta.name), texts.get(meta.name)) for meta in metas
        ],
    )


def save_as_stablehlo(
    exported_model: ExportedProgram,
    stablehlo_dir: str | os.PathLike,
    options: StableHLOExportOptions | None = None,
) -> None:
    """Exports ``exported_model`` and saves it in ``stablehlo_dir`` (load it with
    ``StableHLOGraphModule.load``)."""
    if options is None:
        options = StableHLOExportOptions()
    exported_program_to_stablehlo(exported_model, options).save(stablehlo_dir, options)


def save_torch_model_as_stablehlo(
    torchmodel: torch.nn.Module,
    args: tuple[Any, ...],
    path: str | os.PathLike,
    options: StableHLOExportOptions | None = None,
) -> None:
    """``torch.export``s ``torchmodel`` on ``args`` and saves it as ``save_as_stablehlo`` does."""
    exported = torch.export.export(torchmodel, args)
    if options is None:
        options = StableHLOExportOptions()
    options.override_tracing_arguments = args
    save_as_stablehlo(exported, path, options)


__all__ = [
    "InputLocation",
    "StableHLOExportOptions",
    "StableHLOFunc",
    "StableHLOFunctionMeta",
    "StableHLOGraphModule",
    "StableHLOJSONSerializer",
    "StableHLOModelBundle",
    "VariableSignature",
    "VariableType",
    "XLAExportInterpreter",
    "exported_program_to_stablehlo",
    "save_as_stablehlo",
    "save_torch_model_as_stablehlo",
    "stablehlo_obj_hook",
]
