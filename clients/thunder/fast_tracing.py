"""Thunder's first step, faster: shortcuts in its bytecode interpreter, same traces.

The first training step through Thunder is mostly Thunder interpreting the model's Python, frame
by frame, with a provenance record for every value (docs/thunder.md, "Where the first step
goes"). Two of its costs are pure overhead:

- **Global names.** For every ``LOAD_GLOBAL``, Thunder 0.2 interprets two Python frames, a
  ``lambda d, k: d[k]`` and a ``getitem`` helper that resolves ``__getitem__`` through its
  ``getattr`` lookaside, before it reaches the dict's ``__getitem__`` lookaside, which makes the
  wrapped value and its provenance. A builtin (``len``, ``isinstance``) costs that twice: once
  for ``__builtins__``, once in it. CPython reads an exact dict directly, so here the lookaside
  is called directly: the same wrapped value, with the same provenance, without the frames.
- **Disassembly.** Every interpreted frame runs ``dis.get_instructions`` over its code again.
  Code objects are immutable, so the instructions are kept per code object.
- **Built-in containers.** ``x[k]``, ``len(x)``, ``k in x``, ``if x``, a ``*args`` call's
  arguments, ``**kwargs`` merging and ``[*a]`` each interpret a helper frame that looks the method
  up (``x.__getitem__``, ``b.update``, ``l.extend``, through the ``getattr`` lookaside) and calls
  it, to reach the container's own lookaside. For an exact ``dict``, ``list`` or ``tuple`` (what
  CPython's specialised ``BINARY_SUBSCR_DICT``, ``_LIST_INT`` and ``_TUPLE_INT`` serve) that
  lookaside is called directly (and for an ``OrderedDict``, whose are the same); every other
  type goes the way Thunder goes.
- **Traceback frames.** When an exception leaves an interpreted frame (a ``StopIteration`` ends
  every ``for`` loop over a list), Thunder makes a stand-in Python frame for the traceback: it
  compiles a ``raise`` at that line and runs it in a new thread, which the interpreter's thread
  busy-waits for (0.4 s of a 12-layer nanoGPT's first step on 2 cores). The stand-in depends
  only on the code object, the line and the qualified name, so one is kept per those.

Nothing else changes: the fallbacks (a ``globals`` that is not a dict, a missing name, a
``__builtins__`` module) are Thunder's own code, and the traces are the same; the tests compare
them with and without. ``install`` is called by ``fusecut.thunder.executor`` for the Thunder
versions it was checked on, and ``FUSECUT_THUNDER_FAST_TRACING=0`` leaves Thunder as it is.
"""

from __future__ import annotations

import collections
import dis
import types
import weakref

from fusecut import environment

# what install replaced, to put back (empty while Thunder's interpreter is as it ships)
_installed: dict[str, object] = {}


def enabled_by_environment() -> bool:
    return environment.flag("FUSECUT_THUNDER_FAST_TRACING")


class _CachedDis(types.ModuleType):
    """``dis``, with ``get_instructions(code)`` kept per code object (weakly: a code object that
    goes away takes its instructions with it)."""

    def __init__(self) -> None:
        super().__init__("dis")
        # dis's own names as attributes, not through __getattr__: Thunder reads dis.Instruction
        # for every provenance record
        vars(self).update((k, v) for k, v in vars(dis).items()
                          if not k.startswith("__") and k != "get_instructions")
        self._by_code: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def get_instructions(self, x, *args, **kwargs):
        if args or kwargs or not isinstance(x, types.CodeType):
            return dis.get_instructions(x, *args, **kwargs)
        found = self._by_code.get(x)
        if found is None:
            found = self._by_code[x] = tuple(dis.get_instructions(x))
        return iter(found)


def _direct_globals_lookup(interpreter, original):
    """Thunder's ``globals_lookup`` with the dict's ``__getitem__`` lookaside called directly
    where CPython reads a dict directly; everything else goes to ``original``."""
    unwrap, wrap_const, call = (interpreter.unwrap, interpreter.wrap_const,
                                interpreter._interpret_call)

    def globals_lookup(globals_dict, name):
        plain_globals, key = unwrap(globals_dict), unwrap(name)
        if type(plain_globals) is not dict:
            return original(globals_dict, name)
        if key in plain_globals:
            return call(dict.__getitem__, globals_dict, name)
        builtins = plain_globals.get("__builtins__")
        if type(builtins) is dict and key in builtins:  # an imported module's builtins
            wrapped_builtins = call(dict.__getitem__, globals_dict, wrap_const("__builtins__"))
            if wrapped_builtins is interpreter.INTERPRETER_SIGNALS.EXCEPTION_RAISED:
                return wrapped_builtins
            return call(dict.__getitem__, wrapped_builtins, name)
        return original(globals_dict, name)

    return globals_lookup


# exact types: a subclass may override what is looked up. OrderedDict's lookasides are dict's
# (Thunder registers both); a module's hook dicts are OrderedDicts, tested for emptiness per call.
CONTAINERS = (dict, collections.OrderedDict, list, tuple)


def _container_shortcuts(interpreter, binary_subscr, contains_op, length, truth):
    """The ``BINARY_SUBSCR`` and ``CONTAINS_OP`` handlers and the ``len`` and ``bool``
    lookasides, calling an exact built-in container's method (and so its lookaside) directly;
    others go to Thunder's."""
    unwrap, call, wrap_const = (interpreter.unwrap, interpreter._interpret_call,
                                interpreter.wrap_const)
    raised = interpreter.INTERPRETER_SIGNALS.EXCEPTION_RAISED

    def _binary_subscr_handler(inst, /, stack, **kwargs):
        typ = type(unwrap(stack.getitem_wrapped(-2)))
        if typ not in CONTAINERS:
            return binary_subscr(inst, stack=stack, **kwargs)
        key = stack.pop_wrapped()
        container = stack.pop_wrapped()
        result = call(typ.__getitem__, container, key)
        if result is raised:
            return result
        stack.append(result)

    def _contains_op_handler(inst, /, stack, **kwargs):
        typ = type(unwrap(stack.getitem_wrapped(-1)))
        if typ not in CONTAINERS:
            return contains_op(inst, stack=stack, **kwargs)
        container = stack.pop_wrapped()
        item = stack.pop_wrapped()
        result = call(typ.__contains__, container, item)
        if result is not raised and inst.arg == 1:  # "not in", negated as Thunder negates it
            result = call(lambda result: not result, result)
        if result is raised:
            return result
        stack.append(result)

    def len_lookaside(obj):
        typ = type(unwrap(obj))
        if typ not in CONTAINERS:
            return length(obj)
        return call(typ.__len__, obj)

    def bool_lookaside(obj):
        # Thunder's helper takes the length through the container's lookaside (which starts
        # tracking its items) and compares it with 0; the comparison's result records no inputs,
        # so it is a constant here too
        typ = type(unwrap(obj))
        if typ not in CONTAINERS:
            return truth(obj)
        n = call(typ.__len__, obj)
        return n if n is raised else wrap_const(unwrap(n) != 0)

    return _binary_subscr_handler, _contains_op_handler, len_lookaside, bool_lookaside


def _merge_shortcuts(interpreter, wrap_args, dict_merge, list_extend):
    """``wrap_args_from_list`` (a ``*args`` call's arguments, one by one) and the ``DICT_MERGE``
    and ``LIST_EXTEND`` handlers, calling an exact container's method directly; others go to
    Thunder's."""
    unwrap, call, wrap_const = (interpreter.unwrap, interpreter._interpret_call,
                                interpreter.wrap_const)
    raised = interpreter.INTERPRETER_SIGNALS.EXCEPTION_RAISED

    def wrap_args_from_list(lst):
        typ = type(unwrap(lst))
        if typ not in (list, tuple):
            return wrap_args(lst)
        return [call(typ.__getitem__, lst, wrap_const(i)) for i in range(len(unwrap(lst)))]

    def _dict_merge_handler(inst, /, stack, co, **kwargs):
        if type(unwrap(stack.getitem_wrapped(-2))) is not dict:
            return dict_merge(inst, stack=stack, co=co, **kwargs)
        merged = stack.pop_wrapped()
        into = stack.getitem_wrapped(-1)
        if overlap := unwrap(into).keys() & unwrap(merged):  # Thunder's check and message
            return interpreter.do_raise(KeyError(
                f"{co.co_name} got multiple values for keyword argument {next(iter(overlap))}"))
        if call(dict.update, into, merged) is raised:
            return raised

    def _list_extend_handler(inst, /, stack, **kwargs):
        if type(unwrap(stack.getitem_wrapped(-inst.arg - 1))) is not list:
            return list_extend(inst, stack=stack, **kwargs)
        items = stack.pop_wrapped()
        if call(list.extend, stack.getitem_wrapped(-inst.arg), items) is raised:
            return raised

    return wrap_args_from_list, _dict_merge_handler, _list_extend_handler


def _kept_python_frames(original):
    """``InterpreterFrame.get_or_make_python_frame`` with its stand-in frame kept per code
    object (weakly), line and qualified name: all the stand-in is made of."""
    by_code: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def get_or_make_python_frame(frame):
        if frame.positions is None:
            return original(frame)  # Thunder's assertion says what is wrong
        made = by_code.get(frame.code)
        if made is None:
            made = by_code[frame.code] = {}
        key = (frame.positions.lineno, frame.qualname)
        python_frame = made.get(key)
        if python_frame is None:
            python_frame = made[key] = original(frame)
        return python_frame

    return get_or_make_python_frame


def install() -> bool:
    """Put the shortcuts into Thunder's interpreter (once); False where its shape is not the one
    they were written for, or the environment turned them off."""
    if _installed:
        return True
    if not enabled_by_environment():
        return False
    from thunder.core import interpreter

    original = getattr(interpreter, "globals_lookup", None)
    frame_class = getattr(interpreter, "InterpreterFrame", None)
    make_frame = getattr(frame_class, "get_or_make_python_frame", None)
    if original is None or make_frame is None or getattr(interpreter, "dis", None) is not dis \
            or not hasattr(interpreter, "_interpret_call"):
        return False
    handlers, lookasides = (interpreter._default_opcode_handler_map,
                            interpreter._default_lookaside_map)
    if not {"BINARY_SUBSCR", "CONTAINS_OP", "DICT_MERGE", "LIST_EXTEND"} <= handlers.keys() \
            or not {len, bool} <= lookasides.keys() \
            or not hasattr(interpreter, "wrap_args_from_list"):
        return False
    _installed["globals_lookup"] = original
    _installed["get_or_make_python_frame"] = make_frame
    _installed["handlers"] = (handlers["BINARY_SUBSCR"], handlers["CONTAINS_OP"], lookasides[len],
                              lookasides[bool])
    interpreter.globals_lookup = _direct_globals_lookup(interpreter, original)
    interpreter.dis = _CachedDis()
    frame_class.get_or_make_python_frame = _kept_python_frames(make_frame)
    (handlers["BINARY_SUBSCR"], handlers["CONTAINS_OP"], lookasides[len],
     lookasides[bool]) = _container_shortcuts(interpreter, *_installed["handlers"])
    _installed["merges"] = (interpreter.wrap_args_from_list, handlers["DICT_MERGE"],
                            handlers["LIST_EXTEND"])
    (interpreter.wrap_args_from_list, handlers["DICT_MERGE"],
     handlers["LIST_EXTEND"]) = _merge_shortcuts(interpreter, *_installed["merges"])
    return True


def uninstall() -> None:
    """Thunder's interpreter as it was (for the tests that compare traces)."""
    if not _installed:
        return
    from thunder.core import interpreter

    interpreter.globals_lookup = _installed.pop("globals_lookup")
    interpreter.dis = dis
    interpreter.InterpreterFrame.get_or_make_python_frame = _installed.pop(
        "get_or_make_python_frame")
    (interpreter._default_opcode_handler_map["BINARY_SUBSCR"],
     interpreter._default_opcode_handler_map["CONTAINS_OP"],
     interpreter._default_lookaside_map[len],
     interpreter._default_lookaside_map[bool]) = _installed.pop("handlers")
    (interpreter.wrap_args_from_list, interpreter._default_opcode_handler_map["DICT_MERGE"],
     interpreter._default_opcode_handler_map["LIST_EXTEND"]) = _installed.pop("merges")
