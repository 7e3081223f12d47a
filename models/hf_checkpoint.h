// Hugging Face checkpoint directories: config.json plus model.safetensors, or shards
// "model-00001-of-0000N.safetensors" listed by model.safetensors.index.json. Reading checks that
// the index and the shards agree; writing is atomic (see docs/checkpoints.md for how an existing
// directory is updated); load_into_module / hf_state move tensors between a checkpoint and a
// Module whose parameter paths are the Hugging Face names.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "models/config.h"
#include "tensor/module.h"
#include "tensor/tensor.h"

namespace mt {

struct HfCheckpoint {
  ModelConfig config;
  std::vector<std::pair<std::string, Tensor>> tensors;  // shard by shard, each in file order
  // Where it was read from, for load_into_module's errors (empty when built in memory): the
  // directory, and the file of each tensor (a name in it; absent: not known).
  std::string source = {};
  std::map<std::string, std::string> file_of = {};
};

inline constexpr const char* kHfConfigFile = "config.json";
inline constexpr const char* kHfSingleFile = "model.safetensors";
inline constexpr const char* kHfIndexFile = "model.safetensors.index.json";

// Reads config.json and the weights (the index and its shards when the index exists, else
// model.safetensors). Throws naming the file for a missing file, a shard the index names that
// does not exist, a tensor the index maps to a shard that lacks it (or a shard tensor the index
// does not list), and a tensor name found twice.
HfCheckpoint read_hf_checkpoint(const std::string& dir);

// Writes config.json (torch_dtype from `dtype`) and the tensors, floating ones converted to
// `dtype` (f32, bf16, f16 or f64), integer ones kept. One model.safetensors when max_shard_bytes
// is 0 or the data fits; else shards of at most max_shard_bytes each (a larger tensor gets a
// shard of its own) plus the index. A new directory appears atomically (written as
// "<dir>.tmp.<pid>", then renamed); in an existing directory each file is replaced atomically and
// files of the previous layout (single file vs shards) are removed after the new index/file is in
// place.
// DTensors are refused (their memory is one rank's shard), replicated ones excepted.
void write_hf_checkpoint(const std::string& dir, const ModelConfig& config,
                         const std::vector<std::pair<std::string, Tensor>>& tensors, DType dtype = DType::kF32,
                         int64_t max_shard_bytes = 0);

// Copies the checkpoint into m's parameters (converting dtype; meta parameters get storage). m
// must not be parallelized yet (DTensor parameters are refused): parallelize() slices the loaded
// weights to each rank's shards.
// Every parameter must be present with its shape; checkpoint tensors must name a parameter or a
// buffer (buffers are optional). With tie_word_embeddings an absent "lm_head.weight" is fine (a
// separate lm_head parameter then gets the embedding) and a present one is ignored in favour of
// the embedding, as transformers does. Throws one error listing the missing names, unexpected
// names and shape mismatches (name and both shapes), naming the checkpoint's directory and each
// tensor's file when known; nothing is modified then. The rotary inverse-frequency buffers older
// transformers versions saved ("model.layers.N.self_attn.rotary_emb.inv_freq") are skipped: meshtrain
// computes them from the config, as transformers does since it stopped saving them.
void load_into_module(Module& m, const HfCheckpoint& ck);

// m's parameters under their Hugging Face names, for write_hf_checkpoint; "lm_head.weight" is
// dropped when the config ties word embeddings. The tensors are detached (they share storage).
// A parallelized model gives DTensors, which the writers refuse: gather them first with
// mt::full_tensors: write_hf_checkpoint(dir, cfg, full_tensors(hf_state(m, cfg))).
std::vector<std::pair<std::string, Tensor>> hf_state(const Module& m, const ModelConfig& config);

}  // namespace mt
