// Segments of a rank under contiguous and zigzag sharding.
#include "longattn/parallel/sharding.hpp"

namespace longattn::parallel {

std::string to_string(Sharding sharding) { return sharding == Sharding::zigzag ? "zigzag" : "contiguous"; }

std::vector<Segment> shard_segments(std::int64_t tokens, int ranks, int rank, Sharding sharding, int granule) {
  const char* where = "longattn::parallel::shard_segments";
  require(ranks >= 1, where, "ranks", ranks, "at least 1");
  require(rank >= 0 && rank < ranks, where, "rank", rank, "a rank from 0 to " + std::to_string(ranks - 1));
  require(granule >= 1, where, "granule", granule, "at least one token");
  const std::int64_t chunks = sharding == Sharding::zigzag ? 2 * std::int64_t(ranks) : ranks;
  if (tokens <= 0 || tokens % (chunks * granule) != 0)
    throw_invalid_argument(where, "tokens", tokens,
                           "a positive multiple of " + std::to_string(chunks * granule) + " (" + std::to_string(ranks) +
                               " ranks" + (sharding == Sharding::zigzag ? " x 2 chunks" : "") + " x " +
                               std::to_string(granule) + "-token blocks, " + to_string(sharding) + " sharding)");
  const std::int64_t chunk = tokens / chunks;
  if (sharding == Sharding::contiguous) return {Segment{rank * chunk, 0, chunk}};
  return {Segment{rank * chunk, 0, chunk}, Segment{(2 * std::int64_t(ranks) - 1 - rank) * chunk, chunk, chunk}};
}

}  // namespace longattn::parallel
