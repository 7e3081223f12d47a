// PLACEHOLDER: tests for hf_checkpoint.
#include "testing.h"
