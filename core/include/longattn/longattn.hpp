#pragma once
// Everything longattn::core offers, in one include: errors and checks (base), memory pools and
// their categories (memory), and the attention kernels, modules, matrix products, LayerNorm, linear
// layers and runtime of the core layer. The parallel layer (MPI, NCCL: ring attention, gradient buckets,
// tensor parallelism) links apart, as longattn::parallel: include its headers
// (longattn/parallel/...) beside this one.
//
//   #include "longattn/longattn.hpp"
//   int main(int argc, char* argv[]) {
//     longattn::ScopeGuard guard(argc, argv);
//     ...
//   }
#include "longattn/checks.hpp"
#include "longattn/config.hpp"
#include "longattn/error.hpp"
#include "longattn/memory/category.hpp"
#include "longattn/memory/pool.hpp"
#include "longattn/memory/pooled_view.hpp"
#include "longattn/memory/topology.hpp"
#include "longattn/core/attention.hpp"
#include "longattn/core/attention_runner.hpp"
#include "longattn/core/attention_spec.hpp"
#include "longattn/core/attention_tensors.hpp"
#include "longattn/core/attention_tiles.hpp"
#include "longattn/core/bf16_dot_products.hpp"
#include "longattn/core/blas.hpp"
#include "longattn/core/block_sparse_layout.hpp"
#include "longattn/core/block_sparse_patterns.hpp"
#include "longattn/core/build_info.hpp"
#include "longattn/core/ceilings.hpp"
#include "longattn/core/convert.hpp"
#include "longattn/core/dense_blocks.hpp"
#include "longattn/core/dilated_attention.hpp"
#include "longattn/core/execution_context.hpp"
#include "longattn/core/feature_group.hpp"
#include "longattn/core/finite.hpp"
#include "longattn/core/gemm.hpp"
#include "longattn/core/half.hpp"
#include "longattn/core/layer_norm.hpp"
#include "longattn/core/linear.hpp"
#include "longattn/core/merge_partial.hpp"
#include "longattn/core/multihead_attention.hpp"
#include "longattn/core/rotary.hpp"
#include "longattn/core/runtime.hpp"
#include "longattn/core/sequence_parallel.hpp"
