// All tensor ops in one include.
#pragma once

#include "tensor/autograd.h"
#include "tensor/ops_index.h"
#include "tensor/ops_linalg.h"
#include "tensor/ops_nn.h"
#include "tensor/ops_pointwise.h"
#include "tensor/ops_reduce.h"
#include "tensor/random.h"
#include "tensor/tensor.h"
