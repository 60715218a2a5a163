// metal_shim.hpp: enough of the Metal Shading Language, as C++20, to compile MSL kernels with
// g++ or clang++ and run them on the CPU (docs/codegen.md, "Metal"; ocannl/backends/metal/).
//
// The harness (harness.py) puts this directory on the include path, so the `#include
// <metal_stdlib>` of an emitted .metal file lands here (through the file `metal_stdlib`), then
// appends launch thunks to the MSL text and links launcher.cpp, which runs each kernel over its
// grid: one OS thread per thread of a threadgroup, so `threadgroup_barrier` is a real barrier.
//
// What the header provides:
//  * the address-space qualifiers as macros: `device` and `thread` vanish, `constant` is `const`,
//    `threadgroup` is `static` (threadgroup arrays are declared in the kernel body; the launcher
//    runs one threadgroup at a time, so a function-level static is that group's memory);
//    `kernel` vanishes. Metal attributes (`[[buffer(0)]]`, `[[thread_position_in_grid]]`) are
//    standard attribute syntax: the harness silences the unknown-attribute warnings.
//  * namespace `metal`: the scalar types (`uint`, `ulong`, `half`, `bfloat`...), vectors
//    (`uint3`, `uint4`, `float4`...: members x/y/z/w, [], component-wise arithmetic), the math
//    functions and their `precise::`/`fast::` variants, `select`, `clamp`, `as_type`, atomics,
//    `mem_flags` and `threadgroup_barrier`.
//  * poison: after this header, `double`, `std`, `malloc`, `free` and `printf` are hard errors
//    (MSL has none of them), in g++ and clang++ alike.
//
// What it cannot check: syntax the real Metal compiler rejects but C++ accepts
// (casts dropping an address space), Metal's fast-math default (the harness compiles with IEEE
// semantics, as the backend asks of Metal), half arithmetic (computed in float here; ocannl
// computes in float and only stores half), the hardware limits (the emitter checks them),
// simdgroup functions (not provided: using one is a compile error).
#ifndef OCANNL_METAL_SHIM_HPP
#define OCANNL_METAL_SHIM_HPP

// No standard header: <cmath> and <atomic> alone take a second to parse in C++20 mode, and every
// routine compiles its own kernels. The compilers' builtins give the same functions.

extern "C" void ocannl_shim_threadgroup_barrier(void);  // launcher.cpp
// The C library's pow, called as a function (the harness compiles with -fno-builtin-powf): the
// builtin would become x * x for an exponent of 2 and sqrt in vector code for 0.5, which differ
// from pow in the last bit and at -0.0 and -inf.
extern "C" float powf(float, float);

namespace metal {

using uchar = unsigned char;
using ushort = unsigned short;
using uint = unsigned int;
using ulong = unsigned long;
static_assert(sizeof(long) == 8 && sizeof(ulong) == 8, "MSL's long and ulong are 64 bits");

// ---- 16-bit floats: storage formats converted to and from float (round to nearest even) ------

struct half {
  unsigned short bits;
  half() = default;
  half(float f) : bits(from_float(f)) {}
  operator float() const { return to_float(bits); }

  static float to_float(unsigned short h) {
    unsigned int sign = (unsigned int)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu, out;
    if (exp == 0x1Fu) out = sign | 0x7F800000u | (mant << 13);
    else if (exp) out = sign | ((exp + 112u) << 23) | (mant << 13);
    else if (!mant) out = sign;
    else {
      exp = 113u;
      while (!(mant & 0x400u)) { mant <<= 1; --exp; }
      out = sign | (exp << 23) | ((mant & 0x3FFu) << 13);
    }
    float f;
    __builtin_memcpy(&f, &out, 4);
    return f;
  }
  static unsigned short from_float(float f) {
    unsigned int x, q, rem, halfway;
    __builtin_memcpy(&x, &f, 4);
    unsigned int sign = (x >> 16) & 0x8000u, ax = x & 0x7FFFFFFFu, e = ax >> 23;
    if (ax > 0x7F800000u) {  // NaN: keep the top payload bits, stay a NaN
      q = 0x7C00u + ((ax & 0x7FFFFFu) >> 13);
      return (unsigned short)(sign | (q == 0x7C00u ? 0x7C01u : q));
    }
    if (e >= 143u) return (unsigned short)(sign | 0x7C00u);
    if (e < 113u) {  // a subnormal half, or zero
      if (e < 101u) return (unsigned short)sign;
      unsigned int m = (ax & 0x7FFFFFu) | 0x800000u, shift = 126u - e;
      q = m >> shift;
      rem = m & ((1u << shift) - 1u);
      halfway = 1u << (shift - 1u);
    } else {
      q = ((e - 112u) << 10) | ((ax >> 13) & 0x3FFu);
      rem = ax & 0x1FFFu;
      halfway = 0x1000u;
    }
    if (rem > halfway || (rem == halfway && (q & 1u))) ++q;  // may carry into the exponent
    return (unsigned short)(sign | q);
  }
};

struct bfloat {
  unsigned short bits;
  bfloat() = default;
  bfloat(float f) : bits(from_float(f)) {}
  operator float() const {
    unsigned int x = (unsigned int)bits << 16;
    float f;
    __builtin_memcpy(&f, &x, 4);
    return f;
  }
  static unsigned short from_float(float f) {
    unsigned int x;
    __builtin_memcpy(&x, &f, 4);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (unsigned short)((x >> 16) | 0x40u);  // NaN stays NaN
    return (unsigned short)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
  }
};

static_assert(sizeof(half) == 2 && sizeof(bfloat) == 2, "16-bit floats are two bytes");

// ---- vectors ---------------------------------------------------------------------------------

template <class T, int N> struct vec;

template <class T> struct vec<T, 2> {
  T x, y;
  constexpr vec() : x{}, y{} {}
  constexpr vec(T s) : x(s), y(s) {}
  constexpr vec(T a, T b) : x(a), y(b) {}
  template <class U> constexpr explicit vec(const vec<U, 2>& o) : x(T(o.x)), y(T(o.y)) {}
  constexpr T& operator[](int i) { return i == 0 ? x : y; }
  constexpr const T& operator[](int i) const { return i == 0 ? x : y; }
};

template <class T> struct vec<T, 3> {
  T x, y, z;
  constexpr vec() : x{}, y{}, z{} {}
  constexpr vec(T s) : x(s), y(s), z(s) {}
  constexpr vec(T a, T b, T c) : x(a), y(b), z(c) {}
  template <class U> constexpr explicit vec(const vec<U, 3>& o) : x(T(o.x)), y(T(o.y)), z(T(o.z)) {}
  constexpr T& operator[](int i) { return i == 0 ? x : i == 1 ? y : z; }
  constexpr const T& operator[](int i) const { return i == 0 ? x : i == 1 ? y : z; }
};

template <class T> struct vec<T, 4> {
  T x, y, z, w;
  constexpr vec() : x{}, y{}, z{}, w{} {}
  constexpr vec(T s) : x(s), y(s), z(s), w(s) {}
  constexpr vec(T a, T b, T c, T d) : x(a), y(b), z(c), w(d) {}
  template <class U> constexpr explicit vec(const vec<U, 4>& o) : x(T(o.x)), y(T(o.y)), z(T(o.z)), w(T(o.w)) {}
  constexpr T& operator[](int i) { return i == 0 ? x : i == 1 ? y : i == 2 ? z : w; }
  constexpr const T& operator[](int i) const { return i == 0 ? x : i == 1 ? y : i == 2 ? z : w; }
};

#define OCANNL_SHIM_VEC_OP(op)                                                                   \
  template <class T, int N> constexpr vec<T, N> operator op(vec<T, N> a, const vec<T, N>& b) {   \
    for (int i = 0; i < N; ++i) a[i] = a[i] op b[i];                                             \
    return a;                                                                                    \
  }                                                                                              \
  template <class T, int N> constexpr vec<T, N> operator op(vec<T, N> a, T b) {                  \
    for (int i = 0; i < N; ++i) a[i] = a[i] op b;                                                \
    return a;                                                                                    \
  }                                                                                              \
  template <class T, int N> constexpr vec<T, N> operator op(T a, const vec<T, N>& b) {           \
    return vec<T, N>(a) op b;                                                                    \
  }                                                                                              \
  template <class T, int N, class U> constexpr vec<T, N>& operator op##=(vec<T, N>& a, const U& b) { \
    return a = a op b;                                                                           \
  }
OCANNL_SHIM_VEC_OP(+)
OCANNL_SHIM_VEC_OP(-)
OCANNL_SHIM_VEC_OP(*)
OCANNL_SHIM_VEC_OP(/)
OCANNL_SHIM_VEC_OP(%)
OCANNL_SHIM_VEC_OP(&)
OCANNL_SHIM_VEC_OP(|)
OCANNL_SHIM_VEC_OP(^)
OCANNL_SHIM_VEC_OP(<<)
OCANNL_SHIM_VEC_OP(>>)
#undef OCANNL_SHIM_VEC_OP

template <class T, int N> constexpr vec<T, N> operator-(vec<T, N> a) {
  for (int i = 0; i < N; ++i) a[i] = -a[i];
  return a;
}

#define OCANNL_SHIM_VECTORS(T)  \
  using T##2 = vec<T, 2>;       \
  using T##3 = vec<T, 3>;       \
  using T##4 = vec<T, 4>;
OCANNL_SHIM_VECTORS(float)
OCANNL_SHIM_VECTORS(half)
OCANNL_SHIM_VECTORS(int)
OCANNL_SHIM_VECTORS(uint)
OCANNL_SHIM_VECTORS(short)
OCANNL_SHIM_VECTORS(ushort)
OCANNL_SHIM_VECTORS(char)
OCANNL_SHIM_VECTORS(uchar)
OCANNL_SHIM_VECTORS(long)
OCANNL_SHIM_VECTORS(ulong)
OCANNL_SHIM_VECTORS(bool)
#undef OCANNL_SHIM_VECTORS

// ---- math: float overloads, with precise:: and fast:: variants (both IEEE here) ---------------

#define OCANNL_SHIM_MATH                                                                          \
  inline float exp(float x) { return __builtin_expf(x); }                                        \
  inline float exp2(float x) { return __builtin_exp2f(x); }                                      \
  inline float log(float x) { return __builtin_logf(x); }                                        \
  inline float log2(float x) { return __builtin_log2f(x); }                                      \
  inline float sin(float x) { return __builtin_sinf(x); }                                        \
  inline float cos(float x) { return __builtin_cosf(x); }                                        \
  inline float tan(float x) { return __builtin_tanf(x); }                                        \
  inline float tanh(float x) { return __builtin_tanhf(x); }                                      \
  inline float sqrt(float x) { return __builtin_sqrtf(x); }                                      \
  inline float rsqrt(float x) { return 1.0f / __builtin_sqrtf(x); }                              \
  inline float pow(float x, float y) { return ::powf(x, y); }                                   \
  inline float powr(float x, float y) { return ::powf(x, y); }                                  \
  inline float fmod(float x, float y) { return __builtin_fmodf(x, y); }                          \
  inline float fabs(float x) { return __builtin_fabsf(x); }                                      \
  inline float abs(float x) { return __builtin_fabsf(x); }                                       \
  inline float trunc(float x) { return __builtin_truncf(x); }                                    \
  inline float floor(float x) { return __builtin_floorf(x); }                                    \
  inline float ceil(float x) { return __builtin_ceilf(x); }                                      \
  inline float round(float x) { return __builtin_roundf(x); }                                    \
  inline float rint(float x) { return __builtin_rintf(x); }                                      \
  inline float fmax(float x, float y) { return __builtin_fmaxf(x, y); }                          \
  inline float fmin(float x, float y) { return __builtin_fminf(x, y); }                          \
  inline float copysign(float x, float y) { return __builtin_copysignf(x, y); }                  \
  inline float divide(float x, float y) { return x / y; }

OCANNL_SHIM_MATH
namespace precise {
OCANNL_SHIM_MATH
}
namespace fast {
OCANNL_SHIM_MATH
}
#undef OCANNL_SHIM_MATH

inline float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline bool isnan(float x) { return __builtin_isnan(x); }
inline bool isinf(float x) { return __builtin_isinf(x); }
inline bool isfinite(float x) { return __builtin_isfinite(x); }
inline float saturate(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
inline float max(float a, float b) { return __builtin_fmaxf(a, b); }
inline float min(float a, float b) { return __builtin_fminf(a, b); }
inline float clamp(float x, float lo, float hi) { return min(max(x, lo), hi); }

#define OCANNL_SHIM_INTEGER(T)                                                                    \
  constexpr T max(T a, T b) { return a < b ? b : a; }                                            \
  constexpr T min(T a, T b) { return b < a ? b : a; }                                            \
  constexpr T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }
OCANNL_SHIM_INTEGER(int)
OCANNL_SHIM_INTEGER(uint)
OCANNL_SHIM_INTEGER(long)
OCANNL_SHIM_INTEGER(ulong)
OCANNL_SHIM_INTEGER(short)
OCANNL_SHIM_INTEGER(ushort)
#undef OCANNL_SHIM_INTEGER
constexpr int abs(int x) { return x < 0 ? -x : x; }
constexpr long abs(long x) { return x < 0 ? -x : x; }

template <class T> constexpr T select(T a, T b, bool c) { return c ? b : a; }

template <class To, class From> inline To as_type(const From& x) {
  static_assert(sizeof(To) == sizeof(From), "as_type needs types of the same size");
  To out;
  __builtin_memcpy(&out, &x, sizeof(To));
  return out;
}

// ---- synchronization and atomics -------------------------------------------------------------

enum class mem_flags : unsigned { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
constexpr mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(unsigned(a) | unsigned(b)); }

// Every thread of the threadgroup waits here until all have arrived (a std::barrier of the
// launcher); called from a kernel launched without threadgroup threads, it aborts.
inline void threadgroup_barrier(mem_flags) { ocannl_shim_threadgroup_barrier(); }

enum memory_order { memory_order_relaxed = __ATOMIC_RELAXED };

template <class T> struct _atomic {
  T value;
};
using atomic_int = _atomic<int>;
using atomic_uint = _atomic<uint>;
using atomic_float = _atomic<float>;

template <class T> inline void atomic_store_explicit(volatile _atomic<T>* a, T v, memory_order o) {
  __atomic_store_n(&a->value, v, o);
}
template <class T> inline T atomic_load_explicit(volatile _atomic<T>* a, memory_order o) {
  return __atomic_load_n(&a->value, o);
}
template <class T> inline T atomic_fetch_add_explicit(volatile _atomic<T>* a, T v, memory_order o) {
  return __atomic_fetch_add(&a->value, v, o);
}
inline float atomic_fetch_add_explicit(volatile _atomic<float>* a, float v, memory_order o) {
  float old, next;
  __atomic_load(&a->value, &old, o);
  do {
    next = old + v;
  } while (!__atomic_compare_exchange(&a->value, &old, &next, true, o, o));
  return old;
}

}  // namespace metal

// ---- MSL keywords C++ does not have (after every standard header: `thread` would break <thread>)

#define kernel
#define device
#define constant const
#define thread
#define threadgroup static

#define INFINITY __builtin_inff()
#define NAN __builtin_nanf("")
#define HUGE_VALF __builtin_huge_valf()
#define MAXFLOAT 0x1.fffffep+127f
#define FLT_MAX 0x1.fffffep+127f

#pragma GCC poison double std malloc free printf

#endif  // OCANNL_METAL_SHIM_HPP
