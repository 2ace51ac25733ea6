// mpi_allreduce_bw: the allreduce sweep of bench/common over MPI_Allreduce
// (MPI_IN_PLACE for in-place), for side-by-side numbers with gflow's
// allreduce_bw. Only the MPI standard API is used.
//
//   mpirun -np 4 --mca btl tcp,self mpi_allreduce_bw -e 64M
//
// -a picks Open MPI's tuned allreduce algorithm (it sets
// OMPI_MCA_coll_tuned_use_dynamic_rules and _allreduce_algorithm before
// MPI_Init); without -a, Open MPI's own decision rules choose.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "common/options.h"
#include "common/sweep.h"

namespace gflow::bench {
namespace {

// Open MPI 4.1 coll/tuned allreduce algorithm ids.
const struct {
  const char* name;
  int id;
} kOmpiAlgorithms[] = {{"basic_linear", 1}, {"nonoverlapping", 2}, {"recursive_doubling", 3},
                       {"ring", 4},         {"segmented_ring", 5}, {"rabenseifner", 6}};

// Returns false for an unknown name.
bool selectAlgorithm(const std::string& name) {
  if (name.empty() || name == "default") return true;
  for (const auto& a : kOmpiAlgorithms) {
    if (name != a.name) continue;
    // Environment MCA parameters are read by MPI_Init; mpirun's --mca
    // options reach ranks the same way.
    setenv("OMPI_MCA_coll_tuned_use_dynamic_rules", "1", 1);
    setenv("OMPI_MCA_coll_tuned_allreduce_algorithm", std::to_string(a.id).c_str(), 1);
    return true;
  }
  return false;
}

MPI_Datatype mpiType(DataType t) {
  switch (t) {
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kUInt8: return MPI_UINT8_T;
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kInt16: return MPI_INT16_T;
    case DataType::kComplex64: return MPI_C_FLOAT_COMPLEX;
    case DataType::kComplex128: return MPI_C_DOUBLE_COMPLEX;
    case DataType::kFloat16:
    case DataType::kBFloat16:
    case DataType::kFloat8E4M3:
    case DataType::kFloat8E5M2:
    case DataType::kBool: break;  // not in MPI 3.1 (C bool is, with other op names)
    case DataType::kQInt8:
    case DataType::kQInt4: break;  // gflow's own
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpiOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kProd: return MPI_PROD;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kBand: return MPI_BAND;
    case ReduceOp::kBor: return MPI_BOR;
    case ReduceOp::kBxor: return MPI_BXOR;
    case ReduceOp::kAvg: break;  // MPI has no average
  }
  return MPI_OP_NULL;
}

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(std::string(what) + ": " + msg);
}

class MpiBackend : public Backend {
 public:
  explicit MpiBackend(std::string algorithm)
      : algorithm_(algorithm.empty() ? "default" : std::move(algorithm)) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // Errors come back as codes instead of aborting, so they reach stderr
    // through the same path as the other drivers' errors.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, static_cast<size_t>(len));
    library_ = v.substr(0, v.find_first_of(",\n"));
    if (const char* btl = std::getenv("OMPI_MCA_btl")) library_ += std::string(", btl ") + btl;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  RunInfo info() const override { return RunInfo{"mpi", algorithm_, size_, library_}; }
  bool supports(DataType dtype, ReduceOp op) const override {
    return mpiType(dtype) != MPI_DATATYPE_NULL && mpiOp(op) != MPI_OP_NULL;
  }

  bool supports(Collective) const override { return true; }

  // MPI_Allreduce, MPI_Reduce, MPI_Bcast, MPI_Allgather,
  // MPI_Reduce_scatter_block, MPI_Gather, MPI_Scatter, MPI_Alltoall or
  // MPI_Sendrecv.
  std::function<void()> prepare(Collective k, void* in, void* out, size_t count, DataType dtype,
                                ReduceOp op) override {
    if (count > static_cast<size_t>(INT32_MAX)) throw std::invalid_argument("count exceeds int");
    const void* send = in == out ? MPI_IN_PLACE : in;
    const int n = static_cast<int>(count), b = n / size_, root = kSweepRoot;
    const MPI_Datatype t = mpiType(dtype);
    const MPI_Op mop = mpiOp(op);
    const MPI_Comm w = MPI_COMM_WORLD;
    switch (k) {
      case Collective::kAllreduce:
        return [=] { check(MPI_Allreduce(send, out, n, t, mop, w), "MPI_Allreduce"); };
      case Collective::kReduce:
        return [=] { check(MPI_Reduce(in, out, n, t, mop, root, w), "MPI_Reduce"); };
      case Collective::kBroadcast:
        return [=] { check(MPI_Bcast(out, n, t, root, w), "MPI_Bcast"); };
      case Collective::kAllgather:
        return [=] { check(MPI_Allgather(in, b, t, out, b, t, w), "MPI_Allgather"); };
      case Collective::kReduceScatter:
        return [=] {
          check(MPI_Reduce_scatter_block(in, out, b, t, mop, w), "MPI_Reduce_scatter_block");
        };
      case Collective::kGather:
        return [=] { check(MPI_Gather(in, b, t, out, b, t, root, w), "MPI_Gather"); };
      case Collective::kScatter:
        return [=] { check(MPI_Scatter(in, b, t, out, b, t, root, w), "MPI_Scatter"); };
      case Collective::kSendRecv:
        return [=, next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_] {
          check(MPI_Sendrecv(in, n, t, next, 0, out, n, t, prev, 0, w, MPI_STATUS_IGNORE),
                "MPI_Sendrecv");
        };
      case Collective::kAlltoall:
        return [=] { check(MPI_Alltoall(in, b, t, out, b, t, w), "MPI_Alltoall"); };
    }
    return [] {};
  }

  void barrier() override { check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }
  double maxOverRanks(double v) override {
    check(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
    return v;
  }
  int64_t sumOverRanks(int64_t v) override {
    check(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD),
          "MPI_Allreduce");
    return v;
  }

 private:
  std::string algorithm_;
  std::string library_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace
}  // namespace gflow::bench

int main(int argc, char** argv) {
  using namespace gflow::bench;
  DriverInfo info{"mpi_allreduce_bw",
                  "Allreduce bandwidth sweep over MPI_Allreduce, same flags and columns as "
                  "allreduce_bw.",
                  "Open MPI tuned algorithm: default, basic_linear, nonoverlapping,\n"
                  "               recursive_doubling, ring, segmented_ring, rabenseifner",
                  {}};
  SweepConfig cfg;
  // Parsed before MPI_Init: -a must reach the environment first.
  if (int rc = parseSweepArgs(argc, argv, info, &cfg); rc >= 0) return rc;
  if (!selectAlgorithm(cfg.algorithm)) {
    std::fprintf(stderr, "mpi_allreduce_bw: unknown algorithm '%s' (try --help)\n",
                 cfg.algorithm.c_str());
    return 2;
  }
  MPI_Init(&argc, &argv);
  int rc = 1;
  try {
    MpiBackend backend(cfg.algorithm);
    rc = runSweep(backend, cfg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_allreduce_bw: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
