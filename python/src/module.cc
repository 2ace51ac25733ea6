// The _gflow extension module: gflow's public C++ API for Python. The gflow
// package (python/gflow/__init__.py) re-exports it with the error classes.
#include "bindings.h"

namespace gflow {
namespace python {

// gflow::Error -> the gflow.errors class for its code, with code, detail,
// op, seq, rank and peer as attributes.
void bindErrors(py::module_& m) {
  m.def("_error_codes", [] {
    py::dict d;
    for (int c = 0; c <= static_cast<int>(ErrorCode::kInternal); ++c) {
      d[py::int_(c)] = toString(static_cast<ErrorCode>(c));
    }
    return d;
  });
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      py::object make = py::module_::import("gflow.errors").attr("_from_native");
      py::object exc = make(static_cast<int>(e.code()), e.what(), e.detail(), e.op(), e.seq(),
                            e.rank(), e.peer());
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    }
  });
}

}  // namespace python
}  // namespace gflow

PYBIND11_MODULE(_gflow, m) {
  m.doc() = "gflow allreduce library (native part; use the gflow package)";
  gflow::python::bindErrors(m);
  gflow::python::bindCommunicator(m);
  gflow::python::bindReducer(m);
}
