// gflow.GradientReducer: lazy allreduce with chunk fusion, mixed-precision
// wire and CSC over arrays the caller owns (docs/gradient.md,
// docs/compression.md). The reducer keeps its arrays alive.
#include <pybind11/stl.h>

#include "bindings.h"

namespace gflow {
namespace python {
namespace {

struct PyReducer {
  std::vector<HeldTensor> arrays;  // declared first: destroyed after the reducer
  std::shared_ptr<GradientReducer> reducer;
};

// auto_wire={...}: AutoWireOptions by their Python names.
void setAutoWire(const py::dict& d, AutoWireOptions* a) {
  for (auto item : d) {
    const std::string key = item.first.cast<std::string>();
    py::handle v = item.second;
    if (key == "candidates") {
      for (py::handle w : v) a->candidates.push_back(toDataType(w));
    } else if (key == "warmup_steps") {
      a->warmupSteps = v.cast<int64_t>();
    } else if (key == "period") {
      a->period = v.cast<int64_t>();
    } else if (key == "reprobe") {
      a->reprobe = v.cast<int64_t>();
    } else if (key == "probe_steps") {
      a->probeSteps = v.cast<int64_t>();
    } else if (key == "slack") {
      a->slack = v.cast<double>();
    } else if (key == "residual_limit") {
      a->residualLimit = v.cast<double>();
    } else {
      throw Error(ErrorCode::kInvalidArgument,
                  "GradientReducer: auto_wire has no setting '" + key +
                      "' (candidates, warmup_steps, period, reprobe, probe_steps, slack, "
                      "residual_limit)");
    }
  }
}

std::shared_ptr<PyReducer> make(std::shared_ptr<Communicator> comm, py::list tensors, py::handle op,
                                uint64_t fusionThreshold, py::handle cycleTimeMs, py::handle wire,
                                float prescale, float postscale, double density, size_t chunk,
                                float momentum, uint64_t warmupSteps,
                                std::vector<std::string> names, std::string timeline,
                                py::handle reproducible, bool errorFeedback, py::dict autoWire) {
  if (!comm) throw Error(ErrorCode::kInvalidArgument, "GradientReducer: comm is None");
  auto r = std::make_shared<PyReducer>();
  std::vector<Tensor> grads;
  ReducerOptions o;
  // Collective: an argument error here fails `comm` for every rank.
  checkArgs(*comm, "GradientReducer", [&] {
    for (size_t i = 0; i < tensors.size(); ++i) {
      const std::string what = "GradientReducer: tensor " + std::to_string(i);
      r->arrays.push_back(viewTensor(tensors[i], what.c_str(), true));
      grads.push_back(r->arrays.back().tensor);
    }
    o.op = toReduceOp(op);
    o.fusionThreshold = fusionThreshold;
    if (!cycleTimeMs.is_none()) {
      o.cycleTime = std::chrono::milliseconds(cycleTimeMs.cast<int64_t>());
    }
    if (py::isinstance<py::str>(wire) && wire.cast<std::string>() == "auto") {
      o.autoWire.enabled = true;
    } else if (!wire.is_none()) {
      o.wire = toDataType(wire);
    }
    setAutoWire(autoWire, &o.autoWire);
    o.prescale = prescale;
    o.postscale = postscale;
    o.sparse.density = density;
    o.sparse.chunk = chunk;
    o.sparse.momentum = momentum;
    o.sparse.warmupSteps = warmupSteps;
    o.names = std::move(names);
    o.timeline = std::move(timeline);
    if (!reproducible.is_none()) o.reproducible = reproducible.cast<bool>();
    o.errorFeedback = errorFeedback;
  });
  py::gil_scoped_release nogil;
  r->reducer = std::make_shared<GradientReducer>(std::move(comm), std::move(grads), o);
  return r;
}

py::dict statsDict(const ReducerStats& s) {
  py::dict d;
  d["steps"] = s.steps;
  d["fused_ops"] = s.fusedOps;
  d["packed_bytes"] = s.packedBytes;
  d["in_place_bytes"] = s.inPlaceBytes;
  d["control_ops"] = s.controlOps;
  d["sparse_chunks"] = s.sparseChunks;
  d["sparse_chunks_sent"] = s.sparseChunksSent;
  d["wire_changes"] = s.wireChanges;
  return d;
}

}  // namespace

namespace {

std::shared_ptr<WireChooser> makeChooser(std::shared_ptr<Communicator> comm, size_t buckets,
                                         std::vector<std::string> names, std::string timeline,
                                         py::dict autoWire) {
  if (!comm) throw Error(ErrorCode::kInvalidArgument, "WireChooser: comm is None");
  AutoWireOptions o;
  setAutoWire(autoWire, &o);
  return std::make_shared<WireChooser>(std::move(comm), buckets, o, std::move(names), timeline);
}

void bindChooser(py::module_& m) {
  py::class_<WireChooser, std::shared_ptr<WireChooser>>(m, "WireChooser")
      .def(py::init(&makeChooser), py::arg("comm"), py::arg("buckets"), py::kw_only(),
           py::arg("names") = std::vector<std::string>{}, py::arg("timeline") = "",
           py::arg("auto_wire") = py::dict())
      .def(
          "wire",
          [](const WireChooser& c, size_t b) {
            DataType w;
            {
              py::gil_scoped_release nogil;
              w = c.wire(b);
            }
            return toString(w);
          },
          py::arg("bucket"))
      .def_property_readonly("wires",
                             [](const WireChooser& c) {
                               std::vector<DataType> wires;
                               {
                                 py::gil_scoped_release nogil;
                                 wires = c.wires();
                               }
                               std::vector<std::string> out;
                               for (DataType w : wires) out.push_back(toString(w));
                               return out;
                             })
      // Without the GIL: done() comes from completion threads, and the
      // chooser's lock may be held by a finish_step() waiting for the GIL
      // (its residual_ratios callback).
      .def("ready", &WireChooser::ready, py::arg("bucket"),
           py::call_guard<py::gil_scoped_release>())
      .def("done", &WireChooser::done, py::arg("bucket"), py::call_guard<py::gil_scoped_release>())
      .def(
          "finish_step",
          [](WireChooser& c, bool nonFinite, py::object ratios) {
            std::function<std::vector<double>()> fn;
            if (!ratios.is_none()) {
              fn = [ratios] {
                py::gil_scoped_acquire gil;
                return ratios().cast<std::vector<double>>();
              };
            }
            uint64_t changed = 0;
            {  // fn (and its Python callable) goes with the GIL held
              py::gil_scoped_release nogil;
              changed = c.finishStep(nonFinite, fn);
            }
            return changed;
          },
          py::arg("nonfinite"), py::arg("residual_ratios") = py::none())
      .def_property_readonly("steps", &WireChooser::steps);
}

}  // namespace

void bindReducer(py::module_& m) {
  bindChooser(m);
  py::class_<PyReducer, std::shared_ptr<PyReducer>>(m, "GradientReducer")
      .def(py::init(&make), py::arg("comm"), py::arg("tensors"), py::kw_only(),
           py::arg("op") = "avg", py::arg("fusion_threshold") = 0,
           py::arg("cycle_time_ms") = py::none(), py::arg("wire") = py::none(),
           py::arg("prescale") = 1.0f, py::arg("postscale") = 1.0f, py::arg("density") = -1.0,
           py::arg("chunk") = 0, py::arg("momentum") = 0.0f, py::arg("warmup_steps") = 0,
           py::arg("names") = std::vector<std::string>{}, py::arg("timeline") = "",
           py::arg("reproducible") = py::none(), py::arg("error_feedback") = true,
           py::arg("auto_wire") = py::dict())
      .def(
          "ready", [](PyReducer& r, size_t i) { r.reducer->ready(i); }, py::arg("index"))
      .def(
          "rebuild",
          [](PyReducer& r, std::shared_ptr<Communicator> comm) {
            if (!comm)
              throw Error(ErrorCode::kInvalidArgument, "GradientReducer.rebuild: comm is None");
            py::gil_scoped_release nogil;
            r.reducer->rebuild(std::move(comm));
          },
          py::arg("comm"))
      .def(
          "wait",
          [](PyReducer& r, py::handle timeout) {
            auto t = toTimeout(timeout);
            py::gil_scoped_release nogil;
            r.reducer->wait(t);
          },
          py::arg("timeout") = py::none())
      .def("wait_async",
           [](py::object self) {
             std::shared_ptr<GradientReducer> red = self.cast<PyReducer&>().reducer;
             return std::make_shared<PyWork>(
                 &red->communicator(),
                 [red] {
                   red->wait();
                   return red->nonFinite();
                 },
                 self);
           })
      .def("__len__", [](const PyReducer& r) { return r.reducer->numTensors(); })
      .def_property_readonly("buckets", [](const PyReducer& r) { return r.reducer->buckets(); })
      .def_property_readonly("fusion_threshold",
                             [](const PyReducer& r) { return r.reducer->fusionThreshold(); })
      .def_property_readonly("nonfinite", [](const PyReducer& r) { return r.reducer->nonFinite(); })
      .def_property_readonly("wires",
                             [](const PyReducer& r) {
                               std::vector<std::string> out;
                               for (DataType w : r.reducer->wires()) out.push_back(toString(w));
                               return out;
                             })
      .def("stats", [](const PyReducer& r) { return statsDict(r.reducer->stats()); })
      .def("communicator_stats", [](const PyReducer& r) {
        const Stats s = r.reducer->communicator().stats();
        return py::make_tuple(s.bytesSent(), s.bytesReceived());
      });
}

}  // namespace python
}  // namespace gflow
