// The collectives' front door: each checks its arguments (naming the op,
// the argument and this rank), binds its buffers and submits one op to the
// router; blocking calls wait for it, async ones hand out a Work.
#include <cmath>

#include "backend/device_buffers.h"
#include "core/communicator_impl.h"
#include "core/internal.h"
#include "core/op_checks.h"
#include "gflow/communicator.h"
#include "kernels/gradient_kernels.h"

namespace gflow {

using backend::Algorithm;
using backend::OpDesc;
using backend::OpKind;

namespace {

using Buffers = backend::DeviceBuffers;
using opcheck::checkBlocks;
using opcheck::finish;
using opcheck::overlap;

// What an allreduce may add around its collective: `before`/`after` run on
// the executing thread around it (the fused ops of the gradient layer pack
// and unpack there); `reproducible`: AllreduceOptions::reproducible (unset:
// the communicator's). With `beside` (host steps of an async op: the user
// memory they touch besides the op's buffers) they run on the executor's
// host lane instead: `before` possibly while the op ahead is on the wire,
// `after` while the next one is.
struct AllreduceSteps {
  std::function<void()> before;
  std::function<void()> after;
  std::optional<bool> reproducible;
  std::optional<Footprint> beside;
  // `before` may run while the op ahead is on the wire: it writes only the
  // op's wire buffer and (error feedback) its residual, never the data.
  bool early = false;
  // One piece of an op cut into collectives: OpDesc::parent, a digest of
  // the whole op's count and the piece's place, so that ranks that cut
  // different ops into pieces of one size still raise kMismatch.
  uint64_t piece = 0;
};

// The op's last step as the lane runs it: an error names the op, its
// number and this rank (the task's own errors get that in submit).
std::function<void()> endOf(std::function<void()> after, uint64_t seq, int rank) {
  return [after = std::move(after), seq, rank] {
    const auto context = ErrorContext::forOp("allreduce").withSeq(seq).withRank(rank);
    try {
      after();
    } catch (const Error& e) {
      throw Error(e.code(), "after the collective: " + e.detail(), context);
    } catch (const std::exception& e) {
      throw Error(ErrorCode::kInternal, std::string("after the collective: ") + e.what(), context);
    }
  };
}

// The Overlap of an op with `steps` on the lane (null: none); the steps'
// `before` then runs as the Overlap's once-only ahead step.
std::shared_ptr<const Overlap> laneOverlap(AllreduceSteps& steps, const Tensor& in,
                                           const Tensor& out) {
  if (!steps.beside) return nullptr;
  auto o = std::make_shared<Overlap>();
  o->touches = std::move(*steps.beside);
  o->touches.push_back({in.data, in.nbytes()});
  o->touches.push_back({out.data, out.nbytes()});
  if (steps.before && steps.early) {
    o->ahead = std::make_shared<OnceStep>(std::move(steps.before));
    steps.before = [ahead = o->ahead] { ahead->run(); };
  }
  return o;
}

std::shared_ptr<WorkState> doAllreduce(CommunicatorImpl& I, Tensor in, Tensor out, ReduceOp op,
                                       bool blocking, AllreduceSteps steps = {}) {
  const char* name = "allreduce";
  I.checkUsable(name);
  I.validateTensor(name, "in", in);
  // In place: one lookup of where the buffer lives, not two.
  if (!opcheck::sameTensor(in, out)) I.validateTensor(name, "out", out);
  I.validateOp(name, op, in.dtype);
  if (in.count != out.count || in.dtype != out.dtype) {
    I.invalid(name, "out (" + std::to_string(out.count) + " x " + toString(out.dtype) +
                        ") must match in (" + std::to_string(in.count) + " x " +
                        toString(in.dtype) + ")");
  }
  if (in.data != out.data && overlap(in.data, in.nbytes(), out.data, out.nbytes())) {
    I.invalid(name, "in and out overlap without being the same buffer");
  }
  OpDesc d{OpKind::kAllreduce, in.dtype, op, {}, 0, in.count};
  d.reproducible = I.reproducible(in.dtype, steps.reproducible);
  d.parent = steps.piece;
  CommunicatorImpl* self = &I;
  auto buffers = in.data == out.data
                     ? Buffers::bind(I.binding(name), {{in, Buffers::kInOut}})
                     : Buffers::bind(I.binding(name), {{in, Buffers::kIn}, {out, Buffers::kOut}});
  auto overlap = laneOverlap(steps, in, out);
  return I.submit(
      d, blocking,
      [self, in, out, before = std::move(steps.before),
       after = std::move(steps.after)](const backend::Op& o) {
        if (before) {
          before();
          // The collective waits for what before() enqueued (packing kernels).
          backend::inputsProduced(o);
        }
        self->router().allreduce(o, in.data, out.data);
        if (after) self->finishOnLane(endOf(after, o.seq, self->commRank()));
      },
      std::move(buffers), nullptr, std::move(overlap));
}

// AllreduceOptions::residual: a float32 twin of `inout` (same count and
// device, not overlapping it) for a quantized wire.
void checkResidual(CommunicatorImpl& I, const char* name, const Tensor& inout,
                   const AllreduceOptions& o) {
  const Tensor& r = o.residual;
  if (!isQuantized(o.wire) || inout.dtype != DataType::kFloat32) {
    I.invalid(name, std::string("a residual (error feedback) needs float32 data on a qint8 or "
                                "qint4 wire, not wire ") +
                        toString(o.wire));
  }
  I.validateTensor(name, "residual", r);
  if (r.dtype != DataType::kFloat32 || r.count != inout.count) {
    I.invalid(name, "residual must be float32 with inout's count (" + std::to_string(inout.count) +
                        "), not " + toString(r.dtype) + " x " + std::to_string(r.count));
  }
  if (r.device.type != inout.device.type || r.device.index != inout.device.index) {
    I.invalid(name, "residual must be on inout's device");
  }
  if (overlap(r.data, r.nbytes(), inout.data, inout.nbytes())) {
    I.invalid(name, "residual and inout must not overlap");
  }
}

// The argument checks of doAllreduceWith; returns whether `inout`
// travels compressed.
bool checkAllreduceOptions(CommunicatorImpl& I, const char* name, const Tensor& inout,
                           const AllreduceOptions& o) {
  I.checkUsable(name);
  I.validateTensor(name, "inout", inout);
  I.validateOp(name, o.op, inout.dtype);
  const bool compress = o.wire != DataType::kFloat32 && o.wire != inout.dtype;
  if (compress &&
      (inout.dtype != DataType::kFloat32 ||
       (o.wire != DataType::kFloat16 && o.wire != DataType::kBFloat16 && !isQuantized(o.wire)))) {
    I.invalid(name, std::string("wire type ") + toString(o.wire) + " for " + toString(inout.dtype) +
                        " data: compression takes float32 data to float16, bfloat16, qint8 or "
                        "qint4");
  }
  if (compress && isQuantized(o.wire)) I.validateOp(name, o.op, o.wire);
  if (o.residual.data != nullptr) checkResidual(I, name, inout, o);
  const bool scaled = o.prescale != 1.0f || o.postscale != 1.0f;
  if (scaled && inout.dtype != DataType::kFloat32) {
    I.invalid(name, std::string("prescale/postscale apply to float32 data, not ") +
                        toString(inout.dtype));
  }
  if (!std::isfinite(o.prescale) || !std::isfinite(o.postscale)) {
    I.invalid(name, "prescale and postscale must be finite");
  }
  return compress;
}

// Elements [first, last) of `t`.
Tensor slice(Tensor t, size_t first, size_t last) {
  t.data = static_cast<char*>(t.data) + first * dataTypeSize(t.dtype);
  t.count = last - first;
  return t;
}

// `what` on this rank's kernels: CUDA (or scratch memory) failing there
// fails the communicator, as bad input does, so no peer waits for this rank.
template <typename Fn>
auto orAbort(CommunicatorImpl& I, Fn what) -> decltype(what()) {
  const auto context = ErrorContext::forOp("allreduce").withRank(I.commRank());
  std::optional<Error> full;
  try {
    return what();
  } catch (const Error& e) {
    full.emplace(e.code(), e.detail(), context);
  } catch (const std::exception& e) {  // the host's calloc: std::bad_alloc
    full.emplace(ErrorCode::kInternal, std::string("scratch or kernels: ") + e.what(), context);
  }
  I.abortWith(*full);
  throw *full;
}

// What the collectives of one doAllreduceWith share: the kernels of
// inout's device, the inf/NaN flag, whether the data travels compressed
// (checkAllreduceOptions); and, for a piece of an op cut into collectives,
// its AllreduceSteps::piece.
struct OneOf {
  std::shared_ptr<kernels::GradientKernels> k;
  std::shared_ptr<std::atomic<bool>> flag;
  bool compress = false;
  uint64_t piece = 0;
};

// One collective of doAllreduceWith (the whole op, or one piece of it).
// Compressed: float32 data narrowed to the wire type (with the prescale)
// right before the collective and widened back (with the postscale) right
// after it, so the collective itself is a float16/bfloat16 (or quantized)
// allreduce whose every hop adds in float32 (on the host algorithms).
// Uncompressed: the data scaled in place before and after. Either way the
// reduced values are scanned for inf/NaN before the postscale (every rank
// holds the same bits, so all agree).
std::shared_ptr<WorkState> allreduceOne(CommunicatorImpl& I, Tensor inout,
                                        const AllreduceOptions& o, bool blocking, const OneOf& of) {
  const auto& k = of.k;
  const auto& flag = of.flag;
  const bool compress = of.compress;
  auto* data = static_cast<float*>(inout.data);
  const size_t n = inout.count;
  internal::FusedSteps s;
  if (!compress) {
    const float pre = o.prescale, post = o.postscale;
    s.buffer = inout;
    s.op = o.op;
    s.before = [k, data, n, pre] {
      if (pre != 1.0f) k->scale(data, n, pre);
    };
    s.after = [k, data, n, post, flag, inout] {
      // The reduced values, before postscale (as on the compressed path).
      flag->store(k->nonFinite(inout.data, inout.count, inout.dtype), std::memory_order_release);
      if (post != 1.0f) k->scale(data, n, post);
    };
  } else {
    // Scratch of the tensor's device; narrow() writes every element first.
    void* wire = orAbort(I, [&] { return k->acquire(internal::WireFormat{o.wire}.wireBytes(n)); });
    internal::CompressedAllreduce c;
    c.kernels = k;
    c.format = internal::WireFormat{o.wire, o.prescale, o.postscale};
    c.op = o.op;
    c.worldSize = I.commSize();
    c.wire = wire;
    c.count = n;
    c.spans = {internal::WireSpan{data, n, 0, static_cast<float*>(o.residual.data)}};
    c.nonFinite = flag;
    c.owner = std::shared_ptr<void>(wire, [k](void* p) { k->release(p); });  // after the op
    s = internal::compressedSteps(std::move(c));
  }
  // The op completes once the results are in the tensor (on a GPU: once
  // the stream has run the after step's kernels).
  auto after = [k, run = std::move(s.after)] {
    run();
    k->synchronize();
  };
  // Host steps of an async op run on the host lane, beside other ops' wire
  // time; device steps are enqueued on the stream, which overlaps them anyway.
  // Narrowing leaves the data as it is, so it may run early; an in-place
  // prescale waits for the op (docs/compression.md: a failure's residuals).
  AllreduceSteps steps{std::move(s.before), after,    o.reproducible,
                       std::nullopt,        compress, of.piece};
  if (!blocking && k->where().type == DeviceType::kCPU) {
    steps.beside = Footprint{{inout.data, inout.nbytes()}, {o.residual.data, o.residual.nbytes()}};
  }
  return doAllreduce(I, s.buffer, s.buffer, s.op, blocking, std::move(steps));
}

// Allreduce with AllreduceOptions, on host or device data alike: the
// element work goes through the kernels of the tensor's device (host
// kernels, or the communicator's CudaKernels of its GPU and stream, which
// enqueue on that stream). A compressed op on host data of 1.5 codec
// pieces or more (Settings::codecPieceBytes) runs as one async collective per
// piece (internal::codecPieces), blocking or not, so that the host lane
// narrows and widens one piece while another is on the wire; its Work is
// the last piece's, done when every piece is.
std::shared_ptr<WorkState> doAllreduceWith(CommunicatorImpl& I, Tensor inout,
                                           const AllreduceOptions& o, bool blocking) {
  const bool compress = checkAllreduceOptions(I, "allreduce", inout, o);
  OneOf of{orAbort(I, [&] { return I.kernelsFor(inout.device, inout.stream); }),
           std::make_shared<std::atomic<bool>>(false), compress};
  const bool host = of.k->where().type == DeviceType::kCPU;
  const auto cuts = compress && host ? internal::codecPieces(inout.count, I.codecPieceBytes())
                                     : std::vector<size_t>{0, inout.count};
  if (cuts.size() == 2) {
    auto w = allreduceOne(I, inout, o, blocking, of);
    w->setNonFiniteFlag(of.flag);
    return w;
  }
  std::vector<std::shared_ptr<WorkState>> pieces;
  try {
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      AllreduceOptions piece = o;
      if (o.residual.data) piece.residual = slice(o.residual, cuts[i], cuts[i + 1]);
      of.piece = backend::blocksDigest({inout.count, i, cuts.size() - 1});
      pieces.push_back(allreduceOne(I, slice(inout, cuts[i], cuts[i + 1]), piece, false, of));
    }
  } catch (const std::exception& e) {
    // The peers run every piece: a rank that submitted only some cannot
    // go on (a failed communicator stays failed as it was). The pieces
    // that went in end before the caller hears of it and reuses the memory.
    if (!pieces.empty()) {
      I.abortWith(Error(ErrorCode::kInternal,
                        "cut into " + std::to_string(cuts.size() - 1) + " pieces, piece " +
                            std::to_string(pieces.size()) + " was not submitted: " + e.what(),
                        ErrorContext::forOp("allreduce").withRank(I.commRank())));
    }
    for (const auto& p : pieces) {
      try {
        p->wait(std::chrono::milliseconds(0));
      } catch (const std::exception&) {
      }
    }
    throw;
  }
  auto last = std::move(pieces.back());
  pieces.pop_back();
  last->setEarlierPieces(std::move(pieces));
  last->setNonFiniteFlag(of.flag);
  return last;
}

std::shared_ptr<WorkState> doReduceScatter(CommunicatorImpl& I, Tensor in, Tensor out, ReduceOp op,
                                           bool blocking) {
  const char* name = "reduce_scatter";
  I.checkUsable(name);
  I.validateOp(name, op, in.dtype);
  checkBlocks(I, name, out, "out", in, "in");
  if (overlap(in.data, in.nbytes(), out.data, out.nbytes())) {
    I.invalid(name, "in and out must not overlap");
  }
  OpDesc d{OpKind::kReduceScatter, in.dtype, op, {}, 0, out.count};
  d.reproducible = I.reproducible(in.dtype);
  CommunicatorImpl* self = &I;
  auto buffers = Buffers::bind(I.binding(name), {{in, Buffers::kIn}, {out, Buffers::kOut}});
  return I.submit(
      d, blocking,
      [self, in, out](const backend::Op& o) { self->router().reduceScatter(o, in.data, out.data); },
      std::move(buffers));
}

std::shared_ptr<WorkState> doAllgather(CommunicatorImpl& I, Tensor in, Tensor out, bool blocking) {
  const char* name = "allgather";
  I.checkUsable(name);
  checkBlocks(I, name, in, "in", out, "out");
  const char* own =
      static_cast<const char*>(out.data) + static_cast<size_t>(I.commRank()) * in.nbytes();
  if (in.data != own && overlap(in.data, in.nbytes(), out.data, out.nbytes())) {
    I.invalid(name, "in overlaps out but is not this rank's block of out");
  }
  OpDesc d{OpKind::kAllgather, in.dtype, ReduceOp::kSum, Algorithm::kAuto, 0, in.count};
  CommunicatorImpl* self = &I;
  if (in.data == own && in.device.type != out.device.type) {
    I.invalid(name, "in is this rank's block of out but on another device");
  }
  // In place (in is this rank's block of out): out carries it.
  auto buffers = in.data == own
                     ? Buffers::bind(I.binding(name), {{out, Buffers::kInOut}})
                     : Buffers::bind(I.binding(name), {{in, Buffers::kIn}, {out, Buffers::kOut}});
  return I.submit(
      d, blocking,
      [self, in, out](const backend::Op& o) { self->router().allgather(o, in.data, out.data); },
      std::move(buffers));
}

std::shared_ptr<WorkState> doBroadcast(CommunicatorImpl& I, Tensor inout, int root, bool blocking) {
  const char* name = "broadcast";
  I.checkUsable(name);
  I.validateTensor(name, "inout", inout);
  opcheck::checkRoot(I, name, root);
  OpDesc d{OpKind::kBroadcast, inout.dtype, ReduceOp::kSum, Algorithm::kAuto, root, inout.count};
  CommunicatorImpl* self = &I;
  auto buffers = Buffers::bind(I.binding(name), {{inout, Buffers::kInOut}});
  return I.submit(
      d, blocking, [self, inout](const backend::Op& o) { self->router().broadcast(o, inout.data); },
      std::move(buffers));
}

std::shared_ptr<WorkState> doBarrier(CommunicatorImpl& I, bool blocking) {
  I.checkUsable("barrier");
  OpDesc d{OpKind::kBarrier, DataType::kUInt8, ReduceOp::kSum, Algorithm::kAuto, 0, 0};
  CommunicatorImpl* self = &I;
  return I.submit(d, blocking, [self](const backend::Op& o) { self->router().barrier(o); });
}

}  // namespace

void Communicator::allreduce(Tensor inout, ReduceOp op) {
  finish(doAllreduce(impl(*this), inout, inout, op, true));
}
void Communicator::allreduce(Tensor in, Tensor out, ReduceOp op) {
  finish(doAllreduce(impl(*this), in, out, op, true));
}
AllreduceResult Communicator::allreduce(Tensor inout, const AllreduceOptions& options) {
  auto w = doAllreduceWith(impl(*this), inout, options, true);
  finish(w);
  return AllreduceResult{w->nonFinite()};
}
void Communicator::reduceScatter(Tensor in, Tensor out, ReduceOp op) {
  finish(doReduceScatter(impl(*this), in, out, op, true));
}
void Communicator::allgather(Tensor in, Tensor out) {
  finish(doAllgather(impl(*this), in, out, true));
}
void Communicator::broadcast(Tensor inout, int root) {
  finish(doBroadcast(impl(*this), inout, root, true));
}
void Communicator::barrier() {
  finish(doBarrier(impl(*this), true));
}

Work Communicator::allreduceAsync(Tensor inout, ReduceOp op) {
  return Work(doAllreduce(impl(*this), inout, inout, op, false));
}
Work Communicator::allreduceAsync(Tensor inout, const AllreduceOptions& options) {
  return Work(doAllreduceWith(impl(*this), inout, options, false));
}
Work Communicator::allreduceAsync(Tensor in, Tensor out, ReduceOp op) {
  return Work(doAllreduce(impl(*this), in, out, op, false));
}
Work Communicator::reduceScatterAsync(Tensor in, Tensor out, ReduceOp op) {
  return Work(doReduceScatter(impl(*this), in, out, op, false));
}
Work Communicator::allgatherAsync(Tensor in, Tensor out) {
  return Work(doAllgather(impl(*this), in, out, false));
}
Work Communicator::broadcastAsync(Tensor inout, int root) {
  return Work(doBroadcast(impl(*this), inout, root, false));
}
Work Communicator::barrierAsync() {
  return Work(doBarrier(impl(*this), false));
}

std::shared_ptr<kernels::GradientKernels> internal::CommunicatorAccess::kernelsFor(
    Communicator& comm, Device where, void* stream) {
  return impl(comm).kernelsFor(where, stream);
}

std::vector<ArrivalVerdict> internal::CommunicatorAccess::arrivalVerdicts(
    const Communicator& comm) {
  return impl(comm).arrivalLog().recent();
}

ArrivalVerdict internal::CommunicatorAccess::currentArrival(const Communicator& comm) {
  return impl(comm).arrivalLog().current();
}

bool internal::CommunicatorAccess::reproducible(const Communicator& comm) {
  return impl(comm).reproducibleMode();
}
void internal::CommunicatorAccess::setReproducible(Communicator& comm, bool on) {
  impl(comm).setReproducibleMode(on);
}

std::shared_ptr<WorkState> internal::CommunicatorAccess::fusedAllreduce(
    Communicator& comm, Tensor buffer, ReduceOp op, std::function<void()> before,
    std::function<void()> after) {
  const CommunicatorImpl::FatalArgumentErrors fatal;
  return doAllreduce(impl(comm), buffer, buffer, op, false,
                     AllreduceSteps{std::move(before), std::move(after), std::nullopt, {}, false});
}

}  // namespace gflow
