// CUDA launch helpers: every kernel runs on the caller's current stream on the inputs' device,
// and a failed launch becomes a clear error instead of a later, unrelated one.
#pragma once

#include <cuda_runtime.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/Exception.h>

#include <cstdint>

namespace nostall {

inline cudaStream_t current_stream(const torch::stable::Tensor& on) {
  void* stream = nullptr;
  STD_TORCH_CHECK(
      aoti_torch_get_current_cuda_stream(on.get_device_index(), &stream) == AOTI_TORCH_SUCCESS,
      "could not get the current CUDA stream");
  return static_cast<cudaStream_t>(stream);
}

inline void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  STD_TORCH_CHECK(err == cudaSuccess, kernel, " failed to launch: ", cudaGetErrorString(err));
}

constexpr int kColumnThreads = 256;

// One thread per column: the recurrences run along time, so columns are independent and
// adjacent threads read adjacent addresses (coalesced) at every step.
inline unsigned column_blocks(int64_t N) {
  return static_cast<unsigned>((N + kColumnThreads - 1) / kColumnThreads);
}

}  // namespace nostall
