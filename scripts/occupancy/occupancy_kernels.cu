// Kernels with different register, static and dynamic shared-memory needs,
// for comparing headcount's occupancy calculator with the driver's
// (cuOccupancyMaxActiveBlocksPerMultiprocessor) in scripts/gpu_check.py.
// Built by scripts/occupancy/build.sh into occupancy_kernels.fatbin.
#include <cstdint>

template <int LIVE>
__device__ __forceinline__ float churn(const float* __restrict__ in, int i) {
    float v[LIVE];
#pragma unroll
    for (int j = 0; j < LIVE; ++j) v[j] = in[(i + j * 977) & 0xFFFF];
    float acc = 0.f;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
#pragma unroll
        for (int j = 0; j < LIVE; ++j) { v[j] = fmaf(v[j], v[(j + 1) % LIVE], v[(j + 7) % LIVE]); }
    }
#pragma unroll
    for (int j = 0; j < LIVE; ++j) acc += v[j];
    return acc;
}

#define REG_KERNEL(N) \
    extern "C" __global__ void regs_##N(const float* __restrict__ in, float* __restrict__ out) { \
        int i = blockIdx.x * blockDim.x + threadIdx.x; out[i & 0xFFFF] = churn<N>(in, i); }

REG_KERNEL(4)
REG_KERNEL(24)
REG_KERNEL(48)
REG_KERNEL(96)
REG_KERNEL(160)

#define SMEM_KERNEL(BYTES) \
    extern "C" __global__ void smem_##BYTES(const float* __restrict__ in, float* __restrict__ out) { \
        __shared__ float buf[BYTES / 4]; \
        for (int j = threadIdx.x; j < BYTES / 4; j += blockDim.x) buf[j] = in[(j + blockIdx.x) & 0xFFFF]; \
        __syncthreads(); \
        out[(blockIdx.x * blockDim.x + threadIdx.x) & 0xFFFF] = buf[(threadIdx.x * 7) % (BYTES / 4)]; }

SMEM_KERNEL(4096)
SMEM_KERNEL(16384)
SMEM_KERNEL(40960)

extern "C" __global__ void dynamic_smem(const float* __restrict__ in, float* __restrict__ out, int n) {
    extern __shared__ float buf[];
    for (int j = threadIdx.x; j < n; j += blockDim.x) buf[j] = in[(j + blockIdx.x) & 0xFFFF];
    __syncthreads();
    out[(blockIdx.x * blockDim.x + threadIdx.x) & 0xFFFF] = buf[threadIdx.x % n] + churn<24>(in, threadIdx.x);
}
