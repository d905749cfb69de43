#include "nccl_bootstrap.hpp"

#include "nereus/base/error.hpp"
#ifdef NEREUS_HAVE_NCCL
#include <dlfcn.h>
#include <nccl.h>

#include <cstring>
#endif

namespace nereus::cluster::detail {

#ifdef NEREUS_HAVE_NCCL
namespace {

/// NCCL's entry points, from libnccl.so.2 opened at first use (not linked: see
/// src/meson.build); null where this machine has no NCCL.
struct NcclApi {
  ncclResult_t (*get_unique_id)(ncclUniqueId*) = nullptr;
  const char* (*error_string)(ncclResult_t) = nullptr;
};

const NcclApi& nccl_api() {
  static const NcclApi api = [] {
    NcclApi a;
    void* lib = ::dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return a;
    a.get_unique_id = reinterpret_cast<ncclResult_t (*)(ncclUniqueId*)>(::dlsym(lib, "ncclGetUniqueId"));
    a.error_string = reinterpret_cast<const char* (*)(ncclResult_t)>(::dlsym(lib, "ncclGetErrorString"));
    if (!a.get_unique_id || !a.error_string) a = {};
    return a;
  }();
  return api;
}

}  // namespace

Bytes nccl_unique_id() {
  const NcclApi& api = nccl_api();
  if (!api.get_unique_id) return {};  // no NCCL on this machine: as a build without it
  ncclUniqueId id;
  if (const ncclResult_t r = api.get_unique_id(&id); r != ncclSuccess)
    throw Error(std::string("NCCL cannot make a unique id: ") + api.error_string(r));
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
Bytes nccl_unique_id() { return {}; }
void check_nccl_id(const Bytes&) {}
#endif

}  // namespace nereus::cluster::detail
