// _ddprun_around: the one native piece of ddprun's Python probe. It makes a callable that runs
// the probe's `before` and `after` around a call of PyTorch's, with no Python frame of ours on
// the stack while that call runs.
//
// Why native: a wrapper written in Python is a frame. Every traceback through the wrapped call
// (Gloo's "Connection closed by peer" raised in Work.wait, an argument error in
// dist.all_reduce) would show it, and so would traceback.extract_stack() in a signal handler
// that interrupts a wait. A C call adds no frame: the program sees its own stack, as under
// torchrun. before and after are Python, but neither is on the stack while the call runs, and
// whatever they raise never reaches the program with our frames in it.
//
// Built against the stable ABI (Py_LIMITED_API 3.8), so the one file loads into every CPython
// from 3.8 on (the 1.13 peer's 3.11, the 2.14 peer's 3.13 and 3.14). Where it cannot load, the
// probe falls back to a Python wrapper (_ddprun_probe._around).
//
//   around(target, before, after) -> wrapper
//   wrapper(*args, **kwargs):
//     token = before(args, kwargs)           # args include the bound object, if any
//     if token is None: return target(*args, **kwargs)
//     result = target(*args, **kwargs)       # raises: after(token, None, True), then re-raise
//     after(token, result, False)
//     return result
// Set on a class, the wrapper binds as a method does (work.wait is the wrapper with work
// first). Other attributes (__name__, __doc__, __module__...) are the target's, and one set on
// the wrapper is set on the target; __wrapped__ is the target (bound alike), so
// inspect.signature gives the target's signature.
//
// before and after are the probe's, and catch everything they can. What still escapes them:
// an Exception is dropped (the probe has already stopped recording); anything else (the
// KeyboardInterrupt of a Ctrl-C that arrived while they ran) goes on to the program, with the
// traceback entries of our frames removed, so that it looks raised at the program's own call.

#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x03080000
#include <Python.h>

namespace {

struct Around {
  PyObject_HEAD PyObject* target;  // what is called
  PyObject* before;                // before(args, kwargs) -> token or None
  PyObject* after;                 // after(token, result or None, failed)
  PyObject* bound;                 // the object this wrapper is bound to, or nullptr
};

PyObject* around_type = nullptr;  // the heap type made in module_exec

// Handles an exception raised by before or after: drops an Exception, keeps anything else
// (returns true) with our frames' traceback entries removed.
bool keep_escaped() {
  PyObject* type = nullptr;
  PyObject* value = nullptr;
  PyObject* traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  bool keep = type != nullptr && !PyErr_GivenExceptionMatches(type, PyExc_Exception);
  Py_XDECREF(traceback);  // every entry is a frame of the probe's
  if (!keep) {
    Py_XDECREF(type);
    Py_XDECREF(value);
    return false;
  }
  PyErr_NormalizeException(&type, &value, &traceback);
  if (value != nullptr) PyException_SetTraceback(value, Py_None);
  Py_XDECREF(traceback);
  PyErr_Restore(type, value, nullptr);
  return true;
}

// The call's arguments: args with the bound object first, when there is one. New reference.
PyObject* full_arguments(Around* self, PyObject* args) {
  if (self->bound == nullptr) {
    Py_INCREF(args);
    return args;
  }
  Py_ssize_t count = PyTuple_Size(args);
  PyObject* full = PyTuple_New(count + 1);
  if (full == nullptr) return nullptr;
  Py_INCREF(self->bound);
  PyTuple_SetItem(full, 0, self->bound);
  for (Py_ssize_t i = 0; i < count; ++i) {
    PyObject* item = PyTuple_GetItem(args, i);
    Py_INCREF(item);
    PyTuple_SetItem(full, i + 1, item);
  }
  return full;
}

// Calls after(token, result, failed) with the call's exception, if any, set aside. Returns
// false when after raised something that must reach the program (then it is the error set).
bool run_after(Around* self, PyObject* token, PyObject* result, bool failed) {
  PyObject* type = nullptr;
  PyObject* value = nullptr;
  PyObject* traceback = nullptr;
  if (failed) PyErr_Fetch(&type, &value, &traceback);
  PyObject* outcome =
      PyObject_CallFunctionObjArgs(self->after, token, result != nullptr ? result : Py_None,
                                   failed ? Py_True : Py_False, nullptr);
  bool escaped = outcome == nullptr && keep_escaped();
  Py_XDECREF(outcome);
  if (escaped) {  // the call's own exception gives way to the program's KeyboardInterrupt
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    return false;
  }
  if (failed) PyErr_Restore(type, value, traceback);
  return true;
}

PyObject* around_call(PyObject* object, PyObject* args, PyObject* kwargs) {
  auto* self = reinterpret_cast<Around*>(object);
  PyObject* full = full_arguments(self, args);
  if (full == nullptr) return nullptr;
  PyObject* token = PyObject_CallFunctionObjArgs(self->before, full,
                                                 kwargs != nullptr ? kwargs : Py_None, nullptr);
  if (token == nullptr) {
    if (keep_escaped()) {
      Py_DECREF(full);
      return nullptr;
    }
    token = Py_None;
    Py_INCREF(token);
  }
  PyObject* result = PyObject_Call(self->target, full, kwargs);
  Py_DECREF(full);
  if (token != Py_None && !run_after(self, token, result, result == nullptr)) {
    Py_XDECREF(result);
    result = nullptr;
  }
  Py_DECREF(token);
  return result;
}

PyObject* make_around(PyObject* target, PyObject* before, PyObject* after, PyObject* bound) {
  auto alloc = reinterpret_cast<allocfunc>(
      PyType_GetSlot(reinterpret_cast<PyTypeObject*>(around_type), Py_tp_alloc));
  auto* self = reinterpret_cast<Around*>(alloc(reinterpret_cast<PyTypeObject*>(around_type), 0));
  if (self == nullptr) return nullptr;
  Py_INCREF(target);
  Py_INCREF(before);
  Py_INCREF(after);
  Py_XINCREF(bound);
  self->target = target;
  self->before = before;
  self->after = after;
  self->bound = bound;
  return reinterpret_cast<PyObject*>(self);
}

// A wrapper read through an instance binds to it, as a function would.
PyObject* around_get(PyObject* object, PyObject* instance, PyObject*) {
  auto* self = reinterpret_cast<Around*>(object);
  if (instance == nullptr || instance == Py_None || self->bound != nullptr) {
    Py_INCREF(object);
    return object;
  }
  return make_around(self->target, self->before, self->after, instance);
}

// Our own attributes first (__wrapped__, __self__), then the target's.
PyObject* around_getattro(PyObject* object, PyObject* name) {
  auto* self = reinterpret_cast<Around*>(object);
  if (PyUnicode_Check(name)) {
    if (PyUnicode_CompareWithASCIIString(name, "__wrapped__") == 0) {
      if (self->bound == nullptr) {
        Py_INCREF(self->target);
        return self->target;
      }
      // Bound: the target bound alike, so that inspect.signature() leaves self out.
      return PyObject_CallMethod(self->target, "__get__", "OO", self->bound,
                                 reinterpret_cast<PyObject*>(Py_TYPE(self->bound)));
    }
    if (PyUnicode_CompareWithASCIIString(name, "__self__") == 0 && self->bound != nullptr) {
      Py_INCREF(self->bound);
      return self->bound;
    }
  }
  return PyObject_GetAttr(self->target, name);
}

// Attributes set on the wrapper go to the target (a decorator that marks a function marks
// PyTorch's), where around_getattro finds them again.
int around_setattro(PyObject* object, PyObject* name, PyObject* value) {
  return PyObject_SetAttr(reinterpret_cast<Around*>(object)->target, name, value);
}

PyObject* around_repr(PyObject* object) {
  return PyObject_Repr(reinterpret_cast<Around*>(object)->target);
}

int around_traverse(PyObject* object, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<Around*>(object);
  Py_VISIT(self->target);
  Py_VISIT(self->before);
  Py_VISIT(self->after);
  Py_VISIT(self->bound);
  return 0;
}

int around_clear(PyObject* object) {
  auto* self = reinterpret_cast<Around*>(object);
  Py_CLEAR(self->target);
  Py_CLEAR(self->before);
  Py_CLEAR(self->after);
  Py_CLEAR(self->bound);
  return 0;
}

void around_dealloc(PyObject* object) {
  PyObject_GC_UnTrack(object);
  around_clear(object);
  PyTypeObject* type = Py_TYPE(object);
  auto free = reinterpret_cast<freefunc>(PyType_GetSlot(type, Py_tp_free));
  free(object);
  Py_DECREF(type);
}

PyObject* around(PyObject*, PyObject* args) {
  PyObject* target = nullptr;
  PyObject* before = nullptr;
  PyObject* after = nullptr;
  if (!PyArg_ParseTuple(args, "OOO:around", &target, &before, &after)) return nullptr;
  if (!PyCallable_Check(target) || !PyCallable_Check(before) || !PyCallable_Check(after)) {
    PyErr_SetString(PyExc_TypeError, "around(target, before, after) takes three callables");
    return nullptr;
  }
  return make_around(target, before, after, nullptr);
}

PyType_Slot around_slots[] = {
    {Py_tp_call, reinterpret_cast<void*>(around_call)},
    {Py_tp_descr_get, reinterpret_cast<void*>(around_get)},
    {Py_tp_getattro, reinterpret_cast<void*>(around_getattro)},
    {Py_tp_setattro, reinterpret_cast<void*>(around_setattro)},
    {Py_tp_repr, reinterpret_cast<void*>(around_repr)},
    {Py_tp_traverse, reinterpret_cast<void*>(around_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(around_clear)},
    {Py_tp_dealloc, reinterpret_cast<void*>(around_dealloc)},
    {0, nullptr},
};

PyType_Spec around_spec = {
    "_ddprun_around.Around",
    sizeof(Around),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    around_slots,
};

PyMethodDef module_methods[] = {
    {"around", around, METH_VARARGS,
     "around(target, before, after): target called between before and after, with no Python "
     "frame of ours on the stack while it runs."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT,
    "_ddprun_around",
    nullptr,
    -1,
    module_methods,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) PyObject* PyInit__ddprun_around() {
  if (around_type == nullptr) {
    around_type = PyType_FromSpec(&around_spec);
    if (around_type == nullptr) return nullptr;
  }
  return PyModule_Create(&module_definition);
}
