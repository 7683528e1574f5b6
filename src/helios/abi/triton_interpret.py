"""Triton's interpreter for the attention kernels on CPU tensors (tests, ``--smoke`` benchmarks).

Never used by the runtime. Triton decides whether a kernel (its own library functions such as
``tl.max`` included) is interpreted when the kernel is decorated, from ``TRITON_INTERPRET``; so the
variable must be set before triton is first imported, and it then holds for the whole process.

`enable_interpreter` also repairs two bugs of the triton 3.6 interpreter (compiled kernels are
untouched):

- triton-lang/triton#9171: with numpy >= 2.4 every loop whose bounds are tensors fails (``int()`` of
  a one-element 1-D array now raises). The fix, the one merged upstream, converts such a bound
  through ``squeeze()`` in the interpreter's patched ``tensor.__index__``.
- ``tl.dot`` of bfloat16 operands multiplies their raw uint16 storage (numpy has no bfloat16).
  Operands are widened to float32 first, exactly, as the tensor cores do.
- float32 -> bfloat16 casts truncate (round toward zero); compiled kernels and torch round to
  nearest, ties to even. The fix rounds to nearest even (NaN stays NaN).

And it makes one of its costs smaller: every call of a ``@triton.jit`` helper inside an interpreted
kernel patches the ``triton.language`` namespaces it sees again, listing each with
``inspect.getmembers`` (half the time of a kernel built from helpers), though the kernel's launch
has patched them all already and undoes its patches when it ends. The names of each namespace's
builtins are listed once (each call still patches exactly the members whose current value is a
builtin), and a helper whose namespaces the launch (or a helper before it) patched is not patched
again. Its ``_get_np_dtype``, called for most operations, builds its table of numpy dtypes once, not
at every call. And a ``tl.tensor``'s shape (a ``tl.tuple`` of constexprs, whose type spells its name
out) and element count are built once per block shape and shared by the tensors of that shape (they
are never mutated), not for every tensor an operation returns (a fifth of an interpreted kernel's
time).

The type work of every binary operation (four in ten of an interpreted kernel's time) is made smaller
the same way, each result exactly triton's: a block type shares its shape's ``tl.tuple``, element count
and spelling per shape; dtypes compare their names directly, and block shapes compare with lists and
tuples of ints directly (triton wraps either side in new objects first); the result type of an
operation on given operand types is remembered; builtins patched for a launch hand ``_semantic`` on
without copying their keyword arguments. And the interpreter skips the integer overflow check that
triton computes for every integer addition, subtraction and product (all of it again in int64, with its
bounds) only to hand to ``device_assert``, which drops it without ``debug``, as compiled kernels do.
Every tensor of every launch of tests/abi is bit for bit the same with and without these.
"""

from __future__ import annotations

import os
import sys

__all__ = ["enable_interpreter"]


def enable_interpreter() -> None:
    """Interpret every Triton kernel of this process (CPU tensors work; nothing is compiled).

    Raises RuntimeError when triton was already imported without ``TRITON_INTERPRET=1``: its
    library functions are then compiled-only and cannot run interpreted.
    """
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("triton was imported before TRITON_INTERPRET=1 was set; set it first")
    os.environ["TRITON_INTERPRET"] = "1"
    _fix_interpreter_index()
    _fix_interpreter_bf16_dot()
    _fix_interpreter_bf16_rounding()
    _fix_interpreter_patch_cost()
    _fix_interpreter_nested_patches()
    _fix_interpreter_dtype_table()
    _fix_interpreter_tensor_shapes()
    _fix_interpreter_block_types()
    _fix_interpreter_dtype_equality()
    _fix_interpreter_computation_types()
    _fix_interpreter_overflow_checks()
    _fix_interpreter_builtin_calls()
    _fix_interpreter_shape_equality()


def _source_has(fn, *fragments: str) -> bool:
    """Whether `fn`'s source holds every one of `fragments` (the triton code a replacement reproduces:
    another triton's is left alone)."""
    import inspect

    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return False
    return all(fragment in source for fragment in fragments)


def _fix_interpreter_index() -> None:
    """Wrap the interpreter's tensor patching once so ``__index__`` accepts one-element arrays."""
    from triton.runtime import interpreter

    if getattr(interpreter._patch_lang_tensor, "helios_index_fix", False):
        return
    original = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patch_lang_tensor.helios_index_fix = True
    interpreter._patch_lang_tensor = patch_lang_tensor


def _fix_interpreter_bf16_dot() -> None:
    """Wrap the interpreter's ``create_dot`` once so bfloat16 operands are widened to float32 first."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder

    if getattr(InterpreterBuilder.create_dot, "helios_bf16_fix", False):
        return
    original = InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        a, b = (self.cast_impl(x, tl.float32) if x.dtype.scalar == tl.bfloat16 else x for x in (a, b))
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    create_dot.helios_bf16_fix = True
    InterpreterBuilder.create_dot = create_dot


def _fix_interpreter_bf16_rounding() -> None:
    """Wrap the interpreter's ``cast_impl`` once so float32 -> bfloat16 rounds to nearest even."""
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    if getattr(InterpreterBuilder.cast_impl, "helios_bf16_round", False):
        return
    original = InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar != tl.float32 or dst_type.scalar != tl.bfloat16:
            return original(self, src, dst_type)
        bits = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        rounded = np.where(np.isnan(src.data), np.uint16(0x7FC0), rounded).astype(np.uint16)
        return TensorHandle(rounded.reshape(np.shape(src.data)), dst_type.scalar)

    cast_impl.helios_bf16_round = True
    InterpreterBuilder.cast_impl = cast_impl


def _fix_interpreter_patch_cost() -> None:
    """Wrap the interpreter's ``_patch_builtin`` once so each namespace's builtin names are listed once."""
    import inspect

    import triton.language as tl
    from triton.runtime import interpreter

    if getattr(interpreter._patch_builtin, "helios_listed_once", False):
        return
    names: dict[int, tuple[object, list[str]]] = {}  # id(namespace) -> (namespace, its builtins' names)

    def patch_builtin(pkg, builder, scope):
        listed = names.get(id(pkg))
        if listed is None or listed[0] is not pkg:
            found = [name for name, member in inspect.getmembers(pkg) if tl.core.is_builtin(member)]
            if not found:  # listed while patched (no builtin left to see): list again next time
                return
            listed = names[id(pkg)] = (pkg, found)
        for name in listed[1]:
            member = getattr(pkg, name, None)
            if tl.core.is_builtin(member):  # not patched yet (a launch's patches are undone when it ends)
                interpreter._patch_attr(pkg, name, member, builder, scope)

    patch_builtin.helios_listed_once = True
    interpreter._patch_builtin = patch_builtin


def _fix_interpreter_nested_patches() -> None:
    """Wrap the interpreter's ``_patch_lang`` once so a helper called inside a launch, whose language
    namespaces the launch or an earlier helper patched, is not patched again (the launch's patches
    hold until it ends; a helper's, which the interpreter never undoes, at least as long)."""
    import inspect
    import threading

    import triton.language as tl
    from triton.runtime import interpreter

    if getattr(interpreter._patch_lang, "helios_nested_once", False):
        return
    original = interpreter._patch_lang
    launch = threading.local()  # .patched: ids of the namespaces the running launch patched, .scope: its scope

    # id(globals) -> (globals, its size, ids of its language namespaces): listed again when the dict grows
    # (a module still importing) or is another dict at a reused id; a helper's module is not re-listed at
    # each of its calls (thousands a launch)
    listed: dict[int, tuple[dict, int, frozenset[int]]] = {}

    def namespaces(fn) -> frozenset[int]:
        found = fn.__globals__
        entry = listed.get(id(found))
        if entry is None or entry[0] is not found or entry[1] != len(found):
            entry = listed[id(found)] = (found, len(found), frozenset(
                id(value) for value in found.values() if inspect.ismodule(value) and value in (tl, tl.core)))
        return entry[2]

    def patch_lang(fn):
        seen = namespaces(fn)
        patched = getattr(launch, "patched", None)
        if patched is not None:  # a helper's call inside a launch (kernels launch no kernels)
            if seen <= patched:
                return launch.scope
            original(fn)  # patches the namespaces the launch did not see, until the launch ends at least
            launch.patched = patched | seen
            return launch.scope
        scope = original(fn)  # a launch: GridExecutor restores the scope when it ends
        launch.patched, launch.scope = seen, scope
        restore = scope.restore

        def restore_and_end() -> None:
            launch.patched = launch.scope = None
            restore()

        scope.restore = restore_and_end
        return scope

    patch_lang.helios_nested_once = True
    interpreter._patch_lang = patch_lang


def _fix_interpreter_dtype_table() -> None:
    """Replace the interpreter's ``_get_np_dtype`` once with one that builds its table once (the same
    mapping: pointers and blocks of pointers are uint64, a block maps as its element type; bfloat16 and
    the float8 types are stored as uint16 and uint8)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    if getattr(interpreter._get_np_dtype, "helios_table_once", False):
        return
    original = interpreter._get_np_dtype
    table = {dtype: original(dtype) for dtype in (
        tl.int1, tl.float16, tl.float32, tl.float64, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32,
        tl.int64, tl.uint64, tl.bfloat16, tl.float8e5, tl.float8e5b16, tl.float8e4nv, tl.float8e4b8, tl.float8e4b15)}
    pointer = np.dtype(np.uint64)

    def get_np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.pointer_type):
            return pointer
        if isinstance(tt_dtype, tl.block_type):
            element = tt_dtype.element_ty
            return pointer if isinstance(element, tl.pointer_type) else table[element]
        return table[tt_dtype]

    get_np_dtype.helios_table_once = True
    interpreter._get_np_dtype = get_np_dtype


def _fix_interpreter_tensor_shapes() -> None:
    """Replace ``tl.tensor.__init__`` once with one that shares a block shape's ``shape`` and ``numel``
    (the same values triton 3.6's builds: a ``tl.tuple`` of constexprs, the product as a constexpr)."""
    import math

    from triton.language import core

    original = core.tensor.__init__
    if getattr(original, "helios_shapes_once", False) or not _source_has(
            original, "self.numel = constexpr(math.prod(self.shape))", "self.dtype = type.scalar",
            "self.shape = tuple([constexpr(s) for s in self.shape])"):
        return
    shapes: dict[tuple, tuple] = {}  # block shape (ints; () for a scalar) -> (numel, shape)

    def tensor_init(self, handle, type):  # noqa: A002 (triton's parameter name)
        self.handle = handle
        self.type = type
        self.dtype = type.scalar
        if type.is_block():
            shape = type.shape  # a tl.tuple of ints: its list, without a Python-level iteration
            dims = tuple(shape.values) if shape.__class__ is core.tuple else tuple(shape)
        else:
            dims = ()
        known = shapes.get(dims)
        if known is None:
            known = shapes[dims] = (core.constexpr(math.prod(dims)), core.tuple([core.constexpr(d) for d in dims]))
        self.numel, self.shape = known

    tensor_init.helios_shapes_once = True
    core.tensor.__init__ = tensor_init


def _fix_interpreter_block_types() -> None:
    """Replace ``tl.block_type.__init__`` once with one that shares a block shape's ``shape`` (a
    ``tl.tuple`` of ints: ``tuple`` in triton's ``core`` is its own class), ``numel`` and the shape's
    spelling in ``name`` (every binary operation's broadcast and every interpreted ``to_ir`` builds block
    types, each unwrapping its shape into a new ``tl.tuple`` and typing it). A shape given otherwise than
    as a list or ``tl.tuple`` of ints and int constexprs, or one triton rejects, takes triton's own."""
    from triton.language import core

    original = core.block_type.__init__
    if getattr(original, "helios_shapes_once", False) or not _source_has(
            original, "self.shape = tuple(_unwrap_shape(shape))", "self.numel = validate_block_shape(self.shape)",
            "self.name = f'<{self.shape}, {self.element_ty}>'"):
        return
    shapes: dict[tuple, tuple] = {}  # dims (ints) -> (shape, numel, the shape's spelling)

    def block_type_init(self, element_ty, shape):
        kind = type(shape)
        values = shape if kind is list else shape.values if kind is core.tuple else None
        dims = None
        if values is not None:
            dims = []
            for value in values:
                if type(value) is int:
                    dims.append(value)
                elif type(value) is core.constexpr and type(value.value) is int:
                    dims.append(value.value)
                else:
                    dims = None
                    break
        known = shapes.get(tuple(dims)) if dims is not None else None
        if known is None:
            original(self, element_ty, shape)  # validates (and raises as triton does)
            if dims is not None:
                shapes[tuple(dims)] = (self.shape, self.numel, str(self.shape))
            return
        self.element_ty = element_ty
        self.shape, self.numel, spelled = known
        self.name = f"<{spelled}, {element_ty}>"

    block_type_init.helios_shapes_once = True
    core.block_type.__init__ = block_type_init


def _fix_interpreter_dtype_equality() -> None:
    """Replace ``tl.dtype.__eq__`` once with one that compares two dtypes' names directly (its result for
    any other operand is triton's): triton's unwraps a constexpr operand first, a call of its own on
    every one of the million type comparisons of a kernel's casts and checks."""
    from triton.language import core

    original = core.dtype.__eq__
    if getattr(original, "helios_direct", False) or not _source_has(
            original, "if not isinstance(other, dtype):", "return self.name == other.name"):
        return
    dtype = core.dtype

    def dtype_eq(self, other):
        if isinstance(other, dtype):
            return self.name == other.name
        return original(self, other)

    dtype_eq.helios_direct = True
    core.dtype.__eq__ = dtype_eq


def _fix_interpreter_computation_types() -> None:
    """Wrap triton's ``computation_type_impl`` (the result type of a binary operation, a function of its
    operands' scalar types, whether each is a Python number and whether it divides) once with a memo of
    its answers: which operand's type it returned, or the type it returned otherwise. Operands that it
    rejects are checked again at every call."""
    from triton.language.semantic import TritonSemantic

    original = getattr(TritonSemantic, "computation_type_impl", None)
    if original is None or getattr(original, "helios_memo", False):
        return
    answers: dict[tuple, object] = {}
    first, second = object(), object()  # the answer is the first (second) operand's type

    def computation_type_impl(self, a_ty, a_is_scalar, b_ty, b_is_scalar, div_or_mod):
        key = (type(a_ty), a_ty.name, a_is_scalar, type(b_ty), b_ty.name, b_is_scalar, bool(div_or_mod),
               a_ty is b_ty)
        answer = answers.get(key)
        if answer is first:
            return a_ty
        if answer is second:
            return b_ty
        if answer is not None:
            return answer
        found = original(self, a_ty, a_is_scalar, b_ty, b_is_scalar, div_or_mod)
        answers[key] = first if found is a_ty else second if found is b_ty else found
        return found

    computation_type_impl.helios_memo = True
    TritonSemantic.computation_type_impl = computation_type_impl


def _fix_interpreter_overflow_checks() -> None:
    """Wrap triton's ``binary_op_sanitize_overflow_impl`` once so that an interpreted kernel without
    ``debug`` skips it: it computes each integer addition, subtraction and product again in int64
    together with its bounds, only to hand the result to ``device_assert``, which ignores it without
    ``debug`` (a compiled kernel's compiler drops that code too)."""
    from triton.language.semantic import TritonSemantic
    from triton.runtime.interpreter import InterpreterBuilder

    original = getattr(TritonSemantic, "binary_op_sanitize_overflow_impl", None)
    if original is None or getattr(original, "helios_skipped", False):
        return
    # it feeds nothing but device_assert, which must be the one that returns at once without debug
    if not (_source_has(original, "self.device_assert(cond, msg, None)")
            and _source_has(TritonSemantic.device_assert, "if not self.builder.options.debug:\n            return")):
        return

    def binary_op_sanitize_overflow_impl(self, lhs, rhs, binary_op):
        if isinstance(self.builder, InterpreterBuilder) and not self.builder.options.debug:
            return None
        return original(self, lhs, rhs, binary_op)

    binary_op_sanitize_overflow_impl.helios_skipped = True
    TritonSemantic.binary_op_sanitize_overflow_impl = binary_op_sanitize_overflow_impl


def _fix_interpreter_builtin_calls() -> None:
    """Replace the interpreter's ``_patch_attr`` once with one whose patched builtins hand their keyword
    arguments on with ``_semantic`` set (triton's copies them into a new dict without it first, at every
    call) straight to the builtin's function where the member is ``tl.core.builtin``'s wrapper (which
    only checks that ``_semantic`` is given; a tensor's ``+`` goes through two of them)."""
    from triton.language import core
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_attr", None)
    semantic_type = getattr(interpreter, "TritonSemantic", None)
    if original is None or semantic_type is None or getattr(original, "helios_direct", False) or not _source_has(
            original, "semantic = TritonSemantic(builder)", 'if k != "_semantic"', "_semantic=semantic"):
        return
    wrapper = core.builtin(lambda _semantic=None: None).__code__  # the code of every builtin's wrapper
    if "fn" not in wrapper.co_freevars:
        return
    cell = wrapper.co_freevars.index("fn")

    def patch_attr(obj, name, member, builder, scope):
        semantic = semantic_type(builder)
        target = member.__closure__[cell].cell_contents if getattr(member, "__code__", None) is wrapper else member

        def patched(*args, **kwargs):
            kwargs["_semantic"] = semantic
            return target(*args, **kwargs)

        scope.set_attr(obj, name, patched)

    patch_attr.helios_direct = True
    interpreter._patch_attr = patch_attr


def _fix_interpreter_shape_equality() -> None:
    """Replace ``tl.tuple.__eq__`` once with one that compares its values with a list, tuple or
    ``tl.tuple`` of plain ints directly (what triton's compares them with after unwrapping the other
    side's constexprs into a new ``tl.tuple``, whose type it spells out: the broadcast of every binary
    operation compares block shapes so); any other operand takes triton's."""
    import builtins

    from triton.language import core

    original = core.tuple.__eq__
    if getattr(original, "helios_direct", False) or not _source_has(
            original, "other = _normalize_tuple(other)", "return constexpr(self.values == other.values)"):
        return
    tl_tuple, constexpr = core.tuple, core.constexpr

    def tuple_eq(self, other):
        kind = other.__class__
        values = other if kind is list or kind is builtins.tuple else other.values if kind is tl_tuple else None
        if values is not None and all(value.__class__ is int for value in values):
            return constexpr(self.values == list(values))
        return original(self, other)

    tuple_eq.helios_direct = True
    core.tuple.__eq__ = tuple_eq
