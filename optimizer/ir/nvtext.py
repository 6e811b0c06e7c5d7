"""Parse nvFuser's printed Python definitions (the repro format) without executing them.

The text is parsed with ``ast`` and interpreted: only the calls of nvFuser's frontend
(``fd.define_tensor``, ``fd.ops.<op>``, ``T.shape()`` ...) and of the repro's ``inputs = [...]``
list (``torch.randn(...).as_strided(...)`` ...) mean anything. Everything else, including any
other import, attribute, call, loop or lambda, is a DefinitionError naming the line and column and
what was expected. User text is never exec'd or eval'd.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

from fusecut.optimizer.errors import DefinitionError, counted
from fusecut.optimizer.ir.builder import (
    MAX_OPS_DEFAULT,
    FusionBuilder,
    TensorHandle,
)
from fusecut.optimizer.ir.dtypes import (
    NVFUSER_DTYPES,
    TORCH_DTYPES,
    UNSUPPORTED_NVFUSER_DTYPES,
    DType,
    fits_int64,
)
from fusecut.optimizer.ir.fusion import Fusion
from fusecut.optimizer.ir.inputs import InputMeta, ScalarMeta, TensorMeta, contiguous_strides

MAX_TEXT_BYTES = 8 * 1024 * 1024
MAX_LIST = 100_000
MAX_DEPTH = 64
ALLOWED_MODULES = {"torch", "nvfuser", "fusecut", "nvfuser_direct"}
FLOAT_WORDS = {"inf": float("inf"), "+inf": float("inf"), "-inf": float("-inf"),
               "nan": float("nan"), "infinity": float("inf"), "-infinity": float("-inf")}


@dataclass
class ParsedDefinition:
    fusion: Fusion
    inputs: list[InputMeta] | None  # from the repro's ``inputs = [...]`` list, when present
    function_name: str | None


class _Namespace:
    """DataType / ParallelType / fd.ops / fd.sched: names whose attributes mean something."""

    def __init__(self, kind: str):
        self.kind = kind


class _FD:
    """The ``fd`` parameter of a definition function."""


def parse_text(text: str, max_ops: int = MAX_OPS_DEFAULT) -> ParsedDefinition:
    if len(text.encode("utf-8", "replace")) > MAX_TEXT_BYTES:
        raise DefinitionError(f"definition text is larger than {MAX_TEXT_BYTES} bytes")
    try:
        tree = ast.parse(text, mode="exec")
    except SyntaxError as e:
        raise DefinitionError(f"syntax error: {e.msg}", line=e.lineno, col=e.offset) from None
    except (RecursionError, MemoryError, ValueError) as e:
        raise DefinitionError(f"definition text cannot be parsed: {type(e).__name__}") from None
    return _Module(max_ops).run(tree)


class _Module:
    def __init__(self, max_ops: int):
        self.max_ops = max_ops
        self.functions: dict[str, ast.FunctionDef] = {}
        self.builder: FusionBuilder | None = None
        self.function_name: str | None = None
        self.inputs: list[InputMeta] | None = None
        self.def_line: int | None = None
        self.constants: dict[str, Any] = {}  # module-level NAME = number

    def run(self, tree: ast.Module) -> ParsedDefinition:
        for stmt in tree.body:
            try:
                self._top(stmt)
            except DefinitionError as e:
                raise e.at(stmt.lineno, stmt.col_offset + 1) from None
            except RecursionError:
                raise DefinitionError("expression nested too deeply", line=stmt.lineno) from None
        if self.builder is None:
            defs = list(self.functions.values())
            if len(defs) != 1:
                raise DefinitionError(
                    "expected one definition function `def name(fd: FusionDefinition)` or a "
                    f"`with FusionDefinition() as fd:` block; found {len(defs)} functions")
            self._run_function(defs[0])
        if not self.builder.fusion.outputs:
            raise DefinitionError("the definition has no outputs (fd.add_output(...))",
                                  line=self.def_line)
        return ParsedDefinition(self.builder.fusion, self.inputs, self.function_name)

    # ---- top level --------------------------------------------------------------------------

    def _top(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.name.split(".")[0] not in ALLOWED_MODULES:
                    raise DefinitionError(f"import of '{alias.name}' is not allowed (only torch "
                                          f"and nvfuser)")
        elif isinstance(stmt, ast.ImportFrom):
            if (stmt.module or "").split(".")[0] not in ALLOWED_MODULES or stmt.level:
                raise DefinitionError(f"import from '{stmt.module}' is not allowed (only torch "
                                      f"and nvfuser)")
        elif isinstance(stmt, ast.FunctionDef):
            if stmt.decorator_list:
                raise DefinitionError("decorators are not allowed")
            params = stmt.args
            if (len(params.args) != 1 or params.vararg or params.kwarg or params.kwonlyargs
                    or params.posonlyargs or params.defaults):
                raise DefinitionError(f"definition function '{stmt.name}' must take exactly one "
                                      f"parameter (fd)")
            self.functions[stmt.name] = stmt
        elif isinstance(stmt, ast.With):
            self._with(stmt)
        elif isinstance(stmt, ast.Assign):
            target = stmt.targets[0] if len(stmt.targets) == 1 else None
            if not isinstance(target, ast.Name):
                raise DefinitionError("only `inputs = [...]`, `NAME = number` and `alias = "
                                      "function` may be assigned at the top level")
            if target.id == "inputs":
                self.inputs = _InputList(self.constants).evaluate(stmt.value)
            elif isinstance(stmt.value, ast.Name) and stmt.value.id in self.functions:
                return  # another name for a definition function (nvfuser_fusion = ..._id0)
            else:
                try:
                    self.constants[target.id] = _literal_number(stmt.value, self.constants)
                except DefinitionError:
                    raise DefinitionError(
                        f"top-level `{target.id} = ...` must be a number (a constant the "
                        f"definition uses), `inputs = [...]`, or another name for a definition "
                        f"function") from None
        elif isinstance(stmt, ast.Expr):
            if isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                return  # a docstring
            if not _is_execute_call(stmt.value):
                raise DefinitionError("only fd.execute(inputs) may be called at the top level")
        elif not isinstance(stmt, ast.Pass):
            raise DefinitionError(f"{type(stmt).__name__} statements are not allowed at the top "
                                  f"level")

    def _with(self, stmt: ast.With) -> None:
        if self.builder is not None:
            raise DefinitionError("only one `with FusionDefinition() as fd:` block is allowed")
        if len(stmt.items) != 1:
            raise DefinitionError("expected `with FusionDefinition() as fd:`")
        item = stmt.items[0]
        call = item.context_expr
        if not (isinstance(call, ast.Call) and _dotted(call.func) in ("FusionDefinition",
                                                                      "nvfuser.FusionDefinition")
                and not call.keywords and not call.args):
            raise DefinitionError("expected `with FusionDefinition() as fd:`")
        if not isinstance(item.optional_vars, ast.Name):
            raise DefinitionError("expected `with FusionDefinition() as fd:`")
        fd_name = item.optional_vars.id
        body = [s for s in stmt.body if not isinstance(s, ast.Pass)]
        if (len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Call)
                and isinstance(body[0].value.func, ast.Name)
                and body[0].value.func.id in self.functions):
            call = body[0].value
            if (len(call.args) != 1 or call.keywords or not isinstance(call.args[0], ast.Name)
                    or call.args[0].id != fd_name):
                raise DefinitionError(f"expected `{call.func.id}({fd_name})`",
                                      line=call.lineno, col=call.col_offset + 1)
            self._run_function(self.functions[call.func.id])
        else:  # the definition written inline in the with block
            self.builder = FusionBuilder(self.max_ops)
            self.def_line = stmt.lineno
            _Body(self.builder, fd_name, self.constants).run(stmt.body)

    def _run_function(self, fn: ast.FunctionDef) -> None:
        self.builder = FusionBuilder(self.max_ops)
        self.function_name = fn.name
        self.def_line = fn.lineno
        _Body(self.builder, fn.args.args[0].arg, self.constants).run(fn.body)


def _is_execute_call(node: ast.expr) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "execute" and isinstance(node.func.value, ast.Name))


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _literal_number(node: ast.expr, constants: dict[str, Any] | None = None) -> Any:
    """A numeric literal, possibly negated, or float("inf")-style, or the name of a module-level
    constant (``LOW_VAL = -2``); else a DefinitionError."""
    if isinstance(node, ast.Name) and constants and node.id in constants:
        return constants[node.id]
    if isinstance(node, ast.Constant) and isinstance(node.value, (bool, int, float)):
        return _checked_number(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = node.operand
        if isinstance(operand, ast.Constant) and type(operand.value) is int:  # -2**63 fits
            return _checked_number(-operand.value if isinstance(node.op, ast.USub)
                                   else operand.value)
        v = _literal_number(operand, constants)
        if isinstance(v, bool):
            raise DefinitionError("cannot negate a bool")
        return -v if isinstance(node.op, ast.USub) else v
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "float"
            and len(node.args) == 1 and not node.keywords):
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            word = arg.value.strip().lower()
            if word not in FLOAT_WORDS:
                raise DefinitionError(f"float({arg.value!r}) is not allowed; use inf, -inf or nan")
            return FLOAT_WORDS[word]
        value = _literal_number(arg, constants)
        if isinstance(value, complex):  # float() of a complex is a TypeError in Python too
            raise DefinitionError(f"float() of the complex number {value} is not a number; use "
                                  f"its .real part or a complex scalar")
        return float(value)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "complex"
            and 1 <= len(node.args) <= 2 and not node.keywords):
        parts = [_literal_number(a, constants) for a in node.args]
        if any(isinstance(p, (bool, complex)) for p in parts):
            raise DefinitionError("complex(real, imag) takes two real numbers")
        return complex(*parts)
    raise DefinitionError(f"expected a number, got {ast.unparse(node)[:60]!r}")


def _checked_number(v: Any) -> Any:
    if isinstance(v, int) and not isinstance(v, bool) and not fits_int64(v):
        raise DefinitionError(f"integer literal {str(v)[:40]}... does not fit in 64 bits")
    return v


class _Body:
    """Interprets the statements of a definition function."""

    def __init__(self, builder: FusionBuilder, fd_name: str,
                 constants: dict[str, Any] | None = None):
        self.b = builder
        self.constants = dict(constants or {})
        self.env: dict[str, Any] = {**self.constants, fd_name: _FD(),
                                    "DataType": _Namespace("DataType"),
                                    "ParallelType": _Namespace("ParallelType")}
        self.fd_name = fd_name

    def run(self, body: list[ast.stmt]) -> None:
        for stmt in body:  # names the text assigns: generated names for nested calls avoid them
            targets = stmt.targets if isinstance(stmt, ast.Assign) else []
            for target in targets:
                for node in ast.walk(target):
                    if isinstance(node, ast.Name):
                        self.b.reserved.add(node.id)
        for stmt in body:
            try:
                self._stmt(stmt)
            except DefinitionError as e:
                raise e.at(stmt.lineno, stmt.col_offset + 1) from None
            if isinstance(stmt, ast.Return):
                break  # as Python would: what follows a return never runs

    def _stmt(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, ast.Assign):
            if len(stmt.targets) != 1:
                raise DefinitionError("chained assignment is not allowed")
            target = stmt.targets[0]
            names = self._target_names(target)
            value = self._expr(stmt.value, 0, names)
            if isinstance(target, ast.Name):
                self.env[target.id] = value
            else:
                self._unpack(target, value)
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value:
            self.env[stmt.target.id] = self._expr(stmt.value, 0, [stmt.target.id])
        elif isinstance(stmt, ast.Expr):
            if isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                return
            if not isinstance(stmt.value, ast.Call):
                raise DefinitionError("expected a call such as fd.add_output(T)")
            self._expr(stmt.value, 0, None)
        elif isinstance(stmt, ast.Return):
            if stmt.value is not None:  # nvFuser's tests return tensors to schedule them: ignored
                self._expr(stmt.value, 0, None)
            return
        elif not isinstance(stmt, ast.Pass):
            raise DefinitionError(f"{type(stmt).__name__} statements are not allowed in a "
                                  f"definition (expected assignments and fd calls)")

    def _target_names(self, target: ast.expr) -> list[str]:
        """The names a target binds, in order (a starred name counts once)."""
        if isinstance(target, ast.Name):
            return [target.id]
        if isinstance(target, (ast.Tuple, ast.List)):
            elts = [e.value if isinstance(e, ast.Starred) else e for e in target.elts]
            if all(isinstance(e, ast.Name) for e in elts) and sum(
                    isinstance(e, ast.Starred) for e in target.elts) <= 1:
                return [e.id for e in elts]
        raise DefinitionError("assignment targets must be names, or a tuple of names with at "
                              "most one *name")

    def _unpack(self, target: ast.Tuple | ast.List, value: Any) -> None:
        """``a, b = op(...)`` and ``_, lse, *_ = op(...)``: Python's unpacking of a tuple."""
        if not isinstance(value, (list, tuple)):
            raise DefinitionError(f"cannot unpack a single value into {len(target.elts)} names")
        star = [i for i, e in enumerate(target.elts) if isinstance(e, ast.Starred)]
        n_fixed = len(target.elts) - len(star)
        if (not star and len(value) != n_fixed) or (star and len(value) < n_fixed):
            raise DefinitionError(f"cannot unpack {counted(len(value), 'value')} into "
                                  f"{n_fixed}{'+' if star else ''} "
                                  f"{'name' if n_fixed == 1 and not star else 'names'}")
        for i, e in enumerate(target.elts):
            if isinstance(e, ast.Starred):
                self.env[e.value.id] = list(value[i:len(value) - (n_fixed - i)])
            elif star and i > star[0]:  # counted from the end
                self.env[e.id] = value[len(value) - (len(target.elts) - i)]
            else:
                self.env[e.id] = value[i]

    def _expr(self, node: ast.expr, depth: int, names: list[str] | None) -> Any:
        if depth > MAX_DEPTH:
            raise DefinitionError("expression nested too deeply")
        if isinstance(node, ast.Constant):
            if isinstance(node.value, (bool, int, float)) or node.value is None:
                return _checked_number(node.value)
            raise DefinitionError(f"literal {node.value!r} is not allowed here")
        if isinstance(node, ast.Name):
            if node.id in self.env:
                return self.env[node.id]
            raise DefinitionError(f"name '{node.id}' is not defined")
        if isinstance(node, ast.UnaryOp):
            return _literal_number(node, self.constants)
        if isinstance(node, (ast.List, ast.Tuple)):
            if len(node.elts) > MAX_LIST:
                raise DefinitionError(f"list of {len(node.elts)} elements is too long")
            return [self._expr(e, depth + 1, None) for e in node.elts]
        if isinstance(node, ast.Attribute):
            return self._attribute(node, depth)
        if isinstance(node, ast.Subscript):
            base = self._expr(node.value, depth + 1, None)
            index = self._expr(node.slice, depth + 1, None)
            if not isinstance(base, (list, tuple)) or isinstance(index, bool) or not isinstance(
                    index, int):
                raise DefinitionError("only a list or tuple may be indexed, with an integer")
            if not -len(base) <= index < len(base):
                raise DefinitionError(f"index {index} out of range for "
                                      f"{counted(len(base), 'item')}")
            return base[index]
        if isinstance(node, ast.Call):
            return self._call(node, depth, names)
        raise DefinitionError(f"{type(node).__name__} expressions are not allowed "
                              f"(got {ast.unparse(node)[:60]!r})")

    def _attribute(self, node: ast.Attribute, depth: int) -> Any:
        base = self._expr(node.value, depth + 1, None)
        if isinstance(base, _Namespace):
            if base.kind == "DataType":
                if node.attr in NVFUSER_DTYPES:
                    return NVFUSER_DTYPES[node.attr]
                if node.attr in UNSUPPORTED_NVFUSER_DTYPES:
                    raise DefinitionError(f"DataType.{node.attr} is not supported by fusecut")
                raise DefinitionError(f"unknown DataType.{node.attr}")
            if base.kind == "ParallelType":
                return node.attr
            if base.kind in ("ops", "sched"):
                return _Namespace(f"{base.kind}.{node.attr}")
        if isinstance(base, _FD):
            if node.attr in ("ops", "sched"):
                return _Namespace(node.attr)
            return _Namespace(f"fd.{node.attr}")
        if isinstance(base, TensorHandle) and node.attr == "ndim":
            return base.ndim
        if isinstance(base, TensorHandle) and node.attr in ("shape", "size"):
            return _Namespace(f"tensor.{node.attr}")
        raise DefinitionError(f"attribute '{node.attr}' of {ast.unparse(node.value)[:40]!r} is "
                              f"not allowed")

    def _call(self, node: ast.Call, depth: int, names: list[str] | None) -> Any:
        for kw in node.keywords:
            if kw.arg is None:
                raise DefinitionError("**kwargs is not allowed")
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise DefinitionError("*args is not allowed")
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("float", "complex"):
            return _literal_number(node, self.constants)
        callee = self._expr(func, depth + 1, None) if isinstance(func, ast.Attribute) else None
        if not isinstance(callee, _Namespace):
            raise DefinitionError(f"call to {ast.unparse(func)[:60]!r} is not allowed")
        args = [self._expr(a, depth + 1, None) for a in node.args]
        kwargs = {kw.arg: self._expr(kw.value, depth + 1, None) for kw in node.keywords}
        kind = callee.kind
        if kind in ("ops.shape", "ops.at"):  # host-side vectors: a list of size scalars
            return self._vector_op(kind[4:], args, kwargs)
        if kind.startswith("ops."):
            outs = self.b.op(kind[4:], args, kwargs, names)
            return outs[0] if len(outs) == 1 else tuple(outs)
        if kind in ("tensor.shape", "tensor.size"):
            tensor = self._expr(func.value, depth + 1, None)
            if kind == "tensor.shape":
                if args or kwargs:
                    raise DefinitionError("shape() takes no arguments")
                return tensor.shape()
            if len(args) != 1 or kwargs:
                raise DefinitionError("size() takes one argument: the axis")
            return self.b.size(tensor, args[0], names[0] if names else None)
        if kind == "sched.parallelize":
            return self.b.parallelize(*args, **kwargs)
        method = {"fd.define_tensor": self.b.define_tensor,
                  "fd.define_scalar": self.b.define_scalar,
                  "fd.define_constant": self.b.define_scalar,
                  "fd.define_vector": self.b.define_vector, "fd.add_output": self.b.add_output
                  }.get(kind)
        if method is None:
            raise DefinitionError(f"{kind.replace('fd.', self.fd_name + '.')}() is not part of the "
                                  f"definition API")
        if kind in ("fd.define_tensor", "fd.define_scalar", "fd.define_constant") and names:
            kwargs["name"] = names[0]
        try:
            return method(*args, **kwargs)
        except TypeError as e:  # wrong arguments to one of our builder methods
            raise DefinitionError(f"{kind[3:]}(): {e}") from None


    def _vector_op(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        if kwargs or len(args) != (1 if name == "shape" else 2):
            raise DefinitionError(f"ops.{name}() expects "
                                  f"{'(tensor)' if name == 'shape' else '(vector, index)'}")
        if name == "shape":
            if not isinstance(args[0], TensorHandle):
                raise DefinitionError("ops.shape() expects a tensor")
            return args[0].shape()
        vector, index = args
        if not isinstance(vector, list) or isinstance(index, bool) or not isinstance(index, int):
            raise DefinitionError("ops.at() expects a vector and an integer index")
        if not -len(vector) <= index < len(vector):
            raise DefinitionError(f"ops.at(): index {index} out of range for "
                                  f"{counted(len(vector), 'item')}")
        return vector[index]


def _permuted(base: TensorMeta, dims: tuple[int, ...]) -> TensorMeta:
    """torch's ``.permute(dims)``: the same storage, axes reordered."""
    rank = base.rank
    norm = [d % rank if -rank <= d < rank else -1 for d in dims]
    if sorted(norm) != list(range(rank)):
        raise DefinitionError(f"permute{dims} is not a permutation of the {rank} axes")
    return TensorMeta(tuple(base.shape[d] for d in norm), tuple(base.strides[d] for d in norm),
                      base.dtype, base.fill)


def _expanded(base: TensorMeta, sizes: tuple[int, ...]) -> TensorMeta:
    """torch's ``.expand(sizes)``: size-1 axes (and new leading ones) repeat with stride 0;
    -1 keeps an axis."""
    if len(sizes) < base.rank:
        raise DefinitionError(f"expand{sizes} has fewer entries than the tensor's rank "
                              f"{base.rank}")
    lead = len(sizes) - base.rank
    shape, strides = [], []
    for i, want in enumerate(sizes):
        if i < lead:
            if want < 0:
                raise DefinitionError(f"expand{sizes}: -1 is not allowed for a new axis")
            shape.append(want)
            strides.append(0)
            continue
        have, stride = base.shape[i - lead], base.strides[i - lead]
        if want == -1 or want == have:
            shape.append(have)
            strides.append(stride)
        elif have == 1 and want >= 0:
            shape.append(want)
            strides.append(0)
        else:
            raise DefinitionError(f"expand{sizes}: axis {i - lead} has extent {have}, which "
                                  f"only expands from 1")
    return TensorMeta(tuple(shape), tuple(strides), base.dtype, base.fill)


class _InputList:
    """Interprets the repro's ``inputs = [...]`` into input metadata."""

    TORCH_FACTORIES = {"randn", "rand", "zeros", "ones", "empty", "full", "randint", "arange",
                       "tensor", "make_tensor"}

    def __init__(self, constants: dict[str, Any] | None = None):
        self.constants = constants or {}

    def _number(self, node: ast.expr) -> Any:
        return _literal_number(node, self.constants)

    def evaluate(self, node: ast.expr) -> list[InputMeta]:
        if not isinstance(node, (ast.List, ast.Tuple)):
            raise DefinitionError("inputs must be a list")
        if len(node.elts) > 10_000:
            raise DefinitionError("inputs list is too long")
        out = []
        for elt in node.elts:
            try:
                out.append(self._input(elt))
            except DefinitionError as e:
                raise e.at(elt.lineno, elt.col_offset + 1) from None
        return out

    def _input(self, node: ast.expr) -> InputMeta:
        try:
            value = self._number(node)
        except DefinitionError:
            if isinstance(node, ast.Constant) or (isinstance(node, ast.UnaryOp)
                                                  and isinstance(node.operand, ast.Constant)):
                raise  # a number that is not one fusecut takes (2**64): say so
            return self._tensor(node)
        if isinstance(value, bool):
            return ScalarMeta(DType.bool, value)
        return ScalarMeta(DType.int64 if isinstance(value, int) else DType.float64, value)

    def _tensor(self, node: ast.expr) -> TensorMeta:
        if isinstance(node, ast.Compare):
            if len(node.ops) != 1 or not isinstance(node.ops[0],
                                                    (ast.Gt, ast.Lt, ast.GtE, ast.LtE)):
                raise DefinitionError("only `tensor > number` style comparisons are allowed")
            base = self._tensor(node.left)
            threshold = self._number(node.comparators[0])
            fill = dict(base.fill, compare=type(node.ops[0]).__name__.lower(), threshold=threshold)
            return TensorMeta(base.shape, base.strides, DType.bool, fill)
        if not isinstance(node, ast.Call):
            raise DefinitionError(f"expected a torch tensor expression, got "
                                  f"{ast.unparse(node)[:60]!r}")
        func = node.func
        name = _dotted(func)
        if name in {f"torch.{f}" for f in self.TORCH_FACTORIES} | {"torch.testing.make_tensor"}:
            return self._factory(name.rsplit(".", 1)[1], node)
        if isinstance(func, ast.Attribute):
            base = self._tensor(func.value)
            return self._method(base, func.attr, node)
        raise DefinitionError(f"call to {ast.unparse(func)[:60]!r} is not allowed in inputs")

    def _dims(self, node: ast.Call, rank: int | None, method: str) -> tuple[int, ...]:
        """The integers of ``.permute(0, 2, 1)`` / ``.expand([4, -1])`` (one list or several
        arguments)."""
        if node.keywords:
            raise DefinitionError(f"{method}() takes no keywords here")
        args = node.args[0].elts if len(node.args) == 1 and isinstance(
            node.args[0], (ast.List, ast.Tuple)) else node.args
        if len(args) > 16:
            raise DefinitionError(f"{method}() has too many entries")
        dims = tuple(self._number(a) for a in args)
        for d in dims:
            if isinstance(d, bool) or not isinstance(d, int):
                raise DefinitionError(f"{method}() entries must be integers, got {d!r}")
        if rank is not None and len(dims) != rank:
            raise DefinitionError(f"{method}{dims} needs {rank} entries for a tensor of rank "
                                  f"{rank}")
        return dims

    def _kw(self, node: ast.Call) -> dict[str, Any]:
        out = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise DefinitionError("**kwargs is not allowed")
            if kw.arg == "dtype":
                out["dtype"] = self._torch_dtype(kw.value)
            elif kw.arg in ("device", "layout", "memory_format"):
                if not (isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str)) \
                        and _dotted(kw.value) is None:
                    raise DefinitionError(f"{kw.arg} must be a literal")
            elif kw.arg == "requires_grad":
                continue
            elif kw.arg in ("low", "high", "fill_value"):
                out[kw.arg] = None if (isinstance(kw.value, ast.Constant)
                                       and kw.value.value is None) else self._number(kw.value)
            elif kw.arg == "size":
                out["size"] = self._ints(kw.value)
            else:
                raise DefinitionError(f"keyword '{kw.arg}' is not allowed in inputs")
        return out

    def _torch_dtype(self, node: ast.expr) -> DType:
        name = _dotted(node)
        if name and name.startswith("torch.") and name[6:] in TORCH_DTYPES:
            return TORCH_DTYPES[name[6:]]
        raise DefinitionError(f"unsupported dtype {ast.unparse(node)[:40]!r}")

    def _ints(self, node: ast.expr) -> tuple[int, ...]:
        if isinstance(node, (ast.Tuple, ast.List)):
            if len(node.elts) > 16:
                raise DefinitionError("shape has too many entries")
            vals = [self._number(e) for e in node.elts]
        else:
            vals = [self._number(node)]
        for v in vals:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise DefinitionError(f"sizes must be non-negative integers, got {v!r}")
        return tuple(vals)

    def _shape_args(self, args: list[ast.expr]) -> tuple[int, ...]:
        if len(args) == 1 and isinstance(args[0], (ast.Tuple, ast.List)):
            return self._ints(args[0])
        return tuple(v for a in args for v in self._ints(a))

    def _factory(self, fn: str, node: ast.Call) -> TensorMeta:
        kw = self._kw(node)
        dtype = kw.get("dtype", DType.float32)
        fill: dict[str, Any] = {"fn": fn}
        args = list(node.args)
        if fn == "randint":
            nums = [self._number(a) for a in args if not isinstance(a, (ast.Tuple, ast.List))]
            shape_nodes = [a for a in args if isinstance(a, (ast.Tuple, ast.List))]
            low, high = (0, nums[0]) if len(nums) == 1 else tuple(nums[:2]) if nums else (0, 2)
            fill.update(low=low, high=high)
            shape = self._ints(shape_nodes[0]) if shape_nodes else kw.get("size", ())
            dtype = kw.get("dtype", DType.int64)
        elif fn == "full":
            if len(args) != 2:
                raise DefinitionError("torch.full(size, fill_value) expected")
            shape = self._ints(args[0])
            fill["value"] = self._number(args[1])
        elif fn == "arange":
            if len(args) != 1:
                raise DefinitionError("torch.arange(n) expected")
            shape = (self._ints(args[0])[0],)
            dtype = kw.get("dtype", DType.int64)
        elif fn == "tensor":
            if len(args) != 1:
                raise DefinitionError("torch.tensor(value) expected")
            shape = ()
            fill["value"] = self._number(args[0])
        else:
            shape = self._shape_args(args) if args else kw.get("size", ())
        for key in ("low", "high", "fill_value"):
            if key in kw:
                fill[key] = kw[key]
        return TensorMeta(shape, contiguous_strides(shape), dtype, fill)

    def _method(self, base: TensorMeta, method: str, node: ast.Call) -> TensorMeta:
        if method == "as_strided":
            if len(node.args) < 2:
                raise DefinitionError("as_strided(size, stride) expected")
            shape, strides = self._ints(node.args[0]), self._ints(node.args[1])
            if len(shape) != len(strides):
                raise DefinitionError(f"as_strided size {shape} and stride {strides} differ in "
                                      f"length")
            storage = base.stored_numel
            need = 1 + sum((e - 1) * s for e, s in zip(shape, strides)) if all(shape) else 0
            if need > storage:
                raise DefinitionError(f"as_strided{shape, strides} reaches element {need - 1} of "
                                      f"a storage of {counted(storage, 'element')}")
            return TensorMeta(shape, strides, base.dtype, base.fill)
        if method in ("cuda", "contiguous", "clone", "detach", "requires_grad_"):
            return base
        if method == "to":
            for a in node.args:
                name = _dotted(a) or ""
                if name.startswith("torch.") and name[6:] in TORCH_DTYPES:
                    base = TensorMeta(base.shape, base.strides, self._torch_dtype(a), base.fill)
            kw = self._kw(node)
            if "dtype" in kw:
                base = TensorMeta(base.shape, base.strides, kw["dtype"], base.fill)
            return base
        if method in ("t", "mT") and base.rank == 2:
            return TensorMeta(base.shape[::-1], base.strides[::-1], base.dtype, base.fill)
        if method == "permute":
            return _permuted(base, self._dims(node, base.rank, "permute"))
        if method == "expand":
            return _expanded(base, self._dims(node, None, "expand"))
        if method == "unsqueeze":
            if len(node.args) != 1 or node.keywords:
                raise DefinitionError("unsqueeze(dim) expected")
            dim = self._number(node.args[0])
            if isinstance(dim, bool) or not isinstance(dim, int) or \
                    not -base.rank - 1 <= dim <= base.rank:
                raise DefinitionError(f"unsqueeze dim {dim!r} is out of range for rank "
                                      f"{base.rank}")
            dim %= base.rank + 1
            inner = base.strides[dim] * base.shape[dim] if dim < base.rank else 1
            return TensorMeta(base.shape[:dim] + (1,) + base.shape[dim:],
                              base.strides[:dim] + (inner,) + base.strides[dim:], base.dtype,
                              base.fill)
        raise DefinitionError(f"tensor method '.{method}()' is not allowed in inputs")
