#include "gradient/csc.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>

#include "common/params.h"
#include "kernels/host_kernels.h"
#include "kernels/sparse.h"

namespace gflow::gradient {

using internal::CommunicatorAccess;

// One bucket's sparse allreduce, shared by its two ops. The scratch goes
// back when the job's ops are gone, also when they failed midway (on a GPU
// later users of a block queue behind this job's kernels on the same
// stream). The ops may be destroyed after the Csc: the job keeps the
// kernels alive.
struct Csc::Job {
  explicit Job(std::shared_ptr<kernels::GradientKernels> k) : kernels(std::move(k)) {}
  ~Job() {
    for (void* p : blocks) kernels->release(p);
  }
  void* take(size_t bytes) {
    blocks.push_back(kernels->acquire(bytes));
    return blocks.back();
  }
  std::shared_ptr<kernels::GradientKernels> kernels;
  kernels::GradientKernels::SparseBucket sparse;  // the bucket's tensors, residual, velocity
  size_t chunks = 0, k = 0;
  std::vector<void*> blocks;
  float* norms = nullptr;
  uint32_t* idx = nullptr;
  float* values = nullptr;  // k * chunk picked values
  void* onWire = nullptr;   // compressed values
  void* temp = nullptr;
  size_t tempBytes = 0;
};

Csc::Csc(const std::vector<Tensor>& tensors, CscConfig config,
         std::shared_ptr<kernels::GradientKernels> kernels)
    : tensors_(tensors),
      config_(config),
      // Its own host kernels: they own the residual, freed with the last job.
      kernels_(kernels ? std::move(kernels) : std::make_shared<kernels::HostKernels>()),
      offset_(tensors.size(), 0) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    offset_[i] = total_;
    if (tensors[i].dtype == DataType::kFloat32) total_ += tensors[i].count;
  }
  residual_ = static_cast<float*>(kernels_->allocate(total_ * sizeof(float)));
  if (config_.momentum > 0.0f) {
    velocity_ = static_cast<float*>(kernels_->allocate(total_ * sizeof(float)));
  }
}

void Csc::reset() {
  kernels_->zero(residual_, total_ * sizeof(float));
  if (velocity_) kernels_->zero(velocity_, total_ * sizeof(float));
}

void Csc::carryFrom(const Csc& from) {
  if (from.total_ != total_) return;
  std::vector<kernels::GradientKernels::Copy> copies{
      {from.residual_, residual_, total_ * sizeof(float)}};
  if (velocity_ && from.velocity_)
    copies.push_back({from.velocity_, velocity_, total_ * sizeof(float)});
  kernels_->copy(copies);
}

size_t Csc::picked(size_t n, size_t chunk, uint64_t step) const {
  const size_t chunks = kernels::numChunks(n, chunk);
  if (step < config_.warmupSteps) return chunks;
  const auto k = static_cast<size_t>(std::ceil(config_.density * static_cast<double>(chunks)));
  return std::clamp<size_t>(k, chunks == 0 ? 0 : 1, chunks);
}

std::shared_ptr<Csc::Job> Csc::makeJob(const Bucket& b, const internal::WireFormat& wire,
                                       uint64_t step) const {
  auto job = std::make_shared<Job>(kernels_);
  auto& sp = job->sparse;
  sp.n = b.bytes / sizeof(float);
  // A bucket smaller than a chunk is one chunk of its own size (no padding).
  sp.chunk = std::max<size_t>(1, std::min(config_.chunk, sp.n));
  for (size_t j = 0; j < b.tensors.size(); ++j) {
    const size_t t = b.tensors[j];
    sp.pieces.push_back({static_cast<float*>(tensors_[t].data), residual_ + offset_[t],
                         velocity_ ? velocity_ + offset_[t] : nullptr, tensors_[t].count,
                         b.offsets[j] / sizeof(float)});
  }
  if (const size_t staged = kernels_->stagingElements(sp.n) * sizeof(float)) {
    sp.staged.g = static_cast<float*>(job->take(staged));
    sp.staged.v = static_cast<float*>(job->take(staged));
    if (velocity_) sp.staged.u = static_cast<float*>(job->take(staged));
  }
  job->k = picked(sp.n, sp.chunk, step);
  job->chunks = kernels::numChunks(sp.n, sp.chunk);
  job->norms = static_cast<float*>(job->take(job->chunks * sizeof(float)));
  job->idx = static_cast<uint32_t*>(job->take(job->k * sizeof(uint32_t)));
  job->values = static_cast<float*>(job->take(job->k * sp.chunk * sizeof(float)));
  if (wire.compressed()) job->onWire = job->take(wire.wireBytes(job->k * sp.chunk));
  job->tempBytes = kernels_->topChunksTempBytes(job->chunks);
  job->temp = job->take(job->tempBytes);
  return job;
}

internal::FusedSteps Csc::valuesSteps(const std::shared_ptr<Job>& job, Communicator& comm,
                                      ReduceOp op, const internal::WireFormat& wire,
                                      std::shared_ptr<std::atomic<bool>> nonFinite) const {
  const size_t count = job->k * job->sparse.chunk;
  if (wire.compressed()) {
    internal::CompressedAllreduce c;
    c.kernels = kernels_;
    c.format = wire;
    c.op = op;
    c.worldSize = comm.size();
    c.wire = job->onWire;
    c.count = count;
    c.spans = {internal::WireSpan{job->values, count, 0}};
    c.nonFinite = std::move(nonFinite);
    c.owner = job;
    return internal::compressedSteps(std::move(c));
  }
  internal::FusedSteps s;
  s.buffer = Tensor(job->values, count, DataType::kFloat32, kernels_->where(), kernels_->stream());
  s.op = op;
  s.after = [job, count, nonFinite] {
    if (nonFinite && job->kernels->nonFinite(job->values, count, DataType::kFloat32)) {
      nonFinite->store(true);
    }
  };
  return s;
}

std::vector<std::shared_ptr<WorkState>> Csc::fire(Communicator& comm, const Bucket& b, Fire f) {
  const internal::WireFormat& wire = f.wire;
  const uint64_t step = f.step;
  ReducerStats* stats = f.stats;
  std::shared_ptr<const void> owner = std::move(f.owner);
  auto job = makeJob(b, wire, step);
  if (stats) {
    stats->fusedOps += 2;
    stats->sparseChunksSent += job->k;
    stats->sparseChunks += job->chunks;
  }
  auto spans = std::make_shared<const OpSpans>(
      f.timeline, f.label, SpanArgs{{"step", step}, {"chunks", job->chunks}, {"picked", job->k}});
  auto t0 = std::make_shared<std::array<int64_t, 2>>();
  // 1. Norms of (residual + gradient), summed over ranks.
  const float m = config_.momentum;
  auto normsBefore = [job, m, owner, spans, t0] {
    (void)owner;
    job->kernels->accumulateChunkNorms(job->sparse, m, job->norms);
    (*t0)[0] = spans->now();
  };
  auto normsAfter = [spans, t0] {
    spans->span("csc norms", "allreduce", Timeline::kComm, (*t0)[0], spans->now());
  };
  std::vector<std::shared_ptr<WorkState>> works;
  works.push_back(CommunicatorAccess::fusedAllreduce(
      comm,
      Tensor(job->norms, job->chunks, DataType::kFloat32, kernels_->where(), kernels_->stream()),
      ReduceOp::kSum, normsBefore, normsAfter));
  // 2. The same top chunks on every rank (the norms are the same bits).
  const internal::FusedSteps s = valuesSteps(job, comm, f.op, wire, std::move(f.nonFinite));
  auto valuesBefore = [job, spans, t0, run = s.before] {
    job->kernels->topChunks(job->norms, job->chunks, job->k, job->idx, job->temp, job->tempBytes);
    job->kernels->gatherChunks(job->values, job->sparse, job->idx, job->k);
    if (run) run();
    (*t0)[1] = spans->now();
  };
  auto valuesAfter = [job, owner, spans, t0, run = s.after] {
    (void)owner;
    if (run) run();
    spans->span("csc chunks", "allreduce", Timeline::kComm, (*t0)[1], spans->now());
    // Momentum factor masking: a sent chunk's velocity restarts. When every
    // chunk is sent (warm-up, density 1) the velocity is kept, which is
    // plain momentum SGD.
    job->kernels->scatterChunks(job->sparse, job->values, job->idx, job->k, job->k < job->chunks);
    job->kernels->synchronize();
  };
  submitValues(comm, s.buffer, s.op, valuesBefore, valuesAfter, &works);
  return works;
}

void Csc::submitValues(Communicator& comm, const Tensor& values, ReduceOp op,
                       std::function<void()> before, std::function<void()> after,
                       std::vector<std::shared_ptr<WorkState>>* works) {
  try {
    works->push_back(
        CommunicatorAccess::fusedAllreduce(comm, values, op, std::move(before), std::move(after)));
  } catch (...) {
    // The communicator failed between the two submits: the norms op still
    // runs (and fails); it touches this Csc, so let it end first.
    try {
      works->front()->wait(std::chrono::milliseconds(0));
    } catch (const Error&) {
    }
    throw;
  }
}

gradient::CscConfig cscConfig(Communicator& comm, const SparseOptions& o) {
  const char* kCreate = "reducer.create";
  gradient::CscConfig c;
  c.density = o.density;
  if (o.density < 0) {
    const std::string text = params::cscDensity();
    char* end = nullptr;
    c.density = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0') {
      CommunicatorAccess::failInvalid(comm, kCreate,
                                      "GFLOW_CSC_DENSITY='" + text + "' is not a number");
    }
  }
  c.chunk = o.chunk > 0 ? o.chunk : params::cscChunk();
  c.momentum = o.momentum;
  c.warmupSteps = o.warmupSteps;
  if (!(c.density >= 0 && c.density <= 1)) {
    CommunicatorAccess::failInvalid(
        comm, kCreate,
        "CSC density " + std::to_string(c.density) + " is outside [0, 1] (GFLOW_CSC_DENSITY)");
  }
  if (c.chunk == 0 || c.chunk > (size_t(1) << 24)) {
    CommunicatorAccess::failInvalid(comm, kCreate,
                                    "CSC chunk must be 1..2^24 elements (GFLOW_CSC_CHUNK)");
  }
  if (!(c.momentum >= 0 && c.momentum < 1)) {
    CommunicatorAccess::failInvalid(comm, kCreate, "CSC momentum must be in [0, 1)");
  }
  return c;
}

}  // namespace gflow::gradient
