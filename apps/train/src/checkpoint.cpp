#include "longattn/train/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "longattn/error.hpp"

namespace longattn::train {

namespace {

constexpr const char* magic = "longattn-checkpoint 1";
constexpr const char* where = "longattn::train::checkpoint";

std::string hex(std::uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

void write_all(int fd, const void* data, std::size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    require(n > 0, where, "path", "\"" + path + "\"", std::string("a writable file (") + std::strerror(errno) + ")");
    p += n;
    size -= std::size_t(n);
  }
}

void fsync_directory(const std::string& path) {
  const auto slash = path.rfind('/');
  const std::string directory = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

std::uint64_t fnv1a64(const unsigned char* data, std::size_t size) {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < size; ++i) hash = (hash ^ data[i]) * 0x100000001b3ull;
  return hash;
}

void write_checkpoint(const std::string& path, const Checkpoint& checkpoint, const std::string& temporary_suffix) {
  require(!path.empty(), where, "path", "\"\"", "a file name");
  nlohmann::json metadata = checkpoint.metadata;
  metadata["payload_bytes"] = checkpoint.payload.size();
  metadata["checksum"] = hex(fnv1a64(checkpoint.payload.data(), checkpoint.payload.size()));
  const std::string header = std::string(magic) + "\n" + metadata.dump() + "\n";
  require(!temporary_suffix.empty() && temporary_suffix.find('/') == std::string::npos, where, "temporary_suffix",
          "\"" + temporary_suffix + "\"", "a non-empty file name suffix");
  const std::string temporary = path + temporary_suffix;
  // A .tmp left by a writer that was killed (or anything else under that name: a FIFO, a link)
  // is removed, and the file made anew, so that the write never blocks or lands elsewhere.
  ::unlink(temporary.c_str());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  require(fd >= 0, where, "path", "\"" + temporary + "\"", std::string("a writable file (") + std::strerror(errno) + ")");
  try {
    write_all(fd, header.data(), header.size(), temporary);
    write_all(fd, checkpoint.payload.data(), checkpoint.payload.size(), temporary);
    require(::fsync(fd) == 0, where, "path", "\"" + temporary + "\"", std::string("fsync to succeed (") + std::strerror(errno) + ")");
  } catch (...) {
    ::close(fd);
    ::unlink(temporary.c_str());
    throw;
  }
  ::close(fd);
  require(std::rename(temporary.c_str(), path.c_str()) == 0, where, "path", "\"" + path + "\"",
          std::string("a name the temporary file can be renamed to (") + std::strerror(errno) + ")");
  fsync_directory(path);
}

Checkpoint read_checkpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  require(bool(in), where, "path", "\"" + path + "\"", "a readable checkpoint file");
  const std::streamoff file_bytes = in.tellg();
  in.seekg(0);
  const std::string quoted = "\"" + path + "\"";
  std::string line;
  require(bool(std::getline(in, line)) && line == magic, where, "path", quoted,
          std::string("a file starting with \"") + magic + "\" (not a longattn checkpoint, or another version)");
  Checkpoint checkpoint;
  try {
    std::getline(in, line);
    checkpoint.metadata = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& error) {
    throw_invalid_argument(where, "path", quoted, std::string("valid metadata on line 2 (") + error.what() + ")");
  }
  const auto& m = checkpoint.metadata;
  require(m.is_object() && m.contains("payload_bytes") && m.contains("checksum"), where, "path", quoted,
          "metadata with payload_bytes and checksum");
  // The metadata is not checksummed: check what is read from it before it sizes anything.
  const std::streamoff header_bytes = in.tellg();
  require(m["payload_bytes"].is_number_unsigned() && header_bytes >= 0 &&
              m["payload_bytes"].get<std::uint64_t>() <= std::uint64_t(file_bytes - header_bytes),
          where, "checkpoint's payload_bytes", m["payload_bytes"].dump(),
          "a byte count no larger than the rest of the file, " + std::to_string(file_bytes - header_bytes) +
              " (" + path + " is truncated, or its metadata wrong)");
  require(m["checksum"].is_string() && m["checksum"].get<std::string>().size() == 16, where, "checkpoint's checksum",
          m["checksum"].dump(), "16 hex digits (" + path + ")");
  const std::size_t bytes = m["payload_bytes"].get<std::size_t>();
  checkpoint.payload.resize(bytes);
  in.read(reinterpret_cast<char*>(checkpoint.payload.data()), std::streamsize(bytes));
  require(std::size_t(in.gcount()) == bytes && in.peek() == EOF, where, "path", quoted,
          "a payload of exactly " + std::to_string(bytes) + " bytes (the file is truncated or has extra bytes)");
  const std::string sum = hex(fnv1a64(checkpoint.payload.data(), bytes));
  require(sum == m["checksum"].get<std::string>(), where, "path", quoted,
          "payload checksum " + m["checksum"].get<std::string>() + " (computed " + sum + ": the file is corrupted)");
  return checkpoint;
}

ResumePoint resume_point(const nlohmann::json& m, int steps, const std::string& path) {
  const char* program = "longattn-train";
  const std::string file = " (in " + path + ")";
  require(m.is_object(), program, "checkpoint's metadata", m.dump().substr(0, 40), "a JSON object" + file);
  auto field = [&](const char* key, bool ok, const std::string& expected) -> const nlohmann::json& {
    require(m.contains(key), program, std::string("checkpoint's ") + key, "missing", expected + file);
    require(ok, program, std::string("checkpoint's ") + key, m[key].dump(), expected + file);
    return m[key];
  };
  auto integer = [&](const char* key, std::int64_t low, std::int64_t high) {
    const bool present = m.contains(key);
    const bool ok = present && m[key].is_number_integer() && m[key].get<std::int64_t>() >= low &&
                    m[key].get<std::int64_t>() <= high;
    return field(key, ok, "an integer in [" + std::to_string(low) + ", " + std::to_string(high) + "]").get<std::int64_t>();
  };
  ResumePoint r;
  r.step = int(integer("step", 0, steps));
  r.optimizer_steps = integer("optimizer_steps", 0, std::numeric_limits<std::int64_t>::max());
  const nlohmann::json& rng = field("rng", m.contains("rng") && m["rng"].is_string(), "a random engine's state");
  std::istringstream text(rng.get<std::string>());
  text >> r.rng;
  require(bool(text), program, "checkpoint's rng", rng.dump().substr(0, 40), "a std::mt19937_64 state" + file);
  if (m.contains("loss_scale")) {
    const bool ok = m["loss_scale"].is_number() && m["loss_scale"].get<double>() > 0 &&
                    std::isfinite(m["loss_scale"].get<double>());
    r.loss_scale = field("loss_scale", ok, "a positive finite loss scale").get<double>();
    r.good_steps = int(integer("good_steps", 0, std::numeric_limits<int>::max()));
  }
  return r;
}

}  // namespace longattn::train
