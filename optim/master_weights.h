// Mixed precision with f32 master weights. The model keeps its parameters in bf16 or f16 (so the
// forward and backward run in 16 bits); MasterWeights keeps an f32 copy of each, which is what
// the optimizer steps on, so that updates smaller than a 16-bit ulp still accumulate. Per step:
//   model.zero_grad(); loss.backward(); mw.grads_to_master(); clip_grad_norm(mw.master_params());
//   opt.step(); opt.zero_grad(); mw.master_to_model();
// Parameters that already are f32 or f64 are passed through: the master is the parameter itself
// (no copy), and both transfers skip it. Also: cast_parameters() converts a Module's parameters
// to another dtype in place.
#pragma once

#include <string>
#include <vector>

#include "optim/optimizer.h"
#include "tensor/module.h"

namespace mt {

class MasterWeights {
 public:
  explicit MasterWeights(const NamedTensors& model_params);

  // Same names and order as the model parameters; give these to the optimizer (and clipping).
  const NamedTensors& master_params() const { return masters_; }
  // True when every parameter is passed through (nothing to copy).
  bool pass_through() const;

  // Sets each master's grad to its model parameter's grad cast to f32 (undefined stays
  // undefined). The model's grads are left alone.
  void grads_to_master();
  // Rounds each master into its model parameter in place (round to nearest even).
  void master_to_model();

  // The one-pass alternative to grads_to_master + master_to_model (docs/optim.md, "Mixed
  // precision in one pass"): each master's grad becomes its model parameter's 16-bit grad itself
  // (no f32 copy), and an optimizer given model_copies() (AdamW::set_param_copies) writes the
  // rounded new weights into the model as it updates the masters.
  void attach_model_grads();
  // (master name, model parameter) for every 16-bit parameter.
  NamedTensors model_copies() const;

  // The master copies of the 16-bit parameters (pass-through ones are omitted: they are the
  // model's own tensors), for checkpoints: resuming from the rounded model weights alone would
  // lose the bits below the 16-bit ulp.
  NamedTensors state_dict() const;
  // Copies masters back in; missing/unexpected keys and shape mismatches throw, listing them.
  void load_state_dict(const NamedTensors& state);

 private:
  struct Entry {
    Tensor model, master;
    bool copy = false;  // false: master is model
  };
  std::vector<Entry> entries_;
  NamedTensors masters_;
};

// Converts every floating parameter of `module` (recursively; tied tensors once) to `dtype` in
// place: each parameter keeps its Tensor object (TensorImpl), so handles held anywhere see the new
// storage, as Module::materialize does. Gradients are cleared. Buffers are left as they are.
// Meta parameters are an error (materialize first).
void cast_parameters(Module& module, DType dtype);
// The same for one tensor.
void cast_tensor_in_place(const Tensor& t, DType dtype);

}  // namespace mt
