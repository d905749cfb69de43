#include "nccl_bootstrap.hpp"

#include "nereus/base/error.hpp"
#ifdef NEREUS_HAVE_NCCL
#include <nccl.h>

#include <cstring>
#endif

namespace nereus::cluster::detail {

#ifdef NEREUS_HAVE_NCCL
bool nccl_built() { return true; }

Bytes nccl_unique_id() {
  ncclUniqueId id;
  if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
    throw Error(std::string("NCCL cannot make a unique id: ") + ncclGetErrorString(r));
  Bytes out(sizeof(id.internal));
  std::memcpy(out.data(), id.internal, out.size());
  return out;
}

void check_nccl_id(const Bytes& id) {
  if (!id.empty() && id.size() != sizeof(ncclUniqueId::internal))
    throw Error("an NCCL unique id of " + std::to_string(id.size()) + " bytes (NCCL's are " +
                std::to_string(sizeof(ncclUniqueId::internal)) + ")");
}
#else
bool nccl_built() { return false; }
Bytes nccl_unique_id() { return {}; }
void check_nccl_id(const Bytes&) {}
#endif

}  // namespace nereus::cluster::detail
