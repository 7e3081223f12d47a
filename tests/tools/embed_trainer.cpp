// A complete C++ trainer embedding meshtrain (docs/embedding.md shows this file verbatim).
// usage: embed_trainer PLAN_FILE OUT_DIR [STEPS]
//   ./embed_trainer plans/llama_tp.plan out            one process: a world of one
//   mpirun -np 2 ./embed_trainer plans/llama_tp.plan out   the same training on two ranks
// Prints "step N loss L" on rank 0 and writes OUT_DIR as a Hugging Face checkpoint.
#include <meshtrain/meshtrain.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) try {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s PLAN_FILE OUT_DIR [STEPS]\n", argv[0]);
    return 2;
  }
  const std::string plan_file = argv[1], out_dir = argv[2];
  const int steps = argc > 3 ? std::stoi(argv[3]) : 5;

  // 1. The model, built on the meta device: no weights are allocated until parallelize() gives
  //    each rank its shards, initialized to the single-device values (seeded Philox).
  mt::ModelConfig cfg = mt::builtin_config("llama-tiny");
  mt::manual_seed(1337);
  std::shared_ptr<mt::CausalLM> model;
  {
    mt::InitDeviceGuard meta(mt::Device::meta());
    model = mt::build_causal_lm(cfg);
  }
  model->train();

  // 2. Plan file -> mesh for the mpirun world -> parallelize -> gradient reducer, in one call.
  //    Keep `job` alive while training: it owns the hooks.
  mt::ParallelJob job = mt::parallelize_from_file(*model, plan_file);

  // 3. The optimizer sees the parameters (DTensors now) and updates each rank's shards.
  mt::AdamWOptions adam;
  adam.lr = 3e-3;
  mt::AdamW opt(mt::make_param_groups(model->named_parameters(), 0.1), adam);

  // 4. Every rank reads the same global batch; place_input keeps this rank's part of it.
  mt::DataLoader loader(mt::embedded_corpus_tokens(), /*batch=*/4, /*seq=*/32);
  for (int step = 1; step <= steps; ++step) {
    auto [ids, targets] = loader.next();
    mt::Tensor loss = model->loss(job.place_input(ids), job.place_input(targets));
    const double value = mt::full_item(loss);  // collective under a plan that leaves the loss sharded
    loss.backward();
    job.reducer.finish();  // reduce the Partial gradients (data parallel dims)
    mt::clip_grad_norm(model->parameters(), 1.0);
    opt.step();
    opt.zero_grad();
    if (job.is_root()) std::printf("step %d loss %.9f\n", step, value);
  }

  // 5. Save: gather full tensors on every rank (collective), write on rank 0. Writing the
  //    DTensors themselves (hf_state(*model, cfg)) is refused: their memory is one shard.
  auto state = mt::full_tensors(mt::hf_state(*model, cfg));
  if (job.is_root()) mt::write_hf_checkpoint(out_dir, cfg, state);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "[rank %d] embed_trainer: %s\n", mt::world().rank(), e.what());
  mt::abort_job(e.what());  // ends every rank: none waits forever in a collective
}
