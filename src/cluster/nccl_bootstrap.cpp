#include "nccl_bootstrap.hpp"

#include "nereus/base/error.hpp"
#ifdef NEREUS_HAVE_NCCL
#include <nccl.h>
#endif

namespace nereus::cluster::detail {

#ifdef NEREUS_HAVE_NCCL
void check_nccl_id(const Bytes& id) {
  if (!id.empty() && id.size() != sizeof(ncclUniqueId::internal))
    throw Error("an NCCL unique id of " + std::to_string(id.size()) + " bytes (NCCL's are " +
                std::to_string(sizeof(ncclUniqueId::internal)) + ")");
}
#else
void check_nccl_id(const Bytes&) {}
#endif

}  // namespace nereus::cluster::detail
