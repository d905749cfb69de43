// Built when meson found no cudart or no nccl.h: the nccl backend reports that it is absent.
#include "nereus/base/error.hpp"
#include "nereus/transport/nccl.hpp"

namespace nereus {

bool nccl_built() { return false; }

std::unique_ptr<Transport> make_nccl_transport(asio::io_context&, NcclTransportOptions) {
  throw Error("this build has no NCCL transport: it needs cudart and nccl.h under -Dgpu_toolkit (-Dcuda=enabled -Dnccl=enabled)");
}

}  // namespace nereus
