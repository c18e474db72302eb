// The attention of decoder_train (csrc/ops/decoder_train.h) and its gradient: plain loops over
// each token row's key slots, vectorizing over the head dimension.
#pragma once

#include <cstdint>

namespace nostall::decoder {

// For each of the rows [first, N) and each head, the softmax over its K slots (key_row [N, K],
// -1: masked) of q . k * scale into probs [N, heads, K] (0 where masked), and their average of
// the values into att [N, heads * D]; rows before `first` are left as they are. qkv [N, Q] holds
// the rotated queries, keys and values of every row (any row's keys may be read).
void attention_forward(const float* qkv, const int64_t* key_row, int64_t first, int64_t N,
                       int64_t K, int64_t Q, int64_t heads, int64_t kv, int64_t D, float scale,
                       float* probs, float* att);

// The gradient of attention_forward over the same rows [first, N), for the key-value heads
// [kv_first, kv_last) and the query heads that read them: from datt [N, heads * D] and the saved
// probs added into dqkv [N, Q] (zeroed by the caller; keys and values gather from every row
// attending to them); dp [K] scratch. Calls for disjoint key-value heads write disjoint columns
// of dqkv: they may run at once, each sum in the order one call over every head takes.
void attention_backward(const float* qkv, const float* probs, const float* datt,
                        const int64_t* key_row, int64_t first, int64_t N, int64_t K, int64_t Q,
                        int64_t heads, int64_t kv, int64_t D, float scale, int64_t kv_first,
                        int64_t kv_last, float* dqkv, float* dp);

}  // namespace nostall::decoder
