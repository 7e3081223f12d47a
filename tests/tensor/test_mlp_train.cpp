// PLACEHOLDER: tests for mlp_train.
#include "testing.h"
