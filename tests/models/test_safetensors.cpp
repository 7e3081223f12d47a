// PLACEHOLDER: tests for safetensors.
#include "testing.h"
