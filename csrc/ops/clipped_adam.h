// One optimizer step of Adam with global gradient-norm clipping over flat float32 buffers, in
// place: what ClippedAdam (nostall/algos/optim.py) does with a norm, a clamp, a scale, a step
// count and torch's fused Adam, in two passes over the buffers.
//
//   clip = min(1, max_grad_norm / (||grad||_2 + 1e-6));  grad *= clip;  step += 1
//   exp_avg = beta1 exp_avg + (1 - beta1) grad;  exp_avg_sq = beta2 exp_avg_sq + (1 - beta2) grad^2
//   param -= lr / (1 - beta1^step) * exp_avg / (sqrt(exp_avg_sq) / sqrt(1 - beta2^step) + eps)
//
// Why native: on the GRPO race's model (about 130k parameters) those seven ops took about
// 0.2 ms of a 4.7 ms update, most of it dispatch and passes over the buffers; this is one call.
// CPU only (a GPU optimizer keeps torch's fused kernel). param, grad, exp_avg, exp_avg_sq:
// contiguous float32 [n]; step: a float32 scalar tensor, the count of steps taken.
#pragma once

#include "common/checks.h"

namespace nostall {

// The same step over float32 master weights from a bf16 gradient (a bf16 compute copy's, read,
// not clipped in place), the new parameters also rounded into `rounded` (that copy): one pass
// for what the step, the gradient's widening and the copy's refresh took four.
void clipped_adam_step_bf16_cpu(Tensor param, Tensor grad, Tensor exp_avg, Tensor exp_avg_sq,
                                Tensor step, Tensor rounded, double lr, double beta1, double beta2,
                                double eps, double max_grad_norm);

void clipped_adam_step_cpu(Tensor param, Tensor grad, Tensor exp_avg, Tensor exp_avg_sq,
                           Tensor step, double lr, double beta1, double beta2, double eps,
                           double max_grad_norm);

}  // namespace nostall
