// Tensor parallelism's two pieces in core (Megatron-LM: Shoeybi et al., 2019):
//
//   FeatureGroup  the P ranks a layer's features are split over. Rank p holds part p of every
//                 split weight; sum() adds partial results over the group (an all-reduce);
//                 under sequence parallelism gather() puts the ranks' token shards together (an
//                 all-gather) and reduce_scatter() sums partial results into them. core
//                 only declares it; longattn::parallel implements it over a Communicator, and a
//                 module given none (nullptr) holds its whole layer.
//   FeatureSplit  how one tensor is split: `blocks` matrices of [rows, cols] one after another
//                 (W_qkv: q, k and v), each cut into P equal parts along its rows (a column-
//                 parallel layer's weights: its output features) or its columns (a row-parallel
//                 layer's: its input features), or not at all (replicated). extract() and insert()
//                 move part p between a whole tensor and its part, so weights initialize whole and
//                 checkpoints hold whole tensors whatever P is.
#pragma once

#include <cstddef>

#include "longattn/core/half.hpp"
#include "longattn/error.hpp"

namespace longattn {

template <class ExecSpace>
class FeatureGroup {
 public:
  virtual ~FeatureGroup() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // Sums `count` values at `data` (memory of ExecSpace) over the group, in place, after the work
  // already queued on `exec`; later work on `exec` sees the sums.
  virtual void sum(const ExecSpace& exec, float* data, std::size_t count) const = 0;
  virtual void sum(const ExecSpace& exec, double* data, std::size_t count) const = 0;
  virtual void sum(const ExecSpace& exec, bfloat16* data, std::size_t count) const = 0;
  virtual void sum(const ExecSpace& exec, float16* data, std::size_t count) const = 0;
  // whole[p count, (p + 1) count) = rank p's part[0, count), for every rank p (an all-gather).
  virtual void gather(const ExecSpace& exec, const float* part, float* whole, std::size_t count) const = 0;
  virtual void gather(const ExecSpace& exec, const double* part, double* whole, std::size_t count) const = 0;
  virtual void gather(const ExecSpace& exec, const bfloat16* part, bfloat16* whole, std::size_t count) const = 0;
  virtual void gather(const ExecSpace& exec, const float16* part, float16* whole, std::size_t count) const = 0;
  // part[0, count) = the sum over the ranks of their whole[p count, (p + 1) count), p this rank.
  virtual void reduce_scatter(const ExecSpace& exec, const float* whole, float* part, std::size_t count) const = 0;
  virtual void reduce_scatter(const ExecSpace& exec, const double* whole, double* part, std::size_t count) const = 0;
  virtual void reduce_scatter(const ExecSpace& exec, const bfloat16* whole, bfloat16* part, std::size_t count) const = 0;
  virtual void reduce_scatter(const ExecSpace& exec, const float16* whole, float16* part, std::size_t count) const = 0;
};

struct FeatureSplit {
  enum class Along { none, rows, columns };
  Along along = Along::none;
  std::size_t blocks = 1, rows = 0, cols = 1;

  static FeatureSplit whole(std::size_t count) { return {Along::none, 1, count, 1}; }
  static FeatureSplit by_rows(std::size_t rows, std::size_t cols, std::size_t blocks = 1) {
    return {Along::rows, blocks, rows, cols};
  }
  static FeatureSplit by_columns(std::size_t rows, std::size_t cols) { return {Along::columns, 1, rows, cols}; }

  bool split() const { return along != Along::none; }
  std::size_t whole_count() const { return blocks * rows * cols; }
  std::size_t part_count(int parts) const { return split() ? whole_count() / std::size_t(parts) : whole_count(); }

  // Whether P parts cut every block evenly.
  bool divides(int parts) const {
    return parts >= 1 && (along == Along::rows ? rows % std::size_t(parts) == 0
                          : along == Along::columns ? cols % std::size_t(parts) == 0 : true);
  }

  // part[0, part_count) = part `part` of `parts` of whole[0, whole_count); host pointers.
  template <class V>
  void extract(int parts, int part, const V* whole, V* piece) const {
    visit(parts, part, [&](std::size_t w, std::size_t p, std::size_t n) {
      for (std::size_t i = 0; i < n; ++i) piece[p + i] = whole[w + i];
    });
  }
  // The reverse: part `part` of `whole` = piece.
  template <class V>
  void insert(int parts, int part, const V* piece, V* whole) const {
    visit(parts, part, [&](std::size_t w, std::size_t p, std::size_t n) {
      for (std::size_t i = 0; i < n; ++i) whole[w + i] = piece[p + i];
    });
  }

 private:
  // copy(whole offset, part offset, count) for each contiguous run of the part.
  template <class Copy>
  void visit(int parts, int part, const Copy& copy) const {
    require(divides(parts) && part >= 0 && part < parts, "longattn::FeatureSplit", "part", part,
            "one of " + std::to_string(parts) + " parts that cut the tensor evenly");
    if (!split()) return copy(0, 0, whole_count());
    const std::size_t P = std::size_t(parts), p = std::size_t(part);
    std::size_t at = 0;
    for (std::size_t b = 0; b < blocks; ++b) {
      const std::size_t block = b * rows * cols;
      if (along == Along::rows) {
        const std::size_t n = rows / P * cols;
        copy(block + p * n, at, n);
        at += n;
      } else {
        const std::size_t n = cols / P;
        for (std::size_t r = 0; r < rows; ++r, at += n) copy(block + r * cols + p * n, at, n);
      }
    }
  }
};

}  // namespace longattn
