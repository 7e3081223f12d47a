// PLACEHOLDER: tests for moe.
#include "testing.h"
