// WireChooser (include/gflow/reducer.h): the automatic wire (AutoWire) for
// callers that issue each bucket's allreduce themselves.
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/check.h"
#include "gflow/reducer.h"
#include "gradient/auto_wire.h"
#include "gradient/timeline.h"

namespace gflow {

class WireChooser::Impl {
 public:
  Impl(std::shared_ptr<Communicator> c, size_t buckets, const AutoWireOptions& options,
       std::vector<std::string> names, const std::string& timelineSpec)
      : comm(std::move(c)) {
    const char* kOp = "wire_chooser";
    if (!comm)
      GFLOW_THROW(kInvalidArgument, ErrorContext{kOp}) << "WireChooser needs a communicator";
    if (!names.empty() && names.size() != buckets) {
      GFLOW_THROW(kInvalidArgument, ErrorContext{kOp}.withRank(comm->rank()))
          << names.size() << " names for " << buckets << " buckets";
    }
    for (size_t b = names.size(); b < buckets; ++b) names.push_back("bucket " + std::to_string(b));
    timeline = gradient::Timeline::open(timelineSpec, comm->rank());
    wire = std::make_unique<gradient::AutoWire>(*comm, gradient::policyConfig(options),
                                                std::vector<bool>(buckets, true), std::move(names),
                                                timeline.get());
  }
  size_t checked(size_t bucket, const char* what) const {
    if (bucket >= wire->numBuckets()) {
      GFLOW_THROW(kInvalidArgument, ErrorContext{"wire_chooser"}.withRank(comm->rank()))
          << what << "(" << bucket << "): the chooser has " << wire->numBuckets() << " buckets";
    }
    return bucket;
  }

  std::shared_ptr<Communicator> comm;
  std::unique_ptr<gradient::Timeline> timeline;
  std::unique_ptr<gradient::AutoWire> wire;  // after the timeline it writes to
  mutable std::mutex mutex;                  // done() comes from completion threads
  uint64_t steps = 0;
};

WireChooser::WireChooser(std::shared_ptr<Communicator> comm, size_t buckets,
                         AutoWireOptions options, std::vector<std::string> names,
                         std::string timeline)
    : impl_(std::make_unique<Impl>(std::move(comm), buckets, options, std::move(names), timeline)) {
}

WireChooser::~WireChooser() = default;

DataType WireChooser::wire(size_t bucket) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->wire->wire(impl_->checked(bucket, "wire"));
}

std::vector<DataType> WireChooser::wires() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::vector<DataType> out;
  for (size_t b = 0; b < impl_->wire->numBuckets(); ++b) out.push_back(impl_->wire->wire(b));
  return out;
}

void WireChooser::ready(size_t bucket) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->wire->bucketReady(impl_->checked(bucket, "ready"));
}

void WireChooser::done(size_t bucket) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->wire->bucketDone(impl_->checked(bucket, "done"));
}

uint64_t WireChooser::finishStep(bool nonFinite,
                                 const std::function<std::vector<double>()>& residualRatios) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const uint64_t changed = impl_->wire->stepDone(impl_->steps++, nonFinite, residualRatios);
  if (impl_->timeline) impl_->timeline->flush();
  return changed;
}

uint64_t WireChooser::steps() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->steps;
}

}  // namespace gflow
