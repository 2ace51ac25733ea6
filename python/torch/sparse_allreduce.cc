#include "sparse_allreduce.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace gflow::torch_backend {
namespace {

// What each rank publishes first: enough to size and check the exchange.
constexpr size_t kMaxDims = 16;
struct Shape {
  int64_t nnz, sparseDims, denseDims, dims, dtype;
  int64_t sizes[kMaxDims];
};
constexpr size_t kShapeWords = sizeof(Shape) / sizeof(int64_t);

[[noreturn]] void invalid(const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, "gflow backend: sparse allreduce: " + message);
}

Shape shapeOf(const at::Tensor& t) {
  if (t.dim() > static_cast<int64_t>(kMaxDims)) {
    invalid(std::to_string(t.dim()) + " dimensions (at most " + std::to_string(kMaxDims) + ")");
  }
  Shape s{};
  s.nnz = t._nnz();
  s.sparseDims = t.sparse_dim();
  s.denseDims = t.dense_dim();
  s.dims = t.dim();
  s.dtype = static_cast<int64_t>(t.scalar_type());
  for (int64_t d = 0; d < t.dim(); ++d) s.sizes[d] = t.size(d);
  return s;
}

// Every rank's shape; raises on every rank alike if they differ.
std::vector<Shape> exchangeShapes(Communicator& comm, const at::Tensor& t) {
  Shape mine = shapeOf(t);
  std::vector<Shape> all(static_cast<size_t>(comm.size()));
  comm.allgather(Tensor(&mine, kShapeWords, DataType::kInt64),
                 Tensor(all.data(), kShapeWords * all.size(), DataType::kInt64));
  for (size_t r = 1; r < all.size(); ++r) {
    const Shape& a = all[0];
    const Shape& b = all[r];
    if (a.sparseDims != b.sparseDims || a.denseDims != b.denseDims || a.dims != b.dims ||
        a.dtype != b.dtype || !std::equal(a.sizes, a.sizes + a.dims, b.sizes)) {
      invalid("rank " + std::to_string(r) + "'s tensor differs from rank 0's in its sizes, " +
              "sparse or dense dimensions or dtype");
    }
  }
  return all;
}

// Where each rank's part sits in its block of the gathered bytes: indices
// (sparseDims x maxNnz int64), then values (maxNnz x the dense part), each
// padded to the largest nnz; blocks start 16-byte aligned, so each part
// views as its own type.
struct Layout {
  int64_t maxNnz, perNnz, indexBytes, block;
};

Layout layoutFor(const at::Tensor& t, const std::vector<Shape>& shapes) {
  Layout l{};
  for (const Shape& s : shapes) l.maxNnz = std::max(l.maxNnz, s.nnz);
  l.perNnz = t.element_size();  // bytes of one value: the dense part
  for (int64_t d = t.sparse_dim(); d < t.dim(); ++d) l.perNnz *= t.size(d);
  l.indexBytes = t.sparse_dim() * l.maxNnz * 8;
  l.block = (l.indexBytes + l.maxNnz * l.perNnz + 15) / 16 * 16;
  return l;
}

at::Tensor packed(const at::Tensor& t, const Layout& l) {
  const at::Tensor indices = t._indices().contiguous();
  const at::Tensor values = t._values().contiguous();
  at::Tensor block = at::zeros({l.block}, at::kByte);
  auto* p = static_cast<uint8_t*>(block.data_ptr());
  for (int64_t d = 0; d < t.sparse_dim(); ++d) {  // row d, padded to maxNnz
    std::memcpy(p + d * l.maxNnz * 8, indices[d].data_ptr(), static_cast<size_t>(t._nnz() * 8));
  }
  std::memcpy(p + l.indexBytes, values.data_ptr(), static_cast<size_t>(values.nbytes()));
  return block;
}

// Every rank's indices and values out of `gathered`, summed and coalesced.
at::Tensor sumOfGathered(const at::Tensor& t, const std::vector<Shape>& shapes,
                         const at::Tensor& gathered, const Layout& l) {
  std::vector<at::Tensor> idx, val;
  const at::Tensor values = t._values();  // one tensor: sizes() views its shape
  std::vector<int64_t> valueShape(values.sizes().begin(), values.sizes().end());
  for (size_t r = 0; r < shapes.size(); ++r) {
    const int64_t nnz = shapes[r].nnz;
    const at::Tensor b = gathered.narrow(0, static_cast<int64_t>(r) * l.block, l.block);
    idx.push_back(b.narrow(0, 0, l.indexBytes)
                      .view(at::kLong)
                      .view({t.sparse_dim(), l.maxNnz})
                      .narrow(1, 0, nnz));
    valueShape[0] = nnz;
    val.push_back(b.narrow(0, l.indexBytes, nnz * l.perNnz).view(t.scalar_type()).view(valueShape));
  }
  return at::sparse_coo_tensor(at::cat(idx, 1), at::cat(val, 0), t.sizes(), t.options()).coalesce();
}

}  // namespace

SparseAllreduce startSparseAllreduce(Communicator& comm, const at::Tensor& t) {
  if (!t.device().is_cpu()) invalid("tensor on " + t.device().str() + "; CPU tensors only");
  const std::vector<Shape> shapes = exchangeShapes(comm, t);
  const Layout l = layoutFor(t, shapes);
  const auto n = static_cast<size_t>(comm.size());
  at::Tensor mine = packed(t, l);
  at::Tensor gathered = at::empty({l.block * static_cast<int64_t>(n)}, at::kByte);
  SparseAllreduce out;
  out.work = comm.allgatherAsync(
      Tensor(mine.data_ptr(), static_cast<size_t>(l.block), DataType::kUInt8),
      Tensor(gathered.data_ptr(), static_cast<size_t>(l.block) * n, DataType::kUInt8));
  out.gathered = gathered;
  // `mine` stays alive until the allgather has read it.
  out.after = [t, shapes, gathered, mine, l]() mutable {
    (void)mine;
    t.copy_(sumOfGathered(t, shapes, gathered, l));
  };
  return out;
}

}  // namespace gflow::torch_backend
