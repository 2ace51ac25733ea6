// gflow.Communicator, gflow.Work and the process-default communicator
// (gflow.init / gflow.finalize). Collectives take arrays in place (no
// copies) and release the GIL while they run; async_op=True returns a Work
// that keeps the arrays alive until the op has completed.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <iterator>
#include <optional>
#include <string>

#include "bindings.h"

namespace gflow {
namespace python {
namespace {

using CommPtr = std::shared_ptr<Communicator>;

// After an async op was issued: waits for it without the GIL (blocking
// call), or returns the Work that owns the arrays and the communicator
// (async_op=True).
py::object finish(const CommPtr& comm, Work work, std::vector<HeldTensor> keep, bool asyncOp) {
  auto w = std::make_shared<PyWork>(comm, std::move(work), std::move(keep));
  if (asyncOp) return py::cast(w);
  w->wait(std::chrono::milliseconds(0));
  return py::none();
}

py::object allreduce(const CommPtr& comm, py::handle x, py::handle op, py::handle out,
                     py::handle wire, float prescale, float postscale, py::handle reproducible,
                     py::handle residual, bool asyncOp) {
  Communicator& c = *comm;
  std::vector<HeldTensor> keep;
  AllreduceOptions o;
  checkArgs(c, "allreduce", [&] {
    keep.push_back(viewTensor(x, "allreduce: tensor", out.is_none()));
    o.op = toReduceOp(op);
    if (!out.is_none()) {
      if (!wire.is_none() || prescale != 1.0f || postscale != 1.0f || !reproducible.is_none() ||
          !residual.is_none()) {
        throw Error(ErrorCode::kInvalidArgument,
                    "allreduce: wire, prescale, postscale, reproducible and residual apply to "
                    "in-place allreduce only (drop out=; a communicator created with "
                    "reproducible=True is reproducible out of place too)");
      }
      keep.push_back(viewTensor(out, "allreduce: out", true));
    } else {
      o.wire = wire.is_none() ? keep[0].tensor.dtype : toDataType(wire);
      o.prescale = prescale;
      o.postscale = postscale;
      if (!reproducible.is_none()) o.reproducible = reproducible.cast<bool>();
      if (!residual.is_none()) {
        keep.push_back(viewTensor(residual, "allreduce: residual", true));
        o.residual = keep.back().tensor;
      }
    }
  });
  Work w;
  {
    py::gil_scoped_release nogil;
    w = !out.is_none() ? c.allreduceAsync(keep[0].tensor, keep[1].tensor, o.op)
                       : c.allreduceAsync(keep[0].tensor, o);
  }
  return finish(comm, std::move(w), std::move(keep), asyncOp);
}

// A root argument: an int (bool and floats are refused by name).
// An int argument (`name`: "root", "dst", "tag", ...) of `op`.
int intArg(py::handle arg, const char* op, const char* name) {
  if (!PyIndex_Check(arg.ptr())) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string(op) + ": " + name + " must be an int, got " +
                    std::string(py::str(py::type::handle_of(arg).attr("__qualname__"))));
  }
  return arg.cast<int>();
}
int rootOf(py::handle rootArg, const char* op) {
  return intArg(rootArg, op, "root");
}

// reduce / gather / scatter: `mine` is this rank's array on every rank,
// `atRoot` the root's result (reduce, gather) or source (scatter) array:
// required on the root (but for an in-place reduce: None), ignored
// elsewhere, as in the C++ API.
enum class Rooted { kReduce, kGather, kScatter };
py::object rooted(const CommPtr& comm, Rooted kind, py::handle mine, py::handle atRoot,
                  py::handle rootArg, py::handle op, bool asyncOp) {
  const char* name = kind == Rooted::kReduce   ? "reduce"
                     : kind == Rooted::kGather ? "gather"
                                               : "scatter";
  Communicator& c = *comm;
  std::vector<HeldTensor> keep;
  ReduceOp rop = ReduceOp::kSum;
  const int root = checkArgs(c, name, [&] {
    const int r = rootOf(rootArg, name);
    const bool inPlace = kind == Rooted::kReduce && atRoot.is_none();
    keep.push_back(viewTensor(mine, (std::string(name) + ": tensor").c_str(),
                              kind == Rooted::kScatter || inPlace));
    if (c.rank() == r && !inPlace) {
      if (atRoot.is_none()) {
        throw Error(ErrorCode::kInvalidArgument,
                    std::string(name) + ": the root (rank " + std::to_string(r) + ") passes the " +
                        (kind == Rooted::kScatter ? "input" : "output") + " array");
      }
      keep.push_back(viewTensor(atRoot, (std::string(name) + ": root's array").c_str(),
                                kind != Rooted::kScatter));
    }
    if (kind == Rooted::kReduce) rop = toReduceOp(op);
    return r;
  });
  const Tensor own = keep[0].tensor;
  const Tensor other =
      keep.size() > 1 ? keep[1].tensor : (kind == Rooted::kReduce ? own : Tensor{});
  Work w;
  {
    py::gil_scoped_release nogil;
    w = kind == Rooted::kReduce   ? c.reduceAsync(own, other, root, rop)
        : kind == Rooted::kGather ? c.gatherAsync(own, other, root)
                                  : c.scatterAsync(other, own, root);
  }
  return finish(comm, std::move(w), std::move(keep), asyncOp);
}

// A counts or offsets argument (`name`) of `op`: a sequence of
// non-negative ints, one per rank.
std::vector<size_t> sizesArg(py::handle arg, const char* op, const char* name, int size) {
  if (!py::isinstance<py::sequence>(arg) || py::isinstance<py::str>(arg)) {
    throw Error(
        ErrorCode::kInvalidArgument,
        std::string(op) + ": " + name + " must be a sequence of " + std::to_string(size) + " ints");
  }
  const py::sequence seq = py::reinterpret_borrow<py::sequence>(arg);
  if (static_cast<int>(seq.size()) != size) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string(op) + ": " + name + " has " + std::to_string(seq.size()) +
                    " entries; the communicator has " + std::to_string(size) + " ranks");
  }
  std::vector<size_t> out;
  for (py::handle v : seq) {
    const long long x = static_cast<long long>(intArg(v, op, name));
    if (x < 0) {
      throw Error(
          ErrorCode::kInvalidArgument,
          std::string(op) + ": " + name + " holds a negative entry (" + std::to_string(x) + ")");
    }
    out.push_back(static_cast<size_t>(x));
  }
  return out;
}

// Offsets that place blocks of `counts` one after another.
std::vector<size_t> packed(const std::vector<size_t>& counts) {
  std::vector<size_t> offsets(counts.size());
  size_t at = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    offsets[i] = at;
    at += counts[i];
  }
  return offsets;
}

// allgatherv, gatherv, scatterv and reduceScatterv: one `counts` for every
// rank. `mine` is this rank's own block (in for allgatherv/gatherv, out for
// scatterv/reduceScatterv), `whole` the array of sum(counts) elements
// (every rank's out for allgatherv, the root's for gatherv/scatterv, every
// rank's in for reduceScatterv; None elsewhere on the rooted forms).
enum class Uneven { kAllgatherv, kGatherv, kScatterv, kReduceScatterv };
py::object uneven(const CommPtr& comm, Uneven kind, py::handle mine, py::handle whole,
                  py::handle countsArg, py::handle rootArg, py::handle op, bool asyncOp) {
  static const char* const kNames[] = {"allgatherv", "gatherv", "scatterv", "reduce_scatterv"};
  const char* name = kNames[static_cast<int>(kind)];
  Communicator& c = *comm;
  std::vector<HeldTensor> keep;
  std::vector<size_t> counts;
  ReduceOp rop = ReduceOp::kSum;
  int root = 0;
  const bool rooted = kind == Uneven::kGatherv || kind == Uneven::kScatterv;
  const bool mineIsOut = kind == Uneven::kScatterv || kind == Uneven::kReduceScatterv;
  checkArgs(c, name, [&] {
    counts = sizesArg(countsArg, name, "counts", c.size());
    if (rooted) root = rootOf(rootArg, name);
    keep.push_back(
        viewTensor(mine, (std::string(name) + ": this rank's block").c_str(), mineIsOut));
    if (!rooted || c.rank() == root) {
      if (whole.is_none()) {
        throw Error(ErrorCode::kInvalidArgument,
                    std::string(name) + ": " +
                        (rooted ? "the root (rank " + std::to_string(root) + ") passes"
                                : std::string("every rank passes")) +
                        " the array of sum(counts) elements");
      }
      keep.push_back(
          viewTensor(whole, (std::string(name) + ": the whole array").c_str(), !mineIsOut));
    }
    if (kind == Uneven::kReduceScatterv) rop = toReduceOp(op);
  });
  const Tensor own = keep[0].tensor;
  const Tensor all = keep.size() > 1 ? keep[1].tensor : Tensor{};
  Work w;
  {
    py::gil_scoped_release nogil;
    switch (kind) {
      case Uneven::kAllgatherv: w = c.allgathervAsync(own, all, counts); break;
      case Uneven::kGatherv: w = c.gathervAsync(own, all, counts, root); break;
      case Uneven::kScatterv: w = c.scattervAsync(all, own, counts, root); break;
      case Uneven::kReduceScatterv: w = c.reduceScattervAsync(all, own, counts, rop); break;
    }
  }
  return finish(comm, std::move(w), std::move(keep), asyncOp);
}

py::object alltoallv(const CommPtr& comm, py::handle in, py::handle inCounts, py::handle out,
                     py::handle outCounts, py::handle inOffsets, py::handle outOffsets,
                     bool asyncOp) {
  Communicator& c = *comm;
  std::vector<HeldTensor> keep;
  std::vector<size_t> ic, oc, io, oo;
  checkArgs(c, "alltoallv", [&] {
    ic = sizesArg(inCounts, "alltoallv", "in_counts", c.size());
    oc = sizesArg(outCounts, "alltoallv", "out_counts", c.size());
    io =
        inOffsets.is_none() ? packed(ic) : sizesArg(inOffsets, "alltoallv", "in_offsets", c.size());
    oo = outOffsets.is_none() ? packed(oc)
                              : sizesArg(outOffsets, "alltoallv", "out_offsets", c.size());
    keep.push_back(viewTensor(in, "alltoallv: input", false));
    keep.push_back(viewTensor(out, "alltoallv: output", true));
  });
  Work w;
  {
    py::gil_scoped_release nogil;
    w = c.alltoallvAsync(keep[0].tensor, ic, io, keep[1].tensor, oc, oo);
  }
  return finish(comm, std::move(w), std::move(keep), asyncOp);
}

// The configuration keywords of init/create beyond the identity ones: each
// sets one field of Options (docs/python.md lists them with their GFLOW_*
// variables); None or absent leaves it to the environment.
template <typename T>
void setIf(const py::kwargs& kw, const char* key, std::optional<T>* field) {
  if (kw.contains(key) && !kw[key].is_none()) *field = kw[key].cast<T>();
}

void applyConfig(const py::kwargs& kw, Options* o) {
  static const char* const kKeys[] = {"shm",
                                      "shm_chunk_bytes",
                                      "shm_single_copy",
                                      "piece_bytes",
                                      "ring_window",
                                      "rd_max_bytes",
                                      "hd_max_bytes",
                                      "hier_segment_bytes",
                                      "codec_piece_bytes",
                                      "device_backend",
                                      "verify_device_ops",
                                      "unexpected_limit_bytes",
                                      "spin_us",
                                      "pin_threads",
                                      "progress_priority",
                                      "reproducible"};
  for (auto item : kw) {
    const std::string key = item.first.cast<std::string>();
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys)) {
      throw py::type_error("unexpected keyword argument '" + key + "'");
    }
  }
  setIf(kw, "shm", &o->shm.enabled);
  setIf(kw, "shm_chunk_bytes", &o->shm.chunkBytes);
  if (kw.contains("shm_single_copy") && !kw["shm_single_copy"].is_none()) {
    o->shm.singleCopy = kw["shm_single_copy"].cast<std::string>();
  }
  setIf(kw, "piece_bytes", &o->tuning.pieceBytes);
  setIf(kw, "ring_window", &o->tuning.ringWindow);
  setIf(kw, "rd_max_bytes", &o->tuning.rdMaxBytes);
  setIf(kw, "hd_max_bytes", &o->tuning.hdMaxBytes);
  setIf(kw, "hier_segment_bytes", &o->tuning.hierSegmentBytes);
  setIf(kw, "codec_piece_bytes", &o->tuning.codecPieceBytes);
  if (kw.contains("device_backend") && !kw["device_backend"].is_none()) {
    o->device.backend = kw["device_backend"].cast<std::string>();
  }
  setIf(kw, "verify_device_ops", &o->device.verifyOps);
  setIf(kw, "unexpected_limit_bytes", &o->progress.unexpectedLimitBytes);
  setIf(kw, "spin_us", &o->progress.spinUs);
  setIf(kw, "pin_threads", &o->progress.pinThreads);
  setIf(kw, "progress_priority", &o->progress.priority);
  setIf(kw, "reproducible", &o->reproducible);
}

Options makeOptions(py::handle rank, py::handle size, py::handle root, py::handle timeout,
                    py::handle algorithm, py::handle transport, py::handle token, py::handle hostId,
                    const py::kwargs& config) {
  Options o;
  applyConfig(config, &o);
  if (!rank.is_none()) o.rank = rank.cast<int>();
  if (!size.is_none()) o.size = size.cast<int>();
  if (!root.is_none()) o.root = root.cast<std::string>();
  o.timeout = toTimeout(timeout);
  if (!algorithm.is_none()) o.algorithm = algorithm.cast<std::string>();
  if (!transport.is_none()) o.transport = transport.cast<std::string>();
  if (!token.is_none()) o.token = token.cast<std::string>();
  if (!hostId.is_none()) o.hostId = hostId.cast<std::string>();
  return o;
}

py::dict statsDict(const Stats& s) {
  py::dict d;
  d["allreduce"] = s.allreduce;
  d["reduce_scatter"] = s.reduceScatter;
  d["allgather"] = s.allgather;
  d["broadcast"] = s.broadcast;
  d["barrier"] = s.barrier;
  d["reduce"] = s.reduce;
  d["gather"] = s.gather;
  d["scatter"] = s.scatter;
  d["alltoall"] = s.alltoall;
  d["point_to_point"] = s.pointToPoint;
  d["shared_memory_ops"] = s.sharedMemoryOps;
  d["hierarchical_ops"] = s.hierarchicalOps;
  d["network_ops"] = s.networkOps;
  d["nccl_ops"] = s.ncclOps;
  d["staged_ops"] = s.stagedOps;
  py::list routes;
  for (const Stats::Route& r : s.routes) {
    py::dict e;
    e["op"] = r.op;
    e["path"] = r.path;
    e["algorithm"] = r.algorithm;
    e["ops"] = r.ops;
    routes.append(e);
  }
  d["routes"] = routes;
  d["bytes_sent"] = s.bytesSent();
  d["bytes_received"] = s.bytesReceived();
  d["network_bytes_sent"] = s.networkBytesSent();
  py::list sameHost;
  for (const PeerStats& p : s.peers) sameHost.append(p.sameHost);
  d["same_host"] = sameHost;
  uint64_t single = 0;
  for (const PeerStats& p : s.peers) single += p.singleCopyBytesSent;
  d["single_copy_bytes_sent"] = single;
  // Stragglers, per rank (this one's too): ops it reached last, and the sum
  // of how long after the earliest rank, in ns.
  py::list timesLast, lateNs;
  for (const PeerStats& p : s.peers) {
    timesLast.append(p.timesLast);
    lateNs.append(p.lateNs);
  }
  d["arrival_ops"] = s.arrivalOps;
  d["times_last"] = timesLast;
  d["late_ns"] = lateNs;
  const Stats::Resources& r = s.resources;
  py::dict res;
  res["peers_connected"] = r.peersConnected;
  res["connections"] = r.connections;
  res["store_requests"] = r.storeRequests;
  res["store_served"] = r.storeServed;
  res["threads_started"] = r.threadsStarted;
  res["pinned_bytes"] = r.pinnedBytes;
  res["shared_bytes"] = r.sharedBytes;
  d["resources"] = res;
  return d;
}

}  // namespace

void bindCommunicator(py::module_& m) {
  py::enum_<ReduceOp>(m, "ReduceOp")
      .value("SUM", ReduceOp::kSum)
      .value("AVG", ReduceOp::kAvg)
      .value("MIN", ReduceOp::kMin)
      .value("MAX", ReduceOp::kMax)
      .value("PROD", ReduceOp::kProd)
      .value("BAND", ReduceOp::kBand)
      .value("BOR", ReduceOp::kBor)
      .value("BXOR", ReduceOp::kBxor);
  py::enum_<DataType>(m, "DataType")
      .value("FLOAT32", DataType::kFloat32)
      .value("FLOAT16", DataType::kFloat16)
      .value("BFLOAT16", DataType::kBFloat16)
      .value("FLOAT64", DataType::kFloat64)
      .value("INT32", DataType::kInt32)
      .value("INT64", DataType::kInt64)
      .value("UINT8", DataType::kUInt8)
      .value("INT8", DataType::kInt8)
      .value("INT16", DataType::kInt16)
      .value("BOOL", DataType::kBool)
      .value("FLOAT8_E4M3", DataType::kFloat8E4M3)
      .value("FLOAT8_E5M2", DataType::kFloat8E5M2)
      .value("COMPLEX64", DataType::kComplex64)
      .value("COMPLEX128", DataType::kComplex128)
      .value("QINT8", DataType::kQInt8)
      .value("QINT4", DataType::kQInt4);

  py::class_<PyWork, std::shared_ptr<PyWork>>(m, "Work")
      .def(
          "wait", [](PyWork& w, py::handle timeout) { w.wait(toTimeout(timeout)); },
          py::arg("timeout") = py::none())
      .def("test", &PyWork::test)
      .def("done", &PyWork::test)
      .def_property_readonly("nonfinite", &PyWork::nonFinite)
      .def_property_readonly("source",
                             [](const PyWork& w) -> py::object {
                               const int s = w.source();
                               return s < 0 ? py::object(py::none()) : py::object(py::int_(s));
                             })
      .def(
          "add_done_callback",
          [](py::object self, py::object fn) {
            self.cast<PyWork&>().addDoneCallback(self, std::move(fn));
          },
          py::arg("fn"));

  py::class_<Communicator, CommPtr>(m, "Communicator")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("local_rank", &Communicator::localRank)
      .def_property_readonly("local_size", &Communicator::localSize)
      .def_property_readonly("host_index", &Communicator::hostIndex)
      .def_property_readonly("num_hosts", &Communicator::numHosts)
      .def("allreduce", &allreduce, py::arg("tensor"), py::arg("op") = "sum", py::kw_only(),
           py::arg("out") = py::none(), py::arg("wire") = py::none(), py::arg("prescale") = 1.0f,
           py::arg("postscale") = 1.0f, py::arg("reproducible") = py::none(),
           py::arg("residual") = py::none(), py::arg("async_op") = false)
      .def(
          "reduce_scatter",
          [](const CommPtr& c, py::handle in, py::handle out, py::handle op, bool asyncOp) {
            std::vector<HeldTensor> keep;
            const ReduceOp rop = checkArgs(*c, "reduce_scatter", [&] {
              keep.push_back(viewTensor(in, "reduce_scatter: input", false));
              keep.push_back(viewTensor(out, "reduce_scatter: output", true));
              return toReduceOp(op);
            });
            Work w;
            {
              py::gil_scoped_release nogil;
              w = c->reduceScatterAsync(keep[0].tensor, keep[1].tensor, rop);
            }
            return finish(c, std::move(w), std::move(keep), asyncOp);
          },
          py::arg("input"), py::arg("output"), py::arg("op") = "sum", py::kw_only(),
          py::arg("async_op") = false)
      .def(
          "allgather",
          [](const CommPtr& c, py::handle in, py::handle out, bool asyncOp) {
            std::vector<HeldTensor> keep;
            checkArgs(*c, "allgather", [&] {
              keep.push_back(viewTensor(in, "allgather: input", false));
              keep.push_back(viewTensor(out, "allgather: output", true));
            });
            Work w;
            {
              py::gil_scoped_release nogil;
              w = c->allgatherAsync(keep[0].tensor, keep[1].tensor);
            }
            return finish(c, std::move(w), std::move(keep), asyncOp);
          },
          py::arg("input"), py::arg("output"), py::kw_only(), py::arg("async_op") = false)
      .def(
          "broadcast",
          [](const CommPtr& c, py::handle x, py::handle rootArg, bool asyncOp) {
            std::vector<HeldTensor> keep;
            const int root = checkArgs(*c, "broadcast", [&] {
              keep.push_back(viewTensor(x, "broadcast: tensor", true));
              return rootOf(rootArg, "broadcast");
            });
            Work w;
            {
              py::gil_scoped_release nogil;
              w = c->broadcastAsync(keep[0].tensor, root);
            }
            return finish(c, std::move(w), std::move(keep), asyncOp);
          },
          py::arg("tensor"), py::arg("root") = 0, py::kw_only(), py::arg("async_op") = false)
      .def(
          "reduce",
          [](const CommPtr& c, py::handle x, py::handle root, py::handle op, py::handle out,
             bool asyncOp) { return rooted(c, Rooted::kReduce, x, out, root, op, asyncOp); },
          py::arg("tensor"), py::arg("root") = 0, py::arg("op") = "sum", py::kw_only(),
          py::arg("out") = py::none(), py::arg("async_op") = false)
      .def(
          "gather",
          [](const CommPtr& c, py::handle in, py::handle out, py::handle root, bool asyncOp) {
            return rooted(c, Rooted::kGather, in, out, root, py::none(), asyncOp);
          },
          py::arg("input"), py::arg("output") = py::none(), py::arg("root") = 0, py::kw_only(),
          py::arg("async_op") = false)
      .def(
          "scatter",
          [](const CommPtr& c, py::handle in, py::handle out, py::handle root, bool asyncOp) {
            return rooted(c, Rooted::kScatter, out, in, root, py::none(), asyncOp);
          },
          py::arg("input"), py::arg("output"), py::arg("root") = 0, py::kw_only(),
          py::arg("async_op") = false)
      .def(
          "alltoall",
          [](const CommPtr& c, py::handle in, py::handle out, bool asyncOp) {
            std::vector<HeldTensor> keep;
            checkArgs(*c, "alltoall", [&] {
              keep.push_back(viewTensor(in, "alltoall: input", false));
              keep.push_back(viewTensor(out, "alltoall: output", true));
            });
            Work w;
            {
              py::gil_scoped_release nogil;
              w = c->alltoallAsync(keep[0].tensor, keep[1].tensor);
            }
            return finish(c, std::move(w), std::move(keep), asyncOp);
          },
          py::arg("input"), py::arg("output"), py::kw_only(), py::arg("async_op") = false)
      .def(
          "allgatherv",
          [](const CommPtr& c, py::handle in, py::handle out, py::handle counts, bool asyncOp) {
            return uneven(c, Uneven::kAllgatherv, in, out, counts, py::none(), py::none(), asyncOp);
          },
          py::arg("input"), py::arg("output"), py::arg("counts"), py::kw_only(),
          py::arg("async_op") = false)
      .def(
          "gatherv",
          [](const CommPtr& c, py::handle in, py::handle out, py::handle counts, py::handle root,
             bool asyncOp) {
            return uneven(c, Uneven::kGatherv, in, out, counts, root, py::none(), asyncOp);
          },
          py::arg("input"), py::arg("output"), py::arg("counts"), py::arg("root") = 0,
          py::kw_only(), py::arg("async_op") = false)
      .def(
          "scatterv",
          [](const CommPtr& c, py::handle in, py::handle out, py::handle counts, py::handle root,
             bool asyncOp) {
            return uneven(c, Uneven::kScatterv, out, in, counts, root, py::none(), asyncOp);
          },
          py::arg("input"), py::arg("output"), py::arg("counts"), py::arg("root") = 0,
          py::kw_only(), py::arg("async_op") = false)
      .def(
          "reduce_scatterv",
          [](const CommPtr& c, py::handle in, py::handle out, py::handle counts, py::handle op,
             bool asyncOp) {
            return uneven(c, Uneven::kReduceScatterv, out, in, counts, py::none(), op, asyncOp);
          },
          py::arg("input"), py::arg("output"), py::arg("counts"), py::arg("op") = "sum",
          py::kw_only(), py::arg("async_op") = false)
      .def("alltoallv", &alltoallv, py::arg("input"), py::arg("in_counts"), py::arg("output"),
           py::arg("out_counts"), py::kw_only(), py::arg("in_offsets") = py::none(),
           py::arg("out_offsets") = py::none(), py::arg("async_op") = false)
      .def(
          "send",
          [](const CommPtr& c, py::handle x, py::handle dst, py::handle tag, bool asyncOp) {
            std::vector<HeldTensor> keep;
            const std::pair<int, int> to = checkArgs(*c, "send", [&] {
              keep.push_back(viewTensor(x, "send: tensor", false));
              return std::make_pair(intArg(dst, "send", "dst"), intArg(tag, "send", "tag"));
            });
            Work w;
            {
              py::gil_scoped_release nogil;
              w = c->sendAsync(keep[0].tensor, to.first, to.second);
            }
            return finish(c, std::move(w), std::move(keep), asyncOp);
          },
          py::arg("tensor"), py::arg("dst"), py::arg("tag") = 0, py::kw_only(),
          py::arg("async_op") = false)
      .def(
          "recv",
          [](const CommPtr& c, py::handle x, py::handle src, py::handle tag,
             bool asyncOp) -> py::object {
            std::vector<HeldTensor> keep;
            const std::pair<int, int> from = checkArgs(*c, "recv", [&] {
              keep.push_back(viewTensor(x, "recv: tensor", true));
              const int peer = src.is_none() ? P2POp::kAnySource : intArg(src, "recv", "src");
              return std::make_pair(peer, intArg(tag, "recv", "tag"));
            });
            if (asyncOp) {
              auto source = std::make_shared<int>(-1);
              Work w;
              {
                py::gil_scoped_release nogil;
                w = c->recvAsync(keep[0].tensor, from.first, from.second, source.get());
              }
              return py::cast(std::make_shared<PyWork>(c, std::move(w), std::move(keep), source));
            }
            int source = -1;
            {
              py::gil_scoped_release nogil;
              source = c->recv(keep[0].tensor, from.first, from.second);
            }
            return py::int_(source);
          },
          py::arg("tensor"), py::arg("src") = py::none(), py::arg("tag") = 0, py::kw_only(),
          py::arg("async_op") = false)
      .def(
          "barrier",
          [](const CommPtr& c, bool asyncOp) {
            Work w;
            {
              py::gil_scoped_release nogil;
              w = c->barrierAsync();
            }
            return finish(c, std::move(w), {}, asyncOp);
          },
          py::kw_only(), py::arg("async_op") = false)
      .def(
          "split",
          [](Communicator& c, int color, int key) {
            py::gil_scoped_release nogil;
            return c.split(color, key);
          },
          py::arg("color"), py::arg("key") = 0)
      .def(
          "shrink",
          [](Communicator& c, const std::vector<int>& exclude) {
            py::gil_scoped_release nogil;
            return c.shrink(exclude);
          },
          py::arg("exclude") = std::vector<int>{})
      .def("grow", &Communicator::grow, py::call_guard<py::gil_scoped_release>())
      .def("local_communicator", &Communicator::localCommunicator,
           py::call_guard<py::gil_scoped_release>())
      .def("cross_host_communicator", &Communicator::crossHostCommunicator,
           py::call_guard<py::gil_scoped_release>())
      .def("abort", &Communicator::abort)
      .def(
          "reject_invalid_argument",
          [](Communicator& c, const std::string& op, const std::string& what) {
            gflow::frontend::rejectInvalidArgument(c, op, what);
          },
          py::arg("op"), py::arg("what"))
      .def("stats",
           [](const Communicator& c) {
             py::dict d = statsDict(c.stats());
             d["straggler_summary"] = c.stragglerSummary();
             return d;
           })
      .def("__repr__", [](const Communicator& c) {
        return "<gflow.Communicator rank " + std::to_string(c.rank()) + " of " +
               std::to_string(c.size()) + ">";
      });

  m.def(
      "init",
      [](py::handle rank, py::handle size, py::handle root, py::handle timeout,
         py::handle algorithm, py::handle transport, py::handle token, py::handle hostId,
         const py::kwargs& config) {
        Options o =
            makeOptions(rank, size, root, timeout, algorithm, transport, token, hostId, config);
        py::gil_scoped_release nogil;
        return init(o);
      },
      py::kw_only(), py::arg("rank") = py::none(), py::arg("size") = py::none(),
      py::arg("root") = py::none(), py::arg("timeout") = py::none(),
      py::arg("algorithm") = py::none(), py::arg("transport") = py::none(),
      py::arg("token") = py::none(), py::arg("host_id") = py::none());
  m.def(
      "create",
      [](py::handle rank, py::handle size, py::handle root, py::handle timeout,
         py::handle algorithm, py::handle transport, py::handle token, py::handle hostId,
         const py::kwargs& config) {
        Options o =
            makeOptions(rank, size, root, timeout, algorithm, transport, token, hostId, config);
        py::gil_scoped_release nogil;
        return Communicator::create(o);
      },
      py::kw_only(), py::arg("rank") = py::none(), py::arg("size") = py::none(),
      py::arg("root") = py::none(), py::arg("timeout") = py::none(),
      py::arg("algorithm") = py::none(), py::arg("transport") = py::none(),
      py::arg("token") = py::none(), py::arg("host_id") = py::none());
  m.def(
      "join",
      [](py::handle root, py::handle timeout, py::handle algorithm, py::handle transport,
         py::handle token, py::handle hostId, const py::kwargs& config) {
        Options o = makeOptions(py::none(), py::none(), root, timeout, algorithm, transport, token,
                                hostId, config);
        py::gil_scoped_release nogil;
        return Communicator::join(o);
      },
      py::kw_only(), py::arg("root") = py::none(), py::arg("timeout") = py::none(),
      py::arg("algorithm") = py::none(), py::arg("transport") = py::none(),
      py::arg("token") = py::none(), py::arg("host_id") = py::none());
  m.def(
      "set_log_level",
      [](const std::string& level) {
        static const std::pair<const char*, LogLevel> kLevels[] = {{"ERROR", LogLevel::kError},
                                                                   {"WARN", LogLevel::kWarn},
                                                                   {"INFO", LogLevel::kInfo},
                                                                   {"DEBUG", LogLevel::kDebug},
                                                                   {"TRACE", LogLevel::kTrace}};
        std::string up = level;
        for (char& ch : up) ch = static_cast<char>(toupper(static_cast<unsigned char>(ch)));
        for (const auto& l : kLevels) {
          if (up == l.first) return setLogLevel(l.second);
        }
        throw Error(ErrorCode::kInvalidArgument,
                    "set_log_level: '" + level + "' is not ERROR, WARN, INFO, DEBUG or TRACE",
                    ErrorContext::forOp("set_log_level"));
      },
      py::arg("level"));
  m.def("set_cuda_component", &setCudaComponent, py::arg("path"));
  m.def("default_communicator", &defaultCommunicator);
  m.def("finalize", &finalize, py::call_guard<py::gil_scoped_release>());
  m.def("_shutdown", [] { Completer::instance().shutdown(); });
}

}  // namespace python
}  // namespace gflow
