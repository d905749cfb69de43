// Built when meson found no cudart: the cuda backend reports that it is absent.
#include "nereus/base/error.hpp"
#include "nereus/transport/cuda.hpp"

namespace nereus {

bool cuda_built() { return false; }
void quantize_fp8_on_gpu(int, const fp8::Region&, std::int64_t, std::int64_t, std::uint8_t*, std::int64_t, float*, std::int64_t) {
  throw Error("this build has no CUDA: FP8 in GPU memory cannot be quantized (reconfigure with -Dcuda=enabled)");
}
int cuda_device_count() { return 0; }
std::unique_ptr<Transport> make_cuda_transport(asio::io_context& io, CudaTransportOptions options) {
  return make_cuda_transport(io.get_executor(), std::move(options));
}
std::unique_ptr<Transport> make_cuda_transport(asio::any_io_executor, CudaTransportOptions) {
  throw Error("this build has no CUDA transport: reconfigure with -Dcuda=enabled (cudart under -Dgpu_toolkit)");
}

}  // namespace nereus
