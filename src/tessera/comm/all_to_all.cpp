#include "tessera/comm/all_to_all.h"

#include <cstring>
#include <memory>

#include "tessera/core/error.h"
#include "tessera/device/device.h"

namespace tessera {

namespace {
// The first row of each run and the total.
std::vector<int64_t> run_starts(const std::vector<int64_t>& rows, int64_t& total) {
  std::vector<int64_t> starts(rows.size());
  total = 0;
  for (size_t i = 0; i < rows.size(); ++i) starts[i] = total, total += rows[i];
  return starts;
}
}  // namespace

void all_to_all_v(Communicator& group, Tensor out, const std::vector<int64_t>& recv_rows, Tensor in,
                  const std::vector<int64_t>& send_rows) {
  const int n = group.size(), me = group.rank();
  TESSERA_CHECK(static_cast<int>(recv_rows.size()) == n && static_cast<int>(send_rows.size()) == n,
                "all_to_all_v: one run per rank of the group");
  int64_t in_total = 0, out_total = 0;
  const std::vector<int64_t> send_at = run_starts(send_rows, in_total), recv_at = run_starts(recv_rows, out_total);
  TESSERA_CHECK(in_total <= (in.shape.empty() ? 0 : in.shape[0]) && out_total <= (out.shape.empty() ? 0 : out.shape[0]),
                "all_to_all_v: the runs fit their tensors");
  // Post every receive and send before waiting on any (a send completes only once its receive
  // is posted: communicator.h).
  std::vector<std::unique_ptr<Work>> work;
  for (int peer = 0; peer < n; ++peer)
    if (peer != me && recv_rows[peer] > 0) work.push_back(group.recv_async(out.slice_rows(recv_at[peer], recv_rows[peer]), peer));
  for (int peer = 0; peer < n; ++peer)
    if (peer != me && send_rows[peer] > 0) work.push_back(group.send_async(in.slice_rows(send_at[peer], send_rows[peer]), peer));
  TESSERA_CHECK(send_rows[me] == recv_rows[me], "all_to_all_v: this rank's own run has one size");
  if (send_rows[me] > 0) {
    const Tensor to = out.slice_rows(recv_at[me], recv_rows[me]), from = in.slice_rows(send_at[me], send_rows[me]);
    if (from.device) copy_tensor(to, from);
    else std::memcpy(to.host<char>(), from.host<char>(), from.bytes());  // host memory (no device)
  }
  for (auto& w : work) w->wait();
}

}  // namespace tessera
