// PLACEHOLDER: tests for llama.
#include "testing.h"
