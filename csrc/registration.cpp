// Every nostall operator schema, declared once, with the CPU kernels. CUDA kernels register in
// registration_cuda.cu (a separate library, built only against a CUDA torch). Fake (meta)
// implementations, autograd formulas and vmap rules live in nostall/ops/.
#include <torch/csrc/stable/library.h>

#include "envs/env_ops.h"
#include "ops/clipped_adam.h"
#include "ops/decode_step.h"
#include "ops/decoder_train.h"
#include "ops/decoder_weights.h"
#include "ops/discounted_returns.h"
#include "ops/episodes.h"
#include "ops/gae.h"
#include "ops/generate_completions.h"
#include "ops/group_advantages.h"
#include "ops/mlp.h"
#include "ops/policy_loss.h"
#include "ops/ppo_loss.h"
#include "ops/prefill_prompts.h"
#include "ops/sample_categorical.h"
#include "ops/sample_tokens.h"
#include "ops/token_log_prob.h"
#include "ops/vtrace.h"

STABLE_TORCH_LIBRARY(nostall, m) {
  // GAE over time-major [T, N] rollouts; done stops the recursion, terminated drops the bootstrap.
  m.def(
      "gae(Tensor reward, Tensor value, Tensor next_value, Tensor done, Tensor terminated, "
      "float gamma, float lmbda) -> (Tensor advantage, Tensor value_target)");
  // Adjoint of gae: gradients of (advantage, value_target) to (reward, value, next_value).
  m.def(
      "gae_backward(Tensor grad_advantage, Tensor grad_value_target, Tensor done, "
      "Tensor terminated, float gamma, float lmbda) "
      "-> (Tensor grad_reward, Tensor grad_value, Tensor grad_next_value)");
  // Discounted [T, N] returns, bootstrapping from bootstrap_value where the chain is cut.
  m.def(
      "discounted_returns(Tensor reward, Tensor done, Tensor terminated, Tensor bootstrap_value, "
      "float gamma) -> Tensor");
  // Adjoint of discounted_returns: gradient of returns to (reward, bootstrap_value).
  m.def(
      "discounted_returns_backward(Tensor grad_returns, Tensor done, Tensor terminated, "
      "float gamma) -> (Tensor grad_reward, Tensor grad_bootstrap_value)");
  // IMPALA V-trace targets over [T, N]; importance weights clipped at rho_bar and c_bar.
  m.def(
      "vtrace(Tensor behavior_log_prob, Tensor target_log_prob, Tensor reward, Tensor value, "
      "Tensor next_value, Tensor done, Tensor terminated, float gamma, float rho_bar, "
      "float c_bar) -> (Tensor value_target, Tensor pg_advantage)");

  // GRPO group-relative advantages over [N] rewards in num_groups groups (group_index int64 [N]);
  // scale: 'group' (divide by the group's std + eps), 'batch' (the batch's) or 'none' (Dr. GRPO).
  m.def(
      "group_advantages(Tensor reward, Tensor group_index, int num_groups, str scale, float eps) "
      "-> Tensor");
  m.def(
      "group_advantages_backward(Tensor grad_advantage, Tensor reward, Tensor group_index, "
      "int num_groups, str scale, float eps) -> Tensor");
  // log_softmax(logits [B, T, V]) gathered at tokens [B, T], without the [B, T, V] log-softmax;
  // logsumexp [B, T] is kept for the backward.
  m.def("token_log_prob(Tensor logits, Tensor tokens) -> (Tensor log_prob, Tensor logsumexp)");
  m.def(
      "token_log_prob_backward(Tensor grad_log_prob, Tensor logits, Tensor tokens, "
      "Tensor logsumexp) -> Tensor");
  // The same from hidden [B, T, H] and the output weight [V, H], chunk_size rows of logits at a
  // time.
  m.def(
      "token_log_prob_linear(Tensor hidden, Tensor weight, Tensor tokens, int chunk_size) "
      "-> (Tensor log_prob, Tensor logsumexp)");
  m.def(
      "token_log_prob_linear_backward(Tensor grad_log_prob, Tensor hidden, Tensor weight, "
      "Tensor tokens, Tensor logsumexp, int chunk_size) -> (Tensor grad_hidden, "
      "Tensor grad_weight)");
  // Each row's entropy under softmax(hidden @ weight^T) (an entropy bonus), the same way; the
  // logsumexp [B, T] is kept for the backward.
  m.def(
      "token_entropy_linear(Tensor hidden, Tensor weight, int chunk_size) "
      "-> (Tensor entropy, Tensor logsumexp)");
  m.def(
      "token_entropy_linear_backward(Tensor grad_entropy, Tensor hidden, Tensor weight, "
      "Tensor entropy, Tensor logsumexp, int chunk_size) -> (Tensor grad_hidden, "
      "Tensor grad_weight)");
  // The PPO / GRPO clipped surrogate over [B, T] tokens, aggregated to a scalar, with the clip
  // fraction and approximate KL; optional dual clip and truncated importance weight. token_grad
  // is each token's d loss_t / d log_prob_t (0 where masked), saved for the backward.
  m.def(
      "clipped_policy_loss(Tensor log_prob, Tensor old_log_prob, Tensor advantage, Tensor mask, "
      "float clip_low, float clip_high, str aggregation, int max_tokens, float? dual_clip, "
      "Tensor? behavior_log_prob, float is_cap) "
      "-> (Tensor loss, Tensor clip_fraction, Tensor approx_kl, Tensor token_grad)");
  // Adjoint: grad_loss times token_grad times each sequence's aggregation weight.
  m.def(
      "clipped_policy_loss_backward(Tensor grad_loss, Tensor token_grad, Tensor mask, "
      "str aggregation, int max_tokens) -> Tensor");

  // The PPO loss of a categorical actor-critic over M samples (see ops/ppo_loss.h): logits
  // [M, A], action int64 [M], value, old_log_prob, old_value, advantage, value_target [M] ->
  // loss (scalar), stats [5] = (pg_loss, v_loss, entropy, approx_kl, clip_fraction), and the
  // loss's derivatives in logits [M, A] and value [M], kept for the backward.
  m.def(
      "ppo_loss(Tensor logits, Tensor action, Tensor value, Tensor old_log_prob, "
      "Tensor old_value, Tensor advantage, Tensor value_target, float clip_coef, "
      "float? value_clip, float ent_coef, float vf_coef, bool normalize_advantage) "
      "-> (Tensor loss, Tensor stats, Tensor grad_logits, Tensor grad_value)");
  // Adjoint: grad_loss times the saved derivatives.
  m.def(
      "ppo_loss_backward(Tensor grad_loss, Tensor grad_logits, Tensor grad_value) "
      "-> (Tensor, Tensor)");
  // The same loss for any policy distribution, from its log_prob and entropy [M] (the caller's):
  // loss, stats [5], and the derivatives in log_prob and value [M] kept for the backward.
  m.def(
      "ppo_loss_from_log_prob(Tensor log_prob, Tensor entropy, Tensor value, Tensor old_log_prob, "
      "Tensor old_value, Tensor advantage, Tensor value_target, float clip_coef, "
      "float? value_clip, float ent_coef, float vf_coef, bool normalize_advantage) "
      "-> (Tensor loss, Tensor stats, Tensor grad_log_prob, Tensor grad_value)");
  // Adjoint: (grad_log_prob, grad_entropy = -ent_coef / M, grad_value), times grad_loss.
  m.def(
      "ppo_loss_from_log_prob_backward(Tensor grad_loss, Tensor grad_log_prob, "
      "Tensor grad_value, float ent_coef) -> (Tensor, Tensor, Tensor)");

  // A multilayer perceptron x [M, K] -> [M, J_L]: layers W_i [J_i, J_{i-1}], b_i [J_i], the
  // activation ('tanh' or 'relu') after every layer but the last; hidden holds those activations.
  m.def(
      "mlp(Tensor input, Tensor[] weights, Tensor[] biases, str activation) "
      "-> (Tensor output, Tensor[] hidden)");
  // Adjoint of mlp: gradients to the weights and biases, and to input when input_grad.
  m.def(
      "mlp_backward(Tensor grad_output, Tensor input, Tensor[] weights, Tensor[] hidden, "
      "str activation, bool input_grad) "
      "-> (Tensor? grad_input, Tensor[] grad_weights, Tensor[] grad_biases)");

  // Gumbel-max sample of a categorical policy from logits [N, A] and uniform noise [N, A]: the
  // sample's log-probability [N], the action (int64 [N]) and the logsumexp [N] (kept for the
  // backward). The float outputs come first: opcheck's compiled-gradient test sums the outputs
  // into the first one's dtype.
  m.def(
      "sample_categorical(Tensor logits, Tensor uniform) "
      "-> (Tensor log_prob, Tensor action, Tensor logsumexp)");

  // One decode step of language-model generation: a token per row of logits [B, V] (temperature,
  // top-k, top-p, Gumbel-max with uniform [B, V]; only tokens where allowed [V]), with its
  // log-probability under the sampling distribution; rows already finished get pad_token_id and
  // 0, rows that sample eos_token_id are marked finished (bool [B], in place).
  m.def(
      "sample_tokens(Tensor logits, Tensor uniform, Tensor(a!) finished, Tensor allowed, "
      "float temperature, int top_k, float top_p, int eos_token_id, int pad_token_id) "
      "-> (Tensor token, Tensor log_prob)");

  // One decode step of a Llama-family decoder over a static KV cache (see ops/decode_step.h):
  // token, position int64 [B], slot int64 [1] (every row's) or [B] (each row's), slot_mask bool
  // [B, S]; per-layer weights as lists (qkv_bias may be empty); keys, values [L, B, kv_heads, S,
  // D] get this step's keys and values at each row's slot. Returns the next-token logits [B, V].
  // Inference only.
  m.def(
      "decode_step(Tensor token, Tensor position, Tensor slot, Tensor "
      "slot_mask, " NOSTALL_DECODER_WEIGHTS_SCHEMA
      ", Tensor lm_head, Tensor cos, Tensor sin, Tensor(a!) keys, Tensor(b!) values, "
      "int num_heads, int kv_heads, float eps) -> Tensor logits");

  // The prefill of the same decoder (see ops/prefill_prompts.h): prompt_ids int64 and
  // prompt_mask bool [Bp, P] (left-padded), each prompt's keys and values written into cache
  // slots [0, P) of its group's group_size rows; the next-token logits [Bp * group_size, V].
  m.def(
      "prefill_prompts(Tensor prompt_ids, Tensor prompt_mask, int "
      "group_size, " NOSTALL_DECODER_WEIGHTS_SCHEMA
      ", Tensor lm_head, Tensor cos, Tensor sin, Tensor(a!) keys, Tensor(b!) values, "
      "int num_heads, int kv_heads, float eps) -> Tensor logits");

  // A whole batch of completions (see ops/generate_completions.h): the prefill, then the
  // sampler and a decode step per token, uniform [C, B, V] the noise of each token; returns
  // completion_ids int64, completion_mask bool and log_prob [B, C]. Inference only.
  m.def(
      "generate_completions(Tensor prompt_ids, Tensor prompt_mask, int group_size, "
      "Tensor uniform, Tensor allowed, " NOSTALL_DECODER_WEIGHTS_SCHEMA
      ", Tensor lm_head, Tensor cos, Tensor sin, Tensor(a!) keys, Tensor(b!) values, "
      "int num_heads, int kv_heads, float eps, float temperature, int top_k, float top_p, "
      "int eos_token_id, int pad_token_id) "
      "-> (Tensor completion_ids, Tensor completion_mask, Tensor log_prob)");

  // The training forward of the same decoder over GRPO's grouped batch (see
  // ops/decoder_train.h): each group's prompt [Bp, P] once, its completions [Bp * G, C]; the
  // normed hidden states that predict each completion token [B * C, H], and the activations
  // decoder_train_backward takes. Differentiable (nostall/ops/decoder.py).
  m.def(
      "decoder_train(Tensor prompt_ids, Tensor prompt_mask, Tensor completion_ids, "
      "Tensor completion_mask, " NOSTALL_DECODER_WEIGHTS_SCHEMA
      ", Tensor cos, Tensor sin, int num_heads, int kv_heads, float eps) -> (Tensor hidden, "
      "Tensor residuals, Tensor qkv, Tensor probs, Tensor attended, Tensor gate_up)");
  // Adjoint of decoder_train: the gradient of every weight from the hidden states' gradient.
  m.def(
      "decoder_train_backward(Tensor grad_hidden, Tensor prompt_ids, Tensor prompt_mask, "
      "Tensor completion_ids, Tensor completion_mask, " NOSTALL_DECODER_WEIGHTS_SCHEMA
      ", Tensor cos, Tensor sin, Tensor residuals, Tensor qkv, Tensor probs, Tensor attended, "
      "Tensor gate_up, int num_heads, int kv_heads, float eps) -> "
      "(" NOSTALL_DECODER_WEIGHT_GRADS_SCHEMA ")");
  // The same gradients written (or, with accumulate, added) into flat_grad, end to end in that
  // order: the GRPO update's flat gradient buffer, with no gradient tensor allocated.
  m.def(
      "decoder_train_backward_into(Tensor grad_hidden, Tensor prompt_ids, "
      "Tensor prompt_mask, Tensor completion_ids, Tensor "
      "completion_mask, " NOSTALL_DECODER_WEIGHTS_SCHEMA
      ", Tensor cos, Tensor sin, Tensor residuals, Tensor qkv, Tensor probs, Tensor attended, "
      "Tensor gate_up, int num_heads, int kv_heads, float eps, Tensor(a!) flat_grad, "
      "bool accumulate) -> ()");

  // One step of Adam with global gradient-norm clipping over flat buffers, in place (see
  // ops/clipped_adam.h).
  m.def(
      "clipped_adam_step(Tensor(a!) param, Tensor(b!) grad, Tensor(c!) exp_avg, "
      "Tensor(d!) exp_avg_sq, Tensor(e!) step, float lr, float beta1, float beta2, float eps, "
      "float max_grad_norm) -> ()");
  // The step over float32 master weights from a bf16 gradient, writing their bf16 copy.
  m.def(
      "clipped_adam_step_bf16(Tensor(a!) param, Tensor grad, Tensor(b!) exp_avg, "
      "Tensor(c!) exp_avg_sq, Tensor(d!) step, Tensor(e!) rounded, float lr, float beta1, "
      "float beta2, float eps, float max_grad_norm) -> ()");

  // One rollout step of episode statistics: running returns and lengths grow, and envs whose
  // episode ended (done) write theirs into the ring (returns, lengths) at finished, in env order.
  m.def(
      "episode_update(Tensor reward, Tensor done, Tensor(a!) running_return, "
      "Tensor(b!) running_length, Tensor(c!) returns, Tensor(d!) lengths, Tensor(e!) finished) "
      "-> ()");

  // Environments. Each op that touches one is an ORDERED effect (registered from Python), so
  // torch.compile keeps every call, in order.
  // Opens num_envs copies of env_id; returns its handle. batch_size / max_episode_steps < 0:
  // default.
  m.def(
      "env_create(str env_id, int num_envs, int num_threads, int seed, int autoreset_mode, "
      "int batch_size, int max_episode_steps) -> int");
  // Closes a handle; its environments and threads are freed once no call is using them.
  m.def("env_close(int handle) -> ()");
  // [obs_dim, state_dim, discrete, num_actions, action_dim, max_episode_steps] of env_id.
  m.def("env_describe(str env_id) -> int[]");
  // Resets every env (env i reseeded with seed + i when seed >= 0): obs float32 [num_envs,
  // obs_dim].
  m.def("env_reset(int handle, int seed) -> Tensor obs");
  // Steps every env with actions (int64 [num_envs] or float32 [num_envs, action_dim]),
  // autoresetting; final_obs is [num_envs, obs_dim] in same-step autoreset mode, else [0, obs_dim].
  m.def(
      "env_step(int handle, Tensor actions) -> (Tensor obs, Tensor reward, Tensor terminated, "
      "Tensor truncated, Tensor final_obs)");
  // env_step writing into caller-owned tensors (rows of a rollout buffer): no allocation.
  m.def(
      "env_step_into(int handle, Tensor actions, Tensor(a!) obs, Tensor(b!) reward, "
      "Tensor(c!) terminated, Tensor(d!) truncated, Tensor(e!) final_obs) -> ()");
  // A whole rollout chunk in one call, for an MLP actor-critic: for t < T, the actor (weights,
  // biases; activation between layers) maps obs[t] [N, obs_dim] to logits [N, A] (discrete: the
  // action is the Gumbel-max sample with uniform noise[t] [N, A]) or to the mean of a Gaussian
  // with log_std [A] (continuous: action = mean + exp(log_std) * noise[t]); the critic maps obs[t]
  // to values[t]; the sample's log-probability goes to log_probs[t]; the step writes obs[t + 1],
  // rewards[t], terminated[t], truncated[t] and final_obs[t] (rows only in same-step autoreset).
  // obs[0] is read, not written. All float32 CPU tensors but actions (int64 when discrete),
  // rewards (float64) and the flags (bool).
  m.def(
      "env_rollout(int handle, Tensor(a!) obs, Tensor(b!) actions, Tensor(c!) log_probs, "
      "Tensor(d!) values, Tensor(e!) rewards, Tensor(f!) terminated, Tensor(g!) truncated, "
      "Tensor(h!) final_obs, Tensor noise, Tensor[] actor_weights, Tensor[] actor_biases, "
      "Tensor[] critic_weights, Tensor[] critic_biases, Tensor? log_std, str activation) -> ()");
  // Queues one step for each env in env_ids (int64 [k]) with actions [k, ...]; returns at once.
  m.def("env_send(int handle, Tensor actions, Tensor env_ids) -> ()");
  // Waits for batch_size queued steps and returns them in completion order, with their env ids.
  m.def(
      "env_recv(int handle) -> (Tensor obs, Tensor reward, Tensor terminated, Tensor truncated, "
      "Tensor final_obs, Tensor env_ids)");
  // The exact simulator state, float64 [num_envs, state_dim], for tests and checkpoints.
  m.def("env_get_state(int handle) -> Tensor");
  m.def("env_set_state(int handle, Tensor state) -> ()");
  // Everything needed to resume exactly (generators, episode step counts, states), int64 words.
  m.def("env_save(int handle) -> Tensor");
  m.def("env_load(int handle, Tensor checkpoint) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(nostall, CPU, m) {
  m.impl("gae", TORCH_BOX(&nostall::gae_cpu));
  m.impl("gae_backward", TORCH_BOX(&nostall::gae_backward_cpu));
  m.impl("discounted_returns", TORCH_BOX(&nostall::discounted_returns_cpu));
  m.impl("discounted_returns_backward", TORCH_BOX(&nostall::discounted_returns_backward_cpu));
  m.impl("vtrace", TORCH_BOX(&nostall::vtrace_cpu));
  m.impl("group_advantages", TORCH_BOX(&nostall::group_advantages_cpu));
  m.impl("group_advantages_backward", TORCH_BOX(&nostall::group_advantages_backward_cpu));
  m.impl("token_log_prob", TORCH_BOX(&nostall::token_log_prob_cpu));
  m.impl("token_log_prob_backward", TORCH_BOX(&nostall::token_log_prob_backward_cpu));
  m.impl("token_log_prob_linear", TORCH_BOX(&nostall::token_log_prob_linear_cpu));
  m.impl("token_log_prob_linear_backward", TORCH_BOX(&nostall::token_log_prob_linear_backward_cpu));
  m.impl("token_entropy_linear", TORCH_BOX(&nostall::token_entropy_linear_cpu));
  m.impl("token_entropy_linear_backward", TORCH_BOX(&nostall::token_entropy_linear_backward_cpu));
  m.impl("clipped_policy_loss", TORCH_BOX(&nostall::clipped_policy_loss_cpu));
  m.impl("clipped_policy_loss_backward", TORCH_BOX(&nostall::clipped_policy_loss_backward_cpu));
  m.impl("ppo_loss", TORCH_BOX(&nostall::ppo_loss_cpu));
  m.impl("ppo_loss_backward", TORCH_BOX(&nostall::ppo_loss_backward_cpu));
  m.impl("ppo_loss_from_log_prob", TORCH_BOX(&nostall::ppo_loss_from_log_prob_cpu));
  m.impl("ppo_loss_from_log_prob_backward",
         TORCH_BOX(&nostall::ppo_loss_from_log_prob_backward_cpu));
  m.impl("mlp", TORCH_BOX(&nostall::mlp_cpu));
  m.impl("episode_update", TORCH_BOX(&nostall::episode_update_cpu));
  m.impl("clipped_adam_step", TORCH_BOX(&nostall::clipped_adam_step_cpu));
  m.impl("clipped_adam_step_bf16", TORCH_BOX(&nostall::clipped_adam_step_bf16_cpu));
  m.impl("sample_categorical", TORCH_BOX(&nostall::sample_categorical_cpu));
  m.impl("sample_tokens", TORCH_BOX(&nostall::sample_tokens_cpu));
  m.impl("decode_step", TORCH_BOX(&nostall::decode_step_cpu));
  m.impl("prefill_prompts", TORCH_BOX(&nostall::prefill_prompts_cpu));
  m.impl("generate_completions", TORCH_BOX(&nostall::generate_completions_cpu));
  m.impl("decoder_train", TORCH_BOX(&nostall::decoder_train_cpu));
  m.impl("decoder_train_backward", TORCH_BOX(&nostall::decoder_train_backward_cpu));
  m.impl("decoder_train_backward_into", TORCH_BOX(&nostall::decoder_train_backward_into_cpu));
  m.impl("mlp_backward", TORCH_BOX(&nostall::mlp_backward_cpu));
  m.impl("env_step", TORCH_BOX(&nostall::envs::env_step_cpu));
  m.impl("env_step_into", TORCH_BOX(&nostall::envs::env_step_into_cpu));
  m.impl("env_send", TORCH_BOX(&nostall::envs::env_send_cpu));
  m.impl("env_rollout", TORCH_BOX(&nostall::envs::env_rollout_cpu));
  m.impl("env_set_state", TORCH_BOX(&nostall::envs::env_set_state_cpu));
  m.impl("env_load", TORCH_BOX(&nostall::envs::env_load_cpu));
}

// Ops with no tensor argument dispatch to no backend: they need a backend-independent kernel.
STABLE_TORCH_LIBRARY_IMPL(nostall, CompositeExplicitAutograd, m) {
  m.impl("env_create", TORCH_BOX(&nostall::envs::env_create));
  m.impl("env_close", TORCH_BOX(&nostall::envs::env_close));
  m.impl("env_describe", TORCH_BOX(&nostall::envs::env_describe));
  m.impl("env_reset", TORCH_BOX(&nostall::envs::env_reset));
  m.impl("env_recv", TORCH_BOX(&nostall::envs::env_recv));
  m.impl("env_get_state", TORCH_BOX(&nostall::envs::env_get_state));
  m.impl("env_save", TORCH_BOX(&nostall::envs::env_save));
}
