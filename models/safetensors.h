// safetensors (https://github.com/huggingface/safetensors): the file format Hugging Face
// checkpoints use. An 8-byte little-endian header length N, N bytes of JSON naming each tensor's
// dtype, shape and [begin, end) byte range in the data buffer that follows, then the buffer.
// Reading validates everything a hostile or truncated file could get wrong, and every error names
// the file (and the tensor). Writing is deterministic (same tensors, same bytes) and atomic, and
// records a CRC-32 of the data buffer in the metadata ("mt.crc32") that reading verifies.
// See docs/checkpoints.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "runtime/file_io.h"  // write_file_atomically, fsync_path (declared here before)
#include "tensor/tensor.h"

namespace mt {

struct SafetensorsFile {
  std::vector<std::pair<std::string, Tensor>> tensors;  // in data-buffer order
  std::map<std::string, std::string> metadata;          // "__metadata__" (mt.crc32 included)
};

// Reads every tensor into CPU memory. Throws mt::Error naming the file (and tensor) when the file
// is missing or unreadable, the header is malformed, a dtype is unknown or unsupported, a shape
// does not match its byte range, ranges leave the buffer, overlap or leave holes, or the
// "mt.crc32" checksum does not match.
SafetensorsFile read_safetensors(const std::string& path);

// Partial reads (sharded checkpoints, docs/checkpoints.md "Sharded checkpoints"): the header is read
// and validated as read_safetensors does (dtypes, shapes, offsets tiling the buffer), but no tensor
// data until asked; read_block preads only the bytes of the requested box. The file's CRC-32
// covers the whole buffer, so partial reads cannot verify it (callers that read whole tensors may
// check a per-tensor checksum of their own).
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte range in the data buffer
};
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);  // throws as read_safetensors does
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;
  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* find(const std::string& name) const;  // nullptr when absent
  // The box [offset, offset + sizes) of tensor `name` as a fresh contiguous CPU tensor; reads only
  // the runs of bytes inside the box (one pread per contiguous run). Throws naming the file and
  // tensor when the tensor is absent or the box leaves it.
  Tensor read_block(const std::string& name, const Shape& offset, const Shape& sizes);
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
  uint64_t bytes_read_ = 0;
};

// Writes `tensors` in the given order (names must be unique and not "__metadata__"); any strides,
// any supported dtype, any device but meta; a DTensor only when replicated (else refused, naming
// the tensor: gather it with mt::full_tensor first). `metadata` is stored as "__metadata__"
// together with "mt.crc32" (hex CRC-32 of the data buffer). Atomic: written to "<path>.tmp.<pid>" and renamed,
// so `path` holds either its old content or the whole new file; on error nothing is left behind.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Writes a file of tensors produced one at a time (memory: one tensor), e.g. assembled from the
// chunks of a sharded checkpoint: `produce(i)` returns tensor i of `specs` (name, dtype, shape;
// checked). Same bytes as write_safetensors given the same tensors (the CRC-32 is written into the
// header once the data is), atomic in the same way.
struct SafetensorsSpec {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
};
void write_safetensors_streamed(const std::string& path, const std::vector<SafetensorsSpec>& specs,
                                const std::function<Tensor(size_t)>& produce,
                                const std::map<std::string, std::string>& metadata = {});

// The safetensors dtype string ("F32", "BF16", ...) of a dtype.
const char* safetensors_dtype_name(DType t);

// CRC-32 (IEEE 802.3, the zlib/PNG polynomial), continuing from `crc` (0 to start).
uint32_t crc32_update(uint32_t crc, const void* data, size_t n);
// The CRC-32 of A followed by B from crc(A), crc(B) and B's length, without the bytes (the
// polynomial arithmetic zlib's crc32_combine also uses): O(log len_b).
uint32_t crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

}  // namespace mt
