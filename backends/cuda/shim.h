// Lets rnnc's CUDA kernel source compile as C++ for the CPU (emulation mode).
//
// The kernels rnnc generates are one-thread-per-element with grid-stride loops:
// no shared memory, no __syncthreads, no warp intrinsics. Every thread is then
// independent, so running blocks and threads one after another in a plain loop
// (the launchers emulate.py appends) computes what the GPU computes. Anything
// outside that subset is deliberately left undefined so that a kernel using it
// fails to compile here instead of running with wrong semantics.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <math.h>  // after <cmath>: puts the float overloads (tanh(float), ...) in ::

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __restrict__ __restrict
#define __launch_bounds__(...)

// CUDA's uint3/dim3 hold unsigned int, so index arithmetic such as
// blockIdx.x * blockDim.x + threadIdx.x wraps and promotes exactly as on the GPU.
struct rnnc_dim3 {
    unsigned int x, y, z;
};
typedef rnnc_dim3 uint3;
typedef rnnc_dim3 dim3;

// thread_local so that launches from different host threads (ctypes drops the
// GIL during a call) cannot see each other's indices.
static thread_local uint3 threadIdx = {0, 0, 0};
static thread_local uint3 blockIdx = {0, 0, 0};
static thread_local dim3 blockDim = {1, 1, 1};
static thread_local dim3 gridDim = {1, 1, 1};

// CUDA device functions with no <cmath> counterpart. The fast-math intrinsics
// (__expf, __fdividef) are approximate on the GPU; here they are exact, so tests
// comparing emulated results need the tolerance the GPU would need anyway.
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
// glibc already declares __expf, __logf, __powf, __tanhf as libm internals, so these
// are macros rather than functions that would clash with those declarations.
#define __expf(x) expf(x)
#define __logf(x) logf(x)
#define __powf(x, y) powf(x, y)
#define __tanhf(x) tanhf(x)
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline double __drcp_rn(double x) { return 1.0 / x; }
static inline float __fdividef(float x, float y) { return x / y; }
// The high 32 bits of the 64-bit product of two 32-bit words (Philox's mulhi).
static inline unsigned int __umulhi(unsigned int x, unsigned int y) {
    return (unsigned int)(((unsigned long long)x * y) >> 32);
}
static inline float __fadd_rn(float x, float y) { return x + y; }
static inline float __fmul_rn(float x, float y) { return x * y; }
static inline float __fmaf_rn(float x, float y, float z) { return fmaf(x, y, z); }
static inline double __fma_rn(double x, double y, double z) { return fma(x, y, z); }

// Clamps to [0, 1]; NaN becomes 0 as on the GPU (fminf/fmaxf would keep 0 or 1
// depending on argument order, so test NaN explicitly).
static inline float __saturatef(float x) {
    if (std::isnan(x)) return 0.0f;
    return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x);
}

// CUDA declares min/max overloads for device code; C++ has only std::min/std::max.
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }

// Reinterpret a float's bits and back (the bfloat16 helpers of bf16.py use only these).
static inline unsigned int __float_as_uint(float x) {
    unsigned int bits;
    memcpy(&bits, &x, sizeof bits);
    return bits;
}
static inline float __uint_as_float(unsigned int bits) {
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

// A read-only cached load on the GPU; an ordinary load here.
template <typename T>
static inline T __ldg(const T* p) { return *p; }

// isnan/isinf/copysignf/fminf/fmaxf/fabsf/expf/tanhf/... come from <cmath>/<math.h>.
using std::isinf;
using std::isnan;
