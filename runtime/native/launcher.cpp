// fusecut's warm-call launcher: one C++ call per fd.execute once a plan is compiled.
//
// Python measures about 4-6 us to allocate one tensor and 7-8 us per cuLaunchKernel through
// cuda-python or ctypes on the H100 box; nvFuser's whole warm call is about 11 us. This module
// does, in C++, only what a warm call needs: compare the arguments with the program's signature,
// allocate buffers through torch's caching allocator, fill kernel parameters and launch. It knows
// nothing about plans: runtime/program.py describes a program as plain tuples (see `make`).
//
// cuLaunchKernel is not linked: Python passes its address, so this builds without the CUDA
// toolkit, and a test can pass a recording stand-in and run programs on the CPU.
//
// A host program (seed 004's stream loops) runs here too (`make_host`, `run_host`): its stages
// in order, each stream loop's iterations on a pool of streams, each iteration's programs on
// slices of their operands, with the events and stream waits the Python loop makes, through
// cuEventRecord and cuStreamWaitEvent passed by address like cuLaunchKernel. One C++ call then
// replaces about 28 us of Python per iteration.

#include <Python.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/as_strided.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace {

using LaunchFn = int (*)(void* function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, unsigned smem, void* stream, void** params,
                         void** extra);
using GetContextFn = int (*)(void** context);
using SetContextFn = int (*)(void* context);

// A fusion argument as the program was built for it.
struct InputSpec {
  bool tensor = false;
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype = at::ScalarType::Float;
  int align = 0;               // data_ptr() % 16
  PyTypeObject* scalar_type = nullptr;  // float, int or bool
  PyObject* value = nullptr;   // a scalar whose value the plan depends on (owned), else null
};

struct BufferSpec {
  std::vector<int64_t> sizes;
  at::ScalarType dtype = at::ScalarType::Float;
};

enum ParamKind : int {
  kSlot = 0,        // a tensor's data pointer: inputs first, then buffers
  kInt = 1,         // a constant long long
  kDouble = 2,      // a constant double
  kBool = 3,        // a constant bool
  kScalarInt = 4,   // a scalar argument, as long long
  kScalarDouble = 5,
  kScalarBool = 6,
};

struct Param {
  int kind;
  int64_t index;  // slot or argument position
  int64_t ivalue;
  double dvalue;
};

// A library segment: one cuBLAS call through ATen, as torch.nn.functional.linear or torch.matmul.
struct Library {
  int op = 0;  // 0: none (a kernel launch), 1: linear, 2: matmul
  std::vector<int> inputs;  // slots: a, b[, bias]
  int output = 0;
  at::ScalarType dtype = at::ScalarType::Float;
};

struct Launch {
  Library library;
  void* function;
  unsigned grid[3], block[3], smem;
  std::vector<Param> params;
  std::vector<int> allocs;  // slots of the buffers first written by this launch
  std::vector<int> frees;   // slots of the buffers last read by this launch
};

struct Output {
  int slot;
  bool view;  // a compact buffer seen at its logical shape (stride 0 on broadcast axes)
  std::vector<int64_t> sizes, strides;
};

struct Program {
  LaunchFn launch = nullptr;
  // The driver context the kernels were loaded in. A thread torch has not used yet (autograd's,
  // a user's) has none current: it is made current for the call, and the previous one restored.
  GetContextFn get_context = nullptr;
  SetContextFn set_context = nullptr;
  void* context = nullptr;
  at::Device device = at::Device(at::kCPU);
  std::vector<InputSpec> inputs;
  std::vector<BufferSpec> buffers;
  std::vector<Launch> launches;
  std::vector<Output> outputs;

  ~Program() {
    for (auto& in : inputs) Py_XDECREF(in.value);
  }
};

// ---- building a program from Python tuples ----------------------------------------------------

bool int_vector(PyObject* seq, std::vector<int64_t>& out) {
  PyObject* fast = PySequence_Fast(seq, "expected a sequence of ints");
  if (!fast) return false;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  out.resize(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    out[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
  }
  Py_DECREF(fast);
  return !PyErr_Occurred();
}

bool int_list(PyObject* seq, std::vector<int>& out) {
  std::vector<int64_t> wide;
  if (!int_vector(seq, wide)) return false;
  out.assign(wide.begin(), wide.end());
  return true;
}

bool parse_input(PyObject* item, InputSpec& spec) {
  const char* what;
  PyObject *a, *b;
  int dtype = 0, align = 0;
  if (!PyArg_ParseTuple(item, "sOO|ii", &what, &a, &b, &dtype, &align)) return false;
  if (std::strcmp(what, "tensor") == 0) {
    spec.tensor = true;
    spec.dtype = static_cast<at::ScalarType>(dtype);
    spec.align = align;
    return int_vector(a, spec.sizes) && int_vector(b, spec.strides);
  }
  spec.scalar_type = reinterpret_cast<PyTypeObject*>(a);
  spec.value = b == Py_None ? nullptr : b;
  Py_XINCREF(spec.value);
  return true;
}

void destroy(PyObject* capsule) {
  delete static_cast<Program*>(PyCapsule_GetPointer(capsule, "fusecut.Program"));
}

// make((launch_fn, get_context_fn, set_context_fn, context), device_type, device_index, inputs,
//      buffers, launches, outputs) -> capsule  (context functions 0: no context handling)
//   inputs:   ("tensor", sizes, strides, dtype, align) | ("scalar", type, value-or-None)
//   buffers:  (sizes, dtype)
//   launches: (function, grid, block, smem, params, allocs, frees, library);
//             params: (kind, index, i, d); library: None or (op, input slots, output slot, dtype)
//   outputs:  (slot, sizes-or-None, strides-or-None)
PyObject* make(PyObject*, PyObject* args) {
  unsigned long long launch_fn, get_fn, set_fn, context;
  int device_type, device_index;
  PyObject *inputs, *buffers, *launches, *outputs;
  if (!PyArg_ParseTuple(args, "(KKKK)iiOOOO", &launch_fn, &get_fn, &set_fn, &context,
                        &device_type, &device_index, &inputs, &buffers, &launches, &outputs)) {
    return nullptr;
  }
  auto* prog = new Program();
  prog->launch = reinterpret_cast<LaunchFn>(launch_fn);
  prog->get_context = reinterpret_cast<GetContextFn>(get_fn);
  prog->set_context = reinterpret_cast<SetContextFn>(set_fn);
  prog->context = reinterpret_cast<void*>(context);
  prog->device = at::Device(static_cast<c10::DeviceType>(device_type),
                            static_cast<c10::DeviceIndex>(device_index));
  bool ok = true;
  for (Py_ssize_t i = 0; ok && i < PyList_Size(inputs); ++i) {
    InputSpec spec;
    ok = parse_input(PyList_GetItem(inputs, i), spec);
    prog->inputs.push_back(std::move(spec));
  }
  for (Py_ssize_t i = 0; ok && i < PyList_Size(buffers); ++i) {
    PyObject *sizes;
    int dtype;
    if (!PyArg_ParseTuple(PyList_GetItem(buffers, i), "Oi", &sizes, &dtype)) { ok = false; break; }
    BufferSpec spec;
    ok = int_vector(sizes, spec.sizes);
    spec.dtype = static_cast<at::ScalarType>(dtype);
    prog->buffers.push_back(std::move(spec));
  }
  for (Py_ssize_t i = 0; ok && i < PyList_Size(launches); ++i) {
    Launch l;
    unsigned long long fn;
    PyObject *params, *allocs, *frees, *library;
    if (!PyArg_ParseTuple(PyList_GetItem(launches, i), "K(III)(III)IOOOO", &fn, &l.grid[0],
                          &l.grid[1], &l.grid[2], &l.block[0], &l.block[1], &l.block[2], &l.smem,
                          &params, &allocs, &frees, &library)) {
      ok = false;
      break;
    }
    if (library != Py_None) {
      PyObject* slots;
      int dtype;
      ok = PyArg_ParseTuple(library, "iOii", &l.library.op, &slots, &l.library.output, &dtype) &&
           int_list(slots, l.library.inputs);
      l.library.dtype = static_cast<at::ScalarType>(dtype);
    }
    l.function = reinterpret_cast<void*>(fn);
    for (Py_ssize_t k = 0; ok && k < PyList_Size(params); ++k) {
      Param p;
      long long index, ivalue;
      if (!PyArg_ParseTuple(PyList_GetItem(params, k), "iLLd", &p.kind, &index, &ivalue,
                            &p.dvalue)) {
        ok = false;
        break;
      }
      p.index = index;
      p.ivalue = ivalue;
      l.params.push_back(p);
    }
    ok = ok && int_list(allocs, l.allocs) && int_list(frees, l.frees);
    prog->launches.push_back(std::move(l));
  }
  for (Py_ssize_t i = 0; ok && i < PyList_Size(outputs); ++i) {
    Output o;
    PyObject *sizes, *strides;
    if (!PyArg_ParseTuple(PyList_GetItem(outputs, i), "iOO", &o.slot, &sizes, &strides)) {
      ok = false;
      break;
    }
    o.view = sizes != Py_None;
    if (o.view) ok = int_vector(sizes, o.sizes) && int_vector(strides, o.strides);
    prog->outputs.push_back(std::move(o));
  }
  if (!ok) {
    delete prog;
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "malformed fusecut program");
    return nullptr;
  }
  return PyCapsule_New(prog, "fusecut.Program", destroy);
}

// ---- running it -----------------------------------------------------------------------------

bool matches(const InputSpec& spec, PyObject* arg, const at::Device& device) {
  if (spec.tensor) {
    if (!THPVariable_Check(arg)) return false;
    const at::Tensor& t = THPVariable_Unpack(arg);
    return t.scalar_type() == spec.dtype && t.device() == device &&
           t.sizes() == c10::IntArrayRef(spec.sizes) &&
           t.strides() == c10::IntArrayRef(spec.strides) &&
           static_cast<int>(reinterpret_cast<uintptr_t>(t.data_ptr()) & 15) == spec.align;
  }
  if (Py_TYPE(arg) != spec.scalar_type) return false;
  return spec.value == nullptr || PyObject_RichCompareBool(arg, spec.value, Py_EQ) == 1;
}

// The buffer of output slot ``slot`` as the caller's target tensor (a slice of a whole output,
// seed 004), when the target can hold it as it is: same dtype, dense, as many elements.
at::Tensor as_target(const std::vector<at::Tensor>& targets, int slot, const BufferSpec& spec) {
  if (slot >= static_cast<int>(targets.size()) || !targets[slot].defined()) return {};
  const at::Tensor& t = targets[slot];
  int64_t numel = 1;
  for (int64_t e : spec.sizes) numel *= e;
  if (t.scalar_type() != spec.dtype || !t.is_contiguous() || t.numel() != numel) return {};
  return t.view(spec.sizes);
}

// Runs a program on arguments that match it: tensors by position in ``slots`` (the rest of
// ``slots`` receives the buffers), scalars as Python objects in ``items`` (by position; null
// where the argument is a tensor). ``targets``: by slot, a tensor to write that output to
// (empty: none). Returns the outputs. Throws on a failed launch or conversion.
// The pointer form (a stream loop's kernel-only programs, whose slices are only addresses):
// ``addresses`` gives per slot the address a kernel parameter takes, set for the arguments (a
// slice's address, no slice made) and for buffers written straight into a target; the other
// buffers are allocated and get theirs here. ``keep``: which outputs to return (null: all).
std::vector<at::Tensor> execute(const Program& prog, std::vector<at::Tensor>& slots,
                                PyObject* const* items, void* stream,
                                const std::vector<at::Tensor>& targets,
                                std::vector<uint64_t>* addresses = nullptr,
                                const std::vector<char>* keep = nullptr) {
  const Py_ssize_t n_args = static_cast<Py_ssize_t>(prog.inputs.size());
  std::vector<uint64_t> values;
  std::vector<void*> pointers;
  for (const Launch& l : prog.launches) {
    for (int b : l.allocs) {
      if (addresses != nullptr && (*addresses)[b] != 0) continue;  // written into its target
      const BufferSpec& spec = prog.buffers[b - n_args];
      at::Tensor target = as_target(targets, b, spec);
      slots[b] = target.defined() ? target
                                  : at::empty(spec.sizes, at::TensorOptions().dtype(spec.dtype)
                                                              .device(prog.device));
      if (addresses != nullptr) (*addresses)[b] = reinterpret_cast<uint64_t>(slots[b].data_ptr());
    }
    if (l.library.op != 0) {
      const Library& lib = l.library;
      const at::Tensor& a = slots[lib.inputs[0]];
      const at::Tensor& b = slots[lib.inputs[1]];
      at::Tensor r = lib.op == 1
          ? at::linear(a, b, lib.inputs.size() > 2 ? std::optional<at::Tensor>(
                                  slots[lib.inputs[2]]) : std::nullopt)
          : at::matmul(a, b);
      if (r.scalar_type() != lib.dtype) r = r.to(lib.dtype);
      slots[lib.output] = r.is_contiguous() ? r : r.contiguous();
      for (int f : l.frees) slots[f].reset();
      continue;
    }
    if (l.function == nullptr) continue;  // a segment with nothing to compute
    values.assign(l.params.size(), 0);
    pointers.resize(l.params.size());
    for (size_t k = 0; k < l.params.size(); ++k) {
      const Param& p = l.params[k];
      uint64_t& v = values[k];
      switch (p.kind) {
        case kSlot:
          v = addresses != nullptr ? (*addresses)[p.index]
                                   : reinterpret_cast<uint64_t>(slots[p.index].data_ptr());
          break;
        case kInt:
          v = static_cast<uint64_t>(p.ivalue);
          break;
        case kDouble:
          std::memcpy(&v, &p.dvalue, sizeof(double));
          break;
        case kBool:
          v = p.ivalue != 0;
          break;
        case kScalarInt: {
          long long x = PyLong_AsLongLong(items[p.index]);
          v = static_cast<uint64_t>(x);
          break;
        }
        case kScalarDouble: {
          double x = PyFloat_AsDouble(items[p.index]);
          std::memcpy(&v, &x, sizeof(double));
          break;
        }
        case kScalarBool:
          v = PyObject_IsTrue(items[p.index]) == 1;
          break;
      }
      pointers[k] = &v;
    }
    if (PyErr_Occurred()) throw std::runtime_error("a scalar argument did not convert");
    int err = prog.launch(l.function, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1],
                          l.block[2], l.smem, stream, pointers.data(), nullptr);
    if (err != 0) {
      throw std::runtime_error("cuLaunchKernel failed with CUDA error " + std::to_string(err));
    }
    for (int b : l.frees) slots[b].reset();  // the caching allocator reuses it
  }
  for (const Output& o : prog.outputs) {  // targets not written in place: copy there
    if (o.slot < static_cast<int>(targets.size()) && targets[o.slot].defined() &&
        !targets[o.slot].is_same(slots[o.slot]) &&
        targets[o.slot].data_ptr() != slots[o.slot].data_ptr()) {
      targets[o.slot].copy_(slots[o.slot].reshape(targets[o.slot].sizes()));
    }
  }
  std::vector<at::Tensor> outs(prog.outputs.size());
  for (size_t k = 0; k < prog.outputs.size(); ++k) {
    if (keep != nullptr && !(*keep)[k]) continue;
    const Output& o = prog.outputs[k];
    outs[k] = o.view ? at::as_strided(slots[o.slot], o.sizes, o.strides) : slots[o.slot];
  }
  return outs;
}

// Makes the kernels' driver context current for a call, and the previous one again after it.
struct ContextGuard {
  const Program* prog;
  void* previous = nullptr;
  bool switched = false;
  explicit ContextGuard(const Program* p) : prog(p) {
    if (prog != nullptr && prog->get_context != nullptr &&
        prog->get_context(&previous) == 0 && previous != prog->context) {
      switched = prog->set_context(prog->context) == 0;
    }
  }
  ~ContextGuard() {
    if (switched && previous != nullptr) prog->set_context(previous);
  }
};

PyObject* wrap(const std::vector<at::Tensor>& outs) {
  PyObject* result = PyList_New(outs.size());
  for (size_t i = 0; i < outs.size(); ++i) PyList_SET_ITEM(result, i, THPVariable_Wrap(outs[i]));
  return result;
}

// run(program, args, stream[, targets]) -> list of output tensors, or None when the arguments
// do not match the program's signature (the caller then takes the slow path). ``targets``: per
// output a tensor to write it to, or None; outputs that cannot be written there directly are
// copied there.
PyObject* run(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 3 && argc != 4) {
    PyErr_SetString(PyExc_TypeError, "run(program, args, stream[, targets])");
    return nullptr;
  }
  PyObject* target_list = argc == 4 && argv[3] != Py_None ? argv[3] : nullptr;
  auto* prog = static_cast<Program*>(PyCapsule_GetPointer(argv[0], "fusecut.Program"));
  if (!prog) return nullptr;
  PyObject* seq = PySequence_Fast(argv[1], "fusion arguments must be a list or tuple");
  if (!seq) return nullptr;
  void* stream = PyLong_AsVoidPtr(argv[2]);
  const Py_ssize_t n_args = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  if (n_args != static_cast<Py_ssize_t>(prog->inputs.size())) {
    Py_DECREF(seq);
    Py_RETURN_NONE;
  }
  for (Py_ssize_t i = 0; i < n_args; ++i) {
    if (!matches(prog->inputs[i], items[i], prog->device)) {
      Py_DECREF(seq);
      Py_RETURN_NONE;
    }
  }
  PyObject* result = nullptr;
  ContextGuard context(prog);
  try {
    std::vector<at::Tensor> slots(n_args + prog->buffers.size());
    for (Py_ssize_t i = 0; i < n_args; ++i) {
      if (prog->inputs[i].tensor) slots[i] = THPVariable_Unpack(items[i]);
    }
    std::vector<at::Tensor> targets;  // by slot
    if (target_list != nullptr) {
      if (!PyList_Check(target_list) ||
          PyList_GET_SIZE(target_list) != static_cast<Py_ssize_t>(prog->outputs.size())) {
        throw std::runtime_error("targets must be a list with one entry per output");
      }
      targets.resize(slots.size());
      for (size_t i = 0; i < prog->outputs.size(); ++i) {
        PyObject* t = PyList_GET_ITEM(target_list, i);
        if (t != Py_None && THPVariable_Check(t)) {
          targets[prog->outputs[i].slot] = THPVariable_Unpack(t);
        }
      }
    }
    result = wrap(execute(*prog, slots, items, stream, targets));
  } catch (const std::exception& e) {
    Py_XDECREF(result);
    result = nullptr;
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  Py_DECREF(seq);
  return result;
}

// ---- host programs: stream loops --------------------------------------------------------------

using EventRecordFn = int (*)(void* event, void* stream);
using StreamWaitEventFn = int (*)(void* stream, void* event, unsigned flags);

// Where a program argument comes from in the host program's values (``env``).
struct ArgRef {
  int kind = -1;  // 0: a value whole, 1: a value's slice at the iteration, 2: a scalar argument
  int index = 0;  // value id, or the host program's argument position
  int axis = 0;   // kind 1: the axis sliced (extent 1 in the slice)
};

struct SegmentCall {
  PyObject* capsule = nullptr;  // owned: keeps the program alive
  Program* prog = nullptr;
  bool pointers = false;  // in a loop: kernels only, every target written in place (by address)
  std::vector<ArgRef> args;     // per program argument
  std::vector<int> results;     // per program output: the value id it becomes (-1: a target's)
  std::vector<ArgRef> targets;  // per program output: kind 1, a slice to write it to; or none
};

struct Allocation {
  int value;
  std::vector<int64_t> sizes;
  at::ScalarType dtype;
};

struct HostStep {
  int64_t extent = 0;  // iterations of a stream loop; 0: run once on the caller's stream
  std::vector<Allocation> allocs;  // whole tensors, on the caller's stream before the loop
  std::vector<SegmentCall> calls;
};

struct PoolStream {
  void* handle;  // the driver's stream
  int64_t id;    // torch's (stream_id, device_index, device_type), to make it torch's current
  int device_index, device_type;
  void* done;    // an event: the end of this stream's latest iteration
};

struct HostOutput {
  int value;
  bool expand;  // a compact value seen at its logical shape: reshape to ``view``, expand
  std::vector<int64_t> view, sizes;
};

struct Host {
  EventRecordFn record = nullptr;
  StreamWaitEventFn wait = nullptr;
  at::Device device = at::Device(at::kCPU);
  std::vector<InputSpec> inputs;
  int values = 0;
  std::vector<HostStep> steps;
  std::vector<HostOutput> outputs;
  std::vector<PoolStream> pool;
  void* entry = nullptr;  // an event: the caller's work before a loop

  ~Host() {
    for (auto& in : inputs) Py_XDECREF(in.value);
    for (auto& step : steps) {
      for (auto& call : step.calls) Py_XDECREF(call.capsule);
    }
  }
};

void destroy_host(PyObject* capsule) {
  delete static_cast<Host*>(PyCapsule_GetPointer(capsule, "fusecut.Host"));
}

bool parse_ref(PyObject* item, ArgRef& ref) {
  if (item == Py_None) return true;
  return PyArg_ParseTuple(item, "iii", &ref.kind, &ref.index, &ref.axis);
}

// make_host((event_record_fn, stream_wait_event_fn), device_type, device_index, inputs, values,
//           steps, outputs, pool, entry_event) -> capsule
//   inputs:  as for make
//   steps:   (extent, allocs, calls); allocs: (value, sizes, dtype);
//            calls: (program capsule, args, results, targets, pointers); args and targets:
//            (kind, index, axis) or None; results: value ids (-1: written to its target);
//            pointers: run it in pointer form in a loop (see execute)
//   outputs: (value, view-sizes-or-None, sizes-or-None)
//   pool:    (stream handle, stream_id, device_index, device_type, done event handle)
PyObject* make_host(PyObject*, PyObject* args) {
  unsigned long long record_fn, wait_fn, entry;
  int device_type, device_index, values;
  PyObject *inputs, *steps, *outputs, *pool;
  if (!PyArg_ParseTuple(args, "(KK)iiOiOOOK", &record_fn, &wait_fn, &device_type,
                        &device_index, &inputs, &values, &steps, &outputs, &pool, &entry)) {
    return nullptr;
  }
  auto* host = new Host();
  host->record = reinterpret_cast<EventRecordFn>(record_fn);
  host->wait = reinterpret_cast<StreamWaitEventFn>(wait_fn);
  host->device = at::Device(static_cast<c10::DeviceType>(device_type),
                            static_cast<c10::DeviceIndex>(device_index));
  host->values = values;
  host->entry = reinterpret_cast<void*>(entry);
  bool ok = true;
  for (Py_ssize_t i = 0; ok && i < PyList_Size(inputs); ++i) {
    InputSpec spec;
    ok = parse_input(PyList_GetItem(inputs, i), spec);
    host->inputs.push_back(std::move(spec));
  }
  for (Py_ssize_t i = 0; ok && i < PyList_Size(steps); ++i) {
    HostStep step;
    PyObject *allocs, *calls;
    long long extent;
    ok = PyArg_ParseTuple(PyList_GetItem(steps, i), "LOO", &extent, &allocs, &calls);
    step.extent = extent;
    for (Py_ssize_t k = 0; ok && k < PyList_Size(allocs); ++k) {
      Allocation a;
      PyObject* sizes;
      int dtype;
      ok = PyArg_ParseTuple(PyList_GetItem(allocs, k), "iOi", &a.value, &sizes, &dtype) &&
           int_vector(sizes, a.sizes);
      a.dtype = static_cast<at::ScalarType>(dtype);
      step.allocs.push_back(std::move(a));
    }
    for (Py_ssize_t k = 0; ok && k < PyList_Size(calls); ++k) {
      SegmentCall call;
      PyObject *capsule, *refs, *results, *targets;
      int pointers = 0;
      ok = PyArg_ParseTuple(PyList_GetItem(calls, k), "OOOOp", &capsule, &refs, &results,
                            &targets, &pointers);
      call.pointers = pointers != 0;
      if (!ok) break;
      call.prog = static_cast<Program*>(PyCapsule_GetPointer(capsule, "fusecut.Program"));
      if (call.prog == nullptr) { ok = false; break; }
      Py_INCREF(capsule);
      call.capsule = capsule;
      for (Py_ssize_t r = 0; ok && r < PyList_Size(refs); ++r) {
        ArgRef ref;
        ok = parse_ref(PyList_GetItem(refs, r), ref);
        call.args.push_back(ref);
      }
      for (Py_ssize_t r = 0; ok && r < PyList_Size(targets); ++r) {
        ArgRef ref;
        ok = parse_ref(PyList_GetItem(targets, r), ref);
        call.targets.push_back(ref);
      }
      ok = ok && int_list(results, call.results) &&
           call.args.size() == call.prog->inputs.size() &&
           call.results.size() == call.prog->outputs.size() &&
           call.targets.size() == call.prog->outputs.size();
      step.calls.push_back(std::move(call));
    }
    host->steps.push_back(std::move(step));
  }
  for (Py_ssize_t i = 0; ok && i < PyList_Size(outputs); ++i) {
    HostOutput o;
    PyObject *view, *sizes;
    ok = PyArg_ParseTuple(PyList_GetItem(outputs, i), "iOO", &o.value, &view, &sizes);
    o.expand = ok && view != Py_None;
    if (o.expand) ok = int_vector(view, o.view) && int_vector(sizes, o.sizes);
    host->outputs.push_back(std::move(o));
  }
  for (Py_ssize_t i = 0; ok && i < PyList_Size(pool); ++i) {
    PoolStream ps;
    unsigned long long handle, done;
    long long id;
    ok = PyArg_ParseTuple(PyList_GetItem(pool, i), "KLiiK", &handle, &id, &ps.device_index,
                          &ps.device_type, &done);
    ps.handle = reinterpret_cast<void*>(handle);
    ps.id = id;
    ps.done = reinterpret_cast<void*>(done);
    host->pool.push_back(ps);
  }
  if (ok && host->pool.empty()) {
    for (const HostStep& step : host->steps) ok = ok && step.extent == 0;
  }
  if (!ok) {
    delete host;
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "malformed fusecut host program");
    return nullptr;
  }
  return PyCapsule_New(host, "fusecut.Host", destroy_host);
}

// Torch's current stream of the host's device, set for an iteration (the caching allocator
// and library calls follow it) and restored after, also when a launch throws.
struct CurrentStream {
  std::optional<c10::impl::VirtualGuardImpl> impl;
  std::optional<c10::Stream> caller;
  explicit CurrentStream(const at::Device& device) {
    if (device.is_cuda()) {
      impl.emplace(device.type());
      caller = impl->getStream(device);
    }
  }
  void use(const PoolStream& ps) {
    if (impl) {
      impl->exchangeStream(c10::Stream::unpack3(ps.id, static_cast<c10::DeviceIndex>(
          ps.device_index), static_cast<c10::DeviceType>(ps.device_type)));
    }
  }
  void restore() {
    if (impl) impl->exchangeStream(*caller);
  }
  ~CurrentStream() { restore(); }
};

void check_driver(int err, const char* what) {
  if (err != 0) throw std::runtime_error(std::string(what) + " failed with CUDA error " +
                                         std::to_string(err));
}

at::Tensor resolve(const ArgRef& ref, const std::vector<at::Tensor>& env, int64_t i) {
  const at::Tensor& value = env[ref.index];
  return ref.kind == 1 ? value.narrow(ref.axis, i, 1) : value;
}

// The address ``resolve`` would give its data, without making the slice (a view costs a few
// microseconds through the dispatcher; an iteration makes several).
uint64_t address(const ArgRef& ref, const std::vector<at::Tensor>& env, int64_t i) {
  const at::Tensor& value = env[ref.index];
  uint64_t base = reinterpret_cast<uint64_t>(value.data_ptr());
  if (ref.kind != 1) return base;
  return base + static_cast<uint64_t>(i * value.stride(ref.axis) * value.element_size());
}

// One segment's program on the host program's values (``i``: the loop's iteration, or -1).
void run_call(const SegmentCall& call, std::vector<at::Tensor>& env, PyObject* const* items,
              void* stream, int64_t i) {
  const Program& prog = *call.prog;
  const size_t n = prog.inputs.size();
  std::vector<at::Tensor> slots(n + prog.buffers.size());
  std::vector<PyObject*> scalars(n, nullptr);
  for (size_t k = 0; k < n; ++k) {
    const ArgRef& ref = call.args[k];
    if (ref.kind == 2) {
      scalars[k] = items[ref.index];
    } else if (!call.pointers || i < 0) {
      slots[k] = resolve(ref, env, i);
    }
  }
  std::vector<at::Tensor> outs;
  if (call.pointers && i >= 0) {
    std::vector<uint64_t> addresses(slots.size(), 0);
    std::vector<char> keep(call.results.size());
    for (size_t k = 0; k < n; ++k) {
      if (call.args[k].kind != 2) addresses[k] = address(call.args[k], env, i);
    }
    for (size_t o = 0; o < call.targets.size(); ++o) {
      if (call.targets[o].kind >= 0) {
        addresses[prog.outputs[o].slot] = address(call.targets[o], env, i);
      }
      keep[o] = call.results[o] >= 0;
    }
    outs = execute(prog, slots, scalars.data(), stream, {}, &addresses, &keep);
  } else {
    std::vector<at::Tensor> targets;
    for (size_t o = 0; o < call.targets.size(); ++o) {
      if (call.targets[o].kind < 0) continue;
      if (targets.empty()) targets.resize(slots.size());
      targets[prog.outputs[o].slot] = resolve(call.targets[o], env, i);
    }
    outs = execute(prog, slots, scalars.data(), stream, targets);
  }
  for (size_t o = 0; o < outs.size(); ++o) {
    if (call.results[o] >= 0) env[call.results[o]] = std::move(outs[o]);
  }
}

// run_host(host, args, stream) -> list of output tensors, or None when the arguments do not
// match the host program's signature. ``stream``: the caller's (torch's current) stream.
PyObject* run_host(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 3) {
    PyErr_SetString(PyExc_TypeError, "run_host(host, args, stream)");
    return nullptr;
  }
  auto* host = static_cast<Host*>(PyCapsule_GetPointer(argv[0], "fusecut.Host"));
  if (!host) return nullptr;
  PyObject* seq = PySequence_Fast(argv[1], "fusion arguments must be a list or tuple");
  if (!seq) return nullptr;
  void* caller = PyLong_AsVoidPtr(argv[2]);
  const Py_ssize_t n_args = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  bool match = n_args == static_cast<Py_ssize_t>(host->inputs.size());
  for (Py_ssize_t i = 0; match && i < n_args; ++i) {
    match = matches(host->inputs[i], items[i], host->device);
  }
  if (!match) {
    Py_DECREF(seq);
    Py_RETURN_NONE;
  }
  PyObject* result = nullptr;
  const Program* any = nullptr;
  for (const HostStep& step : host->steps) {
    if (!step.calls.empty()) any = step.calls.front().prog;
  }
  ContextGuard context(any);
  try {
    std::vector<at::Tensor> env(host->values);
    for (Py_ssize_t i = 0; i < n_args; ++i) {
      if (host->inputs[i].tensor) env[i] = THPVariable_Unpack(items[i]);
    }
    CurrentStream current(host->device);
    for (const HostStep& step : host->steps) {
      for (const Allocation& a : step.allocs) {
        env[a.value] = at::empty(a.sizes, at::TensorOptions().dtype(a.dtype)
                                              .device(host->device));
      }
      if (step.extent == 0) {
        for (const SegmentCall& call : step.calls) run_call(call, env, items, caller, -1);
        continue;
      }
      check_driver(host->record(host->entry, caller), "cuEventRecord");
      for (int64_t i = 0; i < step.extent; ++i) {
        const PoolStream& ps = host->pool[i % host->pool.size()];
        // Synchronize Stream 0; SetCurrentStream to Stream ( StreamIdx % numberOfStreams )
        check_driver(host->wait(ps.handle, host->entry, 0), "cuStreamWaitEvent");
        current.use(ps);
        for (const SegmentCall& call : step.calls) run_call(call, env, items, ps.handle, i);
        check_driver(host->record(ps.done, ps.handle), "cuEventRecord");
        current.restore();  // SetCurrentStream to Stream 0
        check_driver(host->wait(caller, ps.done, 0), "cuStreamWaitEvent");
      }
    }
    std::vector<at::Tensor> outs;
    for (const HostOutput& o : host->outputs) {
      const at::Tensor& value = env[o.value];
      outs.push_back(o.expand ? value.reshape(o.view).expand(o.sizes) : value);
    }
    result = wrap(outs);
  } catch (const std::exception& e) {
    Py_XDECREF(result);
    result = nullptr;
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  Py_DECREF(seq);
  return result;
}

PyMethodDef methods[] = {
    {"make", make, METH_VARARGS, "Build a program from its description."},
    {"run", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(run)), METH_FASTCALL,
     "Run a program: its outputs, or None when the arguments do not match."},
    {"make_host", make_host, METH_VARARGS, "Build a host program from its description."},
    {"run_host", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(run_host)),
     METH_FASTCALL, "Run a host program: its outputs, or None when the arguments do not match."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "fusecut_launcher", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_fusecut_launcher() { return PyModule_Create(&module); }
