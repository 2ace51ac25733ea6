// The front doors of send, recv and sendRecv: each checks its messages
// (naming the op, the message and this rank), binds their buffers and
// submits one point-to-point op to the router, which stands outside the
// collectives' op order (CommunicatorImpl::submit).
#include <memory>
#include <string>
#include <vector>

#include "backend/device_buffers.h"
#include "core/communicator_impl.h"
#include "core/op_checks.h"
#include "gflow/communicator.h"

namespace gflow {

using backend::OpDesc;
using backend::OpKind;
using backend::P2PMessage;

namespace {

using Buffers = backend::DeviceBuffers;

std::string nameOf(const std::vector<P2POp>& ops, size_t i) {
  return ops.size() == 1 ? std::string(ops[i].kind == P2POp::Kind::kSend ? "in" : "out")
                         : "ops[" + std::to_string(i) + "]";
}

void checkMessage(CommunicatorImpl& I, const char* name, const std::vector<P2POp>& ops, size_t i) {
  const P2POp& p = ops[i];
  const std::string what = nameOf(ops, i);
  if (p.kind != P2POp::Kind::kSend && p.kind != P2POp::Kind::kRecv) {
    I.invalid(name, what + " has an invalid kind (" + std::to_string(int(p.kind)) + ")");
  }
  I.validateTensor(name, what.c_str(), p.tensor);
  const bool anySource = p.kind == P2POp::Kind::kRecv && p.peer == P2POp::kAnySource;
  if (!anySource && (p.peer < 0 || p.peer >= I.commSize() || p.peer == I.commRank())) {
    I.invalid(name, what + ": peer " + std::to_string(p.peer) + " is not another rank of [0, " +
                        std::to_string(I.commSize()) + ")" +
                        (p.kind == P2POp::Kind::kRecv ? " or P2POp::kAnySource" : ""));
  }
  if (p.tag < 0) I.invalid(name, what + ": tag " + std::to_string(p.tag) + " is negative");
}

// A receive may not overlap any other buffer of the call.
void checkOverlaps(CommunicatorImpl& I, const char* name, const std::vector<P2POp>& ops) {
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind != P2POp::Kind::kRecv) continue;
    for (size_t j = 0; j < ops.size(); ++j) {
      if (j != i && opcheck::overlap(ops[i].tensor.data, ops[i].tensor.nbytes(), ops[j].tensor.data,
                                     ops[j].tensor.nbytes())) {
        I.invalid(name, nameOf(ops, i) + " (a receive) overlaps " + nameOf(ops, j));
      }
    }
  }
}

std::shared_ptr<WorkState> doPointToPoint(CommunicatorImpl& I, const char* name,
                                          std::vector<P2POp> ops, bool blocking) {
  I.checkUsable(name);
  for (size_t i = 0; i < ops.size(); ++i) checkMessage(I, name, ops, i);
  checkOverlaps(I, name, ops);
  std::vector<P2PMessage> msgs(ops.size());
  std::vector<Buffers::Item> items;
  uint64_t bytes = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& p = ops[i];
    const bool send = p.kind == P2POp::Kind::kSend;
    msgs[i] = P2PMessage{send, p.peer, p.tag, p.tensor.dtype, p.tensor.count, p.tensor.data, -1};
    items.push_back({p.tensor, send ? Buffers::kIn : Buffers::kOut});
    bytes += p.tensor.nbytes();
  }
  OpDesc d{
      OpKind::kPointToPoint, DataType::kUInt8, ReduceOp::kSum, backend::Algorithm::kAuto, 0, bytes};
  CommunicatorImpl* self = &I;
  auto buffers = Buffers::bind(I.binding(name), std::move(items));
  auto body = [self, msgs, ops, blocking, name](const backend::Op& o) mutable {
    std::unique_ptr<backend::P2PInFlight> op = self->router().startPointToPoint(o, std::move(msgs));
    // `done` runs while `op` lives (here, or beside it in defer's list).
    auto done = [raw = op.get(), ops] {
      for (size_t i = 0; i < ops.size(); ++i) {
        if (ops[i].source) *ops[i].source = raw->messages()[i].source;
      }
    };
    // An async op stays in flight while later ops run (so a receive posted
    // before this rank's matching send cannot hold that send back).
    if (!blocking && !op->test()) return self->defer(std::move(op), std::move(done), name);
    op->wait();
    done();
  };
  return I.submit(d, blocking, std::move(body), std::move(buffers), name);
}

}  // namespace

void Communicator::send(Tensor in, int peer, int tag) {
  opcheck::finish(doPointToPoint(impl(*this), opcheck::kSend, {P2POp::send(in, peer, tag)}, true));
}
int Communicator::recv(Tensor out, int peer, int tag) {
  int source = -1;
  opcheck::finish(
      doPointToPoint(impl(*this), opcheck::kRecv, {P2POp::recv(out, peer, tag, &source)}, true));
  return source;
}
void Communicator::sendRecv(const std::vector<P2POp>& ops) {
  opcheck::finish(doPointToPoint(impl(*this), opcheck::kSendRecv, ops, true));
}

Work Communicator::sendAsync(Tensor in, int peer, int tag) {
  return Work(doPointToPoint(impl(*this), opcheck::kSend, {P2POp::send(in, peer, tag)}, false));
}
Work Communicator::recvAsync(Tensor out, int peer, int tag, int* source) {
  return Work(
      doPointToPoint(impl(*this), opcheck::kRecv, {P2POp::recv(out, peer, tag, source)}, false));
}
Work Communicator::sendRecvAsync(const std::vector<P2POp>& ops) {
  return Work(doPointToPoint(impl(*this), opcheck::kSendRecv, ops, false));
}

}  // namespace gflow
