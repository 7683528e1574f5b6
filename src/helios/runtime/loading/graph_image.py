"""A program image's callable module built straight from its checked graph JSON.

Torch's path from a program image to a module (`deserialize_program`, then
``ExportedProgram.module()``) builds schema objects, an fx graph whose every node carries a
FakeTensor under a ShapeEnv (symbolic ranges parsed with sympy), an ExportedProgram, and then
copies the graph again to unlift it. For what preparation writes for serving - every input a user
input, every output a user output, no state dict, constants, custom objects or nested graphs - the
unlifted module is the graph itself with pytree calling conventions, so `build_module` creates
exactly those nodes from the JSON: the same targets, arguments (positional or keyword as the
image records them), names and multiple-output ``getitem`` nodes, and the same in/out specs. A
user input the program writes (a user-input mutation output, as a tuning producer's) gets torch's
unlifted form: its new value copied into the input before the output. Node
metadata holds a meta tensor where the shape is static (what `drop_no_op_nodes` reads); input
extents are read from the JSON. Tests compare every node with torch's build, and outputs.

The image must already have passed `read_program_image` (`helios.abi.program_graph`: only allowed
targets and expressions) and `validate_serialized_ops`; the caller checks the built module's ABI
ops again (`module_ops`). Anything else this builder does not know (another signature kind, a
target that is not an op overload or an ``_operator`` function, an argument kind outside the
list, a JSON layout of another torch) raises `NotDirect`, and the caller uses torch's path.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch.utils import _pytree as pytree

__all__ = ["DirectModule", "NotDirect", "build_module"]


class NotDirect(Exception):
    """The image holds something `build_module` does not build (torch's path builds it)."""


@dataclass(frozen=True)
class DirectModule:
    """The built module and the static extents of its user inputs (None where symbolic)."""

    module: torch.fx.GraphModule
    input_shapes: tuple[tuple[int | None, ...], ...]


def build_module(graph_json: dict, state_dict, constants) -> DirectModule:
    """The unlifted module of a checked image (see the module docstring); raises `NotDirect`."""
    try:
        return _Builder(graph_json, state_dict, constants).build()
    except NotDirect:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, StopIteration) as error:
        raise NotDirect(f"{type(error).__name__}: {error}") from None


_TARGETS: dict[str, object] = {}


def _target(name: str):
    """The callable an image's target string names: ``torch.ops.NS.OP.OVERLOAD`` or ``_operator.F``."""
    found = _TARGETS.get(name)
    if found is None:
        parts = name.split(".")
        if len(parts) == 5 and parts[:2] == ["torch", "ops"]:
            found = getattr(getattr(getattr(torch.ops, parts[2]), parts[3]), parts[4])
            if not isinstance(found, torch._ops.OpOverload):
                raise NotDirect(f"{name} is not an op overload")
        elif len(parts) == 2 and parts[0] == "_operator" and hasattr(operator, parts[1]):
            found = getattr(operator, parts[1])
        else:
            raise NotDirect(f"target {name}")
        _TARGETS[name] = found
    return found


# The serialization schema's enum members (torch._export.serde.schema, numbered by the schema's
# version) and the torch attributes they name: torch's own tables live in its serializer, whose import
# pulls in torch._dynamo (4 s on the device, 10 s beside the compile workers' start-up), which a CUDA
# load otherwise never imports (`helios.abi.op_library`). A test proves these equal the serializer's
# tables.
_DTYPES = {"BYTE": "uint8", "CHAR": "int8", "SHORT": "int16", "INT": "int32", "LONG": "int64", "HALF": "float16",
           "FLOAT": "float32", "DOUBLE": "float64", "COMPLEXHALF": "complex32", "COMPLEXFLOAT": "complex64",
           "COMPLEXDOUBLE": "complex128", "BOOL": "bool", "BFLOAT16": "bfloat16", "UINT16": "uint16",
           "UINT32": "uint32", "UINT64": "uint64", "FLOAT8E4M3FN": "float8_e4m3fn", "FLOAT8E5M2": "float8_e5m2",
           "FLOAT8E4M3FNUZ": "float8_e4m3fnuz", "FLOAT8E5M2FNUZ": "float8_e5m2fnuz",
           "FLOAT8E8M0FNU": "float8_e8m0fnu"}
_LAYOUTS = {"SparseCoo": "sparse_coo", "SparseCsr": "sparse_csr", "SparseCsc": "sparse_csc", "SparseBsr": "sparse_bsr",
            "SparseBsc": "sparse_bsc", "_mkldnn": "_mkldnn", "Strided": "strided"}
_FORMATS = {"ContiguousFormat": "contiguous_format", "ChannelsLast": "channels_last",
            "ChannelsLast3d": "channels_last_3d", "PreserveFormat": "preserve_format"}
_TABLES: list[tuple[dict, dict, dict]] = []


def _serde_tables() -> tuple[dict, dict, dict]:
    """The schema's dtype, layout and memory format numbers -> torch's objects (members this torch has)."""
    if not _TABLES:
        from torch._export.serde import schema

        def table(enum, names):
            return {int(enum[member]): getattr(torch, attribute) for member, attribute in names.items()
                    if member in enum.__members__ and hasattr(torch, attribute)}

        _TABLES.append((table(schema.ScalarType, _DTYPES), table(schema.Layout, _LAYOUTS),
                        table(schema.MemoryFormat, _FORMATS)))
    return _TABLES[0]


class _Builder:
    def __init__(self, graph_json: dict, state_dict, constants):
        if state_dict or constants:
            raise NotDirect("state dict or constants")
        self.module_json = graph_json["graph_module"]
        self.graph_json = self.module_json["graph"]
        if self.graph_json.get("custom_obj_values") or self.graph_json.get("is_single_tensor_return"):
            raise NotDirect("custom objects or a single-tensor return")
        self.graph = torch.fx.Graph()
        self.env: dict[str, torch.fx.Node] = {}
        self.dtypes, self.layouts, self.formats = _serde_tables()
        self.metas: dict[tuple, torch.Tensor] = {}  # node values (meta tensors, read only), shared

    def build(self) -> DirectModule:
        signature = self.module_json["signature"]
        names = []
        for spec in signature["input_specs"]:
            if set(spec) != {"user_input"} or set(spec["user_input"]["arg"]) != {"as_tensor"}:
                raise NotDirect(f"input spec {sorted(spec)}")
            names.append(spec["user_input"]["arg"]["as_tensor"]["name"])
        outputs = [self._output_spec(spec, names) for spec in signature["output_specs"]]
        shapes = []
        for name in names:
            node = self.graph.placeholder(name)
            self.env[name] = node
            shape = self._meta(node, name)
            shapes.append(shape)
        for serialized in self.graph_json["nodes"]:
            self._node(serialized)
        graph_outputs = [self._output_name(o) for o in self.graph_json["outputs"]]
        if graph_outputs != [name for name, _ in outputs]:
            raise NotDirect("graph outputs differ from the signature's")
        self._return(outputs)
        in_spec, out_spec = self._specs()
        self.graph._codegen = _codegen(in_spec, out_spec)
        module = torch.fx.GraphModule(torch.nn.Module(), self.graph)
        module._in_spec, module._out_spec = in_spec, out_spec
        return DirectModule(module, tuple(shapes))

    @staticmethod
    def _output_spec(spec: dict, inputs: list[str]) -> tuple[str, str | None]:
        """(the graph output's name, the user input it is copied into, or None for a user output)."""
        if set(spec) == {"user_output"} and set(spec["user_output"]["arg"]) == {"as_tensor"}:
            return spec["user_output"]["arg"]["as_tensor"]["name"], None
        if set(spec) == {"user_input_mutation"} and set(spec["user_input_mutation"]["arg"]) == {"name"} \
                and spec["user_input_mutation"]["user_input_name"] in inputs:
            mutation = spec["user_input_mutation"]
            return mutation["arg"]["name"], mutation["user_input_name"]
        raise NotDirect(f"output spec {sorted(spec)}")

    def _return(self, outputs: list[tuple[str, str | None]]) -> None:
        """The output node: each mutated input's new value copied into it (``aten.copy_``, before the
        output, in output order, as ``ExportedProgram.module()`` unlifts it), then the user outputs
        (a user output that is also a mutation's value returns the copy)."""
        copies = {}
        for name, mutated in outputs:
            if mutated is not None:
                copies[name] = self.graph.call_function(torch.ops.aten.copy_.default,
                                                        (self.env[mutated], self.env[name]))
        self.graph.output(tuple(copies.get(name, self.env[name]) for name, mutated in outputs if mutated is None))

    def _specs(self):
        (entry,) = [e for e in self.module_json["module_call_graph"] if e["fqn"] == ""]
        signature = entry["signature"]
        return pytree.treespec_loads(signature["in_spec"]), pytree.treespec_loads(signature["out_spec"])

    def _meta(self, node: torch.fx.Node, name: str) -> tuple[int | None, ...]:
        """Sets a meta tensor as the node's value when its shape is static; the extents."""
        value = self.graph_json["tensor_values"][name]
        sizes = [d.get("as_int") if set(d) == {"as_int"} else None for d in value["sizes"]]
        strides = [d.get("as_int") if set(d) == {"as_int"} else None for d in value["strides"]]
        if None not in sizes and None not in strides:
            key = (tuple(sizes), tuple(strides), value["dtype"])
            meta = self.metas.get(key)
            if meta is None:  # one meta tensor per shape, stride and dtype: every layer repeats them
                meta = self.metas[key] = torch.empty_strided(sizes, strides, dtype=self.dtypes[value["dtype"]],
                                                             device="meta")
            node.meta["val"] = meta
        return tuple(sizes)

    def _node(self, serialized: dict) -> None:
        target = _target(serialized["target"])
        if isinstance(target, torch._ops.OpOverload):
            args, kwargs = [], {}
            for item in serialized["inputs"]:
                kind = item.get("kind")
                if kind == 1:
                    if kwargs:
                        raise NotDirect("a positional argument after a keyword one")
                    args.append(self._argument(item["arg"]))
                elif kind == 2:
                    kwargs[item["name"]] = self._argument(item["arg"])
                else:
                    raise NotDirect(f"argument kind {kind!r}")
        else:
            args, kwargs = [self._argument(item["arg"]) for item in serialized["inputs"]], {}
        outputs = serialized["outputs"]
        if all(set(o) == {"as_none"} for o in outputs):  # nothing returned (a check, an in-place call)
            self.graph.create_node("call_function", target, tuple(args), kwargs, name=serialized.get("name"))
            return
        if len(outputs) == 1 and set(outputs[0]) <= {"as_tensor", "as_sym_int"} and \
                not serialized.get("is_hop_single_tensor_return"):
            name = self._output_name(outputs[0])
            node = self.graph.create_node("call_function", target, tuple(args), kwargs, name=name)
            self._bind(name, node)
            if "as_tensor" in outputs[0]:
                self._meta(node, name)
            return
        if len(outputs) == 1 and set(outputs[0]) == {"as_tensors"}:  # a list of tensors
            items = [{"as_tensor": item} for item in outputs[0]["as_tensors"]]
        else:  # a tuple of outputs
            items = outputs
        node = self.graph.create_node("call_function", target, tuple(args), kwargs, name=serialized.get("name"))
        for index, item in enumerate(items):
            if set(item) == {"as_none"}:
                continue
            if set(item) != {"as_tensor"}:
                raise NotDirect(f"outputs {[sorted(o) for o in outputs]}")
            item_name = item["as_tensor"]["name"]
            getitem = self.graph.create_node("call_function", operator.getitem, (node, index), name=item_name)
            self._bind(item_name, getitem)
            self._meta(getitem, item_name)

    def _bind(self, name: str, node: torch.fx.Node) -> None:
        if node.name != name or name in self.env:
            raise NotDirect(f"name {name!r} taken")
        self.env[name] = node

    def _output_name(self, output: dict) -> str:
        if set(output) == {"as_tensor"}:
            return output["as_tensor"]["name"]
        if set(output) == {"as_sym_int"} and set(output["as_sym_int"]) == {"as_name"}:
            return output["as_sym_int"]["as_name"]
        raise NotDirect(f"output {sorted(output)}")

    def _argument(self, arg: dict):
        ((kind, value),) = arg.items()
        if kind == "as_tensor":
            return self.env[value["name"]]
        if kind == "as_tensors":
            return [self.env[item["name"]] for item in value]
        if kind in ("as_int", "as_bool", "as_string"):
            return value
        if kind == "as_float":
            return float(value)
        if kind in ("as_ints", "as_bools", "as_strings"):
            return list(value)
        if kind == "as_floats":
            return [float(v) for v in value]
        if kind == "as_none":
            return None
        if kind == "as_scalar_type":
            return self.dtypes[value]
        if kind == "as_layout":
            return self.layouts[value]
        if kind == "as_memory_format":
            return self.formats[value]
        if kind == "as_device":
            return torch.device(value["type"]) if value.get("index") is None else torch.device(value["type"], value["index"])
        if kind == "as_sym_int":
            return self._sym_int(value)
        if kind == "as_sym_ints":
            return [self._sym_int(v) for v in value]
        if kind == "as_optional_tensors":
            return [None if set(v) == {"as_none"} else self.env[v["as_tensor"]["name"]] for v in value]
        raise NotDirect(f"argument {kind}")

    def _sym_int(self, value: dict):
        if set(value) == {"as_name"}:
            return self.env[value["as_name"]]
        if set(value) == {"as_int"}:
            return value["as_int"]
        raise NotDirect(f"symbolic int {sorted(value)}")


def _codegen(in_spec, out_spec):
    from torch.fx.graph import _PyTreeCodeGen, _PyTreeInfo

    children = [in_spec.child(i) for i in range(in_spec.num_children)] if hasattr(in_spec, "child") \
        else in_spec.children_specs
    if in_spec.type is tuple and len(children) == 2 and children[1].type is dict:
        names = [f"arg_{i}" for i in range(children[0].num_children)]
        names.extend(children[1].context)
    else:
        names = [f"arg_{i}" for i in range(in_spec.num_children)]
    return _PyTreeCodeGen(_PyTreeInfo(names, in_spec, out_spec))
