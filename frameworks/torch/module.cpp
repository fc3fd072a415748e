// The Python module of the chorus backend (chorus_torch._C): ProcessGroupChorus as a subclass of
// c10d.Backend, which the chorus_torch package registers as the backend "chorus".
#include <Python.h>
#include <pybind11/chrono.h>
#include <torch/extension.h>

#include <chrono>
#include <string>

#include "chorus/chorus.h"
#include "process_group_chorus.hpp"

PYBIND11_MODULE(_C, m) {
  m.doc() = "Chorus's torch.distributed backend (registered as 'chorus' by the chorus_torch package)";
  py::module::import("torch.distributed");  // registers c10d.Backend, our base class
  m.def("version", [] {
    int v = 0;
    chorusGetVersion(&v);
    return v;
  });
  py::class_<chorus_torch::ProcessGroupChorus, c10d::Backend,
             c10::intrusive_ptr<chorus_torch::ProcessGroupChorus>>(m, "ProcessGroupChorus")
      .def(py::init<const c10::intrusive_ptr<c10d::Store>&, int, int, std::chrono::milliseconds,
                    std::string>(),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("group_name") = "",
           py::call_guard<py::gil_scoped_release>());
}
