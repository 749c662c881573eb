// What an op is, apart from its list (ops.inc): a constexpr function object with its name,
// its precision class and its signature, whose call finds the device of its Tensor (and
// Device) arguments and runs that device's kernel. ops.h makes one per TESSERA_OP line.
#pragma once

#include <tuple>
#include <type_traits>
#include <utility>

#include "tessera/core/tensor.h"
#include "tessera/ops/op_profile.h"

namespace tessera {
class Device;
}

namespace tessera::ops {

// How close an op's results must be, on any backend and in any mode, to the same op
// evaluated in float64 (docs/ops.md). --deterministic-mode pins every op to its fixed-order
// path, so a run gives the same bits in every layout; the classes bound the other paths.
enum class Precision {
  // The same bits on every backend: data movement, the embedding, the RNG, element-wise
  // maps without transcendental functions, the optimizer updates' arithmetic.
  Exact,
  // Sums in any order, and each backend's exp/log/tanh: within a stated bound (a few f32
  // ulp per term) of float64.
  OrderFree,
  // OrderFree, and in a --bf16/--fp16 run products may take 16-bit operands (attention's
  // probabilities, as FlashAttention and cuDNN do): within a 16-bit ulp per term.
  Product16,
};
const char* precision_name(Precision precision);

// How a backward writes a gradient: Accumulate adds into it (+=), Assign overwrites it (=)
// without reading it, so it may hold anything, NaN included. Assign gives exactly the bits
// of Accumulate into a zero-filled tensor (each kernel adds its contribution to 0: a GEMM
// with beta = 0, a column sum stored instead of added) but for the sign of a zero result
// (0 + -0 is +0), which no later sum or norm can tell apart, so Assign of an activation
// gradient is used in --deterministic-mode too. An empty product assigns zeros. An op's
// GradWrite parameters come last and each may be left out, last first: Accumulate.
enum class GradWrite { Accumulate, Assign };

// Where a backward adds the sum of squares of a parameter gradient as it stands after the
// call: sums[slot] += the sum of its squares, in double (sums: I64 [S] holding doubles, as
// sum_squares' slots), so the global gradient norm need not read that gradient again. A
// backend may take it from the result while it is in registers (the CPU's AMX weight
// gradient) or read the gradient once more. Empty sums: nothing. Like a GradWrite, it may be
// left out (empty) when it is an op's last parameter.
// Precision: OrderFree, as sum_squares.
struct GradSquares {
  Tensor sums;
  int64_t slot = 0;
};

// The ops, numbered in ops.inc's order (defined in ops.h).
enum class OpId : int;

// A kernel as the table stores it; Op casts it back to its own signature.
using AnyKernel = void (*)();
// The kernel of `op` for `device`. Throws a runtime Error naming the op and the device when
// the backend has none, and on the strict device when the run did not declare the op at
// start-up (check_supported in kernel_table.h).
AnyKernel resolve_kernel(OpId op, const Device& device);

namespace op_detail {

// The one device of a call: every non-empty Tensor argument (and a Device argument) must be
// on it, and there must be one (an op never copies between devices).
class CallDevice {
 public:
  explicit CallDevice(const char* op) : op_(op) {}
  void add(const Tensor& t);
  void add(const Device& device);
  void add(const GradSquares& squares) {
    if (!squares.sums.empty()) add(squares.sums);
  }
  template <typename T> void add(const T&) {}  // sizes and settings
  const Device& device() const;

 private:
  const char* op_;
  const Device* device_ = nullptr;
};


// The parameters of a signature but its last, as a tuple.
template <typename... Args> struct AllButLast;
template <typename Last> struct AllButLast<Last> {
  using type = std::tuple<>;
};
template <typename First, typename Second, typename... Rest> struct AllButLast<First, Second, Rest...> {
  using rest = typename AllButLast<Second, Rest...>::type;
  template <typename... T> static std::tuple<First, T...> prepend(std::tuple<T...>*);
  using type = decltype(prepend(static_cast<rest*>(nullptr)));
};

// The parameter types an op may be called without when they come last, and the value they
// then take: a GradWrite (Accumulate) and a GradSquares (none).
template <typename T> struct TrailingDefault {
  static constexpr bool has = false;
};
template <> struct TrailingDefault<GradWrite> {
  static constexpr bool has = true;
  static GradWrite value() { return GradWrite::Accumulate; }
};
template <> struct TrailingDefault<GradSquares> {
  static constexpr bool has = true;
  static GradSquares value() { return {}; }
};

// An op whose last parameter has a TrailingDefault may be called without it: the call
// operator over the other parameters, with their own types (so braced arguments still
// convert), and so on while the new last parameter has one too. Other ops get no second
// call operator.
struct NoSecondCall {};
template <typename Derived, typename R, typename Prefix, typename Last> struct CallWithoutLast {
  void operator()(NoSecondCall) const = delete;
};
template <typename... Args> using LastOf = std::tuple_element_t<sizeof...(Args) - 1, std::tuple<Args...>>;
// The prefix tuple when the last parameter has a default, else void (every op has one).
template <typename... Args>
using DefaultedPrefix =
    std::conditional_t<TrailingDefault<LastOf<Args...>>::has, typename AllButLast<Args...>::type, void>;
template <typename Derived, typename R, typename... Args>
using TrailingDefaults = CallWithoutLast<Derived, R, DefaultedPrefix<Args...>, LastOf<Args...>>;

template <typename Derived, typename R, typename Last, typename... Prefix>
struct CallWithoutLast<Derived, R, std::tuple<Prefix...>, Last> : TrailingDefaults<Derived, R, Prefix...> {
  R operator()(Prefix... args) const {
    return static_cast<const Derived&>(*this)(std::forward<Prefix>(args)..., TrailingDefault<Last>::value());
  }
  using TrailingDefaults<Derived, R, Prefix...>::operator();
};

}  // namespace op_detail

template <typename Signature> struct Op;

template <typename R, typename... Args>
struct Op<R(Args...)> : op_detail::TrailingDefaults<Op<R(Args...)>, R, Args...> {
  using Signature = R(Args...);
  OpId id;
  const char* name;
  Precision precision;

  constexpr Op(OpId id_, const char* name_, Precision precision_) : id(id_), name(name_), precision(precision_) {}
  constexpr operator OpId() const { return id; }  // NOLINT: an op stands for its number in lists
  R operator()(Args... args) const {
    op_detail::CallDevice call(name);
    (call.add(args), ...);
    auto kernel = reinterpret_cast<Signature*>(resolve_kernel(id, call.device()));
    const op_detail::ProfileScope profile(id);
    return kernel(std::forward<Args>(args)...);
  }
  using op_detail::TrailingDefaults<Op<R(Args...)>, R, Args...>::operator();
};

}  // namespace tessera::ops
