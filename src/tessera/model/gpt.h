// The GPT model of Megatron's pretrain_gpt (--transformer-impl local), single stage, one
// tensor-parallel rank: parameters and gradients in one slab each, activations for one
// micro-batch in a third, all allocated at construction (nothing in the step loop).
//
// Shape legend: B micro-batch, T sequence, C hidden, A attention width (heads * head dim),
// F ffn hidden, V padded vocabulary, NH heads.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tessera/core/tensor.h"
#include "tessera/model/gpt_config.h"

namespace tessera {

class Device;

// One micro-batch: inputs, targets and the loss mask, as Megatron's get_batch returns them.
struct MicroBatch {
  Tensor tokens;     // i32 [B,T]
  Tensor positions;  // i32 [B,T]
  Tensor labels;     // i32 [B,T]
  Tensor loss_mask;  // f32 [B,T]
};

// Per-step randomness and identity: which iteration and which global samples this
// micro-batch holds (keys the dropout masks), and whether dropout is active.
struct StepContext {
  uint32_t iteration = 0;
  uint32_t first_sample = 0;  // index of the micro-batch's first sample in the global batch
  bool training = true;
};

class GPTModel {
 public:
  GPTModel(const GPTConfig& config, Device& device, int micro_batch_size);

  const GPTConfig& config() const { return config_; }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  const std::vector<Tensor>& params() const { return params_; }
  const std::vector<Tensor>& grads() const { return grads_; }
  const Tensor& param(const std::string& name) const;
  int64_t num_parameters() const;
  size_t activation_bytes() const { return acts_slab_.bytes(); }

  // Megatron's initialisation (megatron.md §10), each element drawn from the counter-based
  // RNG keyed by (seed, parameter id, element index) of the full parameter.
  void init_weights();
  // Copies full parameters by Megatron name; every parameter must be present with its shape.
  void load_weights(const std::map<std::string, std::vector<float>>& weights);
  void zero_grads();

  // Forward of one micro-batch; returns the sum of masked per-token losses (the caller
  // divides by the mask sum). Activations stay for backward. logits() then holds [B,T,V].
  double forward(const MicroBatch& batch, const StepContext& step);
  // Called during backward with a range [first, end) of parameter indices whose gradients
  // this backward will not touch again (data parallelism starts reducing them).
  using GradsReady = std::function<void(size_t first, size_t end)>;
  // Backward of the micro-batch last forwarded: the gradient of
  // sum(loss * mask) * loss_weight is accumulated into grads().
  void backward(const MicroBatch& batch, const StepContext& step, float loss_weight,
                const GradsReady& grads_ready = nullptr);

  Tensor logits() const { return acts_.logits; }

 private:
  struct LayerParams {
    Tensor ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
  };
  struct LayerActs {
    Tensor residual_in;          // [B,T,C] input of the layer (output of the previous one)
    Tensor ln1, ln1_mean, ln1_rstd;  // [B,T,C], [B,T], [B,T]
    Tensor qkv;                  // [B,T,3A]
    Tensor att;                  // [B,NH,T,T]
    Tensor ctx;                  // [B,T,A]
    Tensor residual_mid;         // [B,T,C] after attention + residual
    Tensor ln2, ln2_mean, ln2_rstd;
    Tensor fc1;                  // [B,T,F] before GELU
    Tensor gelu;                 // [B,T,F]
  };
  struct Activations {
    Tensor embedded;             // [B,T,C] after embedding dropout
    std::vector<LayerActs> layers;
    Tensor residual_out;         // [B,T,C] output of the last layer
    Tensor lnf, lnf_mean, lnf_rstd;
    Tensor logits;               // [B,T,V]
    Tensor losses;               // [B,T]
    Tensor scratch_C;            // [B,T,C] projection outputs before dropout
    // Gradient workspaces, zeroed before each use.
    Tensor d_residual, d_C, d_ln, d_ctx, d_qkv, d_att, d_F, d_gelu, d_logits, d_losses;
  };

  // Looked up by name once, at construction: the step only indexes these.
  LayerParams layer_tensors(const std::vector<Tensor>& all, int layer) const;
  // [first, end) parameter indices of layer l (contiguous in registration order).
  std::pair<size_t, size_t> layer_param_range(int layer) const;
  ops::Dropout dropout(float p, int site, const StepContext& step) const;

  GPTConfig config_;
  Device& device_;
  int micro_batch_;
  std::vector<ParamSpec> specs_;
  Buffer params_slab_, grads_slab_, acts_slab_;
  std::vector<Tensor> params_, grads_;
  std::map<std::string, size_t> index_;
  std::vector<LayerParams> layer_params_, layer_grads_;
  std::vector<std::pair<size_t, size_t>> layer_ranges_;
  Activations acts_;
};

}  // namespace tessera
