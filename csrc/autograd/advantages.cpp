// Autograd kernels of the advantage ops. Each backward op's own backward is the forward op (the
// recurrences are linear), so gradients of any order stay native. vtrace's outputs are targets:
// marked non-differentiable, never silently zero-gradient.
#include "autograd/native.h"

namespace nostall::autograd {
namespace {

using GaeSig = Pair(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                    double, double);
using GaeBackwardSig = Triple(const Tensor&, const Tensor&, const Tensor&, const Tensor&, double,
                              double);
using ReturnsSig = Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&, double);
using ReturnsBackwardSig = Pair(const Tensor&, const Tensor&, const Tensor&, double);
using VtraceSig = Pair(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&, const Tensor&, double, double, double);

Pair gae_op(const Tensor& r, const Tensor& v, const Tensor& nv, const Tensor& d, const Tensor& t,
            double gamma, double lmbda) {
  static const auto op = native<GaeSig>("nostall::gae");
  return op.call(r, v, nv, d, t, gamma, lmbda);
}

Triple gae_backward_op(const Tensor& ga, const Tensor& gvt, const Tensor& d, const Tensor& t,
                       double gamma, double lmbda) {
  static const auto op = native<GaeBackwardSig>("nostall::gae_backward");
  return op.call(ga, gvt, d, t, gamma, lmbda);
}

Tensor returns_op(const Tensor& r, const Tensor& d, const Tensor& t, const Tensor& b,
                  double gamma) {
  static const auto op = native<ReturnsSig>("nostall::discounted_returns");
  return op.call(r, d, t, b, gamma);
}

Pair returns_backward_op(const Tensor& g, const Tensor& d, const Tensor& t, double gamma) {
  static const auto op = native<ReturnsBackwardSig>("nostall::discounted_returns_backward");
  return op.call(g, d, t, gamma);
}

void save_boundaries(AutogradContext* ctx, const Tensor& done, const Tensor& terminated,
                     double gamma, double lmbda = 1.0) {
  ctx->save_for_backward({done, terminated});
  ctx->saved_data["gamma"] = gamma;
  ctx->saved_data["lmbda"] = lmbda;
}

struct Saved {
  Tensor done, terminated;
  double gamma, lmbda;
};

Saved load_boundaries(AutogradContext* ctx) {
  const variable_list saved = ctx->get_saved_variables();
  return {saved[0], saved[1], ctx->saved_data["gamma"].toDouble(),
          ctx->saved_data["lmbda"].toDouble()};
}

// gae(reward, value, next_value, done, terminated, gamma, lmbda)
struct GaeFunction : torch::autograd::Function<GaeFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& r, const Tensor& v,
                               const Tensor& nv, const Tensor& d, const Tensor& t, double gamma,
                               double lmbda) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [advantage, value_target] = gae_op(r, v, nv, d, t, gamma, lmbda);
    save_boundaries(ctx, d, t, gamma, lmbda);
    return {advantage, value_target};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Saved s = load_boundaries(ctx);
    auto [gr, gv, gnv] =
        gae_backward_op(grads[0], grads[1], s.done, s.terminated, s.gamma, s.lmbda);
    return {gr, gv, gnv, Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// gae_backward(grad_advantage, grad_value_target, done, terminated, gamma, lmbda)
struct GaeBackwardFunction : torch::autograd::Function<GaeBackwardFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& ga, const Tensor& gvt,
                               const Tensor& d, const Tensor& t, double gamma, double lmbda) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [gr, gv, gnv] = gae_backward_op(ga, gvt, d, t, gamma, lmbda);
    save_boundaries(ctx, d, t, gamma, lmbda);
    return {gr, gv, gnv};
  }

  // The adjoint of the adjoint: delta = h_reward + gamma * h_next_value - h_value is exactly
  // what gae computes from (reward, next_value, value) = these gradients.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Saved s = load_boundaries(ctx);
    auto [advantage, value_target] =
        gae_op(grads[0], grads[1], grads[2], s.done, s.terminated, s.gamma, s.lmbda);
    return {advantage, value_target, Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// discounted_returns(reward, done, terminated, bootstrap_value, gamma)
struct ReturnsFunction : torch::autograd::Function<ReturnsFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& r, const Tensor& d, const Tensor& t,
                        const Tensor& b, double gamma) {
    at::AutoDispatchBelowADInplaceOrView below;
    save_boundaries(ctx, d, t, gamma);
    return returns_op(r, d, t, b, gamma);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Saved s = load_boundaries(ctx);
    auto [gr, gb] = returns_backward_op(grads[0], s.done, s.terminated, s.gamma);
    return {gr, Tensor(), Tensor(), gb, Tensor()};
  }
};

// discounted_returns_backward(grad_returns, done, terminated, gamma)
struct ReturnsBackwardFunction : torch::autograd::Function<ReturnsBackwardFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& g, const Tensor& d,
                               const Tensor& t, double gamma) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [gr, gb] = returns_backward_op(g, d, t, gamma);
    save_boundaries(ctx, d, t, gamma);
    return {gr, gb};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Saved s = load_boundaries(ctx);
    return {returns_op(grads[0], s.done, s.terminated, grads[1], s.gamma), Tensor(), Tensor(),
            Tensor()};
  }
};

struct VtraceFunction : torch::autograd::Function<VtraceFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& blp, const Tensor& tlp,
                               const Tensor& r, const Tensor& v, const Tensor& nv, const Tensor& d,
                               const Tensor& t, double gamma, double rho_bar, double c_bar) {
    at::AutoDispatchBelowADInplaceOrView below;
    static const auto op = native<VtraceSig>("nostall::vtrace");
    auto [value_target, pg_advantage] = op.call(blp, tlp, r, v, nv, d, t, gamma, rho_bar, c_bar);
    ctx->mark_non_differentiable({value_target, pg_advantage});
    return {value_target, pg_advantage};
  }

  static variable_list backward(AutogradContext*, variable_list) {
    TORCH_CHECK(false, "nostall::vtrace outputs are targets and are not differentiable");
  }
};

Pair gae_autograd(const Tensor& r, const Tensor& v, const Tensor& nv, const Tensor& d,
                  const Tensor& t, double gamma, double lmbda) {
  const variable_list out = GaeFunction::apply(r, v, nv, d, t, gamma, lmbda);
  return {out[0], out[1]};
}

Triple gae_backward_autograd(const Tensor& ga, const Tensor& gvt, const Tensor& d, const Tensor& t,
                             double gamma, double lmbda) {
  const variable_list out = GaeBackwardFunction::apply(ga, gvt, d, t, gamma, lmbda);
  return {out[0], out[1], out[2]};
}

Tensor returns_autograd(const Tensor& r, const Tensor& d, const Tensor& t, const Tensor& b,
                        double gamma) {
  return ReturnsFunction::apply(r, d, t, b, gamma);
}

Pair returns_backward_autograd(const Tensor& g, const Tensor& d, const Tensor& t, double gamma) {
  const variable_list out = ReturnsBackwardFunction::apply(g, d, t, gamma);
  return {out[0], out[1]};
}

Pair vtrace_autograd(const Tensor& blp, const Tensor& tlp, const Tensor& r, const Tensor& v,
                     const Tensor& nv, const Tensor& d, const Tensor& t, double gamma,
                     double rho_bar, double c_bar) {
  const variable_list out = VtraceFunction::apply(blp, tlp, r, v, nv, d, t, gamma, rho_bar, c_bar);
  return {out[0], out[1]};
}

}  // namespace
}  // namespace nostall::autograd

TORCH_LIBRARY_IMPL(nostall, Autograd, m) {
  m.impl("gae", &nostall::autograd::gae_autograd);
  m.impl("gae_backward", &nostall::autograd::gae_backward_autograd);
  m.impl("discounted_returns", &nostall::autograd::returns_autograd);
  m.impl("discounted_returns_backward", &nostall::autograd::returns_backward_autograd);
  m.impl("vtrace", &nostall::autograd::vtrace_autograd);
}
