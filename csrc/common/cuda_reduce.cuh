// Block-wide reductions for CUDA kernels that give one result per block (one row, one
// sequence). The block size must be a multiple of 32; every thread gets the result.
#pragma once

#include <cuda_runtime.h>

namespace nostall {

constexpr int kRowThreads = 256;

template <typename T, typename Op>
__device__ T block_all_reduce(T v, Op op) {
  __shared__ T partial[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  __syncthreads();  // a previous call's readers are done with `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  T out = partial[0];
  for (int w = 1; w < warps; ++w) out = op(out, partial[w]);
  return out;
}

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

// Skips NaN (a comparison with NaN is false); callers let NaN reach a sum instead.
struct MaxOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return b > a ? b : a;
  }
};

}  // namespace nostall
