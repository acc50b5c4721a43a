#pragma once
// What longattn-plan is asked: a model, how it is trained, the cluster and the parallel layout.
// Every field has the default the CLI shows; validate() throws longattn::Error naming the first
// bad field, its value and what is valid.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace longattn::plan {

enum class Positions { rotary, learned };  // learned adds sequence x hidden parameters
enum class Precision { bf16, fp16, fp32 };  // bf16/fp16: mixed precision with fp32 optimizer states
enum class Optimizer { adam, sgd_momentum, sgd };
enum class Recompute { none, selective, full };

struct ModelConfig {
  std::int64_t layers = 128;
  std::int64_t hidden = 25600;
  std::int64_t heads = 160;
  std::int64_t ffn = 0;            // 0: 4 x hidden
  std::int64_t vocabulary = 51200;
  std::int64_t sequence = 2048;    // tokens per sequence (context length)
  std::string attention = "dense"; // an attention spec (core/attention_spec.hpp), or block_sparse:density=F
  bool causal = true;
  Positions positions = Positions::rotary;
  bool tied_embeddings = true;  // false: the LM head has weights (V h) and a bias (V) of its own
  bool sub_layer_norm = false;  // MAGNETO's LayerNorm on the attention's output (2h parameters per layer)

  std::int64_t ffn_size() const { return ffn > 0 ? ffn : 4 * hidden; }
  std::int64_t head_dim() const { return hidden / heads; }
};

struct TrainingConfig {
  double tokens = 1e12;                          // training tokens
  std::int64_t global_batch_tokens = 4096000;    // tokens per optimizer step: 2000 x 2048
  Precision precision = Precision::bf16;
  Optimizer optimizer = Optimizer::adam;
  Recompute recompute = Recompute::selective;
  // Gradients kept in fp32 also when training in 16 bits (Megatron-LM's main_grad; longattn-train
  // always), and the data-parallel reduction's buffers in fp32 (false: the training precision).
  bool fp32_gradients = false;
  bool fp32_gradient_reduce = false;
};

// Copies the kernels make of their operands, which live while a kernel runs (memory category
// "transient copies"): none where the kernels read their operands in place (cuBLAS, the tensor-
// core attention), or longattn's CPU paths, which longattn-train's prediction describes; and
// the workspace a 16-bit product takes.
struct KernelCopies {
  // 16-bit matrix products: float copies of A, B and C (Kokkos Kernels' sgemm), or A and B packed
  // in bf16 panels (AVX512-BF16 dot products).
  enum class Gemm { none, float_operands, bf16_panels } gemm = Gemm::none;
  // Pool memory a 16-bit matrix product takes while it runs, beside any copies (cuBLAS's
  // workspace; memory category "workspaces").
  double gemm_workspace_bytes = 0;
  bool head_major_attention = false;  // attention streams head-major copies of two of Q, K, V, dO at a time
  // The attention backward takes its one-pass form, which sums dQ in an fp32 workspace beside a
  // 16-bit dq, or beside a float dq whose heads' rows are apart where head-major copies are
  // streamed (attention_backward_one_pass); false: two passes, dQ in a pass of its own.
  bool attention_dq_sum = true;
};

// One GPU kind. Bandwidths are per GPU and per direction, in bytes/s.
struct GpuSpec {
  std::string name;
  double peak_flops_16bit = 0;  // dense bf16/fp16 tensor-core FLOP/s
  double peak_flops_tf32 = 0;   // dense TF32 tensor-core FLOP/s (what fp32 training runs on)
  double memory_bytes = 0;      // HBM
  double memory_bandwidth = 0;  // HBM bytes/s
  double nvlink_bandwidth = 0;  // inside a node
  double network_bandwidth = 0; // between nodes (one NIC per GPU)
  std::int64_t gpus_per_node = 8;
};

// H100 SXM5 80GB, H200 SXM 141GB, A100 SXM4 80GB, from NVIDIA's data sheets; the network is one
// 400 Gb/s (H100, H200) or 200 Gb/s (A100) InfiniBand NIC per GPU.
const std::vector<GpuSpec>& gpu_table();
const GpuSpec& gpu_by_name(const std::string& name);  // throws Error listing the table
std::string gpu_names();                              // "h100, h200, a100"

struct ClusterConfig {
  std::int64_t gpus = 400;
  GpuSpec gpu = gpu_by_name("h100");
  double price_per_gpu_hour = 2.0;  // USD
  double comm_efficiency = 0.75;    // achieved fraction of link bandwidth in collectives
  double memory_reserve = 0.10;     // fraction of HBM kept free (CUDA context, fragmentation)
};

// Parallel layout: tensor x pipeline x data x context = GPUs. Ranks are ordered tensor
// (innermost), context, data, pipeline, as Megatron-LM orders them.
struct Layout {
  std::int64_t tensor = 1, pipeline = 1, data = 1, context = 1;
  int zero_stage = 1;          // 0-3, over the data x context ranks that hold the same parameters
  std::int64_t micro_batch = 1;  // sequences per micro-batch
  // Tensor parallelism as Megatron-LM runs it: activations outside the blocks' split matrices
  // (LayerNorms, residuals) split over the sequence too (Korthikanti et al.), and the embeddings
  // and the output layer split over the vocabulary. false: those whole on every tensor rank (as
  // longattn-train runs tp).
  bool sequence_parallel = true;
  bool vocab_parallel = true;

  std::int64_t gpus() const { return tensor * pipeline * data * context; }
};

// Kernels that are neither matrix products nor attention, by the elements each class processes
// in a step (estimate.cpp counts them): LayerNorm forward and backward, GELU forward and backward,
// the row kernels (residual and bias adds, bias gradients, embeddings, fills, sequence
// parallelism's reorders), rotary positions (per angle: a token and pair of features, turning
// that pair in every head of Q and K), the loss (softmax and cross-entropy over the vocabulary)
// and the optimizer (per parameter: AdamW, the gradient norm, 16-bit copies of the weights). A
// 16-bit product's operand copies are the product's.
enum class ElementClass { norm_forward, norm_backward, gelu_forward, gelu_backward, rows, rotary, loss, optimizer };
constexpr int element_class_count = 8;
const char* to_string(ElementClass value);
// A class's cost per element as the time of that many FLOPs at the peak (seconds = elements x
// cost / peak), so that ranks sharing a core take proportionally longer.
using ElementCosts = std::array<double, element_class_count>;

// Fraction of the GPU's peak that the kernels reach while computing (exposed communication and
// the pipeline bubble are added separately): measured (perf_tests/write_calibration.py) or given.
struct Efficiency {
  // A matrix product C [m, n] = A [m, k] B [k, n] as measured (perf_tests/write_calibration.py).
  struct Product {
    double m, n, k, efficiency;
  };
  double matmul = 0.45;  // every product's, where no table is given
  double attention_dense = 0.45;
  double attention_dilated = 0.45;
  double attention_block_sparse = 0.45;
  std::string source = "assumed (no --mfu or --calibration given)";
  // Products by shape, as the gemm call runs them with their operand copies, in fp32, in 16 bits
  // (bf16; on a CPU with AVX512-BF16 dot products up to 2, as a fraction of its FP32 FMA peak)
  // and in fp16 where measured apart (a CPU's fp16 products run on float copies; else the 16-bit
  // table's): the efficiency of the measured shape nearest to a product's (log-distance over m,
  // n, k). Empty: `matmul`.
  std::vector<Product> matmul_fp32, matmul_16bit, matmul_fp16;
  double matmul_at(double m, double n, double k, Precision precision) const;
  // Per precision (indexed by Precision), measured by write_calibration.py from longattn-train's
  // own kernels; absent: the element-wise kernels are not counted (an --mfu covers them).
  std::array<std::optional<ElementCosts>, 3> element_costs;
  // longattn-train's element probe (elements per second on a rank) in the runs that timed each
  // precision's costs; 0: not recorded. A trainer run scales the costs by it over its own probe.
  std::array<double, 3> element_rates{};
  // Dense attention's efficiency by head dimension, per precision (indexed by Precision), measured
  // in longattn-train's layers: the nearest measured head dimension's (log distance). Empty:
  // attention_dense.
  struct HeadDim {
    double head_dim, efficiency;
  };
  std::array<std::vector<HeadDim>, 3> attention_by_head_dim;
  double dense_attention_at(double head_dim, Precision precision) const;
  // Dense attention over sequences (or dilated segments) of this many tokens against the head
  // dimension table's (measured at 512 tokens), per precision: the nearest measured length's
  // factor (log distance). Empty: 1 at every length.
  struct Length {
    double tokens, factor;
  };
  std::array<std::vector<Length>, 3> attention_by_length;
  double attention_length_factor(double tokens, Precision precision) const;
  // The other kinds against dense attention at the same head dimension (dilated: against dense
  // attention over segments as long as its passes' where attention_by_length is given), dense
  // attention in a context-parallel ring (its pieces and merges) against one rank's, and dilated
  // attention over context-parallel ranks against one rank's, measured in longattn-train per
  // precision. Absent: attention_<kind> / attention_dense, and no ring factors.
  struct AttentionFactors {
    double dilated = 1, block_sparse = 1, ring = 1, dilated_ring = 1;
  };
  std::array<std::optional<AttentionFactors>, 3> attention_factors;
};

struct Plan {
  ModelConfig model;
  TrainingConfig training;
  ClusterConfig cluster;
  Layout layout;
  Efficiency efficiency;
  KernelCopies copies;
};

// Checks everything but the layout (which the search varies) / the layout against the rest.
void validate_inputs(const Plan& plan);
void validate_layout(const Plan& plan);

// Reads a calibration JSON ({"matmul": e, "attention": {"dense": e, "dilated": e,
// "block_sparse": e}, "source": "...", optionally "matmul_shapes": {"fp32": [[m, n, k, e], ...],
// "16bit": [...], optionally "fp16": [...]} and "element_costs": {"fp32": {"norm_forward": c, ... every class}, "bf16": ...,
// "fp16": ...}, "element_rates": {"fp32": r, ...}, "attention_by_head_dim": {"fp32": [[D, e], ...], ...}, "attention_by_length":
// {"fp32": [[tokens, f], ...], ...} and "attention_factors": {"fp32": {"dilated": f, "block_sparse":
// f, "ring": f, optionally "dilated_ring": f}, ...}); throws Error on a missing file or field, an
// efficiency outside (0, 1], a negative cost or a factor outside (0, 4].
Efficiency read_calibration(const std::string& path);
Efficiency uniform_efficiency(double mfu);

const char* to_string(Positions value);
const char* to_string(Precision value);
const char* to_string(Optimizer value);
const char* to_string(Recompute value);

}  // namespace longattn::plan
