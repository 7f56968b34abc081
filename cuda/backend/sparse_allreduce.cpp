// all_reduce of sparse COO tensors (SUM, AVG), the way DDP's sparse gradients need it.
//
// Sparse tensors have a different number of non-zeros on every rank, so there is no
// element-wise reduction to run. Instead every rank gathers every rank's (indices, values)
// and sums them locally with coalesce(); every rank ends with the same coalesced tensor.
// Three all_gathers: a fixed-size header (layout + nnz, checked on every rank so a layout
// mismatch raises the same clear error everywhere instead of hanging), then the indices and
// values padded to the largest nnz (all_gather blocks must have equal size).

#include <algorithm>
#include <sstream>

#include "backend/sparse_allreduce.h"

#include "backend/process_group.h"

namespace hoccl {
namespace {

constexpr int64_t kMaxSparseDims = 32;
// Header: sparse_dim, dense_dim, ndim, dtype, nnz, sizes[kMaxSparseDims].
constexpr int64_t kHeaderLen = 5 + kMaxSparseDims;
constexpr int64_t kNnzField = 4;

at::Tensor sparseHeader(const at::Tensor& t, int rank) {
  TORCH_CHECK(t.dim() <= kMaxSparseDims, "hoccl all_reduce on rank ", rank, ": sparse tensor has ", t.dim(),
              " dimensions; at most ", kMaxSparseDims, " are supported");
  at::Tensor h = at::zeros({kHeaderLen}, at::kLong);
  auto* p = h.data_ptr<int64_t>();
  p[0] = t.sparse_dim();
  p[1] = t.dense_dim();
  p[2] = t.dim();
  p[3] = static_cast<int64_t>(t.scalar_type());
  p[kNnzField] = t._nnz();
  for (int64_t d = 0; d < t.dim(); ++d) p[5 + d] = t.size(d);
  return h;
}

std::string describeLayout(const int64_t* h) {
  std::ostringstream s;
  s << "sizes [";
  for (int64_t d = 0; d < h[2]; ++d) s << (d ? ", " : "") << h[5 + d];
  s << "], sparse_dim " << h[0] << ", dense_dim " << h[1] << ", dtype "
    << c10::toString(static_cast<at::ScalarType>(h[3]));
  return s.str();
}

// Every rank compares every header with its own, so all ranks raise (no one is left waiting).
void checkHeaders(const at::Tensor& headers, int rank, int world) {
  const int64_t* all = headers.data_ptr<int64_t>();
  const int64_t* mine = all + rank * kHeaderLen;
  for (int r = 0; r < world; ++r) {
    const int64_t* theirs = all + r * kHeaderLen;
    bool same = std::equal(mine, mine + kNnzField, theirs) &&
                std::equal(mine + 5, mine + kHeaderLen, theirs + 5);
    TORCH_CHECK(same, "hoccl all_reduce on rank ", rank, ": sparse tensor layout differs between ranks: rank ",
                rank, " has ", describeLayout(mine), " but rank ", r, " has ", describeLayout(theirs));
  }
}

// Rows [0, nnz) of `rows` followed by zero rows up to `maxNnz` (rows = first dimension).
at::Tensor padRows(const at::Tensor& rows, int64_t maxNnz) {
  std::vector<int64_t> shape(rows.sizes().begin(), rows.sizes().end());
  shape[0] = maxNnz;
  at::Tensor padded = at::zeros(shape, rows.options());
  padded.narrow(0, 0, rows.size(0)).copy_(rows);
  return padded;
}

std::vector<at::Tensor> blocksOf(const at::Tensor& stacked) {
  std::vector<at::Tensor> blocks;
  for (int64_t r = 0; r < stacked.size(0); ++r) blocks.push_back(stacked.select(0, r));
  return blocks;
}

}  // namespace

void checkSparseAllreduce(const at::Tensor& t, RedOp op, int rank) {
  TORCH_CHECK(t.layout() == at::kSparse, "hoccl all_reduce on rank ", rank, ": ", t.layout(),
              " tensors are not supported (sparse COO is)");
  TORCH_CHECK(t.device().is_cpu(), "hoccl all_reduce on rank ", rank,
              ": sparse tensors must be on the CPU (got ", t.device(), ")");
  TORCH_CHECK(op == RedOp::Sum || (op == RedOp::Avg && (t.is_floating_point() || t.is_complex())),
              "hoccl all_reduce on rank ", rank, ": sparse tensors support SUM (and AVG for floating dtypes), not ",
              redOpName(op), " on ", t.scalar_type());
}

void sparseAllreduce(const at::Tensor& tensor, RedOp op, int rank, int world, const GatherBlocks& gather) {
  at::Tensor mine = tensor.coalesce();
  at::Tensor header = sparseHeader(mine, rank);
  at::Tensor headers = at::empty({world, kHeaderLen}, at::kLong);
  gather(header, blocksOf(headers));
  checkHeaders(headers, rank, world);

  at::Tensor nnz = headers.select(1, kNnzField).contiguous();
  int64_t maxNnz = nnz.max().item<int64_t>();
  at::Tensor indices = padRows(mine._indices().t().contiguous(), maxNnz);  // [maxNnz, sparse_dim]
  at::Tensor values = padRows(mine._values().contiguous(), maxNnz);        // [maxNnz, dense...]
  std::vector<int64_t> idxShape{world}, valShape{world};
  idxShape.insert(idxShape.end(), indices.sizes().begin(), indices.sizes().end());
  valShape.insert(valShape.end(), values.sizes().begin(), values.sizes().end());
  at::Tensor allIndices = at::empty(idxShape, indices.options());
  at::Tensor allValues = at::empty(valShape, values.options());
  gather(indices, blocksOf(allIndices));
  gather(values, blocksOf(allValues));

  std::vector<at::Tensor> idxParts, valParts;
  const int64_t* counts = nnz.data_ptr<int64_t>();
  for (int r = 0; r < world; ++r) {
    idxParts.push_back(allIndices.select(0, r).narrow(0, 0, counts[r]));
    valParts.push_back(allValues.select(0, r).narrow(0, 0, counts[r]));
  }
  at::Tensor sumIndices = at::cat(idxParts).t();
  at::Tensor sumValues = at::cat(valParts);
  at::Tensor sum = at::sparse_coo_tensor(sumIndices, sumValues, tensor.sizes()).coalesce();
  if (op == RedOp::Avg) sum._values().div_(world);  // after summing, as the dense AVG does
  // copy_ between sparse tensors replaces indices and values: the caller's tensor becomes the sum.
  tensor.copy_(sum);
}

void ProcessGroupHOCCL::runSparseAllreduce(at::Tensor tensor, RedOp op) {
  sparseAllreduce(tensor, op, localRank_, localSize_, [this](const at::Tensor& block, const std::vector<at::Tensor>& outs) {
    allgatherBlocks(block, outs, OpKind::AllGather, 0);
  });
}

}  // namespace hoccl
